package redis

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// evalCalls returns how many script calls (EVALSHA + EVAL) srv has served.
func evalCalls(t *testing.T, st *Store) int64 {
	t.Helper()
	info, err := st.rc().Do(context.Background(), st.rc().B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), cmd); ok {
				v, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				n += v
			}
		}
	}
	return n
}

// Concurrent decisions share script calls, and every step inside a batch
// is the sequential step it would be alone: on one key at one instant,
// the admitted decisions see remaining = burst-1, burst-2, ..., 0, each
// exactly once, and every later one is denied with the exact retry-after.
func TestBatchedStepsAreSequential(t *testing.T) {
	for bname, st := range backends(t) {
		t.Run(bname, func(t *testing.T) {
			const burst, callers = 100, 400
			tb, _ := limit.NewTokenBucket(limit.PerSecond(10), burst) // 100 ms per token
			lim, _ := bind(st)(tokenBucketSpec("batch-"+bname, tb))
			lim.(*limiter).now = func() int64 { return 5_000_000 } // one instant (µs)
			var srvBefore int64
			if bname == "standalone" {
				srvBefore = evalCalls(t, st)
			}
			var mu sync.Mutex
			var remaining []int64
			denied := 0
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					r, _, err := lim.Take(context.Background(), "hot", 0, 1, 0)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					defer mu.Unlock()
					if r.OK() {
						remaining = append(remaining, r.Remaining)
						return
					}
					denied++
					if r.RetryAfter != 100*time.Millisecond || r.Remaining != 0 {
						t.Errorf("denied with %+v, want retry-after 100ms, remaining 0", r)
					}
				}()
			}
			close(start)
			wg.Wait()
			slices.Sort(remaining)
			want := make([]int64, burst)
			for i := range want {
				want[i] = int64(i)
			}
			if !slices.Equal(remaining, want) || denied != callers-burst {
				t.Fatalf("admitted remaining %v (%d denied), want 0..%d once each", remaining, denied, burst-1)
			}
			if bname == "standalone" {
				calls := evalCalls(t, st) - srvBefore
				if calls >= callers {
					t.Fatalf("%d script calls for %d concurrent decisions: nothing was batched", calls, callers)
				}
				t.Logf("%d decisions in %d script calls", callers, calls)
			}
		})
	}
}

// With Batch 1 every decision is its own call.
func TestBatchOff(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Batch: 1, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(10), 5)
	lim, _ := bind(st)(tokenBucketSpec("off", tb))
	if lim.(*limiter).batcher != nil {
		t.Fatal("Batch: 1 still batches")
	}
	if r, _, err := lim.Take(context.Background(), "k", 0, 1, 0); err != nil || !r.OK() || r.Remaining != 4 {
		t.Fatal(r, err)
	}
}

// The slot function agrees with Redis Cluster's: CLUSTER KEYSLOT.
func TestKeySlot(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	st, err := New(Options{Addrs: cl.Addrs})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, k := range []string{"", "a", "foo", "sluice:{gate:tenant-1}", "{user1000}.following", "foo{}{bar}", "foo{{bar}}zap", "foo{bar}{zap}", "123456789"} {
		want, err := st.rc().Do(context.Background(), st.rc().B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, Redis says %d", k, got, want)
		}
	}
}

// Close while decisions run (and trip the breaker on a closed client)
// neither panics nor leaves a probe running.
func TestCloseWhileDeciding(t *testing.T) {
	srv := redistest.Start(t)
	for range 5 {
		st, err := New(Options{Addrs: []string{srv.Addr}, ProbeEvery: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		tb, _ := limit.NewTokenBucket(limit.PerSecond(1_000_000), 1_000_000)
		lim, _ := bind(st)(tokenBucketSpec("close", tb))
		var wg sync.WaitGroup
		var calls atomic.Int64
		stop := make(chan struct{})
		for i := range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					lim.Take(context.Background(), strconv.Itoa(i), 0, 1, 0)
					calls.Add(1)
				}
			}()
		}
		poll.Until(t, 10*time.Second, func() bool { return calls.Load() >= 100 }) // deciding on Redis
		st.Close()
		n := calls.Load()
		poll.Until(t, 10*time.Second, func() bool { return calls.Load() >= n+100 }) // and on the closed client
		close(stop)
		wg.Wait()
		st.probes.Wait()
	}
}

