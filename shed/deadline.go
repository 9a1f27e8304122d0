package shed

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/internal/servicetime"
)

// Fits is the deadline test: a request whose predicted queueing delay q,
// service time s, time still needed after the work r (the response's way
// back) and margin for uncertainty u add up to less than its remaining
// budget d can finish in time. 45 + 35 + 10 + 15 = 105 ms does not fit
// 80 ms and fits 120 ms; with a 10 ms queue, 70 ms fits 80 ms.
func Fits(q, s, r, u, d time.Duration) bool { return q+s+r+u < d }

// DeadlineOptions configures a Deadline gate. The zero value is valid.
type DeadlineOptions struct {
	// Percentile of recent service times a request is predicted to take,
	// in (0, 1). Default 0.9.
	Percentile float64
	// Reserve is the time a response still needs after the work (the way
	// back to the caller), R in the test. Default 0.
	Reserve time.Duration
	// Margin is the safety margin U. Default 0.
	Margin time.Duration
	// MinSamples is how many completions of a class its estimate needs
	// before the gate trusts it; until then the class is admitted.
	// Default 20.
	MinSamples int
	// Queue predicts the queueing delay a request of class would meet
	// before it starts (Q), from the live state of a wait queue. Nil: 0.
	Queue func(class string) time.Duration
	// Retest is how often, at least, a class that fails the test still
	// lets one request through, whose latency keeps its estimate current:
	// an estimate learned while the service was slow would otherwise turn
	// the class away for good once it is fast again, since nothing it
	// rejects can teach it otherwise. Each retest costs the service a
	// request the test expected to come late. A retest that comes back in
	// time lets the next one through at once (one at a time), so a stale
	// estimate gives way within a few service times rather than seconds; a
	// retest that comes back late is followed by the next after twice its
	// latency, twice as long after each late one, up to Retest (a queue a
	// limit's overshoot left at the service drains within a few service
	// times, and the first retest after it met that queue). Default 1 s;
	// negative: never.
	Retest time.Duration
	// HalfLife is how fast the estimates forget by time: their counts halve
	// with every HalfLife, and with every 256 completions. Default 1 s.
	HalfLife time.Duration
}

// Deadline rejects, before any scarce work, a request that cannot finish
// before its deadline: the predicted queueing delay plus a percentile of
// its class's recent service times plus Reserve and Margin must be less
// than the budget it has left (Fits). Service times are learned from the
// latencies of the class's useful and late completions (failed and
// cancelled ones say nothing about how long the work takes). Requests
// without a deadline, and classes not yet known well enough, pass, and so
// does one request of a failing class per Retest (back to back while they
// come back in time) when its service time alone does not fit, so that
// its estimate follows a service that got faster.
// Rejections have reason deadline (503) and are not retryable as they are:
// the same budget would fail again. It is safe for concurrent use.
type Deadline struct {
	name  string
	opts  DeadlineOptions
	times *ServiceTimes
	queue atomic.Pointer[func(class string) time.Duration] // Q, if set

	mu     sync.Mutex
	retest map[string]retest // by class
}

// retest is a class's retest state: when one failing the test was last
// let through, whether it is still out, whether the last one came back in
// time (the next goes at once), and how long after a late one the next
// waits.
type retest struct {
	last, before clock.Instant // before: last's value before the one out
	out, again   bool
	gap          time.Duration // 0: Retest
}

var _ sluice.Gate = (*Deadline)(nil)

// NewDeadline returns a deadline gate named name.
func NewDeadline(name string, opts DeadlineOptions) (*Deadline, error) {
	if name == "" {
		return nil, param.Errorf("name", "deadline: empty name")
	}
	if opts.Percentile == 0 {
		opts.Percentile = 0.9
	}
	if opts.MinSamples == 0 {
		opts.MinSamples = 20
	}
	if opts.Retest == 0 {
		opts.Retest = time.Second
	}
	if opts.HalfLife == 0 {
		opts.HalfLife = time.Second
	}
	switch {
	case !(opts.Percentile > 0 && opts.Percentile < 1):
		return nil, param.Errorf("percentile", "deadline: percentile %v, want (0, 1)", opts.Percentile)
	case opts.Reserve < 0 || opts.Margin < 0:
		return nil, param.Errorf("reserve", "deadline: negative reserve or margin")
	case opts.MinSamples < 1:
		return nil, param.Errorf("min_samples", "deadline: min samples %d, want ≥ 1", opts.MinSamples)
	case opts.HalfLife < 0:
		return nil, param.Errorf("half_life", "deadline: negative half-life")
	}
	g := &Deadline{name: name, opts: opts, times: NewDecayingServiceTimes(opts.HalfLife), retest: map[string]retest{}}
	g.UseQueue(opts.Queue)
	return g, nil
}

// UseQueue makes the gate read Q from fn (a wait queue's QueueDelay) from
// now on; nil: Q is 0. A policy build binds it to the policy's wait queue,
// which comes later in the chain than the deadline gate.
func (g *Deadline) UseQueue(fn func(class string) time.Duration) {
	if fn == nil {
		g.queue.Store(nil)
		return
	}
	g.queue.Store(&fn)
}

// Name returns the gate's name.
func (g *Deadline) Name() string { return g.name }

// ServiceTimes returns the gate's service-time estimates.
func (g *Deadline) ServiceTimes() *ServiceTimes { return g.times }

