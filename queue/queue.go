// Package queue is the bounded wait queue in front of a concurrency gate: a
// request that finds no free slot waits for one instead of being turned
// away, but only as long as waiting can still end in a useful answer. A
// short queue absorbs the variance of arrivals below a service's deadline;
// a queue that stands is not a kinder rejection, so this one bounds every
// wait, drops from a standing queue (CoDel) and serves it newest first.
//
//	pool, _ := gate.NewInFlight("worker-pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
//	q, _ := queue.New("worker-pool", pool, queue.Options{MaxWait: 100 * time.Millisecond,
//		Classes: []string{"critical", "default", "sheddable"}})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, q)
//
// What it does:
//   - Waiting never holds a slot, and ends with the caller's context.
//   - Per-class queues, served in the order of Options.Classes: a premium
//     request never waits behind a backlog of free ones.
//   - A request waits at most MaxWait, and not at all when it is predicted
//     to start too late for its deadline (the requests ahead of it × the
//     mean service time of recent completions ÷ the slots, plus its own
//     service time). A deadline gate's retest (sluice.Request.MarkRetest)
//     is not refused on its own service time: it is there to measure it.
//   - CoDel (Nichols and Jacobson, RFC 8289: target 5 ms, interval 100 ms)
//     watches how long requests waited when they got their slot; once that
//     has stayed above the target for an interval, the queue drops waiting
//     requests on CoDel's schedule (interval/√count) and serves the newest
//     first (adaptive LIFO, as in Facebook's "Fail at Scale", Maurer 2015):
//     under a standing queue the requests most likely still wanted go first.
//
// Rejections: reason queue (503) for a full queue, a wait past MaxWait or a
// CoDel drop; reason deadline for a request predicted to start too late.
//
// Under an inner gate whose limit moves (sluice.Sizer: an adaptive limit),
// a release or an arrival lets as many waiters start as there are free
// slots. The Chain starts a request's latency clock after the wait
// (sluice.Waiter), so what the inner gate learns is the work's latency.
// An event loop that cannot block (the simulator) uses Options.Events and
// a Park instead of waiting in Decide.
package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/servicetime"
)

// maxMaxWait bounds Options.MaxWait.
const maxMaxWait = 24 * time.Hour

// Options configures a Queue. The zero value is valid.
type Options struct {
	// MaxWait is the longest a request waits for a slot, at most 24 h.
	// Default 100 ms.
	MaxWait time.Duration
	// MaxLen is the most requests waiting at once. Default 1,000.
	MaxLen int
	// Classes are the classes with a queue of their own, highest priority
	// first; requests of other classes share one queue served after them.
	Classes []string
	// Target and Interval are CoDel's: the queueing delay a queue may keep,
	// and how long it may keep more before drops begin. Defaults 5 ms and
	// 100 ms.
	Target, Interval time.Duration
	// ServiceTime predicts how long a request of class holds its slot
	// (0: unknown), for the start-in-time test: a request starts only
	// while its deadline leaves it that long. Default: the Percentile of
	// the class's recent useful and late completions through this queue
	// (the last few hundred, or the last few seconds where they are
	// fewer), once there are 20 of them.
	ServiceTime func(class string) time.Duration
	// Percentile is the default ServiceTime's percentile, in [0.5, 1].
	// Default 0.9: a request that starts at the last moment its median
	// allows answers late half the time (over real HTTP, with deadlines of
	// twice a 5 ms service, 1 to 5% of the answers), while a 99th
	// percentile learned from completions that include time queued at the
	// service above its workers (a limit's overshoot) turned away work a
	// one-worker service needed, and it idled a fifth of the time in the
	// simulator at twice its capacity.
	Percentile float64
	// Clock times waits and CoDel. Default clock.System. It must be the
	// chain's clock. A blocking Decide also sleeps out a wait on a timer of
	// real time: a virtual clock (a simulator) needs Events.
	Clock clock.Clock
	// Events makes Decide never block, for an event loop that cannot (a
	// simulator on a virtual clock): see Park.
	Events bool
	// Fair, if set, orders each class's waiters between tenants by
	// weighted fair queueing in work units (see Fairness); nil: first come,
	// first served.
	Fair *Fairness
}