// A caller whose context has ended fails alone: its step does not run,
// and the breaker stays closed for everyone else.
func TestCancelledCallerDoesNotTrip(t *testing.T) {
	srv := redistest.Start(t)
	for _, batch := range []int{1, 64} {
		st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 5)
		c, _ := limit.NewConcurrency(5)
		lims := map[string]store.Limiter{}
		lims["bucket"], _ = bind(st)(tokenBucketSpec("ctx-bucket-"+strconv.Itoa(batch), tb))
		lims["concurrency"], _ = bind(st)(concurrencySpec("ctx-conc-"+strconv.Itoa(batch), c, time.Minute))
		for name, l := range lims {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if _, _, err := l.Take(ctx, "victim", 0, 1, 0); err == nil {
				t.Errorf("batch %d %s: a cancelled caller was answered", batch, name)
			}
			r, _, err := l.Take(context.Background(), "victim", 0, 1, 0)
			if err != nil || !r.OK() || r.Remaining != 4 {
				t.Errorf("batch %d %s: next caller got %+v, %v (want the cancelled step not to have run)", batch, name, r, err)
			}
			if st.open.Load() || st.Failures() != 0 {
				t.Errorf("batch %d %s: breaker open %v, failures %d after a cancelled caller", batch, name, st.open.Load(), st.Failures())
			}
		}
		st.Close()
	}
}

// An error reply about one key's data (a foreign value of another type)
// fails that decision only: the others of its batch are answered, and the
// breaker stays closed.
func TestForeignValueFailsOneDecision(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fw, _ := limit.NewFixedWindow(1000, time.Hour)
	lim, _ := bind(st)(fixedWindowSpec("foreign", fw))
	if err := st.rc().Do(context.Background(), st.rc().B().Set().Key(lim.(*limiter).stateKey("poison")).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var failed, poisonFailed atomic.Int64
	start := make(chan struct{})
	for g := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			k := "good" + strconv.Itoa(g)
			if g%16 == 5 {
				k = "poison"
			}
			_, _, err := lim.Take(context.Background(), k, 0, 1, 0)
			switch {
			case k == "poison" && err != nil:
				poisonFailed.Add(1)
			case err != nil:
				failed.Add(1)
				t.Log(err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if failed.Load() != 0 || poisonFailed.Load() != 4 || st.open.Load() {
		t.Fatalf("%d good decisions failed, %d of 4 poisoned failed, breaker open %v", failed.Load(), poisonFailed.Load(), st.open.Load())
	}
}

// Names that could make two limiters share keys, or move a key's hash
// tag, are refused.
func TestNamesThatWouldCollide(t *testing.T) {
	srv := redistest.Start(t)
	if _, err := New(Options{Addrs: []string{srv.Addr}, Prefix: "app{1}"}); err == nil {
		t.Fatal("prefix with braces accepted")
	}
	st, err := New(Options{Addrs: []string{srv.Addr}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 5)
	for _, name := range []string{"api:login", "a{b", "}", ""} {
		if _, err := tokenBucketSpec(name, tb); err == nil {
			t.Errorf("limiter name %q accepted", name)
		}
	}
}

// TestBatchBodiesLeaveTheirArguments: the batch script hands every step
// the same KEYS and ARGV tables, refilled (batchSource), which is sound
// only while no algorithm body assigns to them.
func TestBatchBodiesLeaveTheirArguments(t *testing.T) {
	assign := regexp.MustCompile(`\b(KEYS|ARGV)\s*\[[^\]]*\]\s*=[^=]`)
	for name, body := range map[string]string{"token bucket": tokenBucketLua, "gcra": gcraLua, "fixed window": fixedWindowLua,
		"leaky bucket": leakyBucketLua, "sliding window": slidingWindowLua, "common": commonLua} {
		if m := assign.FindString(body); m != "" {
			t.Errorf("%s: %q assigns to a script argument: batchSource must give each step its own tables", name, m)
		}
	}
}
