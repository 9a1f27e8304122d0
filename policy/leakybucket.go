package policy

import (
	"fmt"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

var leakyBucketKind = &kind{
	name:    "leaky_bucket",
	example: `{name: paced, kind: leaky_bucket, rate: 10/s, queue: 20}`,
	doc: "Leaky bucket as a paced queue (limit.LeakyBucket): admitted requests leave at a steady rate, each waiting for its " +
		"slot, with at most queue waiting; a request whose slot comes after its deadline is refused before it waits. " +
		"Rejects with reason policy_rate (429) per tenant, overload (503) at a shared scope.",
	scope:  sluice.ScopeService,
	stored: true,
	reason: gate.PacerReason,
	new:    func() params { return &leakyBucketParams{} },
}

type leakyBucketParams struct {
	rate     limit.Rate
	rateText string
	queue    int64
}

func (p *leakyBucketParams) fields() []field {
	return []field{
		rateField("rate", "departure rate: requests per period, e.g. 10/s", &p.rate, &p.rateText).must(),
		intField("queue", "requests that may wait for their slot", &p.queue, 0, 1<<30).must(),
	}
}

func (p *leakyBucketParams) algorithm() algorithmGate {
	return onAlgorithm("leaky_bucket", algorithm.Settings{Rate: p.rate, Queue: p.queue}, func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error) {
		return gate.NewPacer(name, lim, o)
	})
}

func (p *leakyBucketParams) check(c *checker)                      { p.algorithm().check(c) }
func (p *leakyBucketParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *leakyBucketParams) stateKey() string                      { return p.rate.String() }

func (p *leakyBucketParams) describe(g *Gate) string {
	return fmt.Sprintf("paced queue at %s, queue %d%s", p.rateText, p.queue, scoped(g))
}