// Queue is a sluice.Gate that waits for a slot of the concurrency gate it
// wraps. It is safe for concurrent use.
type Queue struct {
	name   string
	inner  sluice.Gate
	opts   Options
	slots  func() int         // the inner gate's slots now, for predictions (0: unknown)
	sizer  sluice.Sizer       // the inner gate's moving limit, if it has one
	times  *servicetime.Times // learned service times, unless Options.ServiceTime
	shared ServiceEstimates   // a deadline gate's, read first (ShareServiceTimes)

	mu       sync.Mutex
	queues   [][]*waiter // by class priority; the last is for other classes
	n        int
	codel    codel
	waits    int64         // requests that waited
	dropped  int64         // requests the queue turned away after waiting
	lastWait time.Duration // the last wait that ended in a slot
	mix      serviceMean   // of every class's useful completions
	fair     []fairClass   // per class queue, with Options.Fair
	standing standing      // tenants' first and last requests (Fairness.Standing)

	// event mode (Options.Events): every permit is an id of held
	held   map[uint64]*waiter
	nextID uint64
}

var (
	_ sluice.Gate          = (*Queue)(nil)
	_ sluice.Wrapper       = (*Queue)(nil)
	_ sluice.StateReporter = (*Queue)(nil)
	_ sluice.Queuer        = (*Queue)(nil)
	_ sluice.ClassQueuer   = (*Queue)(nil)
	_ sluice.Waiter        = (*Queue)(nil)
)

// waiter is a request waiting for a slot. The queue decides the inner
// gate for it, under its lock, when a slot may be free (grant): a waiter
// is never woken to find its slot taken.
type waiter struct {
	req     *sluice.Request
	ctx     context.Context // the caller's, for the inner gate (blocking mode)
	since   clock.Instant
	until   clock.Instant // its wait runs out (since + the wait budget)
	class   int           // index of its queue
	ready   chan struct{} // blocking mode: closed once decided or dropped
	waiting bool          // in a queue now
	drop    bool          // turned away by CoDel
	granted bool          // holds permit of the inner gate
	permit  sluice.Permit // the inner gate's
	d       sluice.Decision
	waited  time.Duration
	start   float64 // its start tag once picked (Options.Fair)
	flow    string  // the fair queue's flow: its tenant, or Newcomers (Options.Fair)

	// event mode
	own    sluice.Request // the request, copied: the caller's is gone after Decide
	tag    uint64
	notify func(tag uint64, d sluice.Decision)
}

