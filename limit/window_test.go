package limit

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

func TestFixedWindowVectors(t *testing.T) {
	w, err := NewFixedWindow(3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s FixedWindowState
	for i, c := range []struct {
		at        clock.Instant
		cost      int64
		status    Status
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}{
		{100 * ms, 1, Allowed, 2, 0, 900 * time.Millisecond},
		{200 * ms, 2, Allowed, 0, 0, 800 * time.Millisecond},
		{300 * ms, 1, Denied, 0, 700 * time.Millisecond, 700 * time.Millisecond},
		{999 * ms, 4, Exceeded, 0, 0, time.Millisecond},
		{1000 * ms, 3, Allowed, 0, 0, time.Second}, // boundary burst: 3 more right after 3
		{2500 * ms, 0, Invalid, 3, 0, 0},
	} {
		r := w.Take(&s, c.at, c.cost)
		if r.Status != c.status || r.Remaining != c.remaining || r.RetryAfter != c.retry || r.ResetAfter != c.reset {
			t.Fatalf("step %d: %+v", i, r)
		}
	}
}

func TestFixedWindowClockStepBackKeepsCount(t *testing.T) {
	w, _ := NewFixedWindow(2, time.Second)
	var s FixedWindowState
	takeN(w, &s, 5*sec, 2)
	if w.Take(&s, 4*sec, 1).OK() {
		t.Fatal("a step back into an earlier window reset the count")
	}
	if !w.Take(&s, 6*sec, 1).OK() {
		t.Fatal("next window did not open")
	}
}

func TestSlidingLogVectors(t *testing.T) {
	l, err := NewSlidingLog(3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s SlidingLogState
	l.Take(&s, 0, 1)
	l.Take(&s, 400*ms, 2)
	r := l.Take(&s, 500*ms, 1)
	if r.Status != Denied || r.RetryAfter != 500*time.Millisecond {
		t.Fatalf("%+v, want retry when the t=0 entry leaves", r)
	}
	r = l.Take(&s, 500*ms, 3)
	if r.Status != Denied || r.RetryAfter != 900*time.Millisecond {
		t.Fatalf("%+v, want retry when both entries leave", r)
	}
	if l.Take(&s, sec-1, 1).OK() || !l.Take(&s, sec, 1).OK() {
		t.Fatal("entry at 0 must leave exactly at 1s")
	}
	l.Refund(&s, sec, 1)
	if r := l.Take(&s, sec, 1); !r.OK() || r.Remaining != 0 {
		t.Fatalf("after refund: %+v", r)
	}
	// Step back: logged at the newest time, so it does not expire early.
	if l.Take(&s, 0, 1).OK() {
		t.Fatal("step back admitted into a full log")
	}
}

func TestSlidingWindowVectors(t *testing.T) {
	w, err := NewSlidingWindow(10, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var s SlidingWindowState
	if got := takeN(w, &s, 500*ms, 12); got != 10 {
		t.Fatalf("first window admitted %d", got)
	}
	// At 1.25 s the estimate is 10·0.75 + 0 = 7.5: 2 fit, the third does not.
	if got := takeN(w, &s, 1250*ms, 3); got != 2 {
		t.Fatalf("at 1.25s admitted %d, want 2", got)
	}
	// prev 10, cur 2: need 10·(1−el) + 3 ≤ 10 → el ≥ 0.3 s → retry 50 ms.
	r := w.Take(&s, 1250*ms, 1)
	if r.Status != Denied || r.RetryAfter != 50*time.Millisecond {
		t.Fatalf("%+v, want retry-after 50ms", r)
	}
	probe := s
	if w.Take(&probe, 1300*ms-1, 1).OK() || !w.Take(&s, 1300*ms, 1).OK() {
		t.Fatal("retry-after not exact")
	}
	// Cur+cost beyond the limit: wait for the next window.
	var s2 SlidingWindowState
	takeN(w, &s2, 0, 10)
	r = w.Take(&s2, 100*ms, 1)
	if r.Status != Denied || r.RetryAfter != 900*time.Millisecond+100*time.Millisecond {
		t.Fatalf("%+v, want 1s: next window at el 0.1 s", r)
	}
}

func TestLeakyBucketSeedQueue(t *testing.T) {
	// Hand-checked: 6 ms per request,
	// queue 15: worst wait ≈ 90 ms.
	rate, _ := NewRate(1, 6*time.Millisecond)
	l, err := NewLeakyBucket(rate, 15)
	if err != nil {
		t.Fatal(err)
	}
	if l.Window() != 90*time.Millisecond {
		t.Fatalf("max wait %v", l.Window())
	}
	var s LeakyBucketState
	for i := range int64(16) {
		r := l.Take(&s, 0, 1)
		if !r.OK() || r.Wait != time.Duration(clock.Instant(i)*6*ms) {
			t.Fatalf("arrival %d: %+v, want wait %dms", i, r, i*6)
		}
	}
	r := l.Take(&s, 0, 1)
	if r.Status != Denied || r.RetryAfter != 6*time.Millisecond {
		t.Fatalf("17th: %+v", r)
	}
	// After 60 ms ten have left: the next waits 36 ms.
	if r := l.Take(&s, 60*ms, 1); !r.OK() || r.Wait != 36*time.Millisecond {
		t.Fatalf("%+v", r)
	}
}

func TestLeakyBucketNeverHoldsPastDeadline(t *testing.T) {
	rate, _ := NewRate(1, 6*time.Millisecond)
	l, _ := NewLeakyBucket(rate, 15)
	var s LeakyBucketState
	takeN(l, &s, 0, 9) // next arrival waits 54 ms
	before := s
	if r := l.TakeBy(&s, 0, 1, 50*ms); r.Status != TooLate || s != before {
		t.Fatalf("%+v: a 54 ms wait against a 50 ms deadline must be refused untouched", r)
	}
	if r := l.TakeBy(&s, 0, 1, 55*ms); !r.OK() || r.Wait != 54*time.Millisecond {
		t.Fatalf("%+v", r)
	}
}

func TestConcurrencyVectors(t *testing.T) {
	c, err := NewConcurrency(2)
	if err != nil {
		t.Fatal(err)
	}
	var s ConcurrencyState
	for i := range 2 {
		if !c.Take(&s, 0, 1).OK() {
			t.Fatalf("slot %d not granted", i+1)
		}
	}
	if r := c.Take(&s, 0, 1); r.Status != Denied || r.Remaining != 0 {
		t.Fatalf("%+v", r)
	}
	c.Refund(&s, 0, 1)
	c.Refund(&s, 0, 1)
	c.Refund(&s, 0, 1) // extra release never goes negative
	if s.InFlight != 0 || !c.Fresh(&s, 0) {
		t.Fatalf("%+v", s)
	}
	if r := c.Take(&s, 0, 3); r.Status != Exceeded {
		t.Fatalf("%+v", r)
	}
}

func TestWindowBadInput(t *testing.T) {
	if _, err := NewFixedWindow(0, time.Second); err == nil {
		t.Error("fixed window limit 0")
	}
	if _, err := NewFixedWindow(1, 0); err == nil {
		t.Error("fixed window zero window")
	}
	if _, err := NewSlidingLog(-1, time.Second); err == nil {
		t.Error("sliding log negative limit")
	}
	if _, err := NewSlidingWindow(1, -time.Second); err == nil {
		t.Error("sliding window negative window")
	}
	if _, err := NewLeakyBucket(Rate{}, 1); err == nil {
		t.Error("leaky zero rate")
	}
	if _, err := NewLeakyBucket(PerSecond(1), -1); err == nil {
		t.Error("leaky negative queue")
	}
	if _, err := NewConcurrency(0); err == nil {
		t.Error("concurrency 0")
	}
}

// A refund must take back exactly the refunded take, even when other takes
// (and window rollovers) happened in between.
func TestWindowRefundsHitTheirOwnTake(t *testing.T) {
	l, _ := NewSlidingLog(2, 100)
	var ls SlidingLogState
	l.Take(&ls, 0, 1)
	l.Take(&ls, 10, 1)
	l.Refund(&ls, 0, 1) // the take at 0 is refunded, not the one at 10
	if l.Take(&ls, 100, 2).OK() {
		t.Fatal("sliding log: refund removed another request's entry; window (10, 110] would hold 3")
	}
	if !l.Take(&ls, 100, 1).OK() {
		t.Fatal("sliding log: refunded unit not given back")
	}

	w, _ := NewFixedWindow(1, 10)
	var ws FixedWindowState
	w.Take(&ws, 9, 1)
	w.Take(&ws, 10, 1)
	w.Refund(&ws, 9, 1) // from window [0, 10): must not touch [10, 20)
	if w.Take(&ws, 11, 1).OK() {
		t.Fatal("fixed window: refund from an older window freed the current one")
	}

	sw, _ := NewSlidingWindow(1, 10)
	var ss SlidingWindowState
	sw.Take(&ss, 19, 1)
	sw.Take(&ss, 29, 1) // rolls to [20, 30): prev 1 weighted 0.1 + 1 ≤ 1? no: denied
	ss2 := SlidingWindowState{}
	sw.Take(&ss2, 9, 1)
	sw.Take(&ss2, 20, 1) // [20, 30) with prev 0 (two windows later)
	sw.Refund(&ss2, 9, 1)
	if sw.Take(&ss2, 21, 1).OK() {
		t.Fatal("sliding window: refund from an old window freed the current one")
	}
	var ss3 SlidingWindowState
	sw.Take(&ss3, 5, 1)
	sw.Take(&ss3, 15, 1) // denied (prev 1 · 0.5 + 1 > 1) but rolled: prev = 1
	sw.Refund(&ss3, 5, 1)
	if ss3.Prev != 0 {
		t.Fatal("sliding window: refund did not reach the previous window that counted it")
	}
}
