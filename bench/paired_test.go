package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	goredis "github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/internal/redistest"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// BenchmarkRedisPaired: the ratios of BenchmarkRedisSweep taken so that
// the machine's state cannot pick a winner. With few callers a decision's
// time is mostly the wake-ups of two idle processes (client and Redis),
// and on a shared VM those swing by 2× from one second to the next: two
// variants measured a second apart differ by more than the variants do.
// Here every variant runs on one Redis, in slices of pairedSlice each,
// one after the other in a rotating order, round after round (b.N rounds),
// and each ratio is the median of its per-round ratios: both sides of a
// ratio saw the same minute of the machine.
//
// Reported ratios (each > 1 means the first is faster): sluice/redis_rate
// (decisions/s of sluice's token bucket as configured by default over the
// peer go-redis/redis_rate v10's), batched/unbatched (sluice default over
// Options.Batch 1), ping/sluice (one caller's latency of a decision over
// that of a bare PING through the same client: the round trip no decision
// can beat), and same/same: the default against itself (a second variant
// that runs the very same limiter), whose distance from 1 is the noise
// of every other ratio. The log line of each caller count gives every
// ratio's interquartile range over the rounds.
//
//	go test -run '^$' -bench RedisPaired -benchtime 40x .
func BenchmarkRedisPaired(b *testing.B) {
	for _, callers := range []int{1, 4, 16, 64, 256} {
		b.Run("callers="+strconv.Itoa(callers), func(b *testing.B) { paired(b, callers) })
	}
}

// pairedSlice is how long one variant runs in one round.
const pairedSlice = 25 * time.Millisecond

// variant is one way of deciding, run by pairedRun. decide returns nil
// for an admitted decision, errDenied for a denied one, and the store's
// error for one that failed.
type variant struct {
	name   string
	decide func(ctx context.Context, key string) error
}

// errDenied: the benchmark measures admitted decisions, and its limits are
// far above what it sends; a denial means the set-up is wrong.
var errDenied = errors.New("denied")

// verdict is a decision's error for variant.decide.
func verdict(ok bool, err error) error {
	switch {
	case err != nil:
		return err
	case !ok:
		return errDenied
	}
	return nil
}

func paired(b *testing.B, callers int) {
	srv := redistest.Start(b)
	lim, st := sluiceOn(b, srv.Addr, sredis.Options{})
	unb, _ := sluiceOn(b, srv.Addr, sredis.Options{Batch: 1})
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr, PoolSize: callers})
	defer rdb.Close()
	rl := redis_rate.NewLimiter(rdb)
	vs := []variant{
		{"sluice", func(ctx context.Context, key string) error {
			r, _, err := lim.Take(ctx, key, 0, 1, 0)
			return verdict(r.OK(), err)
		}},
		{"nobatch", func(ctx context.Context, key string) error {
			r, _, err := unb.Take(ctx, key, 0, 1, 0)
			return verdict(r.OK(), err)
		}},
		{"redis_rate", func(ctx context.Context, key string) error {
			r, err := rl.Allow(ctx, key, redisRateLimit)
			return verdict(err == nil && r.Allowed > 0, err)
		}},
		{"ping", func(ctx context.Context, _ string) error { return st.Ping(ctx) }},
	}
	vs = append(vs, variant{"same", vs[0].decide})
	// Warm up: connections, scripts, lanes, every key's state.
	for i := 0; i < 100 && vs[0].decide(context.Background(), "warm") != nil; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	for _, v := range vs {
		pairedRun(b, callers, v, pairedSlice)
	}
	b.ResetTimer()
	rates := make([][]float64, len(vs)) // decisions/s per variant per round
	failed := make([]int64, len(vs))    // decisions that failed (a timeout), per variant
	for r := range b.N {
		for i := range vs {
			k := (i + r) % len(vs)
			rate, f := pairedRun(b, callers, vs[k], pairedSlice)
			rates[k] = append(rates[k], rate)
			failed[k] += f
		}
	}
	b.StopTimer()
	peerWrote(b, rdb)
	for i, v := range vs {
		b.ReportMetric(quantile(rates[i], 0.5), v.name+"-dec/s")
		if failed[i] > 0 {
			// Counted, not fatal: one decision that timed out while the
			// host stalled says nothing of the others.
			b.ReportMetric(float64(failed[i]), v.name+"-failed")
		}
	}
	spread := ""
	for _, r := range []struct {
		name string
		x, y int
	}{{"sluice/redis_rate", 0, 2}, {"batched/unbatched", 0, 1}, {"ping/sluice", 3, 0}, {"same/same", 4, 0}} {
		q := make([]float64, len(rates[r.x])) // per round: rates[x]/rates[y]
		for i := range q {
			q[i] = rates[r.x][i] / rates[r.y][i]
		}
		b.ReportMetric(quantile(q, 0.5), r.name)
		spread += fmt.Sprintf(" %s %.3f–%.3f", r.name, quantile(q, 0.25), quantile(q, 0.75))
	}
	b.Logf("%d callers, %d rounds, interquartile ranges:%s", callers, b.N, spread)
}