// New returns a queue named name in front of inner, a concurrency gate
// whose rejections with reason concurrency mean "no slot free now".
func New(name string, inner sluice.Gate, opts Options) (*Queue, error) {
	if name == "" || inner == nil {
		return nil, errors.New("queue: a name and a gate to wrap are required")
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	q := &Queue{name: name, inner: inner, opts: opts, queues: make([][]*waiter, len(opts.Classes)+1)}
	if opts.Fair != nil {
		f := *opts.Fair
		if err := f.validate(); err != nil {
			return nil, err
		}
		q.opts.Fair = &f
		q.fair = make([]fairClass, len(q.queues))
		q.standing.seen = map[string]seenAt{}
		for i := range q.fair {
			q.fair[i] = newFairClass()
		}
	}
	if q.opts.ServiceTime == nil {
		q.times = servicetime.NewDecaying(time.Second)
		q.opts.ServiceTime = q.learnedServiceTime
	}
	q.codel = codel{target: opts.Target, interval: opts.Interval}
	if sz, ok := sluice.As[sluice.Sizer](inner); ok {
		q.sizer = sz
		q.slots = func() int { l, _ := sz.ConcurrencyLimit(); return l }
	} else if a, ok := sluice.As[sluice.Advertiser](inner); ok {
		q.slots = func() int { return int(a.Policy().Quota) }
	} else {
		q.slots = func() int { return 0 }
	}
	if opts.Events {
		q.held = make(map[uint64]*waiter)
	}
	return q, nil
}

// defaults fills the zero fields and checks the others.
func (o *Options) defaults() error {
	if o.MaxWait == 0 {
		o.MaxWait = 100 * time.Millisecond
	}
	if o.MaxLen == 0 {
		o.MaxLen = 1000
	}
	if o.Target == 0 {
		o.Target = 5 * time.Millisecond
	}
	if o.Interval == 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	if o.Percentile == 0 {
		o.Percentile = 0.9
	}
	if o.MaxWait < 0 || o.MaxLen < 0 || o.Target < 0 || o.Interval <= 0 {
		return errors.New("queue: negative wait, length or CoDel times")
	}
	if o.MaxWait > maxMaxWait {
		// A wait's end is its start plus MaxWait: past this it could
		// overflow, and every waiter read as expired at once.
		return fmt.Errorf("queue: MaxWait %v, at most %v", o.MaxWait, maxMaxWait)
	}
	if !(o.Percentile >= 0.5 && o.Percentile <= 1) {
		return errors.New("queue: percentile outside [0.5, 1]")
	}
	return nil
}

// learnedServiceTime is the default ServiceTime: the Percentile of class's
// recent service times, from the shared estimates (ShareServiceTimes) or
// the queue's own; 0 (no test) while neither knows the class.
func (q *Queue) learnedServiceTime(class string) time.Duration {
	now := q.opts.Clock.Now()
	if q.shared != nil {
		// Once the shared estimates have known the class, they alone
		// decide, also when they know too little now: a retest that came
		// back in time cuts them to let the class be measured afresh, and
		// the queue's own, which no retest cuts, held the overshoot's 106
		// ms against a 100 ms deadline and refused every request for 3 s
		// (4 workers × 50 ms at 2×, the capacity matrix).
		if s, _, n := q.shared.EstimateAt(class, q.opts.Percentile, now); n >= 20 {
			return s
		}
	}
	if s, n := q.times.PercentileAt(class, q.opts.Percentile, now); n >= 20 {
		return s
	}
	return 0
}

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// ServiceEstimates are service-time estimates per class that another gate
// keeps and the queue may read (ShareServiceTimes): a deadline gate's
// (shed.Deadline.ServiceTimes) are. EstimateAt returns the p-th percentile
// of class's recent service times at now, whether the class is known now,
// and how many samples it ever had; Estimates every class's, for the
// queue's state. They must be safe for concurrent use.
type ServiceEstimates interface {
	EstimateAt(class string, p float64, now clock.Instant) (d time.Duration, known bool, samples int)
	Estimates(p float64, now clock.Instant) []servicetime.ClassEstimate
}

// ShareServiceTimes makes the default ServiceTime read t, estimates
// another gate keeps (a deadline gate's: shed.Deadline.ServiceTimes), in
// place of the queue's own. Two estimates of one service part after a
// limit's overshoot: the deadline gate's retests bring its own back within
// a few service times, and the queue's, which nothing retests, then turned
// away for seconds every request the deadline gate admitted. The queue
// keeps learning its own and reads them for a class t has not yet seen 20
// samples of (a deadline gate switched off learns nothing); once t has,
// t alone decides, also while it knows too little now (a retest cut it,
// or the class went quiet) and the test is off. Call it before the
// queue is used; it does nothing when Options.ServiceTime was set.
func (q *Queue) ShareServiceTimes(t ServiceEstimates) {
	if st, ok := t.(*servicetime.Times); q.times == nil || t == nil || ok && st == nil {
		return // nil shares nothing (a nil *shed.ServiceTimes too)
	}
	q.shared = t
}

// Unwrap returns the gate the queue waits on.
func (q *Queue) Unwrap() sluice.Gate { return q.inner }

// MayWait reports whether Decide may block (not in event mode).
func (q *Queue) MayWait() bool { return !q.opts.Events }

func (q *Queue) classOf(class string) int {
	for i, c := range q.opts.Classes {
		if c == class {
			return i
		}
	}
	return len(q.opts.Classes)
}

// ahead counts the waiters served before a new request of class index c.
// REQUIRES: q.mu held.
func (q *Queue) ahead(c int) int {
	n := 0
	for i := 0; i <= c; i++ {
		n += q.classLen(i)
	}
	return n
}

// classLen is how many requests wait in class queue c. REQUIRES: q.mu
// held.
func (q *Queue) classLen(c int) int {
	if q.fair != nil {
		return q.fair[c].n
	}
	return len(q.queues[c])
}

// Decide admits through the inner gate, waiting for a slot when there is
// none and the request can still start in time.
func (q *Queue) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	if q.opts.Events {
		return q.decideEvent(ctx, r, now, d)
	}
	q.mu.Lock()
	c := q.classOf(r.Class)
	flow := q.flowOf(r, now)
	if q.ahead(c) == 0 { // nobody to wait behind: try at once
		if q.tooLate(r, now) {
			q.mu.Unlock()
			*d = q.reject(sluice.ReasonDeadline)
			return 0
		}
		p := q.inner.Decide(ctx, r, now, d)
		if !noSlot(d) {
			notes := q.grown(now)
			q.mu.Unlock()
			deliver(notes)
			return p
		}
		*d = sluice.Decision{} // the inner gate's "no slot": wait for one
	}
	w := &waiter{req: r, ctx: ctx, since: now, ready: make(chan struct{}), class: c, flow: flow}
	wait, why, notes := q.admit(w, now)
	if why != sluice.ReasonNone {
		q.mu.Unlock()
		deliver(notes)
		*d = q.reject(why)
		return 0
	}
	w.until = now.Add(wait)
	q.push(w)
	notes = append(notes, q.grown(now)...)
	q.mu.Unlock()
	deliver(notes)
	var p sluice.Permit
	*d, p = q.await(ctx, w, wait)
	return p
}

