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
	// Rebind returns a limiter running alg, an algorithm of the same kind as
	// lim's (from New or Rebind) with other limits, over lim's state: what a
	// reload that changes only a limit or burst does. Nil: the suite skips
	// the reload cases.
	Rebind func(lim store.Limiter, alg any) (store.Limiter, error)
}

// Run runs the conformance suite against b.
func Run(t *testing.T, b Backend) {
	t.Run("SeedVectors", func(t *testing.T) { seedVectors(t, b) })
	t.Run("Differential", func(t *testing.T) { differentialRandom(t, b) })
	t.Run("ExactUnderConcurrency", func(t *testing.T) { exactUnderConcurrency(t, b) })
	t.Run("KeysAreIndependent", func(t *testing.T) { keysAreIndependent(t, b) })
	t.Run("ConcurrencyPermits", func(t *testing.T) { concurrencyPermits(t, b) })
	t.Run("BoundUnderStaleReadings", func(t *testing.T) { boundUnderStaleReadings(t, b) })
	if b.Rebind != nil {
		t.Run("ReloadKeepsState", func(t *testing.T) { reloadKeepsState(t, b) })
	}
}

// reloadKeepsState: a limit or burst changed over kept state (lowered and
// raised again) decides as the algorithm does over the same state, with
// 0 ≤ remaining ≤ the new limit throughout.
func reloadKeepsState(t *testing.T, b Backend) {
	rapid.Check(t, func(rt *rapid.T) {
		rate := must(limit.NewRate(rapid.Int64Range(1, 200).Draw(rt, "tokens"), time.Second))
		hi := rapid.Int64Range(2, 60).Draw(rt, "high")
		lo := rapid.Int64Range(1, hi-1).Draw(rt, "low")
		win := time.Duration(rapid.Int64Range(1, 3000).Draw(rt, "window ms")) * time.Millisecond
		phase := func(n int64) []step { return randomSteps(rt, int64(time.Second/time.Microsecond)/rate.Tokens()*n, n) }
		p1, p2, p3 := phase(hi), phase(lo), phase(hi)
		reload(rt, b, "token bucket", must(limit.NewTokenBucket(rate, hi)), must(limit.NewTokenBucket(rate, lo)), p1, p2, p3)
		reload(rt, b, "gcra", must(limit.NewGCRA(rate, hi)), must(limit.NewGCRA(rate, lo)), p1, p2, p3)
		reload(rt, b, "leaky bucket", must(limit.NewLeakyBucket(rate, hi)), must(limit.NewLeakyBucket(rate, lo)), p1, p2, p3)
		reload(rt, b, "fixed window", must(limit.NewFixedWindow(hi, win)), must(limit.NewFixedWindow(lo, win)), p1, p2, p3)
		reload(rt, b, "sliding window", must(limit.NewSlidingWindow(hi, win)), must(limit.NewSlidingWindow(lo, win)), p1, p2, p3)
		reload(rt, b, "sliding log", must(limit.NewSlidingLog(hi, win)), must(limit.NewSlidingLog(lo, win)), p1, p2, p3)
		// Concurrency keeps no time on its own; a backend may expire permits
		// by age (Redis' ttl), so its steps stay at one instant.
		c1, c2, c3 := atOneInstant(p1), atOneInstant(p2), atOneInstant(p3)
		reload(rt, b, "concurrency", must(limit.NewConcurrency(hi)), must(limit.NewConcurrency(lo)), c1, c2, c3)
	})
}

func atOneInstant(steps []step) []step {
	out := append([]step(nil), steps...)
	for i := range out {
		out[i].at = 3600 * sec
	}
	return out
}

// reload runs p1 with high, p2 with low, p3 with high again, over one state.
func reload[S any](rt *rapid.T, b Backend, name string, high, low limit.Algorithm[S], p1, p2, p3 []step) {
	if _, err := b.New(high, clock.Now); err != nil {
		return // beyond what the backend holds
	}
	r := newRun(rt, b, name, high)
	r.steps(high, p1)
	r.rebind(b, low)
	r.steps(low, p2)
	r.rebind(b, high)
	r.steps(high, p3)
}

// Times in the vectors are microseconds.
const ms, sec = int64(1000), int64(1_000_000)

// step is one call of a vector.
type step struct {
	at     int64  // µs
	cost   int64  // demand units
	refund bool   // a refund of cost units, with the handle of the key's last admitted take (skipped before one)
	debit  bool   // a debit of cost units (a true-up), likewise; skipped for algorithms without one
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
	r := newRun[S](t, b, name, alg)
	r.steps(alg, steps)
}

