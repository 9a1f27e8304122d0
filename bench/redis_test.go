package bench

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice/internal/redistest"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// Decisions against one local Redis with 64 concurrent callers
// (RunParallel with 32 goroutines per GOMAXPROCS on 2 cores), each caller
// on its own tenant key. ns/op is wall time per decision, so decisions/s =
// 1e9 / ns/op (also reported as dec/s).

const redisCallers = 64

func runRedis(b *testing.B, decide func(ctx context.Context, key string) bool) {
	b.SetParallelism(max(redisCallers/runtime.GOMAXPROCS(0), 1))
	var next atomic.Int64
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		key := "tenant-" + strconv.FormatInt(next.Add(1), 10)
		for pb.Next() {
			if !decide(ctx, key) {
				b.Error("denied: the benchmark measures admitted decisions")
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "dec/s")
}

// benchSluice runs sluice's token bucket through store/redis with opts
// against a fresh local Redis.
func benchSluice(b *testing.B, opts sredis.Options) {
	srv := redistest.Start(b)
	opts.Addrs, opts.Timeout = []string{srv.Addr}, time.Second
	st, err := sredis.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	lim, _ := st.TokenBucket("bench", bucket(b))
	runRedis(b, func(ctx context.Context, key string) bool {
		r, _, err := lim.Take(ctx, key, 0, 1, 0)
		return err == nil && r.OK()
	})
}

// BenchmarkRedisSluice: sluice's token bucket through store/redis as
// configured by default: rueidis (auto-pipelined), concurrent decisions
// batched into shared script calls, timeout and breaker.
func BenchmarkRedisSluice(b *testing.B) { benchSluice(b, sredis.Options{}) }

// BenchmarkRedisSluiceNoBatch: the same, every decision its own script
// call (Options.Batch 1): what batching adds, and the rueidis side of the
// client comparison below.
func BenchmarkRedisSluiceNoBatch(b *testing.B) { benchSluice(b, sredis.Options{Batch: 1}) }

// BenchmarkRedisSluiceScriptGoRedis: the same script through go-redis/v9
// (connection pool, no auto-pipelining): the client comparison.
func BenchmarkRedisSluiceScriptGoRedis(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: redisCallers})
	defer rdb.Close()
	src, argv := sredis.TokenBucketScript(bucket(b), 1)
	script := goredis.NewScript(src)
	args := make([]any, len(argv))
	for i, a := range argv {
		args[i] = a
	}
	runRedis(b, func(ctx context.Context, key string) bool {
		v, err := script.Run(ctx, rdb, []string{"sluice:{bench:" + key + "}"}, args...).Int64Slice()
		return err == nil && v[0] == 0
	})
}

// BenchmarkRedisRate: go-redis/redis_rate v10 (GCRA in Lua), the peer.
func BenchmarkRedisRate(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: redisCallers})
	defer rdb.Close()
	lim := redis_rate.NewLimiter(rdb)
	l := redis_rate.Limit{Rate: 1_000_000_000, Burst: 1_000_000_000, Period: time.Second}
	runRedis(b, func(ctx context.Context, key string) bool {
		r, err := lim.Allow(ctx, key, l)
		return err == nil && r.Allowed > 0
	})
}
