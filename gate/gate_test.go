package gate_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_FLEET_USAGE") != "" {
		fleetUsageHelper()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
}

// broken is a store whose backend is down.
type broken struct{ store.Limiter }

func (broken) Take(context.Context, string, clock.Instant, int64, clock.Instant) (limit.Result, store.Handle, error) {
	return limit.Result{}, 0, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
}

func (broken) Refund(context.Context, string, store.Handle, clock.Instant, int64) error {
	return store.ErrUnavailable
}

func keyedTB(t *testing.T, rate string, burst int64) *memory.Keyed[limit.TokenBucketState, *limit.TokenBucket] {
	r, _ := limit.ParseRate(rate)
	tb, err := limit.NewTokenBucket(r, burst)
	if err != nil {
		t.Fatal(err)
	}
	return memory.NewKeyed(tb, memory.Options{})
}

func TestFailurePolicies(t *testing.T) {
	ctx := context.Background()
	req := &sluice.Request{Tenant: "a", Cost: 1}
	down := broken{keyedTB(t, "1/s", 1)}

	open, _ := gate.NewRateLimit("open", down, gate.Options{Scope: sluice.ScopeTenant})
	d, p := gatetest.Decide(ctx, open, req, 0)
	if !d.Admitted || p != 0 || failuresOf(open) != 1 {
		t.Fatalf("fail_open: %+v permit %d", d, p)
	}
	open.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeRejected}) // holds nothing

	closed, _ := gate.NewRateLimit("closed", down, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.FailClosed, RetryHint: 2 * time.Second})
	d, _ = gatetest.Decide(ctx, closed, req, 0)
	if d.Admitted || d.Reason != sluice.ReasonDependency || !d.Retryable || d.RetryAfter != 2*time.Second || d.Entitlement() {
		t.Fatalf("fail_closed: %+v", d)
	}

	fb := keyedTB(t, "1/s", 1)
	local, _ := gate.NewRateLimit("local", down, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback, Fallback: fb})
	d, p = gatetest.Decide(ctx, local, req, 0)
	if !d.Admitted {
		t.Fatalf("local_fallback: %+v", d)
	}
	if d2, _ := gatetest.Decide(ctx, local, req, 0); d2.Admitted {
		t.Fatal("fallback budget not enforced")
	}
	// A refund goes back to the fallback that holds the tokens.
	local.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
	if d3, _ := gatetest.Decide(ctx, local, req, 0); !d3.Admitted {
		t.Fatal("refund did not reach the fallback")
	}

	// Fail open with a fallback: until the store has answered once (a
	// start-up under load), the fallback's limit holds; after, open.
	flaky := &toggled{Limiter: keyedTB(t, "1/s", 5), down: true}
	guarded, _ := gate.NewRateLimit("guarded", flaky, gate.Options{Scope: sluice.ScopeTenant, Fallback: keyedTB(t, "1/s", 2)})
	admitted := 0
	for i := 0; i < 10; i++ {
		if d, _ := gatetest.Decide(ctx, guarded, req, 0); d.Admitted {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("fail_open before the store answered once: %d of 10 admitted, want the fallback's 2", admitted)
	}
	flaky.down = false
	gatetest.Decide(ctx, guarded, &sluice.Request{Tenant: "b", Cost: 1}, 0) // the store answers
	flaky.down = true
	for i := 0; i < 10; i++ {
		if d, _ := gatetest.Decide(ctx, guarded, req, 0); !d.Admitted {
			t.Fatalf("fail_open after the store answered: refused %+v", d)
		}
	}

	if _, err := gate.NewRateLimit("x", down, gate.Options{OnFailure: gate.LocalFallback}); err == nil {
		t.Fatal("local_fallback without a fallback accepted")
	}
	if _, err := gate.ParseFailurePolicy("fail_sometimes"); err == nil {
		t.Fatal("unknown failure policy accepted")
	}
}

// toggled is a store that is down while down is set.
type toggled struct {
	store.Limiter
	down bool
}

