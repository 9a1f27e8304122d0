package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) {
	// rueidis' cluster client may leave a topology refresh sleeping for a
	// few seconds after Close; it ends on its own and holds nothing of ours.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
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
	atUS int64 // microseconds
	cost int64
	op   string // "take" (default) or "refund"
}

// differential runs the steps on a Go algorithm over memory state and on a
// Redis limiter with the same clock, and requires identical results.
func differential[S any](t *testing.T, name string, alg limit.Algorithm[S], lim store.Limiter, steps []step) {
	t.Helper()
	var state S
	var now int64
	lim.(*limiter).now = func() int64 { return now }
	ctx := context.Background()
	for i, st := range steps {
		now = st.atUS
		if st.op == "refund" {
			alg.Refund(&state, now*1000, st.cost)
			if err := lim.Refund(ctx, "k", 1, 0, st.cost); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want := alg.Take(&state, now*1000, st.cost)
		got, _, err := lim.Take(ctx, "k", 0, st.cost, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want.Status || got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter || got.ResetAfter != want.ResetAfter {
			t.Fatalf("%s step %d (t=%dµs cost %d):\n redis  %+v\n memory %+v", name, i, st.atUS, st.cost, got, want)
		}
	}
}

const ms, sec = int64(1000), int64(1_000_000)

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
			lim, err := st.TokenBucket(fresh(), tb)
			if err != nil {
				t.Fatal(err)
			}
			steps := append(repeat(401, step{atUS: 1 * sec, cost: 1}), step{atUS: 1*sec + 5*ms, cost: 1})
			steps = append(steps, repeat(401, step{atUS: 3 * sec, cost: 1})...)
			differential(t, "token bucket 200/s", tb, lim, steps)

			// Stripe timeline: 100/s capacity 500.
			tb2, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
			lim2, _ := st.TokenBucket(fresh(), tb2)
			steps = append(repeat(501, step{atUS: 2 * sec, cost: 1}), step{atUS: 2*sec + 500*ms, cost: 50}, step{atUS: 2*sec + 500*ms, cost: 1})
			steps = append(steps, repeat(101, step{atUS: 4 * sec, cost: 1})...)
			steps = append(steps, step{atUS: 4 * sec, cost: 600}, step{atUS: 4 * sec, cost: 0}, step{atUS: 4*sec + 7, cost: 3, op: "refund"})
			steps = append(steps, step{atUS: 4*sec + 9, cost: 2}, step{atUS: 3 * sec, cost: 1}) // clock step back
			differential(t, "token bucket 100/s", tb2, lim2, steps)

			// redis-cell's table (limit 5, 1/s) on GCRA.
			g, _ := limit.NewGCRA(limit.PerSecond(1), 5)
			lg, _ := st.GCRA(fresh(), g)
			base := 10 * sec
			differential(t, "gcra redis-cell", g, lg, []step{
				{base, 6, ""}, {base, 1, ""}, {base, 1, ""}, {base, 1, ""}, {base, 1, ""}, {base, 1, ""}, {base, 1, ""},
				{base + 3*sec, 1, ""}, {base + 3100*ms, 1, ""}, {base + 4*sec, 1, ""}, {base + 8*sec, 1, ""},
				{base + 9500*ms, 1, ""}, {base + 9500*ms, 2, ""}, {base + 9500*ms, 5, ""}, {base + 9500*ms, 3, ""},
				{base + 9500*ms, 2, "refund"}, {base + 9500*ms, 3, ""},
			})
			// A non-integral interval: 7 per 3 s.
			r, _ := limit.ParseRate("7/3s")
			g2, _ := limit.NewGCRA(r, 4)
			lg2, _ := st.GCRA(fresh(), g2)
			var steps2 []step
			for i := int64(0); i < 60; i++ {
				steps2 = append(steps2, step{atUS: base + i*123457, cost: i%3 + 1})
			}
			differential(t, "gcra 7/3s", g2, lg2, steps2)

			fw, _ := limit.NewFixedWindow(3, time.Second)
			lf, _ := st.FixedWindow(fresh(), fw)
			differential(t, "fixed window", fw, lf, []step{
				{base + 100*ms, 1, ""}, {base + 200*ms, 2, ""}, {base + 300*ms, 1, ""}, {base + 999*ms, 4, ""},
				{base + 1000*ms, 3, ""}, {base + 1500*ms, 2, "refund"}, {base + 1600*ms, 2, ""}, {base + 2500*ms, 0, ""},
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
		lt, err := st.TokenBucket(fmt.Sprint("rt", n), tb)
		if err != nil {
			rt.Skip(err)
		}
		lg, err := st.GCRA(fmt.Sprint("rg", n), g)
		if err != nil {
			rt.Skip(err)
		}
		differentialRapid(rt, tb, lt, steps)
		differentialRapid(rt, g, lg, steps)
	})
}

func differentialRapid[S any](t *rapid.T, alg limit.Algorithm[S], lim store.Limiter, steps []step) {
	var state S
	var now int64
	lim.(*limiter).now = func() int64 { return now }
	ctx := context.Background()
	for i, st := range steps {
		now = st.atUS
		if st.op == "refund" {
			alg.Refund(&state, now*1000, st.cost)
			lim.Refund(ctx, "k", 1, 0, st.cost)
			continue
		}
		want := alg.Take(&state, now*1000, st.cost)
		got, _, err := lim.Take(ctx, "k", 0, st.cost, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got.Status != want.Status || got.Remaining != want.Remaining || got.RetryAfter != want.RetryAfter || got.ResetAfter != want.ResetAfter {
			t.Fatalf("step %d (t=%dµs cost %d):\n redis  %+v\n memory %+v", i, st.atUS, st.cost, got, want)
		}
	}
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
				lim, _ := cs.TokenBucket("atomic-"+bname, tb)
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
