package lease

import (
	"context"
	"math"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Concurrency spends a lease of a global concurrency budget in-process: at
// most the granted slots in flight in this process, each held from
// admission to the end of the request, with the grant refreshed from the
// allocator like a rate Gate's. The decision never waits on the
// allocator; a lapsed lease falls back to OnFailure.
//
// The gate asks for the concurrency its demand needs: the larger of the
// most it had in flight (with the request it was deciding) and, by
// Little's law, its offered requests per second times their mean hold
// time, plus Headroom. It reports what it has in flight with every
// refresh, and the allocator counts that against the others' room while
// it is more than the grant, so a grant that shrank below the work in
// flight does not let the others take the slots still held. Since it
// admits on its old grant until the answer comes, it reports at least that
// grant as in use: a grant shrinks one refresh later (the unused
// allocation of a concurrency budget is at most C for 2R).
//
// Bounds, with capacity C slots: while every process reaches the
// allocator and it keeps its state, the fleet never has more than C in
// flight (a process admits only below its grant, and the allocator grants
// no more than what the others hold or have in use leaves). A process cut
// off from the allocator keeps what it has in flight (a request cannot be
// recalled) and admits by its failure mode once its lease lapses. After a
// lost state, see the package doc. Rejections are reason concurrency at
// scope service (503), with RetryHint as retry-after. It is safe for
// concurrent use, and a sluice.Sizer, so a wait queue can sit in front.
type Concurrency struct {
	holder
	name     string
	inflight int64
	// since the last refresh: the most in flight with the request being
	// decided, the slots offered, and the hold time of completed ones
	peak, offered int64
	holdSum       time.Duration
	holds         int64
	meanHold      time.Duration // of the last interval with completions
	demandAt      clock.Instant
	// pred is the gate g Continues: its requests still in flight count
	// as g's until they end.
	pred *Concurrency
}

var (
	_ sluice.StateReporter = (*Concurrency)(nil)
	_ sluice.Leaseholder   = (*Concurrency)(nil)
	_ sluice.Sizer         = (*Concurrency)(nil)
)

// NewConcurrency returns a concurrency lease gate named name, its
// Allocator's Capacity in slots. It does not ask for a lease: Refresh does
// (Run does it in the background).
func NewConcurrency(name string, opts GateOptions) (*Concurrency, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	g := &Concurrency{name: name, demandAt: opts.Clock.Now()}
	g.holder = holder{opts: opts, short: make(chan struct{}, 1), wants: g.wantsLocked, reserve: true,
		inUse: g.inFlightLocked,
		change: func(now clock.Instant) {
			if g.holds > 0 {
				g.meanHold = g.holdSum / time.Duration(g.holds)
			}
			g.peak, g.offered, g.holdSum, g.holds, g.demandAt = g.inFlightLocked(), 0, 0, 0, now
		}}
	return g, nil
}

// Name returns the gate's name.
func (g *Concurrency) Name() string { return g.name }

// Continue makes g the successor of old, the gate of the same budget and
// client that g replaces (a policy reload): old's requests still in flight
// count as g's until they end, and when old's Run ends, old hands its lease
// over to g (g spends it until its own first refresh) instead of giving it
// back, and spends it no more. Call it before either Run ends.
func (g *Concurrency) Continue(old *Concurrency) {
	if old == nil || old == g {
		return
	}
	g.mu.Lock()
	g.pred = old
	g.mu.Unlock()
	old.mu.Lock()
	old.successor = &g.holder
	old.mu.Unlock()
}

// inFlightLocked is what the gate has in flight: its own slots and those
// its predecessors still hold (a predecessor whose lease ended with none
// left is dropped). Locks go from a gate to its predecessor, never back.
// REQUIRES: g.mu held.
func (g *Concurrency) inFlightLocked() int64 {
	n := g.inflight
	if p := g.pred; p != nil {
		p.mu.Lock()
		m, over := p.inFlightLocked(), p.over
		p.mu.Unlock()
		if m == 0 && over {
			g.pred = nil
		}
		n += m
	}
	return n
}

// wantsLocked is the concurrency the gate asks for. REQUIRES: g.mu held.
func (g *Concurrency) wantsLocked(now clock.Instant, first bool) int64 {
	secs := now.Sub(g.demandAt).Seconds()
	if first || secs <= 0 {
		return g.opts.Allocator.Capacity
	}
	need := float64(g.peak)
	hold := g.meanHold
	if g.holds > 0 {
		hold = g.holdSum / time.Duration(g.holds)
	}
	if hold > 0 {
		need = math.Max(need, float64(g.offered)/secs*hold.Seconds())
	}
	return int64(math.Min(need*(1+g.opts.Headroom), float64(g.opts.Allocator.Capacity))) + 1
}

func (g *Concurrency) slots(r *sluice.Request) int64 {
	if g.opts.Weighted {
		return max(r.Cost, 1)
	}
	return 1
}

// Decide takes r's slots when the grant has room for them.
func (g *Concurrency) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *Concurrency) decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	n := g.slots(r)
	g.inline(ctx, now)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.offered += n
	g.decidedLocked(now)
	in := g.inFlightLocked()
	g.peak = max(g.peak, in+n)
	if lim := g.limitLocked(now); lim >= 0 && in+n > lim {
		g.shortLocked()
		return sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService, Gate: g.name,
			Retryable: true, RetryAfter: g.opts.RetryHint}, 0
	}
	g.inflight += n
	return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, 1
}

// Release frees the request's slots on every outcome; a completed request
// teaches the gate its hold time.
func (g *Concurrency) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if p != 1 {
		return
	}
	n := g.slots(r)
	g.mu.Lock()
	g.inflight -= n
	if done.Outcome == sluice.OutcomeRejected { // a later gate turned it away: it held nothing
		g.offered -= n
	} else if done.Latency > 0 {
		g.holdSum += done.Latency
		g.holds++
	}
	g.mu.Unlock()
}

// ConcurrencyLimit returns the slots the gate spends now and those in
// flight (a lease without a bound reports the capacity).
func (g *Concurrency) ConcurrencyLimit() (limit, inFlight int) {
	now := g.opts.Clock.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	lim := g.limitLocked(now)
	if lim < 0 {
		lim = g.opts.Allocator.Capacity
	}
	return int(min(lim, math.MaxInt32)), int(g.inFlightLocked())
}

// Lease returns the budget, the grant and the fleet's bounds: no slot in
// flight above the budget, all of it idle for a refresh interval at worst.
func (g *Concurrency) Lease(now clock.Instant) sluice.LeaseStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.statusLocked(now)
	st.Unused = float64(g.opts.Allocator.Capacity)
	return st
}

// ReportState returns the grant, how long it has left and the slots in
// flight.
func (g *Concurrency) ReportState(now clock.Instant) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stateLocked(now)
	st.InFlight = g.inFlightLocked()
	return st
}
