package fair

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

// stream is an evenly spaced arrival stream of one class.
type stream struct {
	class  string
	tenant string // counted by tenant when set
	cost   int64
	rate   float64 // requests/s
	next   float64 // ns
}

// run offers the streams to g from start for d and returns the units
// admitted per class. Arrivals are evenly spaced, merged in time order.
func run(t *testing.T, g sluice.Gate, start clock.Instant, d time.Duration, streams ...*stream) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	end := float64(start) + float64(d)
	for _, s := range streams {
		if s.next < float64(start) {
			s.next = float64(start)
		}
	}
	for {
		var s *stream
		for _, x := range streams {
			if x.rate > 0 && (s == nil || x.next < s.next) {
				s = x
			}
		}
		if s == nil || s.next >= end {
			return got
		}
		now := clock.Instant(math.Round(s.next))
		s.next += 1e9 / s.rate
		r := &sluice.Request{Class: s.class, Cost: s.cost, Tenant: s.tenant}
		if dec, p := gatetest.Decide(context.Background(), g, r, now); dec.Admitted {
			got[s.class] += s.cost
			if s.tenant != "" {
				got[s.tenant] += s.cost
			}
			g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now})
		}
	}
}

func within(t *testing.T, what string, got, want int64, tol float64) {
	t.Helper()
	if math.Abs(float64(got-want)) > tol*float64(want) {
		t.Errorf("%s: %d units, want %d ± %.0f%%", what, got, want, 100*tol)
	}
}

// The free and premium example of the Mercury model: capacity 4,000 units/s, premium
// queries cost 3 at 1,000/s, free ones 1 at 6,000/s, reserves 2,400 and
// 1,600. Premium admits 800 req/s and free 1,600; when premium drops to
// 400 req/s free borrows the 1,200 units/s it leaves; when premium comes
// back it has its 2,400 at once, within the revocation time.
func TestReservationSplit(t *testing.T) {
	for _, tc := range []struct {
		name               string
		capacity, recovery int64
		freeReserve        int64
	}{
		{"no recovery reserve", 4000, 0, 1600},
		{"recovery reserve 200", 4200, 200, 1600},
		{"recovery reserve eats free's reserve", 4000, 200, 1400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, err := newReservation("units", ReservationOptions{Capacity: tc.capacity, Recovery: tc.recovery,
				Revocation: 500 * time.Millisecond,
				Classes:    []ClassShare{{Class: "premium", Reserve: 2400}, {Class: "free", Reserve: tc.freeReserve}}})
			if err != nil {
				t.Fatal(err)
			}
			usable := tc.capacity - tc.recovery
			premium := &stream{class: "premium", cost: 3, rate: 1000}
			free := &stream{class: "free", cost: 1, rate: 6000}
			start := clock.Instant(time.Second)
			run(t, g, start, 2*time.Second, premium, free) // past the initial bursts
			got := run(t, g, start.Add(2*time.Second), 10*time.Second, premium, free)
			within(t, "premium, both busy", got["premium"], 2400*10, 0.01)
			within(t, "free, both busy", got["free"], tc.freeReserve*10, 0.01)

			premium.rate = 400
			at := start.Add(12 * time.Second)
			run(t, g, at, time.Second, premium, free)
			got = run(t, g, at.Add(time.Second), 10*time.Second, premium, free)
			within(t, "premium at 400 req/s", got["premium"], 1200*10, 0.01)
			within(t, "free borrowing", got["free"], (usable-1200)*10, 0.01)

			premium.rate = 1000
			back := at.Add(11 * time.Second)
			got = run(t, g, back, 500*time.Millisecond, premium, free)
			// Within the revocation time premium has its whole reserve (and its
			// bucket's 100 ms of burst), and free keeps at most its reserve
			// plus what the pool held when premium came back.
			if min := int64(2400 / 2); got["premium"] < min {
				t.Errorf("premium in the first 500 ms back: %d units, want ≥ %d", got["premium"], min)
			}
			got = run(t, g, back.Add(500*time.Millisecond), 10*time.Second, premium, free)
			within(t, "premium back", got["premium"], 2400*10, 0.01)
			within(t, "free after the reclaim", got["free"], tc.freeReserve*10, 0.01)
		})
	}
}

