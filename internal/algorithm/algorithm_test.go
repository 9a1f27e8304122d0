package algorithm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/leakcheck"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }

// settings is one valid setting of every field: each algorithm reads its
// own.
var settings = Settings{Rate: limit.PerSecond(10), Burst: 4, Limit: 4, Window: time.Minute, Queue: 4, PermitTTL: time.Minute}

// Every registered algorithm builds in memory and on Redis (its twin,
// store/redis.SpecOf, exists for it) and admits up to its limit there:
// four takes of 1, then a refusal (the leaky bucket queues the fifth, then
// refuses the sixth).
func TestEveryAlgorithmOnBothStores(t *testing.T) {
	want := []string{"token_bucket", "gcra", "fixed_window", "sliding_window", "sliding_log", "leaky_bucket", "concurrency"}
	if got := Names(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("registry %v, want %v", got, want)
	}
	var st *sredis.Store
	if !testing.Short() {
		var err error
		st, err = sredis.New(sredis.Options{Addrs: []string{redistest.Start(t).Addr}, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
	}
	for _, name := range Names() {
		a := MustLookup(name)
		for _, on := range []Backend{{Name: "mem"}, {Redis: st, Name: "alg-" + name}} {
			if on.Redis == nil && on.Name != "mem" {
				continue
			}
			if err := a.Check(settings, on.Name, on.Redis != nil); err != nil {
				t.Fatalf("%s: check: %v", name, err)
			}
			lim, err := a.Limiter(settings, on)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			r, ok := lim.(store.Refiller)
			if refills := ok && r.Refills(); refills != (name == "token_bucket" || name == "gcra") {
				t.Errorf("%s on %T: refills %v", name, lim, refills)
			}
			admits := 4
			if a.Behavior() == Paces {
				admits = 5 // four within the queue, and the one served now
			}
			now := clock.Instant(time.Hour)
			for i := range admits + 1 {
				res, _, err := lim.Take(context.Background(), "k", now, 1, now+clock.Instant(time.Hour))
				if err != nil {
					t.Fatalf("%s on %T: take %d: %v", name, lim, i, err)
				}
				if admitted := res.Status == limit.Allowed; admitted != (i < admits) {
					t.Errorf("%s on %T: take %d: %v", name, lim, i, res.Status)
				}
			}
		}
	}
}

// One of n replicas' share: the rate n times slower, the counts divided
// (at least 1 for a burst or a limit, the queue may be 0).
func TestShare(t *testing.T) {
	s, err := Settings{Rate: limit.PerSecond(100), Burst: 7, Limit: 2, Window: time.Second, Queue: 2}.Share(3)
	if err != nil {
		t.Fatal(err)
	}
	want := Settings{Rate: mustRate(t, 100, 3*time.Second), Burst: 2, Limit: 1, Window: time.Second, Queue: 0}
	if s != want {
		t.Errorf("share %+v, want %+v", s, want)
	}
	if s, _ := settings.Share(1); s != settings {
		t.Errorf("a fleet of one shares nothing: %+v", s)
	}
}

func mustRate(t *testing.T, n int64, per time.Duration) limit.Rate {
	r, err := limit.NewRate(n, per)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// A setting the algorithm refuses names itself, in memory and for Redis;
// what only Redis cannot hold exactly fails only the Redis check.
func TestCheckNamesTheSetting(t *testing.T) {
	err := MustLookup("token_bucket").Check(Settings{Rate: limit.PerSecond(1)}, "x", false)
	var pe *param.Error
	if !errors.As(err, &pe) || pe.Param != "burst" {
		t.Errorf("burst 0: %v", err)
	}
	huge := Settings{Rate: limit.PerSecond(1), Burst: 10_000_000} // burst × 1 s above 2^53 ns
	if err := MustLookup("token_bucket").Check(huge, "x", false); err != nil {
		t.Errorf("in memory: %v", err)
	}
	if err := MustLookup("token_bucket").Check(huge, "x", true); err == nil {
		t.Error("a burst Redis' doubles cannot hold passed the Redis check")
	}
}

// In memory, a limiter continues from the previous one of the same
// algorithm: a reload that changes a limit keeps what its keys spent.
func TestPreviousStateCarriesOver(t *testing.T) {
	a := MustLookup("fixed_window")
	first, err := a.Limiter(settings, Backend{})
	if err != nil {
		t.Fatal(err)
	}
	now := clock.Instant(time.Hour)
	for range 4 {
		first.Take(context.Background(), "k", now, 1, 0)
	}
	bigger := settings
	bigger.Limit = 5
	next, err := a.Limiter(bigger, Backend{Previous: first, Memory: memory.Options{}})
	if err != nil {
		t.Fatal(err)
	}
	if res, _, _ := next.Take(context.Background(), "k", now, 1, 0); res.Status != limit.Allowed || res.Remaining != 0 {
		t.Errorf("after the reload: %+v, want the fifth admitted and none left", res)
	}
	other, _ := MustLookup("sliding_window").Limiter(settings, Backend{Previous: first})
	if res, _, _ := other.Take(context.Background(), "k", now, 1, 0); res.Remaining != 3 {
		t.Errorf("another algorithm starts fresh: %+v", res)
	}
}

func TestLookup(t *testing.T) {
	if _, ok := Lookup("nope"); ok {
		t.Error("found nope")
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "token_bucket") {
			t.Errorf("MustLookup of an unknown name: %v", r)
		}
	}()
	MustLookup("nope")
}
