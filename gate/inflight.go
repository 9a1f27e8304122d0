package gate

import (
	"context"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// InFlight bounds in-flight requests per scope: a request holds one slot
// (its cost, with a weighted limiter) from admission until its Ticket is
// done, whatever the outcome. Per tenant it is an entitlement (429, reason
// concurrency); per service or operation it protects a pool (503).
// A rejection carries Options.RetryHint as retry-after: when a slot frees
// depends on the work in flight, not on time.
type InFlight struct {
	base
	weighted bool
}

var _ sluice.Advertiser = (*InFlight)(nil)

// NewInFlight returns a concurrency gate named name over lim, a limiter
// running limit.Concurrency. Each request holds one slot; see
// NewWeightedInFlight to hold its cost.
func NewInFlight(name string, lim store.Limiter, opts Options) (*InFlight, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	return &InFlight{base: base{name: name, lim: lim, opts: opts, reason: opts.reasonOr(sluice.ReasonConcurrency), unit: sluice.UnitConcurrentRequests}}, nil
}

// NewWeightedInFlight is NewInFlight where each request holds as many
// slots as its cost (work units in flight rather than requests).
func NewWeightedInFlight(name string, lim store.Limiter, opts Options) (*InFlight, error) {
	g, err := NewInFlight(name, lim, opts)
	if err == nil {
		g.weighted = true
	}
	return g, err
}

func (g *InFlight) slots(r *sluice.Request) int64 {
	if g.weighted {
		return r.Cost
	}
	return 1
}

// Decide acquires the request's slots in its scope.
func (g *InFlight) Decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	return g.decide(ctx, r, now, g.slots(r))
}

// Release frees the slots on every outcome.
func (g *InFlight) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	g.refund(g.opts.Scope.Key(r), p, c.Now, g.slots(r))
}
