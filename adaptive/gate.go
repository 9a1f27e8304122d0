package adaptive

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// GateOptions configures a Gate. The zero value is valid.
type GateOptions struct {
	// Window gathers samples into the controller's windows.
	Window WindowConfig
	// RetryHint is the retry-after of a rejection. Default 1 s.
	RetryHint time.Duration
	// QueueDelay, if set, is read as each window closes and raises the
	// window's queueing delay (for the QueueDelay controller): for an
	// in-process service, SchedulingDelay().
	QueueDelay func() time.Duration
}

// Gate is a service-wide concurrency limit whose limit a Controller sets
// from the service's own latencies: a request holds one slot from
// admission until its Ticket is done, and is rejected with reason
// concurrency (503) while the limit's slots are all held. Completions feed
// the controller: useful ones with their latency, late ones as drops; a
// failed or cancelled request teaches it nothing (censored), nor does one
// faster than WindowConfig.MinRTT. Pin holds the limit at a value (the
// operator's kill switch for the controller; mode off on the chain is the
// switch for the gate). It is safe for concurrent use; the decision path
// is two atomic operations.
type Gate struct {
	name     string
	opts     GateOptions
	inflight atomic.Int64
	limit    atomic.Int64
	pinned   atomic.Bool

	mu      sync.Mutex // serializes the controller and the windower
	ctrl    Controller
	win     *windower
	started bool // a sample came
}

var (
	_ sluice.Gate          = (*Gate)(nil)
	_ sluice.Sizer         = (*Gate)(nil)
	_ sluice.StateReporter = (*Gate)(nil)
)

// NewGate returns an adaptive concurrency gate named name run by c.
func NewGate(name string, c Controller, opts GateOptions) (*Gate, error) {
	if name == "" {
		return nil, errors.New("adaptive: empty gate name")
	}
	if c == nil {
		return nil, errors.New("adaptive: nil controller")
	}
	if opts.RetryHint == 0 {
		opts.RetryHint = time.Second
	}
	if opts.RetryHint < 0 {
		return nil, configErr("gate %q: negative retry hint", name)
	}
	w, err := newWindower(opts.Window)
	if err != nil {
		return nil, err
	}
	g := &Gate{name: name, opts: opts, ctrl: c, win: w}
	g.limit.Store(int64(c.Limit()))
	return g, nil
}

// Name returns the gate's name.
func (g *Gate) Name() string { return g.name }

// Decide takes a slot if one is free under the current limit. The permit
// records the requests in flight at admission (this one included), which
// its completion reports to the controller.
func (g *Gate) Decide(_ context.Context, r *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	limit := g.limit.Load()
	n := g.inflight.Add(1)
	if n > limit {
		g.inflight.Add(-1)
		*d = sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService, Unit: sluice.UnitConcurrentRequests,
			Gate: g.name, Limit: limit, Retryable: true, RetryAfter: g.opts.RetryHint}
		return 0
	}
	d.Admitted = true
	return sluice.Permit(n)
}

// Release frees the slot and gives the completion to the controller.
func (g *Gate) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	g.inflight.Add(-1)
	if c.Outcome != sluice.OutcomeUseful && c.Outcome != sluice.OutcomeLate {
		return // censored: failed, cancelled or rejected work says nothing of the service's latency
	}
	key := r.Operation
	if key == "" {
		key = r.Class
	}
	s := sample{RTT: c.Latency, InFlight: int(p), Dropped: c.Outcome == sluice.OutcomeLate, Key: key}
	g.mu.Lock()
	defer g.mu.Unlock()
	first := !g.started
	g.started = true
	w, ok := g.win.Add(c.Now, s)
	if first {
		g.shorten(c.Now, s.RTT)
	}
	if !ok {
		return
	}
	if g.opts.QueueDelay != nil {
		w.QueueDelay = max(w.QueueDelay, g.opts.QueueDelay())
	}
	limit := g.ctrl.Update(w)
	g.shorten(c.Now, s.RTT)
	if !g.pinned.Load() {
		g.limit.Store(int64(limit))
	}
}

// shorten ends the window that began at now sooner when the controller
// asks for it (shortWindows). REQUIRES: g.mu held.
func (g *Gate) shorten(now clock.Instant, rtt time.Duration) {
	if sw, ok := g.ctrl.(shortWindows); ok {
		if d := sw.NextWindow(rtt); d > 0 {
			g.win.EndAt(now.Add(min(d, g.win.cfg.MaxTime)))
		}
	}
}

// Pin holds the limit at n (n ≥ 1) whatever the controller says, until
// Unpin; the controller keeps learning meanwhile.
func (g *Gate) Pin(n int) {
	// Under mu, as a window's close is: a close that read pinned false
	// before the pin must not store its limit over it.
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pinned.Store(true)
	g.limit.Store(int64(max(n, 1)))
}

// Unpin returns the limit to the controller.
func (g *Gate) Unpin() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.pinned.Store(false)
	g.limit.Store(int64(g.ctrl.Limit()))
}

// ConcurrencyLimit returns the limit and the requests in flight.
func (g *Gate) ConcurrencyLimit() (limit, inFlight int) {
	return int(g.limit.Load()), int(g.inflight.Load())
}

// gateState is what the admin API shows of a Gate.
type gateState struct {
	Limit    int  `json:"limit"`
	InFlight int  `json:"in_flight"`
	Pinned   bool `json:"pinned,omitempty"`
	// Controller is what the controller reports of itself, when it does
	// (BBR: its estimates).
	Controller any `json:"controller,omitempty"`
}

// ReportState returns the gate's limit and load, and the controller's
// estimates when it reports them.
func (g *Gate) ReportState(now clock.Instant) any {
	l, n := g.ConcurrencyLimit()
	st := gateState{Limit: l, InFlight: n, Pinned: g.pinned.Load()}
	if r, ok := g.ctrl.(interface{ State(clock.Instant) any }); ok {
		g.mu.Lock()
		st.Controller = r.State(now)
		g.mu.Unlock()
	}
	return st
}
