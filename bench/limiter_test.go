// Package bench compares sluice's limiters with peers in one `go test
// -bench` run; see BENCHMARKS.md for the command and the figures. It is a
// separate module so peers stay out of sluice's own go.mod.
package bench

import (
	"context"
	"math/rand"
	"runtime/debug"
	"strconv"
	"testing"
	"unsafe"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

var (
	sinkN  int64
	sinkOK bool
)

// BenchmarkClockRead is one monotonic clock read: the physical floor of a
// decision that reads the real clock.
func BenchmarkClockRead(b *testing.B) {
	for i := 0; i < b.N; i++ {
		sinkN += int64(clock.Now())
	}
}

func bucket(b *testing.B) *limit.TokenBucket {
	tb, err := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	if err != nil {
		b.Fatal(err)
	}
	return tb
}

// BenchmarkTokenBucketAllow: sluice single-key token bucket, real clock,
// admitted path, decision only.
func BenchmarkTokenBucketAllow(b *testing.B) {
	tb := bucket(b)
	l, _ := memory.NewBucket(tb.Rate(), tb.Limit(), nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sinkOK = l.Allow(1)
	}
}

// BenchmarkGCRAAllow: sluice single-key GCRA, real clock, decision only.
func BenchmarkGCRAAllow(b *testing.B) {
	g, _ := limit.NewGCRA(limit.PerSecond(1e9), 1e9)
	l, _ := memory.NewBucket(g.Rate(), g.Limit(), nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sinkOK = l.Allow(1)
	}
}

// BenchmarkTokenBucketTake: as Allow, plus remaining, reset-after and
// retry-after in the result.
func BenchmarkTokenBucketTake(b *testing.B) {
	tb := bucket(b)
	l, _ := memory.NewBucket(tb.Rate(), tb.Limit(), nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sinkN += l.Take(1).Remaining
	}
}

// BenchmarkXTimeRateAllow: golang.org/x/time/rate, the peer, same shape.
func BenchmarkXTimeRateAllow(b *testing.B) {
	l := rate.NewLimiter(1e9, 1e9)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		sinkOK = l.Allow()
	}
}

// keyAt writes tenant i's key into buf, as request parsing would, so the
// key bytes are in cache and the benchmark measures the store.
func keyAt(buf []byte, i int) string {
	k := append(buf[:0], "tenant-"...)
	k = strconv.AppendInt(k, int64(i), 10)
	return unsafe.String(&k[0], len(k))
}

func keyed(b *testing.B, keys int) *memory.Keyed[limit.TokenBucketState, *limit.TokenBucket] {
	k := memory.NewKeyed(bucket(b), memory.Options{MaxKeys: 2 * keys})
	var buf [32]byte
	for i := range keys {
		k.Take(context.Background(), keyAt(buf[:], i), 0, 1, 0)
	}
	debug.FreeOSMemory() // do not bill this benchmark for earlier ones' garbage
	return k
}

func benchKeyedUniform(b *testing.B, keys int) {
	k := keyed(b, keys)
	ctx := context.Background()
	var buf [32]byte
	x := uint32(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x = x*1664525 + 1013904223
		r, _, _ := k.Take(ctx, keyAt(buf[:], int(x%uint32(keys))), clock.Now(), 1, 0)
		sinkN += r.Remaining
	}
}

// BenchmarkKeyedTake1: the keyed store with a single tenant: the same code
// path as the benchmarks below, without the cost of cardinality.
func BenchmarkKeyedTake1(b *testing.B) { benchKeyedUniform(b, 1) }

// BenchmarkKeyedTake1K: the keyed store, 1,000 tenants, uniformly random.
func BenchmarkKeyedTake1K(b *testing.B) { benchKeyedUniform(b, 1_000) }

// BenchmarkKeyedTake1M: 1,000,000 tenants, uniformly random: every decision
// touches a cold cache line (see BenchmarkDRAMLatency).
func BenchmarkKeyedTake1M(b *testing.B) { benchKeyedUniform(b, 1_000_000) }

// BenchmarkKeyedTake1MZipf: 1,000,000 tenants, Zipf(1.1) popularity: a few
// tenants send most requests, as in real traffic.
func BenchmarkKeyedTake1MZipf(b *testing.B) {
	const keys = 1_000_000
	k := keyed(b, keys)
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, keys-1)
	seq := make([]uint32, 1<<20)
	for i := range seq {
		seq[i] = uint32(z.Uint64())
	}
	debug.FreeOSMemory()
	ctx := context.Background()
	var buf [32]byte
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		r, _, _ := k.Take(ctx, keyAt(buf[:], int(seq[i&(1<<20-1)])), clock.Now(), 1, 0)
		sinkN += r.Remaining
	}
}

// BenchmarkKeyedTakeParallel: 10,000 tenants from every core at once.
// Compare -cpu 1 with -cpu 2: ns/op must not rise.
func BenchmarkKeyedTakeParallel(b *testing.B) {
	const keys = 10_000
	k := keyed(b, keys)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		var buf [32]byte
		x := uint32(rand.Int31())
		for pb.Next() {
			x = x*1664525 + 1013904223
			k.Take(ctx, keyAt(buf[:], int(x%keys)), clock.Now(), 1, 0)
		}
	})
}

// BenchmarkDRAMLatency is one dependent random read in a 64 MB working set:
// the floor for any store lookup that misses every cache.
func BenchmarkDRAMLatency(b *testing.B) {
	n := 8 << 20
	perm := rand.New(rand.NewSource(1)).Perm(n)
	next := make([]int64, n)
	for i := range n {
		next[perm[i]] = int64(perm[(i+1)%n])
	}
	debug.FreeOSMemory()
	p := int64(0)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p = next[p]
	}
	sinkN += p
}
