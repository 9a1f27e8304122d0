package redis

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// A Counter is a fixed window at MaxCount, step for step: the same status
// and remaining as limit.FixedWindow's on any takes (costs 0 to 5),
// refunds, and moves of the clock (forward by up to two windows, back
// within and beyond the clock tolerance), batched or not, on the
// DecisionClock.
func TestCounterMatchesFixedWindow(t *testing.T) {
	srv := redistest.Start(t)
	clk := fakeclock.New(int64(1_700_000_000 * time.Second))
	stores := map[string]*Store{}
	for name, batch := range map[string]int{"batched": 64, "unbatched": 1} {
		st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second, DecisionClock: clk, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		stores[name] = st
	}
	var round int
	rapid.Check(t, func(rt *rapid.T) {
		round++
		win := rapid.SampledFrom([]time.Duration{time.Second, time.Minute}).Draw(rt, "window")
		fw := must(limit.NewFixedWindow(MaxCount, win))
		for name, st := range stores {
			sp, err := Counter("count", fw)
			if err != nil {
				rt.Fatal(err)
			}
			lim := st.Limiter(sp)
			key := fmt.Sprintf("%s-%d", name, round)
			var state limit.FixedWindowState
			steps := rapid.IntRange(1, 30).Draw(rt, "steps")
			for i := range steps {
				switch rapid.IntRange(0, 5).Draw(rt, "move") {
				case 0:
					clk.Advance(time.Duration(rapid.Int64Range(0, int64(2*win)).Draw(rt, "forward")))
				case 1:
					clk.Advance(-time.Duration(rapid.Int64Range(0, int64(2*limit.ClockTolerance)).Draw(rt, "back")))
				}
				now := clk.Now()
				cost := rapid.Int64Range(0, 5).Draw(rt, "cost")
				if rapid.IntRange(0, 3).Draw(rt, "refund") == 0 {
					fw.Refund(&state, now, cost)
					if err := lim.Refund(context.Background(), key, 1, now, cost); err != nil {
						rt.Fatalf("%s step %d: refund: %v", name, i, err)
					}
					continue
				}
				want := fw.Take(&state, now, cost)
				got, _, err := lim.Take(context.Background(), key, now, cost, 0)
				if err != nil {
					rt.Fatalf("%s step %d: take: %v", name, i, err)
				}
				if got.Status != want.Status || got.Remaining != want.Remaining {
					rt.Fatalf("%s step %d (t=%v, cost %d): counter %v remaining %d, fixed window %v remaining %d",
						name, i, time.Duration(now), cost, got.Status, got.Remaining, want.Status, want.Remaining)
				}
			}
		}
	})
}

// Concurrent takes of one key, batched, are each counted once: the last
// count is the sum, and every answer's count is distinct.
func TestCounterConcurrentTakesCountOnce(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim := st.Limiter(must(Counter("count", must(limit.NewFixedWindow(MaxCount, time.Hour)))))
	const callers, each = 32, 50
	var mu sync.Mutex
	seen := map[int64]bool{}
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				r, _, err := lim.Take(context.Background(), "k", clock.Instant(0), 1, 0)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				seen[MaxCount-r.Remaining] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(seen) != callers*each {
		t.Fatalf("%d distinct counts for %d takes", len(seen), callers*each)
	}
	for c := int64(1); c <= callers*each; c++ {
		if !seen[c] {
			t.Fatalf("count %d never answered", c)
		}
	}
}

// A counter's limit must be MaxCount: below it, it would refuse.
func TestCounterRefusesALimit(t *testing.T) {
	if _, err := Counter("count", must(limit.NewFixedWindow(100, time.Second))); err == nil {
		t.Fatal("a counter with limit 100 was accepted")
	}
}
