package lease

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Leaser runs a budget's allocator step: the Redis store's Lease (one
// atomic script per refresh, shared by the fleet), or a Local allocator.
type Leaser interface {
	Lease(ctx context.Context, budget string, a Allocator, r Request) (Grant, error)
}

// Local is an in-process Leaser: one State per budget under a mutex, on
// its Clock (default clock.System). It serves one process's gates, the
// simulator and tests.
type Local struct {
	Clock  clock.Clock
	mu     sync.Mutex
	states map[string]*State
}

// Lease runs a's step on budget's state at the Local's now.
func (l *Local) Lease(_ context.Context, budget string, a Allocator, r Request) (Grant, error) {
	if err := a.Validate(); err != nil {
		return Grant{}, err
	}
	c := l.Clock
	if c == nil {
		c = clock.System
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states == nil {
		l.states = map[string]*State{}
	}
	st := l.states[budget]
	if st == nil {
		st = &State{}
		l.states[budget] = st
	}
	return a.Step(st, r, c.Now()), nil
}

// Failure is what a rate lease gate does once its lease has lapsed and
// cannot be refreshed (or before the first grant): Doorman's failure modes.
type Failure uint8

const (
	// FailSafe spends a safe share: SafeShare units/s, by default the
	// allocator's Grant.Safe at the last refresh (the capacity divided by
	// the clients it saw; while it learns, a share of what no holding
	// takes), and nothing before the first answer, when the gate knows
	// nothing of the fleet (Doorman's "safe capacity").
	FailSafe Failure = iota
	// FailOpen admits everything (Doorman's optimistic mode).
	FailOpen
	// FailClosed admits nothing (Doorman's pessimistic mode).
	FailClosed
)

// GateOptions configures a rate lease Gate.
type GateOptions struct {
	// Budget names the global budget; every process of the fleet that
	// shares it uses the same name and Allocator. Required.
	Budget string
	// Client identifies this process among them. Required.
	Client string
	// Allocator is the budget: Capacity in units/s, the lease time and the
	// refresh interval. Required.
	Allocator Allocator
	// Leaser runs the allocator: the Redis store, or a Local one. Required.
	Leaser Leaser
	// Burst is the depth of the local bucket, as time at the granted rate.
	// Default 100 ms.
	Burst time.Duration
	// Headroom is how much more than its recent demand the gate asks for,
	// as a share (so that growing demand is seen). Default 0.1.
	Headroom float64
	// OnFailure is what the gate does without a live lease: before its
	// first grant, once the lease lapsed unrefreshed, and while the
	// allocator learns and grants it nothing. Default FailSafe.
	OnFailure Failure
	// SafeShare is FailSafe's rate, units/s; 0: the allocator's safe share.
	SafeShare int64
	// Clock is the gate's clock. Default clock.System.
	Clock clock.Clock
}

// Gate spends a lease of a global rate budget in-process: a local token
// bucket filled at the granted rate, refreshed from the allocator every
// refresh interval with the demand the gate saw since the last one. The
// decision never waits on the allocator: the lease is asked for in the
// background (Run), and a lapsed lease falls back to OnFailure.
//
// Bounds, with n processes, capacity C units/s, lease time L and refresh
// interval R: the grants never sum above C (the allocator's invariant),
// so the fleet admits at most C·T + Σ bursts = C·(T + Burst) in any window
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
	name string
	opts GateOptions

	mu       sync.Mutex
	rate     int64 // granted units/s
	expiry   clock.Instant
	granted  bool  // a grant was ever received
	learning bool  // the last grant was from a learning allocator
	safe     int64 // the allocator's safe share at the last grant
	tokens   int64
	last     clock.Instant
	demand   int64 // units offered since the last refresh
	demandAt clock.Instant
	// short is signalled when the gate turns requests away for want of
	// lease: Run refreshes early (at most every Refresh/8) instead of
	// waiting for its interval, so a demand that outgrew the grant is seen.
	short chan struct{}
}

var _ sluice.StateReporter = (*Gate)(nil)

const nano = int64(time.Second) // nano-units per unit

// MaxGateRate is the largest capacity a rate Gate spends, units/s: with a
// burst of at most 1 s its bucket, in nano-units, fits an int64 twice.
const MaxGateRate = 1 << 30

// NewGate returns a rate lease gate named name. It does not ask for a
// lease: Refresh does (Run does it in the background).
func NewGate(name string, opts GateOptions) (*Gate, error) {
	switch {
	case name == "":
		return nil, errors.New("lease: empty gate name")
	case opts.Budget == "" || opts.Client == "":
		return nil, errors.New("lease: a budget and a client name are required")
	case opts.Leaser == nil:
		return nil, errors.New("lease: no leaser")
	case opts.Headroom < 0 || opts.SafeShare < 0:
		return nil, errors.New("lease: negative headroom or safe share")
	}
	if err := opts.Allocator.Validate(); err != nil {
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
	if opts.Headroom == 0 {
		opts.Headroom = 0.1
	}
	if opts.Clock == nil {
		opts.Clock = clock.System
	}
	return &Gate{name: name, opts: opts, demandAt: opts.Clock.Now(), short: make(chan struct{}, 1)}, nil
}

// Name returns the gate's name.
func (g *Gate) Name() string { return g.name }

// liveLocked reports a grant to spend at now: unexpired, and not a
// learning allocator's nothing. REQUIRES: g.mu held.
func (g *Gate) liveLocked(now clock.Instant) bool {
	return g.granted && now < g.expiry && !(g.learning && g.rate == 0)
}

// rateLocked is the rate the gate spends at now: the grant while it is
// live, else the failure mode's (-1: unlimited). REQUIRES: g.mu held.
func (g *Gate) rateLocked(now clock.Instant) int64 {
	if g.liveLocked(now) {
		return g.rate
	}
	switch g.opts.OnFailure {
	case FailOpen:
		return -1
	case FailClosed:
		return 0
	}
	if g.opts.SafeShare > 0 {
		return g.opts.SafeShare
	}
	return max(g.safe, 0)
}

// fillLocked fills the bucket at rate up to now. REQUIRES: g.mu held.
func (g *Gate) fillLocked(now clock.Instant, rate int64) {
	elapsed := int64(now - g.last)
	if g.last == 0 || elapsed < 0 {
		elapsed = 0
	}
	g.last = max(g.last, now)
	size := max(rate*int64(g.opts.Burst), nano)
	if rate > 0 {
		elapsed = min(elapsed, size/rate+1)
		g.tokens = min(g.tokens+elapsed*rate, size)
	}
	g.tokens = min(g.tokens, size)
}

// Decide takes r's cost from the local bucket.
func (g *Gate) Decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	units := max(r.Cost, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.demand += units
	rate := g.rateLocked(now)
	if rate < 0 {
		return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, 0
	}
	g.fillLocked(now, rate)
	if size := max(rate*int64(g.opts.Burst), nano); units > size/nano {
		// never in this bucket; a larger grant may hold it
		return sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeService, Gate: g.name, Retryable: true,
			RetryAfter: g.opts.Allocator.refresh()}, 0
	}
	if units*nano > g.tokens {
		select {
		case g.short <- struct{}{}:
		default:
		}
		d := sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeService, Gate: g.name, Retryable: rate > 0}
		if rate > 0 {
			d.RetryAfter = time.Duration((units*nano - g.tokens + rate - 1) / rate)
		} else {
			d.RetryAfter = g.opts.Allocator.refresh()
		}
		return d, 0
	}
	g.tokens -= units * nano
	return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, 1
}

