package redis

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) {
	// rueidis' cluster client may leave a topology refresh sleeping for a
	// few seconds after Close (and, after a node died, its delayed retry
	// of that refresh); they end on their own and hold nothing of ours.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// backends returns a standalone and a cluster store, each closed at the end.
func backends(t *testing.T) map[string]*Store {
	t.Helper()
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	out := map[string]*Store{}
	for name, addrs := range map[string][]string{"standalone": {srv.Addr}, "cluster": cl.Addrs} {
		s, err := New(Options{Addrs: addrs, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out[name] = s
	}
	return out
}

type step struct {
	atUS   int64 // microseconds
	cost   int64
	op     string // "take" (default) or "refund"
	budget int64  // ns until the request's deadline (0: none; leaky bucket only)
}

type fataler interface {
	Fatalf(format string, args ...any)
}

type deadlineTaker[S any] interface {
	TakeBy(s *S, now, cost, deadline int64) limit.Result
}

// differential runs the steps on a Go algorithm over memory state and on a
// Redis limiter with the same clock, and requires identical results.
func differential[S any](t fataler, name string, alg limit.Algorithm[S], lim store.Limiter, steps []step) {
	var state S
	var now int64
	lim.(*limiter).now = func() int64 { return now }
	ctx := context.Background()
	for i, st := range steps {
		now = st.atUS
		nowNS := now * 1000
		if st.op == "refund" {
			alg.Refund(&state, nowNS, st.cost)
			if err := lim.Refund(ctx, "k", 1, clock.Instant(nowNS), st.cost); err != nil {
				t.Fatalf("%v", err)
			}
			continue
		}
		deadline := int64(0)
		if st.budget > 0 {
			deadline = nowNS + st.budget
		}
		var want limit.Result
		if dt, ok := any(alg).(deadlineTaker[S]); ok {
			want = dt.TakeBy(&state, nowNS, st.cost, deadline)
		} else {
			want = alg.Take(&state, nowNS, st.cost)
		}
		got, _, err := lim.Take(ctx, "k", clock.Instant(nowNS), st.cost, clock.Instant(deadline))
		if err != nil {
			t.Fatalf("%v", err)
		}
		if got.Status != want.Status || got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter ||
			got.ResetAfter != want.ResetAfter || got.Wait != want.Wait {
			t.Fatalf("%s step %d (t=%dµs cost %d):\n redis  %+v\n memory %+v", name, i, st.atUS, st.cost, got, want)
		}
	}
}

const ms, sec = int64(1000), int64(1_000_000)

// bind returns a function that puts the result of a Spec constructor on st.
func bind(st *Store) func(*Spec, error) (store.Limiter, error) {
	return func(sp *Spec, err error) (store.Limiter, error) {
		if err != nil {
			return nil, err
		}
		return st.Limiter(sp), nil
	}
}

func repeat(n int, s step) []step {
	out := make([]step, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestDifferentialSeedVectors(t *testing.T) {
	for bname, st := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			run := 0
			fresh := func() string { run++; return fmt.Sprint("v", run) }

			// 200/s burst 400: 400 at t=0, the 401st waits 5 ms, full again after 2 s.
			tb, _ := limit.NewTokenBucket(limit.PerSecond(200), 400)
			lim, err := bind(st)(TokenBucket(fresh(), tb))
			if err != nil {
				t.Fatal(err)
			}
			steps := append(repeat(401, step{atUS: 1 * sec, cost: 1}), step{atUS: 1*sec + 5*ms, cost: 1})
			steps = append(steps, repeat(401, step{atUS: 3 * sec, cost: 1})...)
			differential(t, "token bucket 200/s", tb, lim, steps)

			// Stripe timeline: 100/s capacity 500.
			tb2, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
			lim2, _ := bind(st)(TokenBucket(fresh(), tb2))
			steps = append(repeat(501, step{atUS: 2 * sec, cost: 1}), step{atUS: 2*sec + 500*ms, cost: 50}, step{atUS: 2*sec + 500*ms, cost: 1})
			steps = append(steps, repeat(101, step{atUS: 4 * sec, cost: 1})...)
			steps = append(steps, step{atUS: 4 * sec, cost: 600}, step{atUS: 4 * sec, cost: 0}, step{atUS: 4*sec + 7, cost: 3, op: "refund"})
			steps = append(steps, step{atUS: 4*sec + 9, cost: 2}, step{atUS: 3 * sec, cost: 1}) // clock step back
			differential(t, "token bucket 100/s", tb2, lim2, steps)

			// redis-cell's table (limit 5, 1/s) on GCRA.
			g, _ := limit.NewGCRA(limit.PerSecond(1), 5)
			lg, _ := bind(st)(GCRA(fresh(), g))
			base := 10 * sec
			differential(t, "gcra redis-cell", g, lg, []step{
				{atUS: base, cost: 6, op: ""}, {atUS: base, cost: 1, op: ""}, {atUS: base, cost: 1, op: ""}, {atUS: base, cost: 1, op: ""}, {atUS: base, cost: 1, op: ""}, {atUS: base, cost: 1, op: ""}, {atUS: base, cost: 1, op: ""},
				{atUS: base + 3*sec, cost: 1, op: ""}, {atUS: base + 3100*ms, cost: 1, op: ""}, {atUS: base + 4*sec, cost: 1, op: ""}, {atUS: base + 8*sec, cost: 1, op: ""},
				{atUS: base + 9500*ms, cost: 1, op: ""}, {atUS: base + 9500*ms, cost: 2, op: ""}, {atUS: base + 9500*ms, cost: 5, op: ""}, {atUS: base + 9500*ms, cost: 3, op: ""},
				{atUS: base + 9500*ms, cost: 2, op: "refund"}, {atUS: base + 9500*ms, cost: 3, op: ""},
			})
			// A non-integral interval: 7 per 3 s.
			r, _ := limit.ParseRate("7/3s")
			g2, _ := limit.NewGCRA(r, 4)
			lg2, _ := bind(st)(GCRA(fresh(), g2))
			var steps2 []step
			for i := int64(0); i < 60; i++ {
				steps2 = append(steps2, step{atUS: base + i*123457, cost: i%3 + 1})
			}
			differential(t, "gcra 7/3s", g2, lg2, steps2)

			// seeds/004: 6 ms per request, queue 15; a 50 ms budget refuses a 54 ms wait.
			r6, _ := limit.NewRate(1, 6*time.Millisecond)
			lb, _ := limit.NewLeakyBucket(r6, 15)
			ll, _ := bind(st)(LeakyBucket(fresh(), lb))
			lsteps := repeat(17, step{atUS: base, cost: 1})
			lsteps = append(lsteps, step{atUS: base + 60*ms, cost: 1}, step{atUS: base + 60*ms, cost: 1, budget: 50_000_000},
				step{atUS: base + 60*ms, cost: 1, budget: 200_000_000}, step{atUS: base + 60*ms, cost: 17})
			differential(t, "leaky bucket", lb, ll, lsteps)

			sw, _ := limit.NewSlidingWindow(10, time.Second)
			lsw, _ := bind(st)(SlidingWindow(fresh(), sw))
			swSteps := repeat(12, step{atUS: base + 500*ms, cost: 1})
			swSteps = append(swSteps, repeat(3, step{atUS: base + 1250*ms, cost: 1})...)
			swSteps = append(swSteps, step{atUS: base + 1300*ms - 1, cost: 1}, step{atUS: base + 1300*ms, cost: 1},
				step{atUS: base + 1300*ms, cost: 1, op: "refund"}, step{atUS: base + 2100*ms, cost: 9}, step{atUS: base + 2100*ms, cost: 11})
			differential(t, "sliding window", sw, lsw, swSteps)

			fw, _ := limit.NewFixedWindow(3, time.Second)
			lf, _ := bind(st)(FixedWindow(fresh(), fw))
			differential(t, "fixed window", fw, lf, []step{
				{atUS: base + 100*ms, cost: 1, op: ""}, {atUS: base + 200*ms, cost: 2, op: ""}, {atUS: base + 300*ms, cost: 1, op: ""}, {atUS: base + 999*ms, cost: 4, op: ""},
				{atUS: base + 1000*ms, cost: 3, op: ""}, {atUS: base + 1500*ms, cost: 2, op: "refund"}, {atUS: base + 1600*ms, cost: 2, op: ""}, {atUS: base + 2500*ms, cost: 0, op: ""},
			})
		})
	}
}

// Random sequences (rates, bursts, costs, gaps, refunds, clock steps back)
// give the same results on memory and on Redis.
func TestDifferentialRandom(t *testing.T) {
	st := backends(t)["standalone"]
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		tokens := rapid.Int64Range(1, 500).Draw(rt, "tokens")
		per := rapid.SampledFrom([]time.Duration{time.Millisecond, time.Second, 3 * time.Second, time.Minute}).Draw(rt, "per")
		rate, _ := limit.NewRate(tokens, per)
		burst := rapid.Int64Range(1, 50).Draw(rt, "burst")
		var steps []step
		now := 5 * sec
		for range rapid.IntRange(1, 60).Draw(rt, "steps") {
			now += rapid.Int64Range(-2000, int64(per)/1000/tokens*burst).Draw(rt, "gap")
			now = max(now, 1)
			op := ""
			if rapid.IntRange(0, 8).Draw(rt, "refund") == 0 {
				op = "refund"
			}
			steps = append(steps, step{atUS: now, cost: rapid.Int64Range(0, burst+1).Draw(rt, "cost"), op: op})
		}
		tb, _ := limit.NewTokenBucket(rate, burst)
		g, _ := limit.NewGCRA(rate, burst)
		lt, err := bind(st)(TokenBucket(fmt.Sprint("rt", n), tb))
		if err != nil {
			rt.Skip(err)
		}
		lg, err := bind(st)(GCRA(fmt.Sprint("rg", n), g))
		if err != nil {
			rt.Skip(err)
		}
		differential(rt, "token bucket", tb, lt, steps)
		differential(rt, "gcra", g, lg, steps)
		if win := time.Duration(burst) * per / time.Duration(tokens); win >= time.Millisecond && win%time.Microsecond == 0 {
			sw, _ := limit.NewSlidingWindow(burst, win)
			if ls, err := bind(st)(SlidingWindow(fmt.Sprint("rs", n), sw)); err == nil {
				differential(rt, "sliding window", sw, ls, steps)
			}
			fw, _ := limit.NewFixedWindow(burst, win)
			lf, _ := bind(st)(FixedWindow(fmt.Sprint("rf", n), fw))
			differential(rt, "fixed window", fw, lf, steps)
			sl, _ := limit.NewSlidingLog(burst, win)
			lsl, _ := bind(st)(SlidingLog(fmt.Sprint("rsl", n), sl))
			differential(rt, "sliding log", sl, lsl, steps)
		}
		lb, _ := limit.NewLeakyBucket(rate, burst)
		if ll, err := bind(st)(LeakyBucket(fmt.Sprint("rl", n), lb)); err == nil {
			budgeted := slices.Clone(steps)
			for i := range budgeted {
				if i%3 == 0 {
					budgeted[i].budget = rapid.Int64Range(1, int64(lb.Window())+2).Draw(rt, "budget")
				}
			}
			differential(rt, "leaky bucket", lb, ll, budgeted)
		}
	})
}

