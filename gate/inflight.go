package gate

import (
	"context"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// inFlight is the gate NewInFlight returns.
type inFlight struct {
	base
	weighted bool
}

var _ sluice.Advertiser = (*inFlight)(nil)

// NewInFlight returns a concurrency gate named name over lim, a limiter
// running limit.Concurrency. Each request holds one slot; see
// NewWeightedInFlight to hold its cost.
//
// The gate bounds in-flight requests per scope: a request holds one slot
// (its cost, with a weighted limiter) from admission until its Ticket is
// done, whatever the outcome. Per tenant it is an entitlement (429, reason
// concurrency); per service or operation it protects a pool (503).
// A rejection carries Options.RetryHint as retry-after: when a slot frees
// depends on the work in flight, not on time.
//
// Decide acquires the request's slots in its scope.
//
// Release frees the slots on every outcome.
func NewInFlight(name string, lim store.Limiter, opts Options) (sluice.Gate, error) {
	return gateOf(newInFlight(name, lim, opts, false))
}

func newInFlight(name string, lim store.Limiter, opts Options, weighted bool) (*inFlight, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	return &inFlight{base: newBase(name, lim, opts, opts.reasonOr(sluice.ReasonConcurrency), sluice.UnitConcurrentRequests), weighted: weighted}, nil
}

// NewWeightedInFlight is NewInFlight where each request holds as many
// slots as its cost (work units in flight rather than requests).
func NewWeightedInFlight(name string, lim store.Limiter, opts Options) (sluice.Gate, error) {
	return gateOf(newInFlight(name, lim, opts, true))
}

func (g *inFlight) slots(r *sluice.Request) int64 {
	if g.weighted {
		return r.Cost
	}
	return 1
}

// Decide acquires the request's slots in its scope.
func (g *inFlight) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	return g.decide(ctx, r, now, g.slots(r), d)
}

// Release frees the slots on every outcome.
func (g *inFlight) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	g.refund(g.opts.Scope.Key(r), p, c.Now, g.slots(r))
}

// gateOf returns g as a sluice.Gate, or err (never a typed nil).
func gateOf[G sluice.Gate](g G, err error) (sluice.Gate, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}