// run is one differential run: a backend limiter and the algorithm's own
// states, key by key, stepped together.
type run[S any] struct {
	t       fataler
	name    string
	now     *atomic.Int64
	lim     store.Limiter
	states  map[string]*S
	handles map[string]store.Handle
	costs   map[string]int64 // the cost of each key's last admitted take
	i       int
}

func newRun[S any](t fataler, b Backend, name string, alg limit.Algorithm[S]) *run[S] {
	t.Helper()
	now := new(atomic.Int64)
	lim, err := b.New(alg, func() clock.Instant { return clock.Instant(now.Load()) })
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &run[S]{t: t, name: name, now: now, lim: lim, states: map[string]*S{}, handles: map[string]store.Handle{}, costs: map[string]int64{}}
}

// steps runs steps with alg on both sides.
func (r *run[S]) steps(alg limit.Algorithm[S], steps []step) {
	t := r.t
	t.Helper()
	name, lim := r.name, r.lim
	ctx := context.Background()
	for _, st := range steps {
		i := r.i
		r.i++
		key := st.key
		if key == "" {
			key = "k"
		}
		s := r.states[key]
		if s == nil {
			s = new(S)
			r.states[key] = s
		}
		at := clock.Instant(st.at * 1000)
		r.now.Store(int64(at))
		if st.debit {
			r.debit(alg, s, key, at, st.cost, i)
			continue
		}
		if st.refund {
			r.refund(alg, s, key, at, st.cost, i)
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
			r.handles[key], r.costs[key] = h, st.cost
		}
		if got != want {
			t.Fatalf("%s step %d (t=%dµs cost %d):\n backend   %+v\n algorithm %+v", name, i, st.at, st.cost, got, want)
		}
		if got.Remaining < 0 || got.Remaining > got.Limit {
			t.Fatalf("%s step %d: remaining %d outside [0, %d]", name, i, got.Remaining, got.Limit)
		}
	}
	if lim.Limit() != alg.Limit() || lim.Window() != alg.Window() {
		t.Fatalf("%s: limit %d window %v, algorithm %d %v", name, lim.Limit(), lim.Window(), alg.Limit(), alg.Window())
	}
}

// refund gives cost units back on both sides, with the handle of the
// key's last admitted take (nothing before one).
func (r *run[S]) refund(alg limit.Algorithm[S], s *S, key string, at clock.Instant, cost int64, i int) {
	h, ok := r.handles[key]
	if !ok {
		return // a refund gives back what a take took: nothing yet
	}
	if _, permits := any(alg).(*limit.Concurrency); permits {
		// A permit is released once, with the slots it holds.
		cost = r.costs[key]
		delete(r.handles, key)
	}
	alg.Refund(s, at, cost)
	if err := r.lim.Refund(context.Background(), key, h, at, cost); err != nil {
		r.t.Fatalf("%s step %d: refund: %v", r.name, i, err)
	}
}

// debit charges cost more units on both sides (a true-up), after a take
// of the key and for algorithms that have a debit.
func (r *run[S]) debit(alg limit.Algorithm[S], s *S, key string, at clock.Instant, cost int64, i int) {
	h, ok := r.handles[key]
	ad, algOK := any(alg).(limit.Debiter[S])
	ld, limOK := r.lim.(store.Debiter)
	if !ok || !algOK || !limOK {
		return
	}
	ad.Debit(s, at, cost)
	if err := ld.Debit(context.Background(), key, h, at, cost); err != nil {
		r.t.Fatalf("%s step %d: debit: %v", r.name, i, err)
	}
}

