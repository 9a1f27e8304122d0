package memory

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type counter struct{ n int64 }

func freshCounter(c *counter, _ clock.Instant) bool { return c.n == 0 }

func bump(t *table[counter], key string, delta int64) (int64, bool) {
	s, _, overflow, g := t.lock(key, 0, true)
	defer g.unlock()
	s.n += delta
	return s.n, overflow
}

func get(t *table[counter], key string) (int64, bool) {
	s, _, _, g := t.lock(key, 0, false)
	defer g.unlock()
	if s == nil {
		return 0, false
	}
	return s.n, true
}

// The table behaves as a map under random inserts, updates and sweeps,
// with short (inline) and long keys.
func TestTableMatchesMap(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tbl := newTable(Options{Shards: rapid.SampledFrom([]int{1, 2, 8}).Draw(rt, "shards"), MaxKeys: 1 << 20}, freshCounter)
		model := map[string]int64{}
		keyGen := rapid.OneOf(
			rapid.StringMatching(`[a-d]{0,3}`),
			rapid.StringMatching(`[a-d]{30,34}`), // longer than inlineKey
		)
		for range rapid.IntRange(1, 300).Draw(rt, "ops") {
			k := keyGen.Draw(rt, "key")
			switch rapid.IntRange(0, 9).Draw(rt, "op") {
			case 0:
				tbl.sweep(0)
				for mk, v := range model {
					if v == 0 {
						delete(model, mk)
					}
				}
			case 1, 2:
				d := -model[k] // make it fresh
				bump(tbl, k, d)
				model[k] = 0
			default:
				d := rapid.Int64Range(1, 5).Draw(rt, "delta")
				bump(tbl, k, d)
				model[k] += d
			}
			for mk, want := range model {
				got, ok := get(tbl, mk)
				if !ok || got != want {
					rt.Fatalf("key %q: got %d %v, want %d", mk, got, ok, want)
				}
			}
			if tbl.size() != len(model) {
				rt.Fatalf("len %d, model %d", tbl.size(), len(model))
			}
		}
	})
}

// A table of states that may not be forgotten (counts in flight, as a
// concurrency limit keeps): at the cap fresh keys go first, and a new key
// that finds only held ones shares the overflow state.
func TestTableCapDropsFreshKeysFirst(t *testing.T) {
	tbl := newTable(Options{Shards: 1, MaxKeys: 4}, freshCounter)
	tbl.forgettable = freshCounter
	for i := range 4 {
		bump(tbl, fmt.Sprint("busy", i), 1)
	}
	// Full of non-fresh keys: a new key shares the overflow state.
	if _, overflow := bump(tbl, "new1", 1); !overflow {
		t.Fatal("fifth key stored beyond the cap")
	}
	if n, overflow := bump(tbl, "new2", 1); !overflow || n != 2 {
		t.Fatalf("overflow state not shared: %d %v", n, overflow)
	}
	for i := range 4 {
		if n, ok := get(tbl, fmt.Sprint("busy", i)); !ok || n != 1 {
			t.Fatalf("existing key lost its state at the cap")
		}
	}
	if tbl.overflows() != 2 {
		t.Fatalf("overflowed %d", tbl.overflows())
	}
	// Make two keys fresh; after SweepEvery the next new key gets a slot.
	bump(tbl, "busy0", -1)
	bump(tbl, "busy1", -1)
	s, _, overflow, g := tbl.lock("new3", clock.Instant(2e9), true)
	g.unlock()
	if overflow || s == nil {
		t.Fatal("fresh keys were not dropped to make room")
	}
	if _, ok := get(tbl, "busy0"); ok {
		t.Fatal("fresh key still held")
	}
	if n, _ := get(tbl, "busy2"); n != 1 {
		t.Fatal("non-fresh key lost")
	}
}

