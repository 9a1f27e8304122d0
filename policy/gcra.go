package policy

import (
	"fmt"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/algorithm"
)

var gcraKind = &kind{
	name:    "gcra",
	example: `{name: request-rate, kind: gcra, rate: 100/s, burst: 500}`,
	doc: "Generic cell rate algorithm (limit.GCRA; ITU-T I.371): the token bucket's dual, one theoretical arrival time per key. " +
		"Same settings and decisions as token_bucket.",
	scope:  sluice.ScopeTenant,
	stored: true,
	reason: always(sluice.ReasonPolicyRate),
	new:    func() params { return &gcraParams{bucketParams{refund: true}} },
}

// gcraParams are a bucket's settings run as GCRA.
type gcraParams struct{ bucketParams }

func (p *gcraParams) gcra() algorithmGate {
	return onAlgorithm("gcra", algorithm.Settings{Rate: p.rate, Burst: p.burst}, rateGate(p.refund))
}

func (p *gcraParams) check(c *checker) {
	p.gcra().check(c)
	p.lease.check(c, p.rate, p.burst)
}

func (p *gcraParams) build(b *builder) (sluice.Gate, error) {
	if p.lease.set {
		return p.lease.build(b, p.rate, p.burst)
	}
	return p.gcra().build(b)
}

func (p *gcraParams) describe(g *Gate) string {
	return fmt.Sprintf("GCRA %s, burst %d%s%s", p.rateText, p.burst, scoped(g), p.lease.describe(p.rate))
}