// rebind makes the run continue with alg over the same states, as a reload
// that changes only a limit or burst does.
func (r *run[S]) rebind(b Backend, alg limit.Algorithm[S]) {
	r.t.Helper()
	lim, err := b.Rebind(r.lim, alg)
	if err != nil {
		r.t.Fatalf("%s: rebind: %v", r.name, err)
	}
	r.lim = lim
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
// some of them back in time: mostly stale readings (a few ms), sometimes a
// step of the clock, back or forward, beyond limit.ClockTolerance.
func randomSteps(rt *rapid.T, maxGap, burst int64) []step {
	var steps []step
	now := 3 * 3600 * sec
	tol := limit.ClockTolerance.Microseconds()
	for range rapid.IntRange(1, 60).Draw(rt, "steps") {
		gap := rapid.Int64Range(-2000, maxGap).Draw(rt, "gap")
		if rapid.IntRange(0, 15).Draw(rt, "clock step") == 0 {
			gap = rapid.SampledFrom([]int64{-tol - 1, -tol, -2 * tol, -3600 * sec, tol + 1, 3600 * sec}).Draw(rt, "step")
		}
		now = max(now+gap, 1)
		kind := rapid.IntRange(0, 8).Draw(rt, "refund or debit")
		cost := rapid.Int64Range(0, burst+1).Draw(rt, "cost")
		if kind == 1 && rapid.IntRange(0, 3).Draw(rt, "a debit past the limit") == 0 {
			cost = rapid.SampledFrom([]int64{3 * burst, 1 << 40}).Draw(rt, "huge debit")
		}
		steps = append(steps, step{at: now, cost: cost,
			refund: kind == 0, debit: kind == 1, key: rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "key")})
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

// boundUnderStaleReadings: with clock readings up to ClockTolerance stale,
// refunds and several keys, no key is admitted more than its algorithm's
// bound within any window, counted at the latest reading that key has been
// stepped at (a stale reading must not be counted earlier than a time the
// key's state had passed, even after the backend dropped or expired it).
func boundUnderStaleReadings(t *testing.T, b Backend) {
	rapid.Check(t, func(rt *rapid.T) {
		limitN := rapid.Int64Range(1, 5).Draw(rt, "limit")
		window := time.Duration(rapid.Int64Range(1, 2000).Draw(rt, "window ms")) * time.Millisecond
		rate := must(limit.NewRate(limitN, window))
		// The most each may admit within one window: the bucket kinds burst +
		// rate·window, the log exactly its limit, the windows their documented
		// boundary bursts.
		for _, c := range []struct {
			name  string
			alg   any
			bound int64
		}{
			{"token bucket", must(limit.NewTokenBucket(rate, limitN)), 2 * limitN},
			{"gcra", must(limit.NewGCRA(rate, limitN)), 2 * limitN},
			{"sliding log", must(limit.NewSlidingLog(limitN, window)), limitN},
			{"fixed window", must(limit.NewFixedWindow(limitN, window)), 2 * limitN},
			{"sliding window", must(limit.NewSlidingWindow(limitN, window)), 2*limitN - 1},
		} {
			name, alg, bound := c.name, c.alg, c.bound
			var now atomic.Int64
			lim, err := b.New(alg, func() clock.Instant { return clock.Instant(now.Load()) })
			if err != nil {
				rt.Fatalf("%s: %v", name, err)
			}
			admitted := map[string][]stamp{}
			seen := map[string]int64{}     // per key: the latest reading it was stepped at
			real := int64(10 * sec * 1000) // ns; late readings stay above 0 (Redis reads 0 as "use TIME")
			for range rapid.IntRange(1, 80).Draw(rt, "steps") {
				real += rapid.Int64Range(0, int64(window)/4).Draw(rt, "gap") / 1000 * 1000
				at := real
				if rapid.IntRange(0, 2).Draw(rt, "is stale") == 0 {
					at -= rapid.Int64Range(0, int64(limit.ClockTolerance)).Draw(rt, "late") / 1000 * 1000
				}
				key := rapid.SampledFrom(staleKeys).Draw(rt, "key")
				latest := max(seen[key], at)
				seen[key] = latest
				now.Store(at)
				r, h, err := lim.Take(context.Background(), key, clock.Instant(at), 1, 0)
				if err != nil {
					rt.Fatal(err)
				}
				if !r.OK() {
					continue
				}
				if rapid.IntRange(0, 5).Draw(rt, "refund") == 0 {
					if err := lim.Refund(context.Background(), key, h, clock.Instant(at), 1); err != nil {
						rt.Fatal(err)
					}
					continue
				}
				admitted[key] = append(admitted[key], stamp(latest))
			}
			for _, key := range staleKeys {
				ts := admitted[key]
				for i := range ts {
					n := int64(0)
					for j := i; j < len(ts) && ts[j]-ts[i] < stamp(window); j++ {
						n++
					}
					if n > bound {
						rt.Fatalf("%s key %s: %d admitted within %v from %v (bound %d)", name, key, n, window, time.Duration(ts[i]), bound)
					}
				}
			}
		}
	})
}

// staleKeys are the keys of boundUnderStaleReadings: more than a small
// memory table holds, so that it sweeps and overflows.
var staleKeys = []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}

// stamp is an instant in ns on the suite's clock.
type stamp int64