// Decide applies the deadline test.
func (g *Deadline) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *Deadline) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	if r.Deadline == 0 {
		return sluice.Decision{Admitted: true}, 0
	}
	s, n := g.times.PercentileAt(r.Class, g.opts.Percentile, now)
	if n < g.opts.MinSamples {
		return sluice.Decision{Admitted: true}, 0
	}
	var q time.Duration
	if fn := g.queue.Load(); fn != nil {
		q = (*fn)(r.Class)
	}
	if Fits(q, s, g.opts.Reserve, g.opts.Margin, r.Deadline.Sub(now)) {
		return sluice.Decision{Admitted: true}, 0
	}
	// A retest only where the service time alone does not fit: the queue's
	// part is read live, never stale.
	if !Fits(0, s, g.opts.Reserve, g.opts.Margin, r.Deadline.Sub(now)) && g.retesting(r.Class, now) {
		r.MarkRetest()
		return sluice.Decision{Admitted: true}, retestPermit
	}
	return sluice.Decision{Reason: sluice.ReasonDeadline, Scope: sluice.ScopeService, Gate: g.name}, 0
}

// retesting reports whether a request of class that fails the test goes
// through to measure the class again: one per Retest, or at once after a
// retest that came back in time, one at a time. A retest a later gate
// turned away does not count.
func (g *Deadline) retesting(class string, now clock.Instant) bool {
	if g.opts.Retest < 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st, ok := g.retest[class]
	switch {
	case !ok: // the class's first refusal
		if len(g.retest) >= servicetime.MaxClasses {
			return false
		}
	case now.Sub(st.last) >= g.opts.Retest: // also a retest whose answer never came
	case st.again && !st.out:
	case st.gap > 0 && !st.out && now.Sub(st.last) >= st.gap:
	default:
		return false
	}
	g.retest[class] = retest{last: now, before: st.last, out: true, again: st.again, gap: st.gap}
	return true
}

// deadlineState is what a deadline gate reports (GET /v1/gates): each
// class's estimate at the gate's percentile, and its retest.
type deadlineState struct {
	Percentile float64         `json:"percentile"`
	MinSamples int             `json:"min_samples"`
	Classes    []deadlineClass `json:"classes,omitempty"`
}

// deadlineClass is one class in deadlineState.
type deadlineClass struct {
	servicetime.ClassEstimate
	// RetestOut: a retest of the class is in flight; RetestAgain: the last
	// one came back in time (the next may go at once).
	RetestOut   bool `json:"retest_out,omitempty"`
	RetestAgain bool `json:"retest_again,omitempty"`
	// LastRetestAgoMs is how long ago the last retest went, ms (absent:
	// never).
	LastRetestAgoMs float64 `json:"last_retest_ago_ms,omitempty"`
}

// ReportState returns every class's estimate and retest state.
func (g *Deadline) ReportState(now clock.Instant) any {
	st := deadlineState{Percentile: g.opts.Percentile, MinSamples: g.opts.MinSamples}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.times.Estimates(g.opts.Percentile, now) {
		c := deadlineClass{ClassEstimate: e}
		if r, ok := g.retest[e.Class]; ok {
			c.RetestOut, c.RetestAgain = r.out, r.again
			c.LastRetestAgoMs = float64(now.Sub(r.last)) / 1e6
		}
		st.Classes = append(st.Classes, c)
	}
	return st
}

// retestPermit marks a request let through against the test.
const retestPermit sluice.Permit = 1

// Release learns the service time of useful and late completions. A
// retest that came back in time proves the estimate that refused it
// stale: the class's counts are cut to a quarter, so that a few such
// retests outweigh what a passing overload taught, and the next retest
// may go at once.
func (g *Deadline) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	if p == retestPermit {
		g.mu.Lock()
		if st, ok := g.retest[r.Class]; ok && st.out {
			st.out = false
			if c.Outcome == sluice.OutcomeRejected {
				// A later gate turned it away: it measured nothing and
				// cost the service nothing, so it does not count.
				st.last = st.before
			} else {
				st.again = c.Outcome == sluice.OutcomeUseful
				switch {
				case c.Outcome != sluice.OutcomeLate:
					// In time (the next goes at once), or errored or
					// cancelled, which says nothing of how long the work
					// takes: the next waits the whole Retest.
					st.gap = 0
				case st.gap == 0:
					st.gap = min(max(2*c.Latency, time.Millisecond), g.opts.Retest)
				default:
					st.gap = min(2*st.gap, g.opts.Retest)
				}
			}
			g.retest[r.Class] = st
		}
		g.mu.Unlock()
	}
	if c.Outcome == sluice.OutcomeUseful || c.Outcome == sluice.OutcomeLate {
		if p == retestPermit && c.Outcome == sluice.OutcomeUseful {
			g.times.Scale(r.Class, 0.25)
		}
		g.times.ObserveAt(r.Class, c.Latency, c.Now)
	}
}

// ServiceTimes keeps, per class, a histogram of recent service times
// (servicetime.Times: logarithmic buckets 9% wide whose counts halve past
// 256, and with a half-life also by time). It is safe for concurrent use.
type ServiceTimes = servicetime.Times

// newServiceTimes returns empty estimates whose counts halve by number
// alone.
func newServiceTimes() *ServiceTimes { return servicetime.New() }

// NewDecayingServiceTimes returns empty estimates whose counts also halve
// with every halfLife of time (ObserveAt, PercentileAt).
func NewDecayingServiceTimes(halfLife time.Duration) *ServiceTimes {
	return servicetime.NewDecaying(halfLife)
}