func TestReservationLimits(t *testing.T) {
	g, err := newReservation("units", ReservationOptions{Capacity: 1000,
		Classes: []ClassShare{{Class: "a", Reserve: 300, Max: 500}, {Class: "b", Reserve: 200, NoBorrow: true}}})
	if err != nil {
		t.Fatal(err)
	}
	a := &stream{class: "a", cost: 1, rate: 5000}
	b := &stream{class: "b", cost: 1, rate: 5000}
	other := &stream{class: "other", cost: 2, rate: 5000}
	start := clock.Instant(time.Second)
	run(t, g, start, 2*time.Second, a, b, other)
	got := run(t, g, start.Add(2*time.Second), 10*time.Second, a, b, other)
	within(t, "a, capped at its max", got["a"], 500*10, 0.01)
	within(t, "b, which never borrows", got["b"], 200*10, 0.01)
	// 500 units/s no class reserves: a takes 200 of them up to its max,
	// the unlisted class the other 300.
	within(t, "an unlisted class, borrowing only", got["other"], 300*10, 0.02)
}

// A class refused for its own maximum while the capacity has room has
// spent its entitlement: 429 (policy_rate at scope class), retryable when
// the maximum's bucket holds the cost again; refused for the capacity, 503.
func TestReservationMaxIsAnEntitlement(t *testing.T) {
	g, _ := newReservation("units", ReservationOptions{Capacity: 1000, Burst: time.Second,
		Classes: []ClassShare{{Class: "org", Reserve: 100, Max: 150}, {Class: "b", Reserve: 800, NoBorrow: true}}})
	gatetest.Decide(context.Background(), g, &sluice.Request{Class: "b", Cost: 1}, clock.Instant(time.Second)) // starts the clock; the pool fills from here
	now := clock.Instant(3 * time.Second)
	for i := 0; i < 150; i++ {
		if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Class: "org", Cost: 1}, now); !d.Admitted {
			t.Fatalf("org refused at %d units of its max 150's bucket: %+v", i, d)
		}
	}
	d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Class: "org", Cost: 1}, now)
	if d.Admitted || d.Reason != sluice.ReasonPolicyRate || d.Scope != sluice.ScopeClass || !d.Entitlement() || !d.Retryable || d.RetryAfter <= 0 {
		t.Fatalf("org past its max: %+v, want a retryable 429 at scope class", d)
	}
	for i := 0; i < 801; i++ {
		gatetest.Decide(context.Background(), g, &sluice.Request{Class: "b", Cost: 1}, now)
	}
	if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Class: "b", Cost: 1}, now); d.Admitted || d.Reason != sluice.ReasonOverload || d.Entitlement() {
		t.Fatalf("b past its reserve (no borrowing): %+v, want 503 overload", d)
	}
}

func TestReservationRefundsLaterRejections(t *testing.T) {
	g, _ := newReservation("units", ReservationOptions{Capacity: 10, Burst: time.Second,
		Classes: []ClassShare{{Class: "a", Reserve: 10}}})
	r := &sluice.Request{Class: "a", Cost: 10}
	now := clock.Instant(1)
	d, p := gatetest.Decide(context.Background(), g, r, now)
	if !d.Admitted {
		t.Fatal("a full bucket did not admit its depth")
	}
	if d, _ := gatetest.Decide(context.Background(), g, r, now); d.Admitted || d.Reason != sluice.ReasonOverload || d.RetryAfter != time.Second {
		t.Fatalf("empty bucket: %+v, want overload retryable after 1s", d)
	}
	g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: now})
	if d, _ := gatetest.Decide(context.Background(), g, r, now); !d.Admitted {
		t.Fatal("the units of a request a later gate rejected did not come back")
	}
}