// pairedRun runs v with callers goroutines, each on its own key with one
// decision in flight, for about d, and returns its admitted decisions per
// second and how many failed (the store's error: counted, not fatal). A
// denial stops the benchmark: its limits are far above what it sends.
func pairedRun(b *testing.B, callers int, v variant, d time.Duration) (float64, int64) {
	var done, failures atomic.Int64
	var stop atomic.Bool
	var denied atomic.Bool
	var wg sync.WaitGroup
	ctx := context.Background()
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "tenant-" + strconv.Itoa(c)
			for !stop.Load() {
				switch err := v.decide(ctx, key); {
				case errors.Is(err, errDenied):
					denied.Store(true)
					return
				case err != nil:
					failures.Add(1)
				default:
					done.Add(1)
				}
			}
		}()
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	if denied.Load() {
		b.Fatalf("%s: a decision was denied: the benchmark measures admitted decisions", v.name)
	}
	return float64(done.Load()) / elapsed.Seconds(), failures.Load()
}

// quantile returns the q-quantile of v (0.5: the median), interpolated
// between the two nearest values.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	x := q * float64(len(s)-1)
	i := int(x)
	if i+1 >= len(s) {
		return s[len(s)-1]
	}
	return s[i] + (x-float64(i))*(s[i+1]-s[i])
}

