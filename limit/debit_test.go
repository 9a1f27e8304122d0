package limit

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"pgregory.net/rapid"
)

// trueUp applies a request's true-up: a debit of what its work needed
// beyond the estimate taken, or a refund of what it did not need.
func trueUp[S any](alg interface {
	Refund(*S, clock.Instant, int64)
	Debit(*S, clock.Instant, int64)
}, s *S, at clock.Instant, estimate, actual int64) {
	switch {
	case actual > estimate:
		alg.Debit(s, at, actual-estimate)
	case actual < estimate:
		alg.Refund(s, at, estimate-actual)
	}
}

// Over random sequences of requests, each admitted at its estimate and
// trued up to its actual cost when its work ends (before the next
// request), the state is the one charging the actual cost up front would
// leave (the same remaining units at every later instant), for every
// request the up-front charge admits too; a token bucket that refilled
// to full at the estimate while the work ran is the one exception, and
// there the true-up leaves fewer tokens, never more.
func TestTrueUpEqualsChargingUpFront(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := genRate(t)
		burst := rapid.Int64Range(1, 200).Draw(t, "burst")
		tb, err := NewTokenBucket(rate, burst)
		if err != nil {
			t.Skip(err)
		}
		g, err := NewGCRA(rate, burst)
		if err != nil {
			t.Skip(err)
		}
		span := int64(tb.Window()) + 1
		var tbE, tbA TokenBucketState
		var gE, gA GCRAState
		now := rapid.Int64Range(0, span).Draw(t, "start")
		for range rapid.IntRange(1, 60).Draw(t, "requests") {
			now += rapid.Int64Range(0, span/4+1).Draw(t, "gap")
			est := rapid.Int64Range(1, burst).Draw(t, "estimate")
			act := rapid.Int64Range(1, burst).Draw(t, "actual")
			work := rapid.Int64Range(0, span/2+1).Draw(t, "work")
			at, end := clock.Instant(now), clock.Instant(now+work)

			// Both paths charge only what both would admit: the up-front
			// path's admission is what the comparison is about.
			if tb.Tokens(&tbE, at) >= max(est, act) && tb.Tokens(&tbA, at) >= max(est, act) {
				fullBefore := tb.Tokens(&tbA, at) // unused but for the message
				tb.Take(&tbE, at, est)
				tb.Take(&tbA, at, act)
				refilled := tb.Fresh(&tbE, end) // the bucket refilled to full while the work ran
				trueUp(tb, &tbE, end, est, act)
				e, a := tb.Tokens(&tbE, end), tb.Tokens(&tbA, end)
				switch {
				case refilled && e > a:
					t.Fatalf("token bucket refilled during the work: true-up left %d tokens, up front %d (more)", e, a)
				case !refilled && e != a:
					t.Fatalf("token bucket: true-up (%d→%d) left %d tokens at %v, charging %d up front %d (had %d)", est, act, e, end, act, a, fullBefore)
				}
				if refilled {
					tbE = tbA // compare what follows from one state
				}
			}
			if g.remaining(gcraAhead(g, &gE, now)) >= max(est, act) && g.remaining(gcraAhead(g, &gA, now)) >= max(est, act) {
				g.Take(&gE, at, est)
				g.Take(&gA, at, act)
				trueUp(g, &gE, end, est, act)
				for _, probe := range []int64{work, work + span/3, work + span} {
					p := clock.Instant(now + probe)
					if re, ra := g.remaining(gcraAhead(g, &gE, now+probe)), g.remaining(gcraAhead(g, &gA, now+probe)); re != ra {
						t.Fatalf("GCRA: true-up (%d→%d) leaves %d remaining at %v, charging up front %d", est, act, re, p, ra)
					}
				}
			}
			now += work
		}
	})
}

// gcraAhead returns how far s's TAT is ahead of now (0 when the bucket is
// full), without changing s.
func gcraAhead(g *GCRA, s *GCRAState, now int64) vtime {
	c := *s
	return g.tat(&c, now).sub(vtime{ns: now}, g.t.n)
}

// A debit never takes a state past empty, and a cost above the limit
// counts as the limit: the hand-checked vectors of each algorithm.
func TestDebitStopsAtEmpty(t *testing.T) {
	tb, _ := NewTokenBucket(PerSecond(10), 10) // one token per 100 ms
	var s TokenBucketState
	tb.Take(&s, 0, 4)
	tb.Debit(&s, 0, 3)
	if got := tb.Tokens(&s, 0); got != 3 {
		t.Fatalf("token bucket: 10 − 4 − 3 = %d, want 3", got)
	}
	tb.Debit(&s, clock.Instant(100*time.Millisecond), 1<<40)
	if got := tb.Tokens(&s, clock.Instant(100*time.Millisecond)); got != 0 {
		t.Fatalf("token bucket: a huge debit left %d tokens, want 0", got)
	}
	if got := tb.Tokens(&s, clock.Instant(time.Second)); got != 9 {
		t.Fatalf("token bucket: 900 ms after emptying, %d tokens, want 9", got)
	}
	tb.Debit(&s, clock.Instant(time.Second), -5)
	tb.Debit(&s, clock.Instant(time.Second), 0)
	if got := tb.Tokens(&s, clock.Instant(time.Second)); got != 9 {
		t.Fatalf("token bucket: a debit ≤ 0 changed the bucket to %d", got)
	}

	g, _ := NewGCRA(PerSecond(10), 10) // T = 100 ms, τ + T = 1 s
	var gs GCRAState
	g.Take(&gs, 0, 4) // TAT 400 ms
	g.Debit(&gs, clock.Instant(200*time.Millisecond), 3)
	if gs.TAT != int64(700*time.Millisecond) {
		t.Fatalf("GCRA: TAT %v after 4 + 3 units from 0, want 700ms (from TAT, not from now)", time.Duration(gs.TAT))
	}
	g.Debit(&gs, clock.Instant(200*time.Millisecond), 1<<40)
	if gs.TAT != int64(1200*time.Millisecond) {
		t.Fatalf("GCRA: TAT %v after a huge debit at 200 ms, want 1.2s (empty)", time.Duration(gs.TAT))
	}
	if tat := g.debitTAT(int64(400*time.Millisecond), clock.Instant(200*time.Millisecond), 3); tat != int64(700*time.Millisecond) {
		t.Fatalf("GCRA DebitTAT: %v, want 700ms", time.Duration(tat))
	}

	fw, _ := NewFixedWindow(10, time.Second)
	var fs FixedWindowState
	fw.Take(&fs, 0, 4)
	fw.Debit(&fs, clock.Instant(500*time.Millisecond), 100)
	if fs.Used != 10 {
		t.Fatalf("fixed window: used %d after a debit past the limit, want 10", fs.Used)
	}
	fw.Debit(&fs, clock.Instant(1500*time.Millisecond), 3) // the next window
	if fs.Used != 3 {
		t.Fatalf("fixed window: the next window's debit: used %d, want 3", fs.Used)
	}

	sw, _ := NewSlidingWindow(10, time.Second)
	var ss SlidingWindowState
	sw.Take(&ss, 0, 2)
	sw.Debit(&ss, 0, 5)
	if ss.Cur != 7 {
		t.Fatalf("sliding window: cur %d, want 7", ss.Cur)
	}
	sw.Debit(&ss, 0, 50)
	if ss.Cur != 10 {
		t.Fatalf("sliding window: cur %d after a debit past the limit, want 10", ss.Cur)
	}
}
