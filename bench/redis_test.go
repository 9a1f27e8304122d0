package bench

import (
	"context"
	"encoding/binary"
	"math"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
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

// sluiceBucket returns sluice's token bucket through store/redis with
// opts against a fresh local Redis, and its store (closed with b). The
// timeout is 200 ms, not the default 50: headroom for a busy machine, and
// still within what the store's lanes take (a longer timeout sends every
// call through the pipelined client).
func sluiceBucket(b *testing.B, opts sredis.Options) (store.Limiter, *sredis.Store) {
	return sluiceOn(b, redistest.Start(b).Addr, opts)
}

// sluiceOn is sluiceBucket on the Redis at addr.
func sluiceOn(b *testing.B, addr string, opts sredis.Options) (store.Limiter, *sredis.Store) {
	opts.Addrs, opts.Timeout = []string{addr}, 200*time.Millisecond
	st, err := sredis.New(opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	sp, err := sredis.SpecOf("bench", redisBucket(b))
	if err != nil {
		b.Fatal(err)
	}
	return st.Limiter(sp), st
}

// benchSluice runs sluice's token bucket through store/redis with opts
// against a fresh local Redis.
func benchSluice(b *testing.B, opts sredis.Options) {
	lim, _ := sluiceBucket(b, opts)
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
	src, err := os.ReadFile("../store/redis/lua/tokenbucket.lua")
	if err != nil {
		b.Fatal(err)
	}
	script := goredis.NewScript(string(src))
	args := tokenBucketArgs(redisBucket(b), 1)
	runRedis(b, func(ctx context.Context, key string) bool {
		v, err := script.Run(ctx, rdb, []string{"sluice:{bench:" + key + "}"}, args...).Int64Slice()
		return err == nil && v[0] == 0
	})
}

// tokenBucketArgs is the ARGV of one take of tb's script with Redis time,
// as the script's header documents it: now override, op, cost, handle, and
// the fixed parameters packed as six little-endian doubles.
func tokenBucketArgs(tb *limit.TokenBucket, cost int64) []any {
	per, burst := int64(tb.Rate().Per()), tb.Limit()
	fixed := make([]byte, 0, 48)
	for _, v := range []int64{per, tb.Rate().Tokens(), burst * per, burst, int64(tb.Window()), max(2*tb.Window().Milliseconds(), 1000)} {
		fixed = binary.LittleEndian.AppendUint64(fixed, math.Float64bits(float64(v)))
	}
	return []any{"0", "take", strconv.FormatInt(cost, 10), "1", string(fixed)}
}

// BenchmarkRedisRate: go-redis/redis_rate v10 (GCRA in Lua), the peer.
func BenchmarkRedisRate(b *testing.B) {
	srv := redistest.Start(b)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: redisCallers})
	defer rdb.Close()
	lim := redis_rate.NewLimiter(rdb)
	runRedis(b, func(ctx context.Context, key string) bool {
		r, err := lim.Allow(ctx, key, redisRateLimit)
		return err == nil && r.Allowed > 0
	})
	peerWrote(b, rdb)
}

// redisPerSecond is the rate (and burst) of every Redis benchmark's
// limit, for sluice and the peer alike: far above what one key sees in a
// benchmark, so every decision is admitted, and low enough that the peer's
// arithmetic keeps one decision's increment. redis_rate holds its GCRA
// state as float seconds since 2017, about 3e8 now, to a precision of
// about 6e-8 s: at 1e9 per second the increment of 1e-9 s is lost, the
// state never moves and its script skips the SET (measured with INFO
// commandstats: no SET at all), doing a third less work than in any real
// use. At 1e6 per second both write their state on every decision.
const redisPerSecond = 1_000_000

// redisRateLimit is redisPerSecond as a redis_rate limit.
var redisRateLimit = redis_rate.Limit{Rate: redisPerSecond, Burst: redisPerSecond, Period: time.Second}

// redisBucket is redisPerSecond as sluice's token bucket.
func redisBucket(b *testing.B) *limit.TokenBucket {
	tb, err := limit.NewTokenBucket(limit.PerSecond(redisPerSecond), redisPerSecond)
	if err != nil {
		b.Fatal(err)
	}
	return tb
}

// peerWrote fails b unless the peer's script wrote the state of a key it
// decided on: a benchmark in which the peer skips its SET measures less
// than the peer does.
func peerWrote(b *testing.B, rdb *goredis.Client) {
	keys, err := rdb.Keys(context.Background(), "rate:*").Result()
	if err != nil || len(keys) == 0 {
		b.Fatalf("redis_rate wrote no state (%v): the benchmark's limit lets it skip its SET", err)
	}
}

