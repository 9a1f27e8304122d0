package policy

import (
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/algorithm"
)

var slidingWindowKind = &kind{
	name:    "sliding_window",
	example: `{name: per-minute, kind: sliding_window, limit: 600, window: 1m}`,
	doc: "Sliding window counter (limit.SlidingWindow): the current window's count plus the previous one's, weighted by " +
		"how much of it the sliding window still covers. Two integers per key; admits less than twice the limit in the " +
		"worst case. Rejects with reason policy_rate (429).",
	scope:  sluice.ScopeTenant,
	stored: true,
	reason: always(sluice.ReasonPolicyRate),
	new:    func() params { return &slidingWindowParams{newWindowParams()} },
}

type slidingWindowParams struct{ windowParams }

func (p *slidingWindowParams) algorithm() algorithmGate {
	return onAlgorithm("sliding_window", algorithm.Settings{Limit: p.limit, Window: p.window}, rateGate(p.refund))
}

func (p *slidingWindowParams) check(c *checker)                      { p.algorithm().check(c) }
func (p *slidingWindowParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *slidingWindowParams) describe(g *Gate) string {
	return p.text("sliding window counter", g) + " (bound < 2x in the worst case)"
}