// flowOf is r's flow in a fair queue (its tenant, or Newcomers while it
// has no standing), recording its request; "" without fairness.
// REQUIRES: q.mu held.
func (q *Queue) flowOf(r *sluice.Request, now clock.Instant) string {
	if q.fair == nil {
		return ""
	}
	return q.opts.Fair.flowOf(&q.standing, r.Tenant, now)
}

// noSlot reports whether d is the inner gate's "no slot free now": a
// retryable concurrency rejection. A request the gate could never admit
// (its cost above the limit: not retryable) must not wait for one.
func noSlot(d *sluice.Decision) bool {
	return !d.Admitted && d.Reason == sluice.ReasonConcurrency && d.Retryable
}

// admit tags w (fair queueing) and returns how long it may wait, or why
// it may not; in a full fair queue it may make room by turning another
// waiter away (the returned notes). REQUIRES: q.mu held.
func (q *Queue) admit(w *waiter, now clock.Instant) (time.Duration, sluice.Reason, []note) {
	ahead, room := q.ahead(w.class), -1
	if q.fair != nil {
		ahead += q.aheadFair(w.class, w.flow) - q.fair[w.class].n
		if q.n >= q.opts.MaxLen {
			room = q.evictable(w.class, w.flow, w.req.Cost)
		}
	}
	wait, why := q.budget(w.req, ahead, room >= 0, now)
	if why != sluice.ReasonNone || room < 0 {
		return wait, why, nil
	}
	out := q.evict(room)
	q.dropped++
	out.drop, out.d = true, q.reject(sluice.ReasonQueue)
	return wait, why, []note{{out, out.d}}
}

// push queues w at the back of its class, or in tag order in a fair
// queue. REQUIRES: q.mu held.
func (q *Queue) push(w *waiter) {
	if q.fair != nil {
		q.fair[w.class].push(w, q.opts.Fair.weight(w.flow))
	} else {
		q.queues[w.class] = append(q.queues[w.class], w)
	}
	w.waiting = true
	q.n++
	q.waits++
}

// grown gives slots to waiters when the inner gate's limit moves and may
// have grown since the last release. REQUIRES: q.mu held.
func (q *Queue) grown(now clock.Instant) []note {
	if q.sizer == nil || q.n == 0 {
		return nil
	}
	return q.grant(now)
}

