// Package storetest is the conformance suite of store.Limiter: every
// backend (the memory store, Redis standalone, Redis Cluster, a third
// party's) runs the same tests, so a gate decides the same on each.
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, storetest.Backend{New: func(alg any, now func() clock.Instant) (store.Limiter, error) {
//			return myStore.Limiter(alg) // with fresh state, deciding at now()
//		}})
//	}
//
// The suite checks each algorithm of package limit against the algorithm
// itself, step for step, on the published vectors (a token bucket of 200/s
// and burst 400 admits 400 at once, the 401st after 5 ms, and is full again
// 2 s later; Stripe's 100/s with capacity 500; redis-cell's GCRA table; a
// 6 ms paced queue of 15) and on random sequences with refunds and clock
// steps back; that concurrent callers admit exactly the limit (no lost
// update); that keys are independent; and the contract of handles and
// concurrency permits.
package storetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// Backend is a store under test.
type Backend struct {
	// New returns a limiter with fresh state (its own keys) running alg,
	// one of package limit's algorithms: *limit.TokenBucket, *limit.GCRA,
	// *limit.FixedWindow, *limit.SlidingWindow, *limit.SlidingLog,
	// *limit.LeakyBucket or *limit.Concurrency. It returns an error when the
	// backend cannot hold alg's parameters; the suite then skips that case.
	//
	// now is the suite's clock: the instants it passes to Take and Refund.
	// A backend that keeps time of its own (Redis decides on Redis TIME)
	// must decide at now() for the suite, through a test hook. The suite's
	// instants are whole microseconds.
	New func(alg any, now func() clock.Instant) (store.Limiter, error)
}

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	t.Run("SeedVectors", func(t *testing.T) { seedVectors(t, b) })
	t.Run("Differential", func(t *testing.T) { differentialRandom(t, b) })
	t.Run("ExactUnderConcurrency", func(t *testing.T) { exactUnderConcurrency(t, b) })
	t.Run("KeysAreIndependent", func(t *testing.T) { keysAreIndependent(t, b) })
	t.Run("ConcurrencyPermits", func(t *testing.T) { concurrencyPermits(t, b) })
}

// Times in the vectors are microseconds.
const ms, sec = int64(1000), int64(1_000_000)

// step is one call of a vector.
type step struct {
	at     int64  // µs
	cost   int64  // demand units
	refund bool   // a refund of cost units, with the handle of the key's last admitted take (skipped before one)
	budget int64  // ns to the request's deadline (leaky bucket); 0: none
	key    string // "" is "k"
}

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// fataler is what differential needs of *testing.T and *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

// deadlineTaker is an algorithm whose step takes the request's deadline.
type deadlineTaker[S any] interface {
	TakeBy(s *S, now clock.Instant, cost int64, deadline clock.Instant) limit.Result
}

// differential runs steps on the backend and on alg over local state, and
// requires identical results.
func differential[S any](t fataler, b Backend, name string, alg limit.Algorithm[S], steps []step) {
	t.Helper()
	var now atomic.Int64
	lim, err := b.New(alg, func() clock.Instant { return clock.Instant(now.Load()) })
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	states := map[string]*S{}
	handles := map[string]store.Handle{}
	ctx := context.Background()
	for i, st := range steps {
		key := st.key
		if key == "" {
			key = "k"
		}
		s := states[key]
		if s == nil {
			s = new(S)
			states[key] = s
		}
		at := clock.Instant(st.at * 1000)
		now.Store(int64(at))
		if st.refund {
			if _, ok := handles[key]; !ok {
				continue // a refund gives back what a take took: nothing yet
			}
			alg.Refund(s, at, st.cost)
			if err := lim.Refund(ctx, key, handles[key], at, st.cost); err != nil {
				t.Fatalf("%s step %d: refund: %v", name, i, err)
			}
			continue
		}
		var deadline clock.Instant
		if st.budget > 0 {
			deadline = at + clock.Instant(st.budget)
		}
		var want limit.Result
		if dt, ok := any(alg).(deadlineTaker[S]); ok {
			want = dt.TakeBy(s, at, st.cost, deadline)
		} else {
			want = alg.Take(s, at, st.cost)
		}
		got, h, err := lim.Take(ctx, key, at, st.cost, deadline)
		if err != nil {
			t.Fatalf("%s step %d: %v", name, i, err)
		}
		if got.OK() {
			if h == 0 || h>>63 != 0 {
				t.Fatalf("%s step %d: handle %#x of an admitted take (want nonzero, bit 63 clear)", name, i, uint64(h))
			}
			handles[key] = h
		}
		if got != want {
			t.Fatalf("%s step %d (t=%dµs cost %d):\n backend   %+v\n algorithm %+v", name, i, st.at, st.cost, got, want)
		}
	}
	if lim.Limit() != alg.Limit() || lim.Window() != alg.Window() {
		t.Fatalf("%s: limit %d window %v, algorithm %d %v", name, lim.Limit(), lim.Window(), alg.Limit(), alg.Window())
	}
}

func must[A any](a A, err error) A {
	if err != nil {
		panic(err)
	}
	return a
}

func seedVectors(t *testing.T, b Backend) {
	// 200/s burst 400: 400 at once, the 401st waits 5 ms, full again after 2 s.
	tb := must(limit.NewTokenBucket(limit.PerSecond(200), 400))
	steps := append(repeat(401, step{at: sec, cost: 1}), step{at: sec + 5*ms, cost: 1})
	differential(t, b, "token bucket 200/s", tb, append(steps, repeat(401, step{at: 3 * sec, cost: 1})...))

	// Stripe's timeline: 100/s, capacity 500; a cost above the burst, a
	// cost of 0, a refund, and a clock step back.
	tb = must(limit.NewTokenBucket(limit.PerSecond(100), 500))
	steps = append(repeat(501, step{at: 2 * sec, cost: 1}), step{at: 2*sec + 500*ms, cost: 50}, step{at: 2*sec + 500*ms, cost: 1})
	steps = append(steps, repeat(101, step{at: 4 * sec, cost: 1})...)
	steps = append(steps, step{at: 4 * sec, cost: 600}, step{at: 4 * sec, cost: 0}, step{at: 4*sec + 7, cost: 3, refund: true},
		step{at: 4*sec + 9, cost: 2}, step{at: 3 * sec, cost: 1})
	differential(t, b, "token bucket 100/s", tb, steps)

	// redis-cell's table (limit 5, 1/s) on GCRA.
	base := 10 * sec
	var cell []step
	for _, c := range [][2]int64{{0, 6}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {0, 1}, {3 * sec, 1}, {3100 * ms, 1}, {4 * sec, 1},
		{8 * sec, 1}, {9500 * ms, 1}, {9500 * ms, 2}, {9500 * ms, 5}, {9500 * ms, 3}} {
		cell = append(cell, step{at: base + c[0], cost: c[1]})
	}
	cell = append(cell, step{at: base + 9500*ms, cost: 2, refund: true}, step{at: base + 9500*ms, cost: 3})
	differential(t, b, "gcra redis-cell", must(limit.NewGCRA(limit.PerSecond(1), 5)), cell)

	// A rate whose interval is not whole nanoseconds: 7 per 3 s.
	var odd []step
	for i := int64(0); i < 60; i++ {
		odd = append(odd, step{at: base + i*123457, cost: i%3 + 1})
	}
	differential(t, b, "gcra 7/3s", must(limit.NewGCRA(must(limit.ParseRate("7/3s")), 4)), odd)

	// A 6 ms paced queue of 15: a 50 ms budget refuses a 54 ms wait.
	lb := must(limit.NewLeakyBucket(must(limit.NewRate(1, 6*time.Millisecond)), 15))
	paced := append(repeat(17, step{at: base, cost: 1}), step{at: base + 60*ms, cost: 1}, step{at: base + 60*ms, cost: 1, budget: 50_000_000},
		step{at: base + 60*ms, cost: 1, budget: 200_000_000}, step{at: base + 60*ms, cost: 17})
	differential(t, b, "leaky bucket", lb, paced)

	windows(t, b, base)
}

func windows(t *testing.T, b Backend, base int64) {
	sw := must(limit.NewSlidingWindow(10, time.Second))
	steps := append(repeat(12, step{at: base + 500*ms, cost: 1}), repeat(3, step{at: base + 1250*ms, cost: 1})...)
	steps = append(steps, step{at: base + 1300*ms - 1, cost: 1}, step{at: base + 1300*ms, cost: 1},
		step{at: base + 1300*ms, cost: 1, refund: true}, step{at: base + 2100*ms, cost: 9}, step{at: base + 2100*ms, cost: 11})
	differential(t, b, "sliding window", sw, steps)

	fw := must(limit.NewFixedWindow(3, time.Second))
	differential(t, b, "fixed window", fw, []step{
		{at: base + 100*ms, cost: 1}, {at: base + 200*ms, cost: 2}, {at: base + 300*ms, cost: 1}, {at: base + 999*ms, cost: 4},
		{at: base + 1000*ms, cost: 3}, {at: base + 1500*ms, cost: 2, refund: true}, {at: base + 1600*ms, cost: 2}, {at: base + 2500*ms, cost: 0},
	})

	sl := must(limit.NewSlidingLog(3, time.Second))
	differential(t, b, "sliding log", sl, []step{
		{at: base, cost: 2}, {at: base + 400*ms, cost: 1}, {at: base + 500*ms, cost: 1}, {at: base + 1000*ms, cost: 1},
		{at: base + 1000*ms, cost: 2}, {at: base + 1400*ms, cost: 1, refund: true}, {at: base + 1400*ms, cost: 1}, {at: base + 1400*ms, cost: 4},
	})
}

// Random sequences (rates, bursts, costs, gaps, refunds, clock steps back,
// two keys) give the algorithm's results.
func differentialRandom(t *testing.T, b Backend) {
	rapid.Check(t, func(rt *rapid.T) {
		tokens := rapid.Int64Range(1, 500).Draw(rt, "tokens")
		per := rapid.SampledFrom([]time.Duration{time.Millisecond, time.Second, 3 * time.Second, time.Minute}).Draw(rt, "per")
		rate := must(limit.NewRate(tokens, per))
		burst := rapid.Int64Range(1, 50).Draw(rt, "burst")
		steps := randomSteps(rt, int64(per)/1000/tokens*burst, burst)
		if tb, err := limit.NewTokenBucket(rate, burst); err == nil {
			differentialIfHeld(rt, b, "token bucket", tb, steps)
		}
		if g, err := limit.NewGCRA(rate, burst); err == nil {
			differentialIfHeld(rt, b, "gcra", g, steps)
		}
		if win := time.Duration(burst) * per / time.Duration(tokens); win >= time.Millisecond && win%time.Microsecond == 0 {
			differentialIfHeld(rt, b, "sliding window", must(limit.NewSlidingWindow(burst, win)), steps)
			differentialIfHeld(rt, b, "fixed window", must(limit.NewFixedWindow(burst, win)), steps)
			differentialIfHeld(rt, b, "sliding log", must(limit.NewSlidingLog(burst, win)), steps)
		}
		if lb, err := limit.NewLeakyBucket(rate, burst); err == nil {
			budgeted := append([]step(nil), steps...)
			for i := range budgeted {
				if i%3 == 0 {
					budgeted[i].budget = rapid.Int64Range(1, int64(lb.Window())+2).Draw(rt, "budget")
				}
			}
			differentialIfHeld(rt, b, "leaky bucket", lb, budgeted)
		}
	})
}

// randomSteps draws a sequence on two keys with gaps up to maxGap µs,
// some of them back in time.
func randomSteps(rt *rapid.T, maxGap, burst int64) []step {
	var steps []step
	now := 5 * sec
	for range rapid.IntRange(1, 60).Draw(rt, "steps") {
		now = max(now+rapid.Int64Range(-2000, maxGap).Draw(rt, "gap"), 1)
		steps = append(steps, step{at: now, cost: rapid.Int64Range(0, burst+1).Draw(rt, "cost"),
			refund: rapid.IntRange(0, 8).Draw(rt, "refund") == 0, key: rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "key")})
	}
	return steps
}

