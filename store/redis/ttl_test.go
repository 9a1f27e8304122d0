package redis

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// A key's TTL only collects garbage: it must never be shorter than the time
// until the state it holds is fresh, or Redis would forget a used quota
// (a leaky bucket at 1 per 10 s kept its key for 2 s). For every algorithm
// at every parameter shape the policy accepts, down to one per day, after
// every step, stale readings included, the key lives at least until the
// algorithm's own state is fresh.
func TestTTLOutlivesState(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		per := rapid.SampledFrom([]time.Duration{time.Millisecond, time.Second, 10 * time.Second, time.Minute, time.Hour, 24 * time.Hour}).Draw(rt, "per")
		rate := must(limit.NewRate(rapid.Int64Range(1, 20).Draw(rt, "tokens"), per))
		size := rapid.Int64Range(0, 20).Draw(rt, "burst or queue")
		win := time.Duration(max(size, 1)) * per
		n++
		name := fmt.Sprint("ttl", n)
		switch rapid.IntRange(0, 5).Draw(rt, "kind") {
		case 0:
			ttlCase(rt, st, name, must(limit.NewTokenBucket(rate, max(size, 1))))
		case 1:
			ttlCase(rt, st, name, must(limit.NewGCRA(rate, max(size, 1))))
		case 2:
			ttlCase(rt, st, name, must(limit.NewLeakyBucket(rate, size)))
		case 3:
			ttlCase(rt, st, name, must(limit.NewFixedWindow(max(size, 1), win)))
		case 4:
			ttlCase(rt, st, name, must(limit.NewSlidingWindow(max(size, 1), win)))
		case 5:
			ttlCase(rt, st, name, must(limit.NewSlidingLog(max(size, 1), win)))
		}
	})
}

func ttlCase[S any](rt *rapid.T, st *Store, name string, alg limit.Algorithm[S]) {
	sp, err := SpecOf(name, alg)
	if err != nil {
		return // beyond what Redis' doubles hold
	}
	lim := st.Limiter(sp).(*limiter)
	var at int64 = 3600e6 // µs
	lim.now = func() int64 { return at }
	var s S
	ctx := context.Background()
	span := max(int64(alg.Window()/time.Microsecond), 10)
	for range rapid.IntRange(1, 30).Draw(rt, "steps") {
		at += rapid.Int64Range(0, span/3).Draw(rt, "gap")
		if rapid.IntRange(0, 4).Draw(rt, "stale") == 0 {
			at -= rapid.Int64Range(0, limit.ClockTolerance.Microseconds()).Draw(rt, "late")
		}
		cost := rapid.Int64Range(1, max(alg.Limit(), 1)).Draw(rt, "cost")
		now := clock.Instant(at * 1000)
		want := alg.Take(&s, now, cost)
		got, _, err := lim.Take(ctx, "k", now, cost, 0)
		if err != nil {
			rt.Fatal(err)
		}
		if got != want {
			rt.Fatalf("%v: backend %+v, algorithm %+v", alg, got, want)
		}
		for _, key := range lim.keys("k") {
			ttl, err := st.rc().Do(ctx, st.rc().B().Pttl().Key(key).Build()).AsInt64()
			if err != nil {
				rt.Fatal(err)
			}
			switch {
			case ttl == -1:
				rt.Fatalf("%T: key %s has no TTL", alg, key)
			case ttl == -2 && !alg.Fresh(&s, now):
				rt.Fatalf("%T: key %s is gone while the state is not fresh: %+v", alg, key, s)
			case ttl >= 0 && !alg.Fresh(&s, now.Add(time.Duration(ttl)*time.Millisecond+50*time.Millisecond)):
				rt.Fatalf("%T %v: key %s expires in %v, before its state is fresh: %+v", alg, alg.Window(), key, time.Duration(ttl)*time.Millisecond, s)
			}
		}
	}
}

func must[A any](a A, err error) A {
	if err != nil {
		panic(err)
	}
	return a
}

// On Redis' own clock the token bucket renews its key's TTL once per half
// TTL instead of on every write (KEEPTTL otherwise): after every step,
// batched or alone, the key still lives at least the TTL every write used
// to set, and a state last written in an earlier half-TTL period (here
// faked: 3 s back, with a short expiry) is renewed.
func TestTokenBucketTTLOnRedisTime(t *testing.T) {
	srv := redistest.Start(t)
	for _, batch := range []int{1, 0} {
		st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second, Batch: batch})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		tb := must(limit.NewTokenBucket(limit.PerSecond(10), 10))
		sp := must(tokenBucketSpec(fmt.Sprint("ttlrt", batch), tb))
		lim := st.Limiter(sp).(*limiter)
		ctx := context.Background()
		want := ttlMs(tb.Window()) // what every write set before
		key := lim.keys("k")[0]
		pttl := func() int64 {
			t.Helper()
			ms, err := st.rc().Do(ctx, st.rc().B().Pttl().Key(key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			return ms
		}
		step := func(op string) {
			t.Helper()
			var err error
			if op == "take" {
				_, _, err = lim.Take(ctx, "k", 0, 1, 0)
			} else {
				err = lim.Refund(ctx, "k", 1, 0, 1)
			}
			if err != nil {
				t.Fatal(err)
			}
			if ms := pttl(); ms < want-20 { // 20 ms: the time between the step and the PTTL
				t.Fatalf("batch %d: after a %s the key expires in %d ms, want at least %d", batch, op, ms, want)
			}
		}
		for i := range 20 {
			step([]string{"take", "refund"}[i%3/2])
		}
		// A state from an earlier period with a short expiry left: the next
		// write renews it.
		tm, err := st.rc().Do(ctx, st.rc().B().Time().Build()).AsStrSlice()
		if err != nil {
			t.Fatal(err)
		}
		sec, _ := strconv.ParseInt(tm[0], 10, 64)
		us, _ := strconv.ParseInt(tm[1], 10, 64)
		old := sec*1e6 + us - 3e6
		if err := st.rc().Do(ctx, st.rc().B().Set().Key(key).Value(packDoubles(0, old)).Px(100*time.Millisecond).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		step("take")
		if err := st.rc().Do(ctx, st.rc().B().Set().Key(key).Value(packDoubles(0, old)).Px(100*time.Millisecond).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		step("refund")
	}
}