func (s *toggled) Take(ctx context.Context, key string, now clock.Instant, cost int64, dl clock.Instant) (limit.Result, store.Handle, error) {
	if s.down {
		return limit.Result{}, 0, fmt.Errorf("%w: loading the scripts", store.ErrUnavailable)
	}
	return s.Limiter.Take(ctx, key, now, cost, dl)
}

func TestRateGateDecisionFields(t *testing.T) {
	g, _ := gate.NewRateLimit("request-rate", keyedTB(t, "100/s", 500), gate.Options{Scope: sluice.ScopeTenant})
	ctx := context.Background()
	req := &sluice.Request{Tenant: "a", Cost: 500}
	d, _ := gatetest.Decide(ctx, g, req, 0)
	if !d.Admitted || d.Limit != 500 || d.Remaining != 0 || d.Window != 5*time.Second || d.ResetAfter != 5*time.Second {
		t.Fatalf("%+v", d)
	}
	req.Cost = 1
	d, _ = gatetest.Decide(ctx, g, req, 0)
	if d.Admitted || d.Reason != sluice.ReasonPolicyRate || d.RetryAfter != 10*time.Millisecond || !d.Retryable || !d.Entitlement() {
		t.Fatalf("%+v", d)
	}
}

func TestConcurrencyGateScopes(t *testing.T) {
	c, _ := limit.NewConcurrency(1)
	svc, _ := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	ctx := context.Background()
	req := &sluice.Request{Tenant: "a"}
	_, p := gatetest.Decide(ctx, svc, req, 0)
	d, _ := gatetest.Decide(ctx, svc, &sluice.Request{Tenant: "b"}, 0)
	if d.Admitted || d.Reason != sluice.ReasonConcurrency || d.Entitlement() || d.RetryAfter != time.Second {
		t.Fatalf("service-wide concurrency must be protection (503) with a retry hint: %+v", d)
	}
	svc.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeErrored})
	if d, _ := gatetest.Decide(ctx, svc, req, 0); !d.Admitted {
		t.Fatal("slot not released on error")
	}

	w, _ := limit.NewConcurrency(10)
	weighted, _ := gate.NewWeightedInFlight("work", memory.NewKeyed(w, memory.Options{}), gate.Options{})
	big := &sluice.Request{Cost: 7}
	_, p = gatetest.Decide(ctx, weighted, big, 0)
	if d, _ := gatetest.Decide(ctx, weighted, &sluice.Request{Cost: 4}, 0); d.Admitted {
		t.Fatal("weighted slots not counted")
	}
	weighted.Release(big, p, sluice.Completion{})
	if d, _ := gatetest.Decide(ctx, weighted, &sluice.Request{Cost: 10}, 0); !d.Admitted {
		t.Fatal("weighted slots not released")
	}
}

// The pacer waits for real timers; synctest runs them on a fake clock.
func TestPacer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		now := func() clock.Instant { return clock.Instant(time.Since(start)) }
		rate, _ := limit.NewRate(1, 10*time.Millisecond)
		lb, _ := limit.NewLeakyBucket(rate, 3)
		g, _ := gate.NewPacer("smooth", memory.NewKeyed(lb, memory.Options{}), gate.Options{})
		ctx := context.Background()

		var mu sync.Mutex
		var proceeded []time.Duration
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Cost: 1}, now()); d.Admitted {
					mu.Lock()
					proceeded = append(proceeded, time.Since(start))
					mu.Unlock()
				}
			}()
		}
		synctest.Wait()
		// Queue full: the fifth is rejected with the exact wait; a
		// service-wide queue protects capacity, so the reason is overload.
		d, _ := gatetest.Decide(ctx, g, &sluice.Request{Cost: 1}, now())
		if d.Admitted || d.Reason != sluice.ReasonOverload || d.RetryAfter != 10*time.Millisecond || d.Entitlement() {
			t.Errorf("fifth: %+v", d)
		}
		wg.Wait()
		if len(proceeded) != 4 || proceeded[3] != 30*time.Millisecond {
			t.Fatalf("proceeded at %v, want 0, 10, 20, 30 ms", proceeded)
		}
		// A slot after the deadline is refused before waiting.
		gatetest.Decide(ctx, g, &sluice.Request{Cost: 1}, now())
		d, _ = gatetest.Decide(ctx, g, &sluice.Request{Cost: 1, Deadline: now().Add(5 * time.Millisecond)}, now())
		if d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("deadline: %+v", d)
		}
		// Cancellation while waiting.
		cctx, cancel := context.WithTimeout(ctx, 3*time.Millisecond)
		defer cancel()
		d, _ = gatetest.Decide(cctx, g, &sluice.Request{Cost: 1}, now())
		if d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("cancelled wait: %+v", d)
		}
	})
}

