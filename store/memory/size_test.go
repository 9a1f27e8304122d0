package memory_test

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// residentBytes reads this process's resident set size.
func residentBytes(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc/self/statm")
	}
	f := strings.Fields(string(b))
	n, _ := strconv.ParseInt(f[1], 10, 64)
	return n * int64(os.Getpagesize())
}

// The documented cost of a key at the cap (Options.MaxKeys): 128 bytes of
// heap with keys up to 28 bytes, and about 1.5 times that resident while
// the runtime keeps the arrays a table outgrew. Measured within 20%.
func TestKeyCostAtTheCap(t *testing.T) {
	if raceEnabled || testing.Short() {
		t.Skip("fills a million keys")
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	rss := residentBytes(t)
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	k := memory.NewKeyed(tb, memory.Options{})
	buf := make([]byte, 0, 32)
	for i := range 2 * memory.DefaultMaxKeys {
		buf = strconv.AppendInt(append(buf[:0], "tenant-"...), int64(i), 10)
		k.Take(context.Background(), string(buf), clock.Instant(1), 1, 0)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held, _, _ := k.Keys()
	heap := float64(after.HeapInuse-before.HeapInuse) / float64(held)
	res := float64(residentBytes(t)-rss) / float64(held)
	t.Logf("%d keys: %.0f B/key of heap, %.0f B/key resident", held, heap, res)
	if heap < 128*0.8 || heap > 128*1.2 {
		t.Errorf("%.0f B/key of heap, documented 128", heap)
	}
	if res > 192*1.2 {
		t.Errorf("%.0f B/key resident, documented about 192", res)
	}
	runtime.KeepAlive(k)
}
