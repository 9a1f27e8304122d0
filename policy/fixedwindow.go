package policy

import (
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/limit"
	sredis "github.com/sluice-go/sluice/store/redis"
)

var fixedWindowKind = &kind{
	name:    "fixed_window",
	example: `{name: per-minute, kind: fixed_window, limit: 600, window: 1m}`,
	doc: "Fixed window (limit.FixedWindow): at most limit demand units per aligned window. " +
		"Cheap, but a client may get twice the limit across a window edge. Rejects with reason policy_rate (429).",
	scope:  sluice.ScopeTenant,
	stored: true,
	reason: always(sluice.ReasonPolicyRate),
	new:    func() params { return &fixedWindowParams{newWindowParams()} },
}

type fixedWindowParams struct{ windowParams }

func (p *fixedWindowParams) algorithm() algorithm[limit.FixedWindowState, *limit.FixedWindow] {
	return algorithm[limit.FixedWindowState, *limit.FixedWindow]{
		alg:   func() (*limit.FixedWindow, error) { return limit.NewFixedWindow(p.limit, p.window) },
		redis: sredis.FixedWindow,
		share: func(a *limit.FixedWindow, n int64) (*limit.FixedWindow, error) {
			return limit.NewFixedWindow(shareOf(a.Limit(), n), a.Window())
		},
		gate: rateGate(p.refund),
	}
}

func (p *fixedWindowParams) check(c *checker)                      { p.algorithm().check(c) }
func (p *fixedWindowParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *fixedWindowParams) describe(g *Gate) string               { return p.text("fixed window", g) }