func TestReservationRejectsBadOptions(t *testing.T) {
	for _, o := range []ReservationOptions{
		{},
		{Capacity: 100, Recovery: 100},
		{Capacity: 100, Classes: []ClassShare{{Class: "a", Reserve: 60}, {Class: "b", Reserve: 50}}},
		{Capacity: 100, Recovery: 20, Classes: []ClassShare{{Class: "a", Reserve: 90}}},
		{Capacity: 100, Classes: []ClassShare{{Class: "a", Reserve: 50, Max: 40}}},
		{Capacity: 100, Classes: []ClassShare{{Class: "a", Reserve: 10}, {Class: "a", Reserve: 10}}},
		{Capacity: 100, Classes: []ClassShare{{Class: "", Reserve: 10}}},
		{Capacity: 100, Classes: []ClassShare{{Class: "a", Reserve: -1}}},
		{Capacity: MaxRate + 1},
		{Capacity: 100, Burst: time.Hour},
	} {
		if _, err := newReservation("r", o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
}

// The tenant level under a class: each tenant of the class gets at most
// its cap (429 at scope tenant beyond it), inside the class's reserve.
func TestReservationTenantLevel(t *testing.T) {
	g, err := newReservation("units", ReservationOptions{Capacity: 4000,
		Classes: []ClassShare{{Class: "premium", Reserve: 2400}, {Class: "free", Reserve: 1600, Tenant: 200}}})
	if err != nil {
		t.Fatal(err)
	}
	var streams []*stream
	var names []string
	for i, rate := range []float64{1000, 150, 150, 150} {
		name := fmt.Sprintf("free-%d", i)
		names = append(names, name)
		streams = append(streams, &stream{class: "free", cost: 1, rate: rate, tenant: name})
	}
	start := clock.Instant(time.Second)
	run(t, g, start, time.Second, streams...)
	got := run(t, g, start.Add(time.Second), 10*time.Second, streams...)
	within(t, "the heavy tenant, at its cap", got[names[0]], 200*10, 0.01)
	for _, n := range names[1:] {
		within(t, "a light tenant, all it asks", got[n], 150*10, 0.01)
	}
	d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Class: "free", Tenant: names[0], Cost: 10}, start.Add(11*time.Second))
	if d.Admitted || d.Reason != sluice.ReasonPolicyRate || d.Scope != sluice.ScopeTenant || !d.Retryable {
		t.Errorf("over the tenant cap: %+v, want policy_rate at scope tenant", d)
	}
	d, _ = gatetest.Decide(context.Background(), g, &sluice.Request{Class: "free", Tenant: "x", Cost: 21}, start.Add(11*time.Second))
	if d.Admitted || d.Retryable {
		t.Errorf("a cost above the tenant bucket: %+v, want a final rejection", d)
	}
}

// The units no class reserves are shared fairly between the classes that
// borrow them: two classes that each want more than half of the 50 units/s
// left unreserved get 25 each (first come, first served gave one 41 and
// the other 9); a class that wants only 9 gets its 9 and the other the
// rest (max-min).
func TestReservationPoolSharedFairly(t *testing.T) {
	for _, c := range []struct {
		rateB      float64
		wantA, wnB int64 // units/s
	}{{300, 25, 25}, {9, 41, 9}} {
		g, _ := newReservation("units", ReservationOptions{Capacity: 1050,
			Classes: []ClassShare{{Class: "reserved", Reserve: 1000, NoBorrow: true}, {Class: "a"}, {Class: "b"}}})
		a := &stream{class: "a", cost: 1, rate: 900}
		b := &stream{class: "b", cost: 1, rate: c.rateB}
		busy := &stream{class: "reserved", cost: 1, rate: 2000} // its reserve all used: nothing of it lent
		start := clock.Instant(time.Second)
		run(t, g, start, 2*time.Second, a, b, busy)
		got := run(t, g, start.Add(2*time.Second), 20*time.Second, a, b, busy)
		within(t, fmt.Sprintf("a beside b at %v/s", c.rateB), got["a"], c.wantA*20, 0.05)
		within(t, fmt.Sprintf("b at %v/s", c.rateB), got["b"], c.wnB*20, 0.05)
	}
}

// However the classes come and go, what the pool hands out never passes
// what fills it: the work admitted in any run of T is at most
// (Capacity − Recovery)·T plus the buckets' depth, with the fair turn at
// the pool among three borrowing classes of random rates.
func TestReservationFairPoolKeepsTheBound(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		g, _ := newReservation("units", ReservationOptions{Capacity: 1000, Recovery: 50,
			Classes: []ClassShare{{Class: "r", Reserve: 500}, {Class: "a"}, {Class: "b"}}})
		var streams []*stream
		for _, class := range []string{"r", "a", "b", "c"} {
			streams = append(streams, &stream{class: class, cost: rapid.Int64Range(1, 5).Draw(rt, "cost"+class),
				rate: float64(rapid.IntRange(0, 2000).Draw(rt, "rate"+class))})
		}
		d := time.Duration(rapid.Int64Range(1, 5).Draw(rt, "seconds")) * time.Second
		got := run(t, g, clock.Instant(time.Second), d, streams...)
		total := int64(0)
		for _, c := range []string{"r", "a", "b", "c"} {
			total += got[c]
		}
		if bound := 950*int64(d/time.Second) + g.Depth(); total > bound {
			rt.Fatalf("%d units admitted in %v, above the bound %d", total, d, bound)
		}
	})
}
