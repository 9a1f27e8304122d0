package gate

import (
	"context"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// pacer is the gate NewPacer returns.
type pacer struct {
	base
}

var (
	_ sluice.Gate   = (*pacer)(nil)
	_ sluice.Waiter = (*pacer)(nil)
)

// NewPacer returns a pacing gate named name over lim.
//
// The gate smooths a scope's requests to a steady rate with a bounded queue,
// over a limiter running limit.LeakyBucket: an admitted request waits in
// Decide until its departure slot, then proceeds. It never holds a request
// past its deadline (reason deadline, refused before waiting), rejects when
// the queue is full (with the exact retry-after: reason policy_rate, 429,
// when the queue is per tenant; overload, 503, when it protects a shared
// resource at service, operation or class scope), and
// stops waiting when ctx is done (reason deadline; the slot stays used, so
// the pace is never exceeded). A caller on a virtual clock passes a context
// from sluice.ContextWithWait and Decide returns at once, adding the wait.
//
// Decide schedules r and waits for its slot.
//
// MayWait reports true: Decide waits for the departure slot.
//
// Release does nothing: a paced slot is spent once it is scheduled.
func NewPacer(name string, lim store.Limiter, opts Options) (sluice.Gate, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	return &pacer{newBase(name, lim, opts, opts.reasonOr(PacerReason(opts.Scope)), sluice.UnitRequests)}, nil
}

// PacerReason is the rejection reason of a Pacer whose queue is counted
// over scope: policy_rate (429) for a queue of each caller, overload (503)
// for one that protects a shared resource.
func PacerReason(scope sluice.Scope) sluice.Reason {
	if scope.PerCaller() {
		return sluice.ReasonPolicyRate
	}
	return sluice.ReasonOverload
}

// Decide schedules r and waits for its slot.
func (g *pacer) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	res, _, ok := g.take(ctx, g.opts.Scope.Key(r), r, now, r.Cost)
	if !ok {
		g.unavailable(d)
		return 0
	}
	g.decision(d, &res)
	if !d.Admitted || res.Wait <= 0 {
		return 0
	}
	if w := sluice.WaitFrom(ctx); w != nil {
		*w += res.Wait // the caller delays the work on its own clock
		return 0
	}
	t := time.NewTimer(res.Wait)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
		*d = sluice.Decision{Reason: sluice.ReasonDeadline, Scope: g.opts.Scope, Gate: g.name}
	}
	return 0
}

// MayWait reports true: Decide waits for the departure slot.
func (g *pacer) MayWait() bool { return true }

// Release does nothing: a paced slot is spent once it is scheduled.
func (g *pacer) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {}

// SpendsAtAdmission reports true: Release does nothing (see sluice.Gate).
func (g *pacer) SpendsAtAdmission() bool { return true }
