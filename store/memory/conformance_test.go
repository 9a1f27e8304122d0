package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	"github.com/sluice-go/sluice/store/storetest"
)

// The memory store passes the conformance suite of every store.
func TestConformance(t *testing.T) { storetest.Run(t, backend(memory.Options{})) }

// A key dropped by a sweep (its state fresh at the sweep's instant) must not
// come back at an earlier time: a reading taken before the sweep and applied
// after it counts at the sweep's instant. Here a 1-per-second sliding log
// admits "a" at 11.5 s; a new key arriving at 12.6 s sweeps it from the full
// table; a delayed reading of 11.7 s admits "a" again, which must count at
// 12.6 s, so that "a" is refused at 12.7 s.
func TestStaleReadingAfterSweep(t *testing.T) {
	sl, _ := limit.NewSlidingLog(1, time.Second)
	k := memory.NewKeyed(sl, memory.Options{MaxKeys: 2, Shards: 1, SweepEvery: time.Nanosecond})
	ctx := context.Background()
	at := func(ms int64) clock.Instant { return clock.Instant(ms * int64(time.Millisecond)) }
	take := func(key string, ms int64) bool {
		r, _, _ := k.Take(ctx, key, at(ms), 1, 0)
		return r.OK()
	}
	if !take("a", 11500) || !take("b", 11500) {
		t.Fatal("first takes")
	}
	if !take("c", 12600) { // the table is full: this sweeps a and b
		t.Fatal("c after the sweep")
	}
	if !take("a", 11700) {
		t.Fatal("a's delayed reading: a fresh key")
	}
	if take("a", 12700) {
		t.Fatal("a admitted twice within 0.1 s of real time: the delayed reading counted before the sweep")
	}
}

// backend is the memory store with table options o.
func backend(o memory.Options) storetest.Backend {
	return storetest.Backend{New: func(alg any, _ func() clock.Instant) (store.Limiter, error) {
		switch a := alg.(type) {
		case *limit.TokenBucket:
			return memory.NewKeyed(a, o), nil
		case *limit.GCRA:
			return memory.NewKeyed(a, o), nil
		case *limit.FixedWindow:
			return memory.NewKeyed(a, o), nil
		case *limit.SlidingWindow:
			return memory.NewKeyed(a, o), nil
		case *limit.SlidingLog:
			return memory.NewKeyed(a, o), nil
		case *limit.LeakyBucket:
			return memory.NewKeyed(a, o), nil
		case *limit.Concurrency:
			return memory.NewKeyed(a, o), nil
		}
		return nil, fmt.Errorf("no algorithm %T", alg)
	}, Rebind: rebind}
}

// rebind is Keyed.WithAlgorithm for any algorithm of package limit.
func rebind(lim store.Limiter, alg any) (store.Limiter, error) {
	switch a := alg.(type) {
	case *limit.TokenBucket:
		return lim.(*memory.Keyed[limit.TokenBucketState, *limit.TokenBucket]).WithAlgorithm(a), nil
	case *limit.GCRA:
		return lim.(*memory.Keyed[limit.GCRAState, *limit.GCRA]).WithAlgorithm(a), nil
	case *limit.FixedWindow:
		return lim.(*memory.Keyed[limit.FixedWindowState, *limit.FixedWindow]).WithAlgorithm(a), nil
	case *limit.SlidingWindow:
		return lim.(*memory.Keyed[limit.SlidingWindowState, *limit.SlidingWindow]).WithAlgorithm(a), nil
	case *limit.SlidingLog:
		return lim.(*memory.Keyed[limit.SlidingLogState, *limit.SlidingLog]).WithAlgorithm(a), nil
	case *limit.LeakyBucket:
		return lim.(*memory.Keyed[limit.LeakyBucketState, *limit.LeakyBucket]).WithAlgorithm(a), nil
	case *limit.Concurrency:
		return lim.(*memory.Keyed[limit.ConcurrencyState, *limit.Concurrency]).WithAlgorithm(a), nil
	}
	return nil, fmt.Errorf("no algorithm %T", alg)
}
