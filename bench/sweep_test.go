package bench

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/internal/redistest"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// BenchmarkRedisSweep: decisions per second and latency on one local
// Redis at 1, 4, 16, 64 and 256 concurrent callers (each on its own
// tenant key, one decision in flight each), for sluice's token bucket as
// configured by default, the same without batching (Options.Batch 1) and
// with the client's former 100 µs flush delay (Options.FlushDelay), the
// peer go-redis/redis_rate v10 (its pool as large as the callers), and a
// bare PING through sluice's own client: the round trip no decision can
// beat. One Redis per benchmark; ns/op is wall time per decision, so
// dec/s = 1e9 / ns/op; µs/dec is the mean latency one caller sees.
//
//	go test -run '^$' -bench RedisSweep -count 5 . | go run ./ratio -sweep
func BenchmarkRedisSweep(b *testing.B) {
	for _, callers := range []int{1, 4, 16, 64, 256} {
		b.Run("callers="+strconv.Itoa(callers), func(b *testing.B) {
			b.Run("sluice", func(b *testing.B) { sweepSluice(b, callers, sredis.Options{}, false) })
			b.Run("sluice-nobatch", func(b *testing.B) { sweepSluice(b, callers, sredis.Options{Batch: 1}, false) })
			b.Run("sluice-flush100us", func(b *testing.B) {
				sweepSluice(b, callers, sredis.Options{FlushDelay: 100 * time.Microsecond}, false)
			})
			b.Run("redis_rate", func(b *testing.B) { sweepRedisRate(b, callers) })
			b.Run("ping", func(b *testing.B) { sweepSluice(b, callers, sredis.Options{}, true) })
		})
	}
}

// sweep runs b.N decisions split over callers goroutines, each with its
// own key, and reports dec/s and the mean latency per decision.
func sweep(b *testing.B, callers int, decide func(ctx context.Context, key string) bool) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Bool
	ctx := context.Background()
	b.ResetTimer()
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "tenant-" + strconv.Itoa(c)
			for next.Add(1) <= int64(b.N) {
				if !decide(ctx, key) {
					failed.Store(true)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if failed.Load() {
		b.Fatal("a decision failed or was denied: the sweep measures admitted decisions")
	}
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "dec/s")
	b.ReportMetric(float64(callers)*elapsed.Seconds()*1e6/float64(b.N), "µs/dec")
}

func sweepSluice(b *testing.B, callers int, opts sredis.Options, ping bool) {
	lim, st := sluiceBucket(b, opts)
	warm := func(ctx context.Context, key string) bool { // connected, the script loaded
		r, _, err := lim.Take(ctx, key, 0, 1, 0)
		return err == nil && r.OK()
	}
	for i := 0; !warm(context.Background(), "warm"); i++ {
		if i == 100 {
			b.Fatal("Redis not reachable")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ping {
		sweep(b, callers, func(ctx context.Context, _ string) bool { return st.Ping(ctx) == nil })
		return
	}
	sweep(b, callers, warm)
}

func sweepRedisRate(b *testing.B, callers int) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: callers})
	defer rdb.Close()
	lim := redis_rate.NewLimiter(rdb)
	sweep(b, callers, func(ctx context.Context, key string) bool {
		r, err := lim.Allow(ctx, key, redisRateLimit)
		return err == nil && r.Allowed > 0
	})
	peerWrote(b, rdb)
}
