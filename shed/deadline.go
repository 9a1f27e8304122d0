package shed

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
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
func (g *Deadline) Decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
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
		if len(g.retest) >= maxServiceClasses {
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

// DeadlineState is what a deadline gate reports (GET /v1/gates): each
// class's estimate at the gate's percentile, and its retest.
type DeadlineState struct {
	Percentile float64         `json:"percentile"`
	MinSamples int             `json:"min_samples"`
	Classes    []DeadlineClass `json:"classes,omitempty"`
}

// DeadlineClass is one class in DeadlineState.
type DeadlineClass struct {
	ClassEstimate
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
	st := DeadlineState{Percentile: g.opts.Percentile, MinSamples: g.opts.MinSamples}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, e := range g.times.Estimates(g.opts.Percentile, now) {
		c := DeadlineClass{ClassEstimate: e}
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
				case st.again:
					st.gap = 0
				case st.gap == 0:
					st.gap = min(2*c.Latency, g.opts.Retest)
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

// ServiceTimes keeps, per class, a histogram of recent service times on
// logarithmic buckets (8 per doubling, 9% wide, from 10 µs to about 3
// hours) whose counts halve whenever they pass 256, so estimates follow the
// last few hundred completions. With a half-life (NewDecayingServiceTimes)
// and the At methods, counts also halve with every half-life of time, so
// that estimates follow the last few seconds where completions are few: a
// class turned away on the strength of latencies from a passing overload
// (a limit's overshoot, which a deadline of twice the service time calls
// late) is estimated again from the few requests still let through within
// seconds, not after hundreds of them (and Scale weighs the past down at
// once). It is safe for concurrent use.
type ServiceTimes struct {
	mu       sync.Mutex
	classes  map[string]*histogram
	halfLife time.Duration // 0: counts halve by number alone
}

// NewServiceTimes returns empty estimates whose counts halve by number
// alone.
func NewServiceTimes() *ServiceTimes { return &ServiceTimes{classes: map[string]*histogram{}} }

// NewDecayingServiceTimes returns empty estimates whose counts also halve
// with every halfLife of time (ObserveAt, PercentileAt).
func NewDecayingServiceTimes(halfLife time.Duration) *ServiceTimes {
	return &ServiceTimes{classes: map[string]*histogram{}, halfLife: halfLife}
}

// Observe records one service time of class.
func (s *ServiceTimes) Observe(class string, d time.Duration) { s.ObserveAt(class, d, 0) }

// ObserveAt records one service time of class completed at now (0: no
// decay by time).
func (s *ServiceTimes) ObserveAt(class string, d time.Duration, now clock.Instant) {
	s.mu.Lock()
	h := s.classes[class]
	if h == nil {
		if len(s.classes) >= maxServiceClasses {
			s.mu.Unlock()
			return
		}
		h = &histogram{}
		s.classes[class] = h
	}
	h.decay(now, s.halfLife)
	h.add(d)
	s.mu.Unlock()
}

// Scale multiplies class's counts by f in (0, 1]: what it learned weighs
// that much against what comes next.
func (s *ServiceTimes) Scale(class string, f float64) {
	if !(f > 0 && f <= 1) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.classes[class]; h != nil {
		for i := range h.counts {
			h.counts[i] *= f
		}
		h.total *= f
	}
}

// maxServiceClasses bounds the classes kept: classes are few and server-defined.
const maxServiceClasses = 256

// Percentile returns the p-th percentile of class's recent service times
// (the upper edge of its bucket, so it errs long) and how many samples
// stand behind it.
func (s *ServiceTimes) Percentile(class string, p float64) (time.Duration, int) {
	return s.PercentileAt(class, p, 0)
}

// PercentileAt is Percentile at now (0: no decay by time). When the counts
// left after decay weigh less than 3 samples, it reports no samples: the
// class is not known now, whatever it once was.
func (s *ServiceTimes) PercentileAt(class string, p float64, now clock.Instant) (time.Duration, int) {
	d, known, samples := s.EstimateAt(class, p, now)
	if !known {
		return 0, 0
	}
	return d, samples
}

// EstimateAt is PercentileAt that tells a class not known now (known
// false, d 0: its decayed counts weigh less than 3 samples) from one never
// seen: samples counts every sample the class ever had either way. A
// reader sharing these estimates can tell "forgotten on purpose" (a
// retest proved them stale) from "never learned".
func (s *ServiceTimes) EstimateAt(class string, p float64, now clock.Instant) (d time.Duration, known bool, samples int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.classes[class]
	if h == nil {
		return 0, false, 0
	}
	h.decay(now, s.halfLife)
	if s.halfLife > 0 && h.total < 3 {
		return 0, false, h.samples
	}
	return h.percentile(p), true, h.samples
}

// ClassEstimate is one class's service-time estimate as a gate reads it
// (the state a gate reports, GET /v1/gates).
type ClassEstimate struct {
	Class string `json:"class"`
	// Ms is the estimate, ms: the gate's percentile of the recent service
	// times; 0 when the class is not known now.
	Ms float64 `json:"ms"`
	// Weight is how many samples the estimate stands on after decay (it
	// halves with every half-life and every 256 completions).
	Weight float64 `json:"weight"`
	// Samples is every sample the class ever had.
	Samples int `json:"samples"`
}

// Estimates returns every class's p-th percentile at now (0: no decay by
// time), sorted by class.
func (s *ServiceTimes) Estimates(p float64, now clock.Instant) []ClassEstimate {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ClassEstimate, 0, len(s.classes))
	for class, h := range s.classes {
		h.decay(now, s.halfLife)
		e := ClassEstimate{Class: class, Weight: math.Round(h.total*10) / 10, Samples: h.samples}
		if s.halfLife == 0 || h.total >= 3 {
			e.Ms = float64(h.percentile(p)) / 1e6
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b ClassEstimate) int { return strings.Compare(a.Class, b.Class) })
	return out
}

const (
	bucketsPerDoubling = 8
	histBuckets        = 8 * 30 // 10 µs · 2^30 ≈ 3 h
	histBase           = 10 * time.Microsecond
	histHalveAt        = 256
)

// histogram is decaying counts on logarithmic buckets.
type histogram struct {
	counts  [histBuckets]float64
	total   float64
	samples int           // every sample ever, for MinSamples
	at      clock.Instant // when the counts were last decayed by time
}

// decay scales the counts down by 2^(−elapsed/halfLife) since the last
// decay (in steps of at least an eighth of halfLife).
func (h *histogram) decay(now clock.Instant, halfLife time.Duration) {
	if halfLife <= 0 || now == 0 {
		return
	}
	if h.at == 0 || now < h.at {
		h.at = now
		return
	}
	dt := now.Sub(h.at)
	if dt < halfLife/8 {
		return
	}
	f := math.Exp2(-float64(dt) / float64(halfLife))
	for i := range h.counts {
		h.counts[i] *= f
	}
	h.total *= f
	h.at = now
}

func bucketOf(d time.Duration) int {
	if d <= histBase {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(d)/float64(histBase)) * bucketsPerDoubling))
	return min(max(i, 0), histBuckets-1)
}

// upper returns bucket i's upper edge.
func upper(i int) time.Duration {
	return time.Duration(math.Ceil(float64(histBase) * math.Exp2(float64(i)/bucketsPerDoubling)))
}

func (h *histogram) add(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.total++
	h.samples++
	if h.total > histHalveAt {
		for i := range h.counts {
			h.counts[i] /= 2
		}
		h.total /= 2
	}
}

func (h *histogram) percentile(p float64) time.Duration {
	want, sum := p*h.total, 0.0
	for i, c := range h.counts {
		sum += c
		if sum >= want && c > 0 {
			return upper(i)
		}
	}
	return upper(histBuckets - 1)
}