// grant gives waiters, in serving order, slots of the inner gate until it
// has none free: it decides the inner gate for each under the lock, so a
// freed slot goes to the waiter it is meant for, however many a release
// freed (a weighted limit) or a grown limit added. A waiter the gate
// rejects for another reason gets that rejection and the next one is
// tried. A waiter whose wait has run out by now (on Options.Clock) is
// turned away as its timer would have: a release that comes before the
// timer fires, or a clock that moved past it, must not start it late. The
// returned notes tell the waiters, once the lock is released.
// REQUIRES: q.mu held.
func (q *Queue) grant(now clock.Instant) []note {
	var notes []note
	var drops []*waiter
	for q.n > 0 {
		w, lifo, ok := q.pop(now, &drops)
		if !ok {
			break
		}
		if w.until != 0 && now >= w.until {
			q.dropped++
			drops = append(drops, w)
			continue
		}
		ctx := w.ctx
		if ctx == nil {
			ctx = context.Background()
		}
		w.d = sluice.Decision{}
		p := q.inner.Decide(ctx, w.req, now, &w.d) // w is on the heap already
		if noSlot(&w.d) {
			w.d = sluice.Decision{}
			q.unpop(w, lifo)
			break
		}
		d := w.d
		if d.Admitted {
			w.granted, w.permit, w.waited = true, p, now.Sub(w.since)
			q.lastWait = w.waited
			if q.fair != nil {
				q.fair[w.class].served(w, q.opts.Fair.weight(w.flow), q.opts.Fair.Burst)
			}
		}
		notes = append(notes, note{w, d})
	}
	for _, w := range drops {
		w.drop, w.d = true, q.reject(sluice.ReasonQueue)
		notes = append(notes, note{w, w.d})
	}
	return notes
}

// budget returns how long a new request with ahead waiters to be served
// before it may wait, or why it may not; room: a full queue will make
// room for it. REQUIRES: q.mu held.
func (q *Queue) budget(r *sluice.Request, ahead int, room bool, now clock.Instant) (time.Duration, sluice.Reason) {
	if (q.n >= q.opts.MaxLen && !room) || q.opts.MaxWait == 0 {
		return 0, sluice.ReasonQueue
	}
	wait := q.opts.MaxWait
	if r.Deadline == 0 {
		return wait, sluice.ReasonNone
	}
	var s time.Duration
	if q.opts.ServiceTime != nil && !r.Retest() {
		s = q.opts.ServiceTime(r.Class)
	}
	left := r.Deadline.Sub(now) - s // the latest it may start
	if predicted := q.predict(ahead, s); predicted > 0 && predicted >= left {
		return 0, sluice.ReasonDeadline
	}
	if left <= 0 {
		return 0, sluice.ReasonDeadline
	}
	return min(wait, left), sluice.ReasonNone
}

// tooLate is the start-in-time test of a request that would start now:
// its predicted service time must end before its deadline, with no queue
// ahead of it as with one. REQUIRES: q.mu held.
func (q *Queue) tooLate(r *sluice.Request, now clock.Instant) bool {
	if r.Deadline == 0 || q.opts.ServiceTime == nil || r.Retest() {
		return false
	}
	s := q.opts.ServiceTime(r.Class)
	return s > 0 && now.Add(s) >= r.Deadline
}

// await waits until w is decided, its wait runs out, or ctx ends.
func (q *Queue) await(ctx context.Context, w *waiter, wait time.Duration) (sluice.Decision, sluice.Permit) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-w.ready:
		return q.outcome(w)
	case <-timer.C:
		q.mu.Lock()
		if q.remove(w, w.class) {
			q.dropped++
			q.mu.Unlock()
			return q.reject(sluice.ReasonQueue), 0
		}
		q.mu.Unlock()
		<-w.ready // decided meanwhile: take it
		return q.outcome(w)
	case <-ctx.Done():
		q.mu.Lock()
		if q.remove(w, w.class) {
			q.mu.Unlock()
			return q.reject(sluice.ReasonQueue), 0
		}
		q.mu.Unlock()
		<-w.ready
		if w.granted { // a slot came as the caller left: pass it on
			now := q.opts.Clock.Now()
			q.inner.Release(w.req, w.permit, sluice.Completion{Outcome: sluice.OutcomeCancelled, Now: now})
			q.mu.Lock()
			notes := q.grant(now)
			q.mu.Unlock()
			deliver(notes)
		}
		return q.reject(sluice.ReasonQueue), 0
	}
}

