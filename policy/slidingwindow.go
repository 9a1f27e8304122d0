package policy

import (
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/limit"
	sredis "github.com/sluice-go/sluice/store/redis"
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

func (p *slidingWindowParams) algorithm() algorithm[limit.SlidingWindowState, *limit.SlidingWindow] {
	return algorithm[limit.SlidingWindowState, *limit.SlidingWindow]{
		alg:   func() (*limit.SlidingWindow, error) { return limit.NewSlidingWindow(p.limit, p.window) },
		redis: sredis.SlidingWindow,
		share: func(a *limit.SlidingWindow, n int64) (*limit.SlidingWindow, error) {
			return limit.NewSlidingWindow(shareOf(a.Limit(), n), a.Window())
		},
		gate: rateGate(p.refund),
	}
}

func (p *slidingWindowParams) check(c *checker)                      { p.algorithm().check(c) }
func (p *slidingWindowParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *slidingWindowParams) describe(g *Gate) string {
	return p.text("sliding window counter", g) + " (bound < 2x in the worst case)"
}
