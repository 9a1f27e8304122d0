package memory

import (
	"math/rand"
	"strconv"
	"testing"
	"unsafe"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/limit"
)

var sinkN int64

// BenchmarkClockRead is the physical floor of a decision with the real
// clock: one monotonic clock read.
func BenchmarkClockRead(b *testing.B) {
	for i := 0; i < b.N; i++ {
		sinkN += sluice.Now()
	}
}

func BenchmarkBucketTokenBucket(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	l := NewTokenBucket(tb, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		l.Allow(1)
	}
}

func BenchmarkSingleTokenBucket(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	l := NewSingle(tb, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		l.Allow(1)
	}
}

func BenchmarkSingleGCRA(b *testing.B) {
	g, _ := limit.NewGCRA(limit.PerSecond(1e9), 1e9)
	l := NewSingle(g, nil)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		l.Allow(1)
	}
}

// keyAt writes tenant i's key into buf, as request parsing would, so the
// key bytes are in cache and the benchmark measures the table.
func keyAt(buf []byte, i int) string {
	b := append(buf[:0], "tenant-"...)
	b = strconv.AppendInt(b, int64(i), 10)
	return unsafe.String(&b[0], len(b))
}

func benchKeyed(b *testing.B, keys int) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	k := NewKeyed(tb, Options{MaxKeys: keys * 2})
	var buf [32]byte
	for i := range keys {
		k.Take(nil, keyAt(buf[:], i), 0, 1, 0)
	}
	x := uint32(1)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		x = x*1664525 + 1013904223
		k.Take(nil, keyAt(buf[:], int(x%uint32(keys))), sluice.Now(), 1, 0)
	}
}

func BenchmarkKeyedTokenBucket1K(b *testing.B) { benchKeyed(b, 1000) }
func BenchmarkKeyedTokenBucket1M(b *testing.B) { benchKeyed(b, 1_000_000) }

// Zipf-distributed tenants (s = 1.1): a few tenants send most requests.
func BenchmarkKeyedTokenBucket1MZipf(b *testing.B) {
	const keys = 1_000_000
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	k := NewKeyed(tb, Options{MaxKeys: keys * 2})
	var buf [32]byte
	for i := range keys {
		k.Take(nil, keyAt(buf[:], i), 0, 1, 0)
	}
	z := rand.NewZipf(rand.New(rand.NewSource(1)), 1.1, 1, keys-1)
	seq := make([]uint32, 1<<20)
	for i := range seq {
		seq[i] = uint32(z.Uint64())
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.Take(nil, keyAt(buf[:], int(seq[i&(1<<20-1)])), sluice.Now(), 1, 0)
	}
}

// BenchmarkRandomDRAMRead is the floor of any uniformly random access into a
// 64 MB working set on this machine: one dependent-free random read.
func BenchmarkRandomDRAMRead(b *testing.B) {
	mem := make([]int64, 8<<20)
	for i := range mem {
		mem[i] = int64(i)
	}
	x := uint32(1)
	for i := 0; i < b.N; i++ {
		x = x*1664525 + 1013904223
		sinkN += mem[x&(8<<20-1)]
	}
}

func BenchmarkSingleTokenBucketFixedNow(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	l := NewSingle(tb, nil)
	n := int64(0)
	for i := 0; i < b.N; i++ {
		n++
		l.TakeAt(n, 1)
	}
}

func BenchmarkTokenBucketStepOnly(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	var s limit.TokenBucketState
	n := int64(0)
	for i := 0; i < b.N; i++ {
		n++
		tb.Take(&s, n, 1)
	}
}

func BenchmarkBucketFixedNow(b *testing.B) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	l := NewTokenBucket(tb, nil)
	n := int64(0)
	for i := 0; i < b.N; i++ {
		n++
		l.TakeAt(n, 1)
	}
}