// outcome is what a decided waiter returns.
func (q *Queue) outcome(w *waiter) (sluice.Decision, sluice.Permit) {
	if w.granted {
		return w.d, w.permit
	}
	return w.d, 0
}

// remove takes w out of queue c, reporting whether it was there (not yet
// woken). REQUIRES: q.mu held.
func (q *Queue) remove(w *waiter, c int) bool {
	if !w.waiting {
		return false
	}
	if q.fair != nil {
		if !q.fair[c].take(w) {
			return false
		}
		q.n--
		w.waiting = false
		return true
	}
	for i, x := range q.queues[c] {
		if x == w {
			q.queues[c] = append(q.queues[c][:i], q.queues[c][i+1:]...)
			q.n--
			w.waiting = false
			return true
		}
	}
	return false
}

// Release frees the inner gate's slot and gives it to the next waiter.
func (q *Queue) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	if q.opts.Events {
		q.releaseEvent(r, p, c)
		return
	}
	q.inner.Release(r, p, c)
	q.released(r, c)
}

// released learns from a completion and hands the freed slots on.
func (q *Queue) released(r *sluice.Request, c sluice.Completion) {
	// Late work took as long as it did: leaving it out would teach the
	// queue that work is quick exactly when every answer is late.
	learn := c.Outcome == sluice.OutcomeUseful || c.Outcome == sluice.OutcomeLate
	if q.times != nil && learn {
		q.times.ObserveAt(r.Class, c.Latency, c.Now)
	}
	q.mu.Lock()
	if learn {
		q.mix.add(c.Latency)
	}
	notes := q.grant(q.opts.Clock.Now())
	q.mu.Unlock()
	deliver(notes)
}

// pop takes the next waiter to serve: from the first class with waiters,
// its oldest, or its newest while CoDel sees a standing queue. CoDel
// judges the queue by its oldest waiter's age and, on its schedule, drops
// that oldest waiter first (the one least likely still wanted): dropped
// waiters are appended to drops. lifo reports that w came from the back.
// REQUIRES: q.mu held.
func (q *Queue) pop(now clock.Instant, drops *[]*waiter) (w *waiter, lifo, ok bool) {
	if q.fair != nil {
		return q.popFair(now, drops)
	}
	for q.n > 0 {
		c := 0
		for len(q.queues[c]) == 0 {
			c++
		}
		queue := q.queues[c]
		oldest := queue[0]
		q.n--
		if q.codel.drop(now, now.Sub(oldest.since), q.n) {
			q.queues[c] = queue[1:]
			oldest.waiting = false
			q.dropped++
			*drops = append(*drops, oldest)
			continue
		}
		w, lifo = oldest, q.codel.dropping // adaptive LIFO
		if lifo {
			w = queue[len(queue)-1]
			q.queues[c] = queue[:len(queue)-1]
		} else {
			q.queues[c] = queue[1:]
		}
		w.waiting = false
		return w, lifo, true
	}
	return nil, false, false
}

// popFair is pop over fair queues: the head of the tenant with the
// smallest start tag, judged by CoDel on its wait; CoDel's drops take the
// newest waiter of the tenant with the most work waiting. REQUIRES: q.mu
// held.
func (q *Queue) popFair(now clock.Instant, drops *[]*waiter) (*waiter, bool, bool) {
	for q.n > 0 {
		c := 0
		for q.fair[c].n == 0 {
			c++
		}
		f := &q.fair[c]
		t, start := f.pick(q.opts.Fair.Burst)
		head := t.ws[0]
		if q.codel.drop(now, now.Sub(head.since), q.n-1) {
			q.dropped++
			*drops = append(*drops, q.evict(c))
			continue
		}
		f.take(head)
		q.n--
		head.start, head.waiting = start, false
		return head, false, true
	}
	return nil, false, false
}