// differentialIfHeld runs differential when the backend can hold alg.
func differentialIfHeld[S any](rt *rapid.T, b Backend, name string, alg limit.Algorithm[S], steps []step) {
	if _, err := b.New(alg, clock.Now); err != nil {
		return // beyond what the backend holds (e.g. Redis' doubles)
	}
	differential(rt, b, name, alg, steps)
}

// 8 × 64 goroutines on one key admit exactly the limit: no lost update.
func exactUnderConcurrency(t *testing.T, b Backend) {
	const n = 1000
	for name, alg := range map[string]any{
		"token bucket": must(limit.NewTokenBucket(must(limit.ParseRate("1/h")), n)),
		"concurrency":  must(limit.NewConcurrency(n)),
	} {
		lim, err := b.New(alg, func() clock.Instant { return clock.Instant(sec * 1000) })
		if err != nil {
			t.Fatal(err)
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 * 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 40 { // 20,480 attempts for 1,000 units
					r, _, err := lim.Take(context.Background(), "hot", clock.Instant(sec*1000), 1, 0)
					if err != nil {
						t.Error(err)
						return
					}
					if r.OK() {
						admitted.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		if admitted.Load() != n {
			t.Fatalf("%s: admitted %d, want exactly %d", name, admitted.Load(), n)
		}
	}
}

func keysAreIndependent(t *testing.T, b Backend) {
	tb := must(limit.NewTokenBucket(must(limit.ParseRate("1/h")), 3))
	differential(t, b, "two keys", tb, []step{
		{at: sec, cost: 3, key: "a"}, {at: sec, cost: 1, key: "a"}, {at: sec, cost: 3, key: "b"}, {at: sec, cost: 1, key: "b"},
		{at: sec, cost: 2, key: "a", refund: true}, {at: sec, cost: 2, key: "a"}, {at: sec, cost: 1, key: "b"},
	})
}

// A concurrency limit hands out permits: each admitted take has its own
// handle, a release frees exactly one, and a full limit is whole again
// when every permit is back.
func concurrencyPermits(t *testing.T, b Backend) {
	c := must(limit.NewConcurrency(3))
	lim, err := b.New(c, func() clock.Instant { return clock.Instant(sec * 1000) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, now := context.Background(), clock.Instant(sec*1000)
	var held []store.Handle
	for i := range 3 {
		r, h, err := lim.Take(ctx, "k", now, 1, 0)
		if err != nil || !r.OK() || r.Remaining != int64(2-i) {
			t.Fatalf("permit %d: %+v %v", i, r, err)
		}
		held = append(held, h)
	}
	if r, _, _ := lim.Take(ctx, "k", now, 1, 0); r.Status != limit.Denied || r.Remaining != 0 {
		t.Fatalf("a fourth permit: %+v", r)
	}
	if r, _, _ := lim.Take(ctx, "k", now, 4, 0); r.Status != limit.Exceeded || r.RetryAfter != 0 {
		t.Fatalf("a cost above the limit: %+v", r)
	}
	for _, h := range held {
		if err := lim.Refund(ctx, "k", h, now, 1); err != nil {
			t.Fatal(err)
		}
	}
	if r, _, _ := lim.Take(ctx, "k", now, 3, 0); !r.OK() {
		t.Fatalf("after every release: %+v", r)
	}
	if r, _, _ := lim.Take(ctx, "k", now, 0, 0); r.Status != limit.Invalid {
		t.Fatalf("cost 0: %+v", r)
	}
}
