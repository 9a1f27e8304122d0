package redis

import (
	"context"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) {
	// rueidis' cluster client may leave a topology refresh sleeping for a
	// few seconds after Close (and, after a node died, its delayed retry
	// of that refresh); they end on their own and hold nothing of ours.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"),
		goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
}

// backends returns a standalone and a cluster store, each closed at the end.
func backends(t *testing.T) map[string]*Store {
	t.Helper()
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	out := map[string]*Store{}
	for name, addrs := range map[string][]string{"standalone": {srv.Addr}, "cluster": cl.Addrs} {
		s, err := New(Options{Addrs: addrs, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		out[name] = s
	}
	return out
}

// bind returns a function that puts the result of a Spec constructor on st.
func bind(st *Store) func(*Spec, error) (store.Limiter, error) {
	return func(sp *Spec, err error) (store.Limiter, error) {
		if err != nil {
			return nil, err
		}
		return st.Limiter(sp), nil
	}
}

// Differential for the memory counterpart used as local fallback.
var _ store.Limiter = (*memory.Keyed[limit.TokenBucketState, *limit.TokenBucket])(nil)

// Permit ids leave bit 63 to gates (it marks fallback permits).
func TestPermitIDsLeaveBit63(t *testing.T) {
	for range 10_000 {
		if h := newPermit(); h == 0 || h>>63 != 0 {
			t.Fatalf("permit %x", uint64(h))
		}
	}
}

// A foreign or corrupted value under a limiter's key (another program's
// data, a truncated write) is read as fresh state: the script answers at
// once — a script that spun on it would block Redis for every client — and
// the decision is the one of an unused key.
func TestCorruptStateReadsFresh(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(10), 20)
	g, _ := limit.NewGCRA(limit.PerSecond(10), 20)
	lb, _ := limit.NewLeakyBucket(limit.PerSecond(10), 5)
	ltb, _ := bind(st)(TokenBucket("tb", tb))
	lg, _ := bind(st)(GCRA("gcra", g))
	llb, _ := bind(st)(LeakyBucket("leaky", lb))
	nan := string(slices.Repeat([]byte{0xff}, 16))
	huge := packDoubles(0, 0)[:0] + string(slices.Repeat([]byte{0x7f, 0xef, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 2)) // big-endian 1.8e308 bytes, read little-endian
	for _, raw := range []string{nan, huge, string(make([]byte, 16)) + "x", "not ours", packDoubles(1<<53, 1<<53),
		"\x00\x00\x00\x00\x00\x00\xf0\x7f\x00\x00\x00\x00\x00\x00\xf0\x7f" /* +Inf, +Inf */, "\x00\x00\x00\x00\x00\x00\xf0\xff\x00\x00\x00\x00\x00\x00\xf0\xff" /* -Inf */} {
		for name, lim := range map[string]store.Limiter{"tb": ltb, "gcra": lg, "leaky": llb} {
			key := st.key(name, "k")
			if err := st.client.Do(context.Background(), st.client.B().Set().Key(key).Value(raw).Build()).Error(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			r, _, err := lim.Take(ctx, "k", 0, 1, 0)
			cancel()
			if err != nil {
				t.Fatalf("%s on %q: %v", name, raw, err)
			}
			if !r.OK() || r.Wait != 0 {
				t.Fatalf("%s on %q: %+v, want the fresh state's admission", name, raw, r)
			}
		}
	}
}