// 8 clients × 64 goroutines on one key admit exactly the limit: no lost
// update (the read-modify-write race of seeds/002).
func TestAtomicityNoLostUpdates(t *testing.T) {
	for bname, st := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			const limitN = 1000
			tb, _ := limit.NewTokenBucket(mustRate("1/h"), limitN)
			var admitted atomic.Int64
			var wg sync.WaitGroup
			for c := range 8 {
				cs, err := New(Options{Addrs: st.opts.Addrs, Timeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer cs.Close()
				lim, _ := bind(cs)(TokenBucket("atomic-"+bname, tb))
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 40 { // 8×64×40 = 20,480 attempts for 1,000 tokens
							r, _, err := lim.Take(context.Background(), "hot", 0, 1, 0)
							if err != nil {
								t.Error(c, err)
								return
							}
							if r.OK() {
								admitted.Add(1)
							}
						}
					}()
				}
			}
			wg.Wait()
			if admitted.Load() != limitN {
				t.Fatalf("admitted %d, want exactly %d", admitted.Load(), limitN)
			}
		})
	}
}

func mustRate(s string) limit.Rate {
	r, err := limit.ParseRate(s)
	if err != nil {
		panic(err)
	}
	return r
}

// Differential for the memory counterpart used as local fallback.
var _ store.Limiter = (*memory.Keyed[limit.TokenBucketState, *limit.TokenBucket])(nil)