// unpop puts back a waiter pop took. REQUIRES: q.mu held.
func (q *Queue) unpop(w *waiter, lifo bool) {
	switch {
	case q.fair != nil:
		q.fair[w.class].pushFront(w, q.opts.Fair.weight(w.flow))
	case lifo:
		q.queues[w.class] = append(q.queues[w.class], w)
	default:
		q.queues[w.class] = append([]*waiter{w}, q.queues[w.class]...)
	}
	w.waiting = true
	q.n++
}

// reject is the queue's rejection: reason queue is retryable (after a
// second: the service is busy now); a request predicted to miss its
// deadline is not, as it was sent.
func (q *Queue) reject(why sluice.Reason) sluice.Decision {
	d := sluice.Decision{Reason: why, Scope: sluice.ScopeService, Gate: q.name}
	if why == sluice.ReasonQueue {
		d.Retryable, d.RetryAfter = true, time.Second
	}
	return d
}

// QueueDelay predicts the wait of a new request of class now (predict):
// 0 while a slot is free and nobody waits. A deadline gate's Queue option
// takes it.
func (q *Queue) QueueDelay(class string) time.Duration {
	var s time.Duration
	if q.opts.ServiceTime != nil {
		s = q.opts.ServiceTime(class)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	n := q.ahead(q.classOf(class))
	if n == 0 {
		if q.sizer == nil {
			return 0 // whether a slot is free is unknown: it may be
		}
		if limit, inFlight := q.sizer.ConcurrencyLimit(); inFlight < limit {
			return 0
		}
	}
	return q.predict(n, s)
}

// predict is the wait before a request with n requests waiting ahead of
// it, every slot busy: the first slot frees after S/(k+1) (k slots whose
// work started at spread-out times: the least of k residuals of a service
// time S, on average), and each request ahead takes a slot for S/k more:
// S/(k+1) + n·S/k, S the mean service time of the mix. Counting the work
// in the slots as whole service times (n+1)·S/k turned away, with a
// deadline of twice the service time and one worker, every request that
// came while the worker was busy, and the worker idled once it was done.
// The requests ahead take the mix's time, not the new request's own (a
// cheap read behind costly solves waits as long as a solve would); own,
// the request's service time, stands in until the mix has 20
// completions. 0: unknown. REQUIRES: q.mu held.
func (q *Queue) predict(n int, own time.Duration) time.Duration {
	s := q.mix.value()
	if s <= 0 {
		s = own
	}
	slots := q.slots()
	if s <= 0 || slots <= 0 {
		return 0
	}
	return s/time.Duration(slots+1) + time.Duration(n)*s/time.Duration(slots)
}

// serviceMean is the mean service time of useful and late completions: a plain
// mean of the first 20, then an exponential average weighing each new one
// 1/50.
type serviceMean struct {
	mean float64
	n    int
}

func (m *serviceMean) add(d time.Duration) {
	if m.n < 20 {
		m.n++
		m.mean += (float64(d) - m.mean) / float64(m.n)
		return
	}
	m.mean += (float64(d) - m.mean) / 50
}

func (m *serviceMean) value() time.Duration {
	if m.n < 20 {
		return 0
	}
	return time.Duration(m.mean)
}

// state is what the admin API shows of a Queue.
type state struct {
	Waiting  int     `json:"waiting"`
	OldestMs float64 `json:"oldest_ms"`
	LastWait float64 `json:"last_wait_ms"`
	Waits    int64   `json:"waits"`
	Dropped  int64   `json:"dropped"`
	Standing bool    `json:"standing"`
	// Classes are the class queues, in serving order.
	Classes []sluice.ClassQueue `json:"classes,omitempty"`
	// ServiceMs is, by class, the service time the queue's start test
	// reads now, ms (its default estimate: the shared one, or its own where
	// the shared one knows too little; 0: none, the test is off).
	ServiceMs map[string]float64 `json:"service_ms,omitempty"`
	// Inner is the state of the gate the queue waits on, if it reports one.
	Inner any `json:"inner,omitempty"`
}

// ReportState returns the queue's length, the age of its oldest waiter,
// the last wait that ended in a slot, how many requests waited and how
// many of them it turned away, and whether CoDel sees a standing queue.
func (q *Queue) ReportState(now clock.Instant) any {
	q.mu.Lock()
	st := state{Waiting: q.n, LastWait: ms(q.lastWait), Waits: q.waits, Dropped: q.dropped, Standing: q.codel.dropping}
	st.OldestMs = ms(q.oldestLocked(now))
	q.mu.Unlock()
	if len(q.opts.Classes) > 0 {
		st.Classes = q.ClassQueues(now)
	}
	if q.times != nil {
		st.ServiceMs = map[string]float64{}
		for _, t := range []ServiceEstimates{q.shared, q.times} {
			if t == nil {
				continue
			}
			for _, e := range t.Estimates(0.5, now) {
				if _, ok := st.ServiceMs[e.Class]; !ok && len(st.ServiceMs) < 64 {
					st.ServiceMs[e.Class] = ms(q.opts.ServiceTime(e.Class))
				}
			}
		}
	}
	if r, ok := sluice.As[sluice.StateReporter](q.inner); ok {
		st.Inner = r.ReportState(now)
	}
	return st
}

// QueueStats returns the waiting requests, the oldest one's age, and the
// requests that waited and were turned away after waiting.
func (q *Queue) QueueStats(now clock.Instant) (waiting int, oldest time.Duration, waited, dropped int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n, q.oldestLocked(now), q.waits, q.dropped
}

// ClassQueues returns each class queue's length and oldest waiter's age,
// in serving order; the classes without a queue of their own are "other".
func (q *Queue) ClassQueues(now clock.Instant) []sluice.ClassQueue {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]sluice.ClassQueue, len(q.queues))
	for c := range q.queues {
		name := "other"
		if c < len(q.opts.Classes) {
			name = q.opts.Classes[c]
		}
		out[c] = sluice.ClassQueue{Class: name, Waiting: q.classLen(c), Oldest: q.classOldest(c, now)}
	}
	return out
}

