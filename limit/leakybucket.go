package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// LeakyBucket is the leaky bucket as a bounded, paced queue: arrivals join a
// queue that drains at Rate, and each admitted request is told how long to
// wait (Result.Wait) before it proceeds, so admitted work leaves evenly
// spaced. It is the queueing form of the leaky bucket (as opposed to the
// meter form, which is TokenBucket with Burst 1).
//
// Burst and delay contract: requests proceed at most at Rate (after the
// request in progress, at most Queue units wait); the longest wait is
// Queue/Rate (for example 6 ms per unit and Queue 15 give a worst wait of
// 90 ms). An arrival that would find more than Queue units ahead of it is
// Denied with the exact RetryAfter. An arrival whose wait would end at or
// after its deadline is TooLate: the bucket never holds a request past its
// deadline. Wait is rounded up to the nanosecond; the schedule itself is
// exact (see GCRA for the fixed-point representation).
//
// Refund does nothing: other requests may already be scheduled behind a
// cancelled one, so its slot stays used and the rate is never exceeded.
type LeakyBucket struct {
	rate  Rate
	queue int64
	t     interval
	dvt   vtime // (Queue+1)·T: the most the schedule may run ahead of now
	step  vtime // dvt + ClockTolerance: further ahead, the clock stepped back
}

// LeakyBucketState is one queue's state. The zero value is an empty queue.
type LeakyBucketState struct {
	// Next is when the next arrival may proceed, whole nanoseconds.
	Next int64
	// NextFrac is the fraction of a nanosecond, in units of 1/Rate.Tokens().
	NextFrac int64
}

var _ Algorithm[LeakyBucketState] = (*LeakyBucket)(nil)

// NewLeakyBucket returns a paced queue draining at rate with room for queue
// waiting units (queue ≥ 0; 0 admits only when the bucket is idle).
func NewLeakyBucket(rate Rate, queue int64) (*LeakyBucket, error) {
	if rate.isZero() {
		return nil, paramErr("rate", "leaky bucket: rate must be > 0")
	}
	if queue < 0 {
		return nil, paramErr("queue", "leaky bucket: queue %d, want ≥ 0", queue)
	}
	if queue+1 > maxScaled/max(rate.per, rate.tokens) {
		return nil, paramErr("queue", "leaky bucket: queue %d too large for rate %v", queue, rate)
	}
	l := &LeakyBucket{rate: rate, queue: queue, t: newInterval(rate)}
	l.dvt = l.t.times(queue + 1)
	l.step = l.dvt.add(vtime{ns: tolerance}, l.t.n)
	return l, nil
}

// Limit returns Queue+1: the units that fit at once (one proceeding, Queue
// waiting).
func (l *LeakyBucket) Limit() int64 { return l.queue + 1 }

// Window returns the longest wait, Queue/Rate.
func (l *LeakyBucket) Window() time.Duration { return time.Duration(l.t.times(l.queue).ceil()) }

// Rate returns the drain rate.
func (l *LeakyBucket) Rate() Rate { return l.rate }

// Queue returns the units that may wait.
func (l *LeakyBucket) Queue() int64 { return l.queue }

// Take is TakeBy without a deadline.
func (l *LeakyBucket) Take(s *LeakyBucketState, now clock.Instant, cost int64) Result {
	return l.TakeBy(s, now, cost, 0)
}

// TakeBy schedules cost units at now for a request that must proceed before
// deadline (0 = none).
func (l *LeakyBucket) TakeBy(s *LeakyBucketState, at clock.Instant, cost int64, by clock.Instant) Result {
	now, deadline := int64(at), int64(by)
	n := l.t.n
	nowv := vtime{ns: now}
	start := vtime{ns: s.Next, f: s.NextFrac}
	if start.less(nowv) {
		start = nowv
	} else if l.step.less(start.sub(nowv, n)) {
		start = nowv.add(l.dvt, n) // the clock stepped back: a full queue at now
		s.Next, s.NextFrac = start.ns, start.f
	}
	r := Result{Limit: l.queue + 1, Remaining: l.room(start.sub(nowv, n)), ResetAfter: time.Duration(start.sub(nowv, n).ceil())}
	switch {
	case cost <= 0:
		r.Status = Invalid
		return r
	case cost > l.queue+1:
		r.Status = Exceeded
		return r
	}
	next := start.add(l.t.times(cost), n)
	ahead := next.sub(nowv, n)
	if l.dvt.less(ahead) {
		r.Status = Denied
		r.RetryAfter = time.Duration(ahead.sub(l.dvt, n).ceil())
		return r
	}
	wait := start.sub(nowv, n).ceil()
	if deadline != 0 && now+wait >= deadline {
		r.Status = TooLate
		return r
	}
	s.Next, s.NextFrac = next.ns, next.f
	r.Wait = time.Duration(wait)
	r.Remaining = l.room(ahead)
	r.ResetAfter = time.Duration(ahead.ceil())
	return r
}

// room returns the whole units that still fit when the schedule runs x
// ahead of now.
func (l *LeakyBucket) room(x vtime) int64 {
	if l.dvt.less(x) {
		return 0
	}
	return l.dvt.sub(x, l.t.n).scaled(l.t.n) / l.rate.per
}

// Refund does nothing (see the type doc).
func (l *LeakyBucket) Refund(s *LeakyBucketState, now clock.Instant, cost int64) {}

// Fresh reports whether the queue is empty at now.
func (l *LeakyBucket) Fresh(s *LeakyBucketState, at clock.Instant) bool {
	now := int64(at)
	return !(vtime{ns: now}).less(vtime{ns: s.Next, f: s.NextFrac})
}
