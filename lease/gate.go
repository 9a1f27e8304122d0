package lease

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Gate spends a lease of a global rate budget in-process: a local token
// bucket filled at the granted rate, refreshed from the allocator every
// refresh interval with the demand the gate saw since the last one. The
// decision never waits on the allocator: the lease is asked for in the
// background (Run), and a lapsed lease falls back to OnFailure.
//
// Bounds, with n processes, capacity C units/s, lease time L and refresh
// interval R: the grants never sum above C (the allocator's invariant; each
// refresh reports the rate the gate spends until the answer applies, which
// the allocator keeps from the others until the gate's next step), so the
// fleet admits at most C·T + Σ bursts = C·(T + Burst) in any window
// T while every process spends a live grant; after the allocator lost its
// state, and while some processes spend safe shares, see the package doc
// (up to 2C, for bounded times). The unused allocation is at most what the
// processes whose demand fell hold until their next refresh: at most C
// for R. A process that stops frees its share within L (at once when it
// closes its gate); a new process gets its fair share once the others
// have refreshed, within R of its first request. Rejections are reason
// policy_rate at scope service, retryable when the bucket refills.
// It is safe for concurrent use.
type Gate struct {
	holder
	name     string
	tokens   int64 // nano-units
	last     clock.Instant
	demand   int64 // units offered since the last refresh
	demandAt clock.Instant
}

var (
	_ sluice.StateReporter = (*Gate)(nil)
	_ sluice.Leaseholder   = (*Gate)(nil)
)

const nano = int64(time.Second) // nano-units per unit

// MaxGateRate is the largest capacity a rate Gate spends, units/s: with a
// burst of at most 1 s its bucket, in nano-units, fits an int64 twice.
const MaxGateRate = 1 << 30

// NewGate returns a rate lease gate named name. It does not ask for a
// lease: Refresh does (Run does it in the background).
func NewGate(name string, opts GateOptions) (*Gate, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	if opts.Burst == 0 {
		opts.Burst = 100 * time.Millisecond
	}
	switch {
	case opts.Allocator.Capacity > MaxGateRate:
		return nil, errors.New("lease: a rate gate's capacity must be at most 2^30 units/s")
	case opts.Burst < time.Millisecond || opts.Burst > time.Second:
		return nil, errors.New("lease: burst must be in [1ms, 1s]")
	}
	g := &Gate{name: name, demandAt: opts.Clock.Now()}
	g.holder = holder{opts: opts, short: make(chan struct{}, 1), wants: g.wantsLocked, inUse: func() int64 { return 0 }, reserve: true,
		change: func(now clock.Instant) {
			g.fillLocked(now, g.limitLocked(now)) // the old rate up to now
			g.demand, g.demandAt = 0, now
		}}
	return g, nil
}

// Name returns the gate's name.
func (g *Gate) Name() string { return g.name }

// Continue makes g the successor of old, the gate of the same budget and
// client that g replaces (a policy reload): when old's Run ends, old hands
// its lease over to g (g spends it until its own first refresh) instead of
// giving it back, and spends it no more. Call it before either Run ends.
func (g *Gate) Continue(old *Gate) {
	if old == nil || old == g {
		return
	}
	old.mu.Lock()
	old.successor = &g.holder
	old.mu.Unlock()
}

// wantsLocked is the rate the gate asks for: its offered rate since the
// last refresh plus the headroom; before any grant, the whole capacity
// (the fair share decides). REQUIRES: g.mu held.
func (g *Gate) wantsLocked(now clock.Instant, first bool) int64 {
	secs := now.Sub(g.demandAt).Seconds()
	if first || secs <= 0 {
		return g.opts.Allocator.Capacity
	}
	return int64(float64(g.demand)/secs*(1+g.opts.Headroom)) + 1
}

// fillLocked fills the bucket at rate up to now. REQUIRES: g.mu held.
func (g *Gate) fillLocked(now clock.Instant, rate int64) {
	elapsed := int64(now - g.last)
	if g.last == 0 || elapsed < 0 {
		elapsed = 0
	}
	g.last = max(g.last, now)
	size := max(rate*int64(g.opts.Burst), nano)
	if rate <= 0 { // nothing to spend: not even what the bucket held at a rate before
		g.tokens = 0
		return
	}
	elapsed = min(elapsed, size/rate+1)
	g.tokens = min(g.tokens+elapsed*rate, size)
}

// Decide takes r's cost from the local bucket.
func (g *Gate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *Gate) decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	units := max(r.Cost, 1)
	g.inline(ctx, now)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.demand += units
	g.decidedLocked(now)
	rate := g.limitLocked(now)
	if rate < 0 {
		return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, 0
	}
	g.fillLocked(now, rate)
	if size := max(rate*int64(g.opts.Burst), nano); units > size/nano {
		// never in this bucket; a larger grant may hold it
		return sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeService, Gate: g.name, Retryable: true,
			RetryAfter: g.opts.Allocator.RefreshEvery()}, 0
	}
	if units*nano > g.tokens {
		g.shortLocked()
		d := sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeService, Gate: g.name, Retryable: rate > 0}
		if rate > 0 {
			d.RetryAfter = time.Duration((units*nano - g.tokens + rate - 1) / rate)
		} else {
			d.RetryAfter = g.opts.Allocator.RefreshEvery()
		}
		return d, 0
	}
	g.tokens -= units * nano
	return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, 1
}

// Release gives the units back when a later gate rejected the request,
// and trues the charge up to the work's actual cost (done.Cost) when it
// has one: the difference comes out of the local bucket (never below
// empty) or goes back into it, and counts in the demand the next lease
// asks for.
func (g *Gate) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if p != 1 {
		return
	}
	est := max(r.Cost, 1)
	var diff int64
	switch {
	case done.Outcome == sluice.OutcomeRejected:
		diff = -est
	case done.Cost > 0:
		diff = done.Cost - est
	}
	if diff == 0 {
		return
	}
	g.mu.Lock()
	g.demand += diff
	if diff > 0 {
		g.tokens = max(g.tokens-min(diff, g.tokens/nano+1)*nano, 0)
	} else {
		g.tokens += -diff * nano // fillLocked caps it at the bucket's size
	}
	g.mu.Unlock()
}

// Lease returns the budget, the grant and the fleet's bounds: the local
// bursts above the rate, a refresh interval of it unused.
func (g *Gate) Lease(now clock.Instant) sluice.LeaseStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.statusLocked(now)
	c := float64(g.opts.Allocator.Capacity)
	st.Overshoot, st.Unused = c*g.opts.Burst.Seconds(), c*g.opts.Allocator.RefreshEvery().Seconds()
	return st
}

// ReportState returns the grant and how long it has left.
func (g *Gate) ReportState(now clock.Instant) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stateLocked(now)
}
