package whatif

import (
	"context"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/policy"
)

// Options.Follow: the gates whose decisions depend on timing decide as the
// recording says, so that what is left to replay, the rate gates on the
// recorded arrival times, can be checked request for request against the
// recording. A rate gate gives back the tokens of a request a later gate
// refuses; when that later gate follows the recording, the tokens come
// back as they did, and the policy that recorded a log replays it exactly.
// What does not (a log of another policy, a gate renamed, sampled
// rejections, a clock that stepped) shows as disagreement.

// rateKinds are the kinds whose decisions follow from the arrival times
// and costs alone.
var rateKinds = map[string]bool{"token_bucket": true, "gcra": true, "fixed_window": true, "sliding_window": true,
	"sliding_log": true, "leaky_bucket": true}

// followed is a timing gate that decides as the recording did: it refuses
// the requests the recording says it refused, for the recorded reason and
// after the recorded wait, and admits the others, holding nothing.
type followed struct {
	name string
	r    *runner
}

func (g *followed) Name() string { return g.name }

func (g *followed) Decide(_ context.Context, _ *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	rec := &g.r.recs[g.r.cur]
	d.Gate = g.name
	// Admitted as recorded; or, when the runner decides through the chain
	// that ends here (turnAway), admitted to be turned away when its
	// recorded wait ends.
	d.Admitted = rec.Decision != Rejected || rec.Gate != g.name || g.r.turnAway
	if !d.Admitted {
		d.Reason = reasonNamed(rec.Reason)
	}
	return 0
}

func (g *followed) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// SpendsAtAdmission reports true: the gate holds nothing (see sluice.Gate).
func (g *followed) SpendsAtAdmission() bool { return true }

// following is c with each gate of f that is not of a rate kind replaced
// by one that follows the recording, the names of those replaced, and for
// each of them that enforces, the chain up to it: a request the recording
// says it turned away after a wait is decided through that chain (the
// gates after it never saw the request) and turned away when the wait
// ends, giving the tokens of the gates before it back then.
func (r *runner) following(c *sluice.Chain, f *policy.File) (*sluice.Chain, []string, map[string]*sluice.Chain, error) {
	kinds := make(map[string]string, len(f.Gates))
	for _, g := range f.Gates {
		kinds[g.Name] = g.Kind
	}
	gates := c.Gates()
	modes := make(map[string]sluice.Mode, len(gates))
	prefixes := map[string]*sluice.Chain{}
	var names []string
	for i, g := range gates {
		name := g.Name()
		m, _ := c.Mode(name)
		modes[name] = m
		if rateKinds[kinds[name]] {
			continue
		}
		gates[i] = &followed{name: name, r: r}
		names = append(names, name)
		if m != sluice.ModeEnforce {
			continue
		}
		pc, err := sluice.NewChain(sluice.ChainOptions{Clock: c.Clock(), Modes: modes}, gates[:i+1]...)
		if err != nil {
			return nil, nil, nil, err
		}
		prefixes[name] = pc
	}
	fc, err := sluice.NewChain(sluice.ChainOptions{Clock: c.Clock(), Modes: modes}, gates...)
	return fc, names, prefixes, err
}

// reasonNamed is the reason whose wire name is s (ReasonNone if none).
func reasonNamed(s string) sluice.Reason {
	for r := range sluice.Reason(sluice.ReasonCount) {
		if r.String() == s {
			return r
		}
	}
	return sluice.ReasonNone
}