// Release gives the units back when a later gate rejected the request.
func (g *Gate) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if p != 1 || done.Outcome != sluice.OutcomeRejected {
		return
	}
	g.mu.Lock()
	g.tokens += max(r.Cost, 1) * nano
	g.demand -= max(r.Cost, 1)
	g.mu.Unlock()
}

// Refresh asks the allocator for a lease sized to the demand the gate saw
// since the last refresh (plus Headroom), and returns when to ask again.
// On an error the current lease runs on until its expiry.
func (g *Gate) Refresh(ctx context.Context) (time.Duration, error) {
	now := g.opts.Clock.Now()
	g.mu.Lock()
	secs := now.Sub(g.demandAt).Seconds()
	wants := g.opts.Allocator.Capacity // no interval to measure yet: ask for all, the fair share decides
	if secs > 0 && g.granted {
		wants = int64(float64(g.demand)/secs*(1+g.opts.Headroom)) + 1
	}
	has := int64(0)
	if g.liveLocked(now) {
		has = g.rate
	}
	g.mu.Unlock()
	grant, err := g.opts.Leaser.Lease(ctx, g.opts.Budget, g.opts.Allocator, Request{Client: g.opts.Client, Wants: wants, Has: has})
	if err != nil {
		return g.opts.Allocator.refresh() / 4, err
	}
	g.mu.Lock()
	g.fillLocked(now, g.rateLocked(now)) // the old rate up to now
	g.rate, g.expiry, g.granted, g.learning, g.safe = grant.Has, grant.Expiry, true, grant.Learning, grant.Safe
	g.demand, g.demandAt = 0, now
	g.mu.Unlock()
	return grant.Refresh, nil
}

// Run refreshes the lease until ctx ends, then gives it back (a graceful
// shutdown frees the share at once). It refreshes every interval the
// allocator names, and early (but not within an eighth of the interval of
// the last refresh) when requests are turned away for want of lease.
func (g *Gate) Run(ctx context.Context) {
	early := g.opts.Allocator.refresh() / 8
	for {
		wait, _ := g.Refresh(ctx)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			g.opts.Leaser.Lease(rctx, g.opts.Budget, g.opts.Allocator, Request{Client: g.opts.Client, Release: true})
			cancel()
			return
		case <-timer.C:
		case <-g.short:
			timer.Stop()
			select {
			case <-ctx.Done():
			case <-time.After(early):
			}
		}
	}
}

var _ sluice.Leaseholder = (*Gate)(nil)

// Lease returns the budget's capacity, the grant and whether it is live.
func (g *Gate) Lease(now clock.Instant) (capacity, granted int64, live bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.opts.Allocator.Capacity, g.rate, g.liveLocked(now)
}

// GateState is what the admin API shows of a lease gate.
type GateState struct {
	Rate      int64   `json:"granted_units_per_s"`
	ExpiresIn float64 `json:"expires_in_s"`
	Live      bool    `json:"live"`
	Learning  bool    `json:"allocator_learning"`
	Spending  int64   `json:"spending_units_per_s"` // the grant, or the failure mode's rate (-1: unlimited)
}

// ReportState returns the grant and how long it has left.
func (g *Gate) ReportState(now clock.Instant) any {
	g.mu.Lock()
	defer g.mu.Unlock()
	return GateState{Rate: g.rate, ExpiresIn: max(g.expiry.Sub(now), 0).Seconds(), Live: g.liveLocked(now),
		Learning: g.learning, Spending: g.rateLocked(now)}
}
