package policy

import (
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/algorithm"
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

func (p *fixedWindowParams) algorithm() algorithmGate {
	return onAlgorithm("fixed_window", algorithm.Settings{Limit: p.limit, Window: p.window}, rateGate(p.refund))
}

func (p *fixedWindowParams) check(c *checker)                      { p.algorithm().check(c) }
func (p *fixedWindowParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *fixedWindowParams) describe(g *Gate) string               { return p.text("fixed window", g) }