// classOldest is the age of class queue c's oldest waiter. REQUIRES: q.mu
// held.
func (q *Queue) classOldest(c int, now clock.Instant) time.Duration {
	switch {
	case q.fair != nil:
		return q.oldestFair(c, now)
	case len(q.queues[c]) > 0:
		return now.Sub(q.queues[c][0].since)
	}
	return 0
}

// oldestLocked is the age of the oldest waiter. REQUIRES: q.mu held.
func (q *Queue) oldestLocked(now clock.Instant) (age time.Duration) {
	for c := range q.queues {
		age = max(age, q.classOldest(c, now))
	}
	return age
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// codel is CoDel's dequeue-time state machine (RFC 8289, §5): sojourn is
// how long the dequeued request waited.
type codel struct {
	target, interval time.Duration
	firstAbove       clock.Instant // when the sojourn has been above target for an interval; 0: not above
	dropNext         clock.Instant
	count            int
	lastCount        int
	dropping         bool
}

// drop reports whether the request dequeued at now after sojourn should be
// dropped; left is how many remain queued.
func (c *codel) drop(now clock.Instant, sojourn time.Duration, left int) bool {
	ok := c.okToDrop(now, sojourn, left)
	if c.dropping {
		if !ok {
			c.dropping = false
			return false
		}
		if now >= c.dropNext {
			c.count++
			c.dropNext = c.controlLaw(c.dropNext)
			return true
		}
		return false
	}
	if ok {
		c.dropping = true
		delta := c.count - c.lastCount
		c.count = 1
		if delta > 1 && now.Sub(c.dropNext) < 16*c.interval {
			c.count = delta
		}
		c.dropNext = c.controlLaw(now)
		c.lastCount = c.count
		return true
	}
	return false
}

// okToDrop tracks whether the sojourn has stayed above target for an
// interval.
func (c *codel) okToDrop(now clock.Instant, sojourn time.Duration, left int) bool {
	if sojourn < c.target || left == 0 {
		c.firstAbove = 0
		return false
	}
	if c.firstAbove == 0 {
		c.firstAbove = now.Add(c.interval)
		return false
	}
	return now >= c.firstAbove
}

// controlLaw is the next drop time: t + interval/√count.
func (c *codel) controlLaw(t clock.Instant) clock.Instant {
	return t.Add(time.Duration(float64(c.interval) / math.Sqrt(float64(c.count))))
}
