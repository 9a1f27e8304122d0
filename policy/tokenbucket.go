package policy

import (
	"fmt"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/limit"
)

var tokenBucketKind = &kind{
	name:    "token_bucket",
	example: `{name: request-rate, kind: token_bucket, rate: 100/s, burst: 500}`,
	doc: "Token bucket (limit.TokenBucket): a bucket of burst tokens refilled at rate; a request takes its cost. " +
		"Rejects with reason policy_rate (429) and the exact retry-after; a cost above the burst is never retryable.",
	scope:  sluice.ScopeTenant,
	stored: true,
	reason: always(sluice.ReasonPolicyRate),
	new:    func() params { return &bucketParams{refund: true} },
}

// bucketParams are the settings of the two bucket kinds, token_bucket and
// gcra, whose decisions are identical (GCRA is the token bucket's dual).
type bucketParams struct {
	rate     limit.Rate
	rateText string
	burst    int64
	refund   bool
	lease    leaseSettings
}

func (p *bucketParams) fields() []field {
	return []field{
		rateField("rate", "sustained rate: tokens per period, e.g. 100/s, 5/m, 1/h", &p.rate, &p.rateText).must(),
		intField("burst", "bucket size in demand units: what a full bucket admits at once", &p.burst, 1, 1<<40).must(),
		refundField(&p.refund),
		leaseField(&p.lease),
	}
}

func (p *bucketParams) tokenBucket() algorithmGate {
	return onAlgorithm("token_bucket", algorithm.Settings{Rate: p.rate, Burst: p.burst}, rateGate(p.refund))
}

func (p *bucketParams) check(c *checker) {
	p.tokenBucket().check(c)
	p.lease.check(c, p.rate, p.burst)
}

func (p *bucketParams) build(b *builder) (sluice.Gate, error) {
	if p.lease.set {
		return p.lease.build(b, p.rate, p.burst)
	}
	return p.tokenBucket().build(b)
}
func (p *bucketParams) stateKey() string { return p.rate.String() }
func (p *bucketParams) bursts() int64    { return p.burst }

// capacity: a request costing more than the burst is never admitted.
func (p *bucketParams) capacity() (int64, string) { return p.burst, "burst" }

func (p *bucketParams) describe(g *Gate) string {
	return fmt.Sprintf("token bucket %s, burst %d%s%s", p.rateText, p.burst, scoped(g), p.lease.describe(p.rate))
}

// leased: see leaser. (gcra's settings embed these.)
func (p *bucketParams) leased() bool { return p.lease.set }