// A table full of keys that may be forgotten (rate limits) makes room for
// a new key by evicting: keys seen once before keys seen more, and an
// established key (used three times) survives a flood of one-shot keys.
func TestTableEvictsOneShotKeysFirst(t *testing.T) {
	tbl := newTable(Options{Shards: 1, MaxKeys: 64}, freshCounter)
	for i := range 8 {
		for range 3 {
			bump(tbl, fmt.Sprint("tenant", i), 1) // established: n = 3
		}
	}
	for i := range 10_000 { // the flood: one request per key
		if _, overflow := bump(tbl, fmt.Sprint("flood", i), 1); overflow {
			t.Fatalf("flood key %d shared the overflow state of a table that may evict", i)
		}
	}
	for i := range 8 {
		if n, ok := get(tbl, fmt.Sprint("tenant", i)); !ok || n != 3 {
			t.Fatalf("established tenant %d lost its state to the flood: %d %v", i, n, ok)
		}
	}
	// A new tenant after the flood gets its own fresh state.
	if n, overflow := bump(tbl, "newcomer", 1); overflow || n != 1 {
		t.Fatalf("new tenant after the flood: %d, overflow %v", n, overflow)
	}
	if tbl.size() > 64 || tbl.evicted.Load() < 10_000-64 {
		t.Fatalf("%d keys held, %d evicted", tbl.size(), tbl.evicted.Load())
	}
}

func TestTableConcurrentUse(t *testing.T) {
	tbl := newTable(Options{Shards: 4, MaxKeys: 64}, freshCounter)
	tbl.forgettable = freshCounter // counts in flight, like a concurrency limit's: never evicted while held
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := fmt.Sprint("k", (g*7+i)%100)
				bump(tbl, k, 1)
				bump(tbl, k, -1)
			}
		}()
	}
	wg.Wait()
	tbl.sweep(0)
	if tbl.size() != 0 {
		t.Fatalf("%d keys left after all became fresh", tbl.size())
	}
}

func TestKeyedOverflowRefundGoesToOverflowState(t *testing.T) {
	c, _ := limit.NewConcurrency(1)
	k := NewKeyed(c, Options{Shards: 1, MaxKeys: 1})
	ctx := context.Background()
	if _, h, _ := k.Take(ctx, "a", 0, 1, 0); h != handleKey {
		t.Fatal("first key not stored")
	}
	r, h, _ := k.Take(ctx, "b", 0, 1, 0)
	if !r.OK() || h != handleOverflow {
		t.Fatalf("%+v %v", r, h)
	}
	if r, _, _ := k.Take(ctx, "c", 0, 1, 0); r.OK() {
		t.Fatal("overflow keys are not limited together")
	}
	k.Refund(ctx, "b", h, 0, 1)
	if r, _, _ := k.Take(ctx, "c", 0, 1, 0); !r.OK() {
		t.Fatal("release with the overflow handle did not free the shared slot")
	}
}

func TestKeyedLongKeysAreDistinct(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	k := NewKeyed(tb, Options{})
	a := strings.Repeat("x", 100) + "a"
	b := strings.Repeat("x", 100) + "b"
	ctx := context.Background()
	if r, _, _ := k.Take(ctx, a, 0, 1, 0); !r.OK() {
		t.Fatal()
	}
	if r, _, _ := k.Take(ctx, b, 0, 1, 0); !r.OK() {
		t.Fatal("two long keys with one prefix share state")
	}
	// The caller's buffer may be reused: the table keeps its own copy.
	buf := []byte(a)
	key := string(buf)
	buf[0] = 'y'
	if r, _, _ := k.Take(ctx, key, 0, 1, 0); r.OK() {
		t.Fatal("state of a not found")
	}
}

func TestKeyedDoesNotAllocateForExistingKey(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e6), 1e6)
	k := NewKeyed(tb, Options{})
	ctx := context.Background()
	for _, key := range []string{"short", strings.Repeat("long", 20)} {
		k.Take(ctx, key, 0, 1, 0)
		if n := testing.AllocsPerRun(100, func() { k.Take(ctx, key, 1, 1, 0) }); n != 0 {
			t.Fatalf("%d allocs per decision for %q", int(n), key)
		}
	}
}