// On a virtual clock the caller takes the pacer's wait (sluice.ContextWithWait)
// instead of the gate sleeping: Decide returns at once with the wait added.
func TestPacerHandsItsWaitToAVirtualClock(t *testing.T) {
	rate, _ := limit.NewRate(1, 10*time.Millisecond)
	lb, _ := limit.NewLeakyBucket(rate, 3)
	g, _ := gate.NewPacer("smooth", memory.NewKeyed(lb, memory.Options{}), gate.Options{})
	var wait time.Duration
	ctx := sluice.ContextWithWait(context.Background(), &wait)
	for i := range 3 {
		if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Cost: 1}, 0); !d.Admitted {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	if wait != 30*time.Millisecond { // 0 + 10 + 20 ms
		t.Fatalf("waits added up to %v, want 30ms", wait)
	}
}

// failuresOf is g's count of store failures (sluice.FailureCounter).
func failuresOf(g sluice.Gate) int64 {
	f, _ := sluice.As[sluice.FailureCounter](g)
	return f.Failures()
}

// flapping is a store in memory that fails while down, Debit included.
type flapping[S any, A limit.Algorithm[S]] struct {
	*memory.Keyed[S, A]
	down bool
}

func (s *flapping[S, A]) Take(ctx context.Context, key string, now clock.Instant, cost int64, dl clock.Instant) (limit.Result, store.Handle, error) {
	if s.down {
		return limit.Result{}, 0, fmt.Errorf("%w: connection refused", store.ErrUnavailable)
	}
	return s.Keyed.Take(ctx, key, now, cost, dl)
}

func (s *flapping[S, A]) Debit(ctx context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if s.down {
		return store.ErrUnavailable
	}
	return s.Keyed.Debit(ctx, key, h, now, cost)
}

// flappingTB is a token bucket that fails while down.
type flappingTB = flapping[limit.TokenBucketState, *limit.TokenBucket]

// A store that fails and recovers again and again (a flapping Redis)
// under local_fallback admits what one bucket would, in every window:
// burst + rate·T. The fallback was full whenever the store failed, and
// the store full when it came back, each refilling while the other spent:
// 100/s with a burst of 100, offered 400/s, flapping every second, let
// about twice the limit through.
func TestLocalFallbackThroughAFlappingStore(t *testing.T) {
	for _, period := range []time.Duration{200 * time.Millisecond, time.Second, 3 * time.Second} {
		st := &flappingTB{Keyed: keyedTB(t, "100/s", 100)}
		g, _ := gate.NewRateLimit("rate", st, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback,
			Fallback: keyedTB(t, "100/s", 100)})
		ctx := context.Background()
		const step = 2500 * time.Microsecond // 400 requests a second
		var admitted []time.Duration
		for at := time.Duration(0); at < 20*time.Second; at += step {
			st.down = (at/period)%2 == 1
			if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, clock.Instant(at)); d.Admitted {
				admitted = append(admitted, at)
			}
		}
		// Every window from an admission on: at most burst + rate·T.
		for i, from := range admitted {
			for j := i; j < len(admitted); j++ {
				T := admitted[j] - from
				if n := j - i + 1; float64(n) > 100+100*T.Seconds()+1 {
					t.Fatalf("flapping every %v: %d admitted in the %v from %v, above burst + rate·T = %.0f",
						period, n, T, from, 100+100*T.Seconds())
				}
			}
		}
		if got, want := len(admitted), 100+100*20; got < want*9/10 {
			t.Errorf("flapping every %v: %d admitted in 20 s, want about %d (the limit still serves)", period, got, want)
		}
	}
}