// BenchmarkRedisLease: the same decisions through a lease gate whose lease
// of a global rate budget comes from the same local Redis (one script per
// refresh, in the background): every decision in process. Its ratio to
// BenchmarkRedisSluice is what leases buy over one script per decision.
func BenchmarkRedisLease(b *testing.B) {
	benchLease(b, lease.MaxGateRate)
}

// BenchmarkRedisLeaseOvershoot is BenchmarkRedisLease with a budget of
// 1,000,000 units/s, well below the demand: the admitted rate over the
// budget is the overshoot (the bound is 1 + burst/T: the local bucket of
// 100 ms over the run).
func BenchmarkRedisLeaseOvershoot(b *testing.B) {
	benchLease(b, 1_000_000)
}

func benchLease(b *testing.B, capacity int64) {
	srv := redistest.Start(b)
	st, err := sredis.New(sredis.Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	g, err := lease.NewGate("bench", lease.GateOptions{Budget: "bench", Client: "bench-1", Leaser: st,
		Allocator: lease.Allocator{Capacity: capacity, Lease: time.Second, Refresh: 250 * time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The first grant of a new budget comes after one lease time of
	// learning (meanwhile the gate spends its safe share); take one before
	// timing, then keep it fresh in the background.
	for {
		if _, err := g.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
		if st := g.ReportState(clock.Now()).(lease.GateState); st.Rate > 0 && !st.Learning {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	go g.Run(ctx)
	// A gate that starts before its traffic holds a lease sized to no
	// demand, and turns part of the first few hundred milliseconds of it
	// away while its refreshes catch up (its cold start); the admitted
	// share measured is the steady state's: one second of the same demand
	// first, untimed.
	warm, wg := time.Now().Add(time.Second), sync.WaitGroup{}
	for range redisCallers {
		wg.Go(func() {
			for time.Now().Before(warm) {
				r := sluice.Request{Cost: 1}
				if d, p := gatetest.Decide(ctx, g, &r, clock.Now()); d.Admitted {
					g.Release(&r, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
				}
			}
		})
	}
	wg.Wait()
	// Every decision counts (the demand soon outgrows any grant: rejected
	// decisions are decisions too); the admitted share is reported.
	var admitted atomic.Int64
	b.SetParallelism(max(redisCallers/runtime.GOMAXPROCS(0), 1))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := sluice.Request{Cost: 1}
		var d sluice.Decision // the gates write their verdicts here
		for pb.Next() {
			rr := r
			d = sluice.Decision{}
			p := g.Decide(ctx, &rr, clock.Now(), &d)
			if d.Admitted {
				admitted.Add(1)
				g.Release(&rr, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
			}
		}
	})
	secs := time.Since(start).Seconds()
	b.ReportMetric(float64(b.N)/secs, "dec/s")
	b.ReportMetric(100*float64(admitted.Load())/float64(b.N), "admitted%")
	if capacity < lease.MaxGateRate {
		b.ReportMetric(float64(admitted.Load())/secs/float64(capacity), "admitted/budget")
	}
}

// BenchmarkRedisLeaseSlots: a concurrency lease of 64 slots from the same
// local Redis: each decision takes a slot and its release gives it back,
// in process.
func BenchmarkRedisLeaseSlots(b *testing.B) {
	srv := redistest.Start(b)
	st, err := sredis.New(sredis.Options{Addrs: []string{srv.Addr}, Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	g, err := lease.NewConcurrency("bench", lease.GateOptions{Budget: "bench-slots", Client: "bench-1", Leaser: st,
		Allocator: lease.Allocator{Capacity: 64, Lease: time.Second, Refresh: 250 * time.Millisecond}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for {
		if _, err := g.Refresh(ctx); err != nil {
			b.Fatal(err)
		}
		if st := g.ReportState(clock.Now()).(lease.GateState); st.Rate > 0 && !st.Learning {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	go g.Run(ctx)
	var admitted atomic.Int64
	b.SetParallelism(max(redisCallers/runtime.GOMAXPROCS(0), 1))
	start := time.Now()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := sluice.Request{Cost: 1}
		var d sluice.Decision // the gates write their verdicts here
		for pb.Next() {
			rr := r
			d = sluice.Decision{}
			p := g.Decide(ctx, &rr, clock.Now(), &d)
			if d.Admitted {
				admitted.Add(1)
				g.Release(&rr, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: time.Microsecond})
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "dec/s")
	b.ReportMetric(100*float64(admitted.Load())/float64(b.N), "admitted%")
}
