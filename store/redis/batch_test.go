package redis

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// evalCalls returns how many script calls (EVALSHA + EVAL) srv has served.
func evalCalls(t *testing.T, st *Store) int64 {
	t.Helper()
	info, err := st.client.Do(context.Background(), st.client.B().Info().Section("commandstats").Build()).ToString()
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
			lim, _ := st.TokenBucket("batch-"+bname, tb)
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
	lim, _ := st.TokenBucket("off", tb)
	if lim.(*limiter).batch != nil {
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
		want, err := st.client.Do(context.Background(), st.client.B().ClusterKeyslot().Key(k).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if got := keySlot(k); int64(got) != want {
			t.Errorf("keySlot(%q) = %d, Redis says %d", k, got, want)
		}
	}
}
