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
			l := lim.(*limiter)
			key := fmt.Sprintf("%s-%d", name, round)
			// The batched store runs each step in a batch of two (the step
			// and a take on another key), so that the batch script runs:
			// a caller alone gets the single-step script.
			inPair := func(op string, cost int64) [5]int64 {
				c := &call{key: l.s.key(l.name, key), op: op, cost: cost, extra: "1", arrived: clock.Now(), done: make(chan struct{}, 1)}
				d := &call{key: l.s.key(l.name, key+"-other"), op: "take", cost: 1, extra: "1", arrived: clock.Now(), done: make(chan struct{}, 1)}
				l.batcher.exec([]*call{c, d})
				if c.err != nil {
					rt.Fatalf("%s: %s: %v", name, op, c.err)
				}
				return c.res
			}
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
					if name == "batched" && cost > 0 {
						inPair("refund", cost)
					} else if err := lim.Refund(context.Background(), key, 1, now, cost); err != nil {
						rt.Fatalf("%s step %d: refund: %v", name, i, err)
					}
					continue
				}
				want := fw.Take(&state, now, cost)
				var got limit.Result
				if name == "batched" {
					v := inPair("take", cost)
					got = limit.Result{Status: limit.Status(v[0]), Remaining: v[1]}
				} else {
					var err error
					if got, _, err = lim.Take(context.Background(), key, now, cost, 0); err != nil {
						rt.Fatalf("%s step %d: take: %v", name, i, err)
					}
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

// A Counter refuses what a fixed window at MaxCount refuses, batched or
// alone: a cost above the limit, a take past it.
func TestCounterRefusesPastMaxCount(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	l := st.Limiter(must(Counter("count", must(limit.NewFixedWindow(MaxCount, time.Hour))))).(*limiter)
	batch := func(costs ...int64) []*call {
		var b []*call
		for i, c := range costs {
			b = append(b, &call{key: st.key("count", fmt.Sprintf("k%d", i)), op: "take", cost: c, extra: "1", arrived: clock.Now(), done: make(chan struct{}, 1)})
		}
		l.batcher.exec(b)
		return b
	}
	for _, size := range []int{1, 2} {
		costs := []int64{MaxCount + 1, 1}[:size]
		if b := batch(costs...); b[0].err != nil || limit.Status(b[0].res[0]) != limit.Exceeded {
			t.Errorf("batch of %d: cost MaxCount+1: %v %v, want exceeded", size, b[0].res[:2], b[0].err)
		}
	}
	batch(MaxCount) // k0 full
	if b := batch(1, 1); limit.Status(b[0].res[0]) != limit.Denied || b[1].res[0] != 0 {
		t.Errorf("a take past MaxCount in a batch: %v, want denied (and the other key's take allowed: %v)", b[0].res[:2], b[1].res[:2])
	}
}

// A foreign hash whose count is not an integer does not fail a take: the
// step counts it as 0 and writes the state over it, batched or alone, as
// before fixed windows added within their window with HINCRBY.
func TestFixedWindowOverwritesAForeignCount(t *testing.T) {
	srv := redistest.Start(t)
	clk := fakeclock.New(int64(1_700_000_000 * time.Second))
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 5 * time.Second, DecisionClock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	win := time.Hour
	ws := int64(clk.Now()) / 1000 / win.Microseconds() * win.Microseconds()
	for _, c := range []string{"abc", "1.5"} {
		for name, sp := range map[string]*Spec{"fixed window": must(fixedWindowSpec("fw", must(limit.NewFixedWindow(10, win)))),
			"counter": must(Counter("cnt", must(limit.NewFixedWindow(MaxCount, win))))} {
			l := st.Limiter(sp).(*limiter)
			k := st.key(l.name, "k"+c)
			srv.Do("HSET", k, "s", fmt.Sprint(ws), "c", c)
			b := []*call{{key: k, op: "take", cost: 1, extra: "1", arrived: clock.Now(), done: make(chan struct{}, 1)},
				{key: st.key(l.name, "other"), op: "take", cost: 1, extra: "1", arrived: clock.Now(), done: make(chan struct{}, 1)}}
			l.batcher.exec(b[:1]) // alone: the single-step script
			if b[0].err != nil || b[0].res[0] != 0 {
				t.Errorf("%s, c=%q, alone: %v %v", name, c, b[0].res, b[0].err)
			}
			srv.Do("HSET", k, "c", c)
			b[0].err, b[0].res = nil, [5]int64{}
			l.batcher.exec(b) // in a batch
			if b[0].err != nil || b[0].res[0] != 0 {
				t.Errorf("%s, c=%q, batched: %v %v", name, c, b[0].res, b[0].err)
			}
		}
	}
}