// A window's fallback admissions are not owed to the store: charged once it
// answers, after the window turned, they counted in the next window and
// could refuse a tenant for a whole one (a day's).
func TestFallbackWindowAdmissionsAreNotOwed(t *testing.T) {
	fw := func() *memory.Keyed[limit.FixedWindowState, *limit.FixedWindow] {
		f, err := limit.NewFixedWindow(100, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return memory.NewKeyed(f, memory.Options{})
	}
	st := &flapping[limit.FixedWindowState, *limit.FixedWindow]{Keyed: fw()}
	g, _ := gate.NewRateLimit("rate", st, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback, Fallback: fw()})
	ctx := context.Background()
	admit := func(at time.Duration) (n int) {
		for range 200 {
			if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, clock.Instant(at)); d.Admitted {
				n++
			}
		}
		return n
	}
	admit(time.Second) // the store decides: window [0 s, 10 s) spent, the fallback's too
	st.down = true
	if n := admit(9 * time.Second); n != 0 {
		t.Fatalf("the outage, same window: %d admitted, want 0 (the store's admissions were mirrored)", n)
	}
	st.down = false
	if n := admit(11 * time.Second); n != 100 {
		t.Fatalf("the next window, the store back: %d admitted, want 100", n)
	}
}

// A light tenant's long outage is not charged against the full bucket the
// store would have kept: what the bucket refilled past one burst since
// the debt began is taken off it. At pressure the debt empties the store,
// as its admissions would have.
func TestFallbackDebtOfALongOutage(t *testing.T) {
	for _, c := range []struct {
		name      string
		every     time.Duration // one request each
		wantAfter int           // admitted at once when the store is back, of 200
	}{
		{"light: 10/s against 100/s", 100 * time.Millisecond, 100},
		{"at pressure: 400/s", 2500 * time.Microsecond, 0},
	} {
		st := &flappingTB{Keyed: keyedTB(t, "100/s", 100)}
		g, _ := gate.NewRateLimit("rate", st, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback, Fallback: keyedTB(t, "100/s", 100)})
		ctx := context.Background()
		gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, 1) // the store has answered
		st.down = true
		at := time.Millisecond
		for ; at < 10*time.Second; at += c.every {
			gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, clock.Instant(at))
		}
		st.down = false
		n := 0
		for range 200 {
			if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, clock.Instant(at)); d.Admitted {
				n++
			}
		}
		if n < c.wantAfter-2 || n > c.wantAfter+2 {
			t.Errorf("%s, 10 s on the fallback: %d admitted at once when the store is back, want about %d", c.name, n, c.wantAfter)
		}
	}
}

// A store admission a later gate refused gives its units back to the
// fallback too, which had taken them: the fallback drained while the store
// did not, and an outage then refused a tenant that had spent nothing.
func TestRefundsReachTheMirroredFallback(t *testing.T) {
	st := &flappingTB{Keyed: keyedTB(t, "1/h", 10)}
	g, _ := gate.NewRateLimit("rate", st, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback, Fallback: keyedTB(t, "1/h", 10)})
	ctx := context.Background()
	for range 10 {
		r := &sluice.Request{Tenant: "a", Cost: 1}
		d, p := gatetest.Decide(ctx, g, r, 1)
		if !d.Admitted {
			t.Fatal(d)
		}
		g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: 1}) // a later gate refused it
	}
	st.down = true
	n := 0
	for range 20 {
		if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Tenant: "a", Cost: 1}, 2); d.Admitted {
			n++
		}
	}
	if n != 10 {
		t.Fatalf("the outage after 10 refunded admissions: the fallback admitted %d, want its burst of 10", n)
	}
}