// Permit ids leave bit 63 to gates (it marks fallback permits).
func TestPermitIDsLeaveBit63(t *testing.T) {
	for range 10_000 {
		if h := newPermit(); h == 0 || h>>63 != 0 {
			t.Fatalf("permit %x", uint64(h))
		}
	}
}

// A foreign or corrupted value under a limiter's key (another program's
// data, a truncated write) is read as fresh state: the script answers at
// once — a script that spun on it would block Redis for every client — and
// the decision is the one of an unused key.
func TestCorruptStateReadsFresh(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(10), 20)
	g, _ := limit.NewGCRA(limit.PerSecond(10), 20)
	lb, _ := limit.NewLeakyBucket(limit.PerSecond(10), 5)
	ltb, _ := bind(st)(TokenBucket("tb", tb))
	lg, _ := bind(st)(GCRA("gcra", g))
	llb, _ := bind(st)(LeakyBucket("leaky", lb))
	nan := string(slices.Repeat([]byte{0xff}, 16))
	huge := packDoubles(0, 0)[:0] + string(slices.Repeat([]byte{0x7f, 0xef, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 2)) // big-endian 1.8e308 bytes, read little-endian
	for _, raw := range []string{nan, huge, string(make([]byte, 16)) + "x", "not ours", packDoubles(1<<53, 1<<53),
		"\x00\x00\x00\x00\x00\x00\xf0\x7f\x00\x00\x00\x00\x00\x00\xf0\x7f" /* +Inf, +Inf */, "\x00\x00\x00\x00\x00\x00\xf0\xff\x00\x00\x00\x00\x00\x00\xf0\xff" /* -Inf */} {
		for name, lim := range map[string]store.Limiter{"tb": ltb, "gcra": lg, "leaky": llb} {
			key := st.key(name, "k")
			if err := st.client.Do(context.Background(), st.client.B().Set().Key(key).Value(raw).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, _, err := lim.Take(ctx, "k", 0, 1, 0)
			cancel()
			if err != nil {
				t.Fatalf("%s on %q: %v", name, raw, err)
			}
			if !r.OK() || r.Wait != 0 {
				t.Fatalf("%s on %q: %+v, want the fresh state's admission", name, raw, r)
			}
		}
	}
}