// BenchmarkRedisSoloLatency: one caller's decision latency against a bare
// PING through the same client, paired op by op. Throughput over a slice
// (BenchmarkRedisPaired's callers=1) counts a slice's stalls against
// whichever variant ran in it, and one VM stall of a few ms in a slice of
// 25 ms moves its ratio by a tenth or more. Here one goroutine runs a PING,
// a decision and a floor script (below) b.N times each, in an order that
// rotates from one iteration to the next, timing each, so that every
// decision has a PING beside it, within a few hundred µs of the same
// machine state. Reported: the median latency of each (ns), the ratios of
// the medians, the median of the per-iteration decision/PING ratios, the
// 90th percentiles, and the Redis time of a decision's script and of the
// floor's (INFO commandstats over the timed loop).
//
// The floor is what any script-based limiter on Redis pays at least: an
// EVALSHA that reads Redis' clock (TIME), reads one key (GET) and writes it
// back (SET ... KEEPTTL), and answers one integer, sent on a dedicated
// rueidis connection as the store sends a lone caller's decisions. What a decision costs above it is its
// arithmetic, its encoding and the store's own code.
//
//	go test -run '^$' -bench RedisSoloLatency -benchtime 20000x .
func BenchmarkRedisSoloLatency(b *testing.B) {
	srv := redistest.Start(b)
	lim, st := sluiceOn(b, srv.Addr, sredis.Options{})
	ctx := context.Background()
	fc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer fc.Close()
	// A dedicated connection, as the store's calls take when one caller
	// is alone (store/redis/lanes.go).
	dc, release := fc.Dedicate()
	defer release()
	sha, err := dc.Do(ctx, dc.B().ScriptLoad().Script(floorLua).Build()).ToString()
	if err != nil {
		b.Fatal(err)
	}
	floor := dc.B().Evalsha().Sha1(sha).Numkeys(1).Key("floor").Build().Pin()
	// Each op answers its error: a call that failed (timed out while the
	// host stalled) is counted, and its iteration left out of the
	// latencies, instead of ending the run.
	ops := [3]func() error{
		func() error { // a decision
			r, _, err := lim.Take(ctx, "solo", 0, 1, 0)
			if err == nil && !r.OK() {
				b.Fatalf("decision: %v: the benchmark's limit is far above what it sends", r)
			}
			return err
		},
		func() error { return st.Ping(ctx) },              // a PING
		func() error { return dc.Do(ctx, floor).Error() }, // the floor
	}
	for range 1000 { // connections, the scripts, the keys' state
		for _, op := range ops {
			op()
		}
	}
	var lat [3][]float64 // decision, PING, floor
	for k := range lat {
		lat[k] = make([]float64, 0, b.N)
	}
	per := make([]float64, 0, b.N)
	stats := goredis.NewClient(&goredis.Options{Addr: srv.Addr})
	defer stats.Close()
	before := commandStats(b, stats)
	failed := 0
	b.ResetTimer()
	for i := range b.N {
		var took [3]time.Duration
		var err error
		for j := range 3 {
			k := (i + j) % 3
			t0 := time.Now()
			if e := ops[k](); e != nil {
				err = e
			}
			took[k] = time.Since(t0)
		}
		if err != nil {
			failed++
			continue
		}
		for k := range lat {
			lat[k] = append(lat[k], float64(took[k]))
		}
		per = append(per, float64(took[0])/float64(took[1]))
	}
	b.StopTimer()
	if failed > 0 {
		b.ReportMetric(float64(failed), "failed")
	}
	dec, pin, flo := quantile(lat[0], 0.5), quantile(lat[1], 0.5), quantile(lat[2], 0.5)
	b.ReportMetric(dec, "decision-ns")
	b.ReportMetric(pin, "ping-ns")
	b.ReportMetric(flo, "floor-ns")
	b.ReportMetric(dec/pin, "decision/ping")
	b.ReportMetric(flo/pin, "floor/ping")
	b.ReportMetric(dec/flo, "decision/floor")
	b.ReportMetric(quantile(per, 0.5), "pair-median")
	b.ReportMetric(quantile(lat[0], 0.9), "decision-p90-ns")
	b.ReportMetric(quantile(lat[1], 0.9), "ping-p90-ns")
	// What of each is Redis' own time: the scripts' usec_per_call over the
	// timed loop (a PING's is well under 1 µs). The two scripts are told
	// apart by their calls: the floor's SETs carry KEEPTTL on one key.
	after := commandStats(b, stats)
	calls := after["evalsha"][0] - before["evalsha"][0]
	if calls == 2*float64(b.N) {
		b.ReportMetric(1000*(after["evalsha"][1]-before["evalsha"][1])/calls, "scripts-server-ns")
	}
}

// floorLua is the least a script-based limiter does on Redis: read the
// clock, read the state, write it back.
const floorLua = `local t = redis.call('TIME')
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'sixteen bytes...', 'KEEPTTL')
return 1`

// commandStats returns INFO commandstats as calls and usec by command.
func commandStats(b *testing.B, c *goredis.Client) map[string][2]float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	out := map[string][2]float64{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var v [2]float64
		for _, kv := range strings.Split(rest, ",") {
			k, val, _ := strings.Cut(kv, "=")
			f, _ := strconv.ParseFloat(val, 64)
			switch k {
			case "calls":
				v[0] = f
			case "usec":
				v[1] = f
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = v
	}
	return out
}
