package policy

import (
	"fmt"
	"time"
)

// windowParams are the settings of the three window kinds: a limit of
// demand units per window.
type windowParams struct {
	limit  int64
	window time.Duration
	refund bool
}

func newWindowParams() windowParams { return windowParams{refund: true} }

// capacity: a request costing more than the limit is never admitted.
func (p *windowParams) capacity() (int64, string) { return p.limit, "limit" }

func (p *windowParams) fields() []field {
	return []field{
		intField("limit", "demand units admitted per window", &p.limit, 1, 1<<40).must(),
		durationField("window", "window length, e.g. 1s, 1m (at most 366 days)", &p.window, time.Millisecond).must(),
		refundField(&p.refund),
	}
}

func (p *windowParams) stateKey() string { return p.window.String() }

func (p *windowParams) text(what string, g *Gate) string {
	return fmt.Sprintf("%s %d per %v%s", what, p.limit, p.window, scoped(g))
}
