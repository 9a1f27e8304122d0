package memory_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// A flood of distinct keys must not lock new tenants out: after ~1.05M
// keys, 1.22M later ones, brand-new real tenants among them, got 429 with
// "retry after 4836s" (the shared overflow state). Here 2M one-shot keys
// flood a table of the default 1M while 100 new tenants arrive among them:
// each is admitted on its first request, and 100 established tenants keep
// their state (still refused).
func TestKeyFloodLocksNoTenantOut(t *testing.T) {
	flood := 2_000_000
	if raceEnabled || testing.Short() {
		flood = 300_000 // with a table of 100k: the same ratio
	}
	opts := memory.Options{}
	if flood < 2_000_000 {
		opts.MaxKeys = 100_000
	}
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1) // one request, then one per second
	k := memory.NewKeyed(tb, opts)
	ctx := context.Background()
	now := clock.Instant(1)
	take := func(key string) bool {
		r, _, _ := k.Take(ctx, key, now, 1, 0)
		return r.OK()
	}
	for i := range 100 {
		for range 3 {
			take("established-" + strconv.Itoa(i)) // admitted once, then refused
		}
	}
	buf := make([]byte, 0, 32)
	for i := range flood {
		buf = strconv.AppendInt(append(buf[:0], "flood-"...), int64(i), 10)
		take(string(buf))
		if i%(flood/100) == 0 {
			if !take("new-" + strconv.Itoa(i)) {
				t.Fatalf("new tenant %d refused its first request after %d flood keys", i/(flood/100), i)
			}
		}
	}
	for i := range 100 {
		if take("established-" + strconv.Itoa(i)) {
			t.Fatalf("established tenant %d lost its state to the flood", i)
		}
	}
	held, evicted, overflowed := k.Keys()
	t.Logf("%d flood keys: %d held, %d evicted, %d overflow decisions", flood, held, evicted, overflowed)
}
