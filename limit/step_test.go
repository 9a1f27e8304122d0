package limit

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// firstAdmit returns the first instant from `from`, in steps of `by`, at
// which a cost-1 take is admitted, trying up to `until`.
func firstAdmit[S any](a Algorithm[S], s *S, from, until clock.Instant, by time.Duration) (clock.Instant, bool) {
	for t := from; t <= until; t = t.Add(by) {
		probe := *s
		if a.Take(&probe, t, 1).OK() {
			*s = probe
			return t, true
		}
	}
	return 0, false
}

// stepCase is one algorithm, filled to its limit at an hour on the clock.
type stepCase[S any] struct {
	name string
	alg  Algorithm[S]
}

func checkStepBack[S any](t *testing.T, c stepCase[S], fill func(*S, clock.Instant)) {
	t.Helper()
	var s S
	hour := clock.Instant(time.Hour)
	fill(&s, hour)
	back := clock.Instant(10 * time.Second) // the clock stepped back 59m50s
	if r := c.alg.Take(&s, back, 1); r.OK() {
		t.Fatalf("%s: the step back handed out a unit the full state did not have: %+v", c.name, r)
	}
	// Within its window; the sliding window's estimate lets the previous
	// window's count fade over one more.
	at, ok := firstAdmit(c.alg, &s, back, back.Add(2*c.alg.Window()+time.Millisecond), time.Millisecond)
	if !ok {
		t.Fatalf("%s: still locked out two windows after the clock stepped back an hour", c.name)
	}
	t.Logf("%s: admitted again %v after the step back", c.name, at.Sub(back))
}

// A clock step back of an hour neither hands out capacity nor locks the key
// out for the step's length: every algorithm admits again within its window.
func TestClockStepBackEveryAlgorithm(t *testing.T) {
	rate := PerSecond(100)
	tb, _ := NewTokenBucket(rate, 10)
	g, _ := NewGCRA(rate, 10)
	lb, _ := NewLeakyBucket(rate, 9)
	fw, _ := NewFixedWindow(10, 100*time.Millisecond)
	sw, _ := NewSlidingWindow(10, 100*time.Millisecond)
	sl, _ := NewSlidingLog(10, 100*time.Millisecond)
	fillN := func(n int, take func(clock.Instant)) func(clock.Instant) {
		return func(at clock.Instant) {
			for range n {
				take(at)
			}
		}
	}
	checkStepBack(t, stepCase[TokenBucketState]{"token bucket", tb}, func(s *TokenBucketState, at clock.Instant) { fillN(10, func(a clock.Instant) { tb.Take(s, a, 1) })(at) })
	checkStepBack(t, stepCase[GCRAState]{"gcra", g}, func(s *GCRAState, at clock.Instant) { fillN(10, func(a clock.Instant) { g.Take(s, a, 1) })(at) })
	checkStepBack(t, stepCase[LeakyBucketState]{"leaky bucket", lb}, func(s *LeakyBucketState, at clock.Instant) { fillN(10, func(a clock.Instant) { lb.Take(s, a, 1) })(at) })
	checkStepBack(t, stepCase[FixedWindowState]{"fixed window", fw}, func(s *FixedWindowState, at clock.Instant) { fillN(10, func(a clock.Instant) { fw.Take(s, a, 1) })(at) })
	checkStepBack(t, stepCase[SlidingWindowState]{"sliding window", sw}, func(s *SlidingWindowState, at clock.Instant) {
		fillN(10, func(a clock.Instant) { sw.Take(s, a, 1) })(at)
	})
	checkStepBack(t, stepCase[SlidingLogState]{"sliding log", sl}, func(s *SlidingLogState, at clock.Instant) { fillN(10, func(a clock.Instant) { sl.Take(s, a, 1) })(at) })
}

// A limit lowered under a kept state (a reload that changes only the limit
// or burst): 0 ≤ remaining ≤ the new limit, a retry-after within the new
// window (plus ClockTolerance for the virtual-time algorithms), and no
// capacity the old state did not have.
func TestLoweredLimitEveryAlgorithm(t *testing.T) {
	rate := PerSecond(100)
	check := func(name string, r Result, limit int64, window time.Duration) {
		t.Helper()
		if r.OK() || r.Remaining < 0 || r.Remaining > limit || r.RetryAfter <= 0 || r.RetryAfter > window+ClockTolerance {
			t.Errorf("%s after lowering to %d: %+v, want denied, remaining in [0, %d], retry within %v", name, limit, r, limit, window+ClockTolerance)
		}
	}
	{
		old, _ := NewTokenBucket(rate, 100)
		var s TokenBucketState
		takeN(old, &s, sec, 95)
		a, _ := NewTokenBucket(rate, 10)
		check("token bucket", a.Take(&s, sec, 1), 10, a.Window())
	}
	{
		old, _ := NewGCRA(rate, 100)
		var s GCRAState
		takeN(old, &s, sec, 95)
		a, _ := NewGCRA(rate, 10)
		check("gcra", a.Take(&s, sec, 1), 10, a.Window())
	}
	{
		old, _ := NewLeakyBucket(rate, 99)
		var s LeakyBucketState
		takeN(old, &s, sec, 95)
		a, _ := NewLeakyBucket(rate, 9)
		check("leaky bucket", a.Take(&s, sec, 1), 10, a.Window()+10*time.Millisecond)
	}
	{
		old, _ := NewFixedWindow(100, time.Second)
		var s FixedWindowState
		takeN(old, &s, sec, 50)
		a, _ := NewFixedWindow(10, time.Second)
		check("fixed window", a.Take(&s, sec, 1), 10, a.Window())
	}
	{
		old, _ := NewSlidingWindow(100, time.Second)
		var s SlidingWindowState
		takeN(old, &s, sec, 50)
		a, _ := NewSlidingWindow(10, time.Second)
		check("sliding window", a.Take(&s, sec, 1), 10, 2*a.Window())
	}
	{
		old, _ := NewSlidingLog(100, time.Second)
		var s SlidingLogState
		takeN(old, &s, sec, 50)
		a, _ := NewSlidingLog(10, time.Second)
		check("sliding log", a.Take(&s, sec, 1), 10, a.Window())
	}
	{
		old, _ := NewConcurrency(100)
		var s ConcurrencyState
		takeN(old, &s, sec, 50)
		a, _ := NewConcurrency(10)
		if r := a.Take(&s, sec, 1); r.OK() || r.Remaining != 0 {
			t.Errorf("concurrency after lowering to 10 with 50 in flight: %+v", r)
		}
	}
}

// A sliding log that admitted at 11.5 s and refunded it must still know
// that time reached 11.5 s: a delayed reading of 10.2 s is logged at
// 11.5 s, so it does not make room for another unit at 11.6 s.
func TestSlidingLogStaleReadingAfterRefund(t *testing.T) {
	l, _ := NewSlidingLog(1, time.Second)
	var s SlidingLogState
	if !l.Take(&s, 11500*ms, 1).OK() {
		t.Fatal("first take")
	}
	l.Refund(&s, 11500*ms, 1)
	if !l.Take(&s, 10200*ms, 1).OK() {
		t.Fatal("the refunded unit is free again")
	}
	if r := l.Take(&s, 11600*ms, 1); r.OK() {
		t.Fatal("two admits within 0.1 s of real time in a 1-per-second log")
	}
}
