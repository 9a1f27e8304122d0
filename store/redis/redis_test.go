package redis

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/redis/rueidis"
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
	ltb, _ := bind(st)(tokenBucketSpec("tb", tb))
	lg, _ := bind(st)(gcraSpec("gcra", g))
	llb, _ := bind(st)(leakyBucketSpec("leaky", lb))
	nan := string(slices.Repeat([]byte{0xff}, 16))
	huge := packDoubles(0, 0)[:0] + string(slices.Repeat([]byte{0x7f, 0xef, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, 2)) // big-endian 1.8e308 bytes, read little-endian
	for _, raw := range []string{nan, huge, string(make([]byte, 16)) + "x", "not ours", packDoubles(1<<53, 1<<53),
		"\x00\x00\x00\x00\x00\x00\xf0\x7f\x00\x00\x00\x00\x00\x00\xf0\x7f" /* +Inf, +Inf */, "\x00\x00\x00\x00\x00\x00\xf0\xff\x00\x00\x00\x00\x00\x00\xf0\xff" /* -Inf */} {
		for name, lim := range map[string]store.Limiter{"tb": ltb, "gcra": lg, "leaky": llb} {
			key := lim.(*limiter).stateKey("k")
			if err := st.rc().Do(context.Background(), st.rc().B().Set().Key(key).Value(raw).Build()).Error(); err != nil {
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

// Limits Redis' doubles cannot count exactly are refused at construction
// (a fixed window or sliding log of 2^53 + 2 admitted forever), without a
// connection, by every Spec constructor.
func TestLimitsBeyondDoublesRefused(t *testing.T) {
	huge := int64(1)<<53 + 2
	fw := must(limit.NewFixedWindow(huge, time.Second))
	sl := must(limit.NewSlidingLog(huge, time.Second))
	sw := must(limit.NewSlidingWindow(huge, time.Second))
	c := must(limit.NewConcurrency(huge))
	tb := must(limit.NewTokenBucket(limit.PerSecond(1), huge/1e9*2))
	g := must(limit.NewGCRA(limit.PerSecond(1), huge/1e9*2))
	lb := must(limit.NewLeakyBucket(limit.PerSecond(1), huge/1e9*2))
	for name, err := range map[string]error{
		"fixed window":   second(fixedWindowSpec("a", fw)),
		"sliding log":    second(slidingLogSpec("a", sl)),
		"sliding window": second(slidingWindowSpec("a", sw)),
		"concurrency":    second(concurrencySpec("a", c, time.Minute)),
		"token bucket":   second(tokenBucketSpec("a", tb)),
		"gcra":           second(gcraSpec("a", g)),
		"leaky bucket":   second(leakyBucketSpec("a", lb)),
	} {
		if err == nil {
			t.Errorf("%s: a limit beyond 2^53 was accepted", name)
		}
	}
	// The largest count is accepted.
	if _, err := fixedWindowSpec("a", must(limit.NewFixedWindow(MaxCount, time.Second))); err != nil {
		t.Error(err)
	}
}

func second[A any](_ A, err error) error { return err }

// A concurrency take and release cost one permit's work on Redis however
// many slots it holds (a release of 3·10^6 slots ran one ZREM per slot and
// kept Redis busy for 4.5 s): commands counted by the server.
func TestConcurrencyWorkIndependentOfCost(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(concurrencySpec("weighted", must(limit.NewConcurrency(10_000_000)), time.Minute))
	ctx := context.Background()
	srv.Do("config", "resetstat")
	r, h, err := lim.Take(ctx, "k", 0, 3_000_000, 0)
	if err != nil || !r.OK() || r.Remaining != 7_000_000 {
		t.Fatalf("take: %+v %v", r, err)
	}
	if err := lim.Refund(ctx, "k", h, 0, 3_000_000); err != nil {
		t.Fatal(err)
	}
	if err := lim.Refund(ctx, "k", h, 0, 3_000_000); err != nil { // twice: a no-op
		t.Fatal(err)
	}
	stats := srv.Do("info", "commandstats")
	for _, cmd := range []string{"zadd", "zrem"} {
		calls := commandCalls(stats, cmd)
		if calls > 2 {
			t.Errorf("%d %s calls for one weighted permit", calls, cmd)
		}
	}
	if r, _, _ := lim.Take(ctx, "k", 0, 10_000_000, 0); !r.OK() {
		t.Fatalf("after the release (and a repeated one) the limit is not whole: %+v", r)
	}
}

// commandCalls reads cmdstat_<cmd>:calls=N from INFO commandstats.
func commandCalls(stats, cmd string) int {
	i := strings.Index(stats, "cmdstat_"+cmd+":calls=")
	if i < 0 {
		return 0
	}
	n, _ := strconv.Atoi(strings.SplitN(stats[i+len("cmdstat_"+cmd+":calls="):], ",", 2)[0])
	return n
}

// rc returns the store's client (nil before it reached Redis).
// rc returns the store's client for a test to inspect Redis with. A store
// whose first dial failed (a machine too busy to answer the handshake in
// time) connects on its probe; rc dials until it is connected, for up to
// 10 s, rather than hand back no client.
func (s *Store) rc() rueidis.Client {
	for deadline := time.Now().Add(10 * time.Second); ; {
		if cn := s.conn.Load(); cn != nil {
			return cn.client
		}
		if time.Now().After(deadline) || s.dial() == nil && s.conn.Load() == nil {
			panic("redis: no connection after 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Limiters of one name whose states mean different things keep apart: a
// fixed window after a token bucket (a policy reload that changed the
// gate's kind, or the next policy's processes in a rolling deploy) met the
// bucket's string with HMGET, WRONGTYPE, for the key's whole TTL; a bucket
// of another rate period would read the old one's units. A new burst keeps
// the state.
func TestKindChangeUnderOneName(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	take := func(lim store.Limiter) limit.Result {
		t.Helper()
		r, _, err := lim.Take(ctx, "k1", 0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	perHour, _ := limit.NewRate(1, time.Hour)
	perMin, _ := limit.NewRate(1, time.Minute)
	tb, _ := limit.NewTokenBucket(perHour, 2)
	bucket, _ := bind(st)(tokenBucketSpec("g", tb))
	take(bucket)
	take(bucket)
	if r := take(bucket); r.OK() {
		t.Fatalf("the bucket's third take: %+v", r)
	}
	fw, _ := limit.NewFixedWindow(10, time.Hour)
	window, _ := bind(st)(fixedWindowSpec("g", fw))
	if r := take(window); !r.OK() || r.Remaining != 9 {
		t.Fatalf("a fixed window of the bucket's name: %+v, want a fresh window", r)
	}
	slog, _ := limit.NewSlidingLog(10, time.Hour)
	log, _ := bind(st)(slidingLogSpec("g", slog))
	if r := take(log); !r.OK() || r.Remaining != 9 {
		t.Fatalf("a sliding log of the bucket's name: %+v", r)
	}
	other, _ := limit.NewTokenBucket(perMin, 2)
	perMinute, _ := bind(st)(tokenBucketSpec("g", other))
	if r := take(perMinute); !r.OK() || r.Remaining != 1 {
		t.Fatalf("a bucket of another rate: %+v, want a fresh one", r)
	}
	deeper, _ := limit.NewTokenBucket(perHour, 5)
	sameRate, _ := bind(st)(tokenBucketSpec("g", deeper))
	if r := take(sameRate); !r.OK() || r.Remaining != 2 {
		t.Fatalf("a deeper bucket of the same rate: %+v, want the old state (3 of 5 spent)", r)
	}
}

// An address no dial can reach is refused by New, before any dial: a
// port out of range was accepted, and every call failed until a restart.
func TestNewRefusesUnreachableAddresses(t *testing.T) {
	for _, a := range []string{"127.0.0.1:99999", "127.0.0.1:0", "127.0.0.1:x", "127.0.0.1", ""} {
		if s, err := New(Options{Addrs: []string{a}}); err == nil {
			s.Close()
			t.Errorf("address %q accepted", a)
		} else if !strings.Contains(err.Error(), "address") {
			t.Errorf("address %q: %v, want an error naming the address", a, err)
		}
	}
}

// Ping of a store that has not reached Redis says what its dial got, not
// only that Redis is unavailable (what an operator's log showed of an
// outage from the start).
func TestPingBeforeRedisWasReachedSaysWhy(t *testing.T) {
	s, err := New(Options{Addrs: []string{"127.0.0.1:1"}, Timeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Ping(context.Background())
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("Ping: %v, want ErrUnavailable saying the connection was refused", err)
	}
}
