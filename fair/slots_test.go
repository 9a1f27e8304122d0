package fair_test

import (
	"context"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/queue"
)

type held struct {
	r *sluice.Request
	p sluice.Permit
}

func take(t *testing.T, g *fair.Slots, class string, deadline time.Duration, now clock.Instant) (held, bool) {
	t.Helper()
	r := &sluice.Request{Class: class, Cost: 1}
	if deadline > 0 {
		r.Deadline = now.Add(deadline)
	}
	d, p := g.Decide(context.Background(), r, now)
	if !d.Admitted && (d.Reason != sluice.ReasonConcurrency || !d.Retryable) {
		t.Fatalf("%s: %+v, want a retryable concurrency rejection", class, d)
	}
	return held{r, p}, d.Admitted
}

// Premium reserves 6 of 10 units in flight, free 4. With premium idle,
// free borrows all 10 (its requests' deadlines are within the revocation
// time); premium then finds no room, which stops the lending: free
// releases give premium its units back, none goes to free again, and
// premium holds its 6 once the borrowed work is done.
func TestSlotsLendAndReclaim(t *testing.T) {
	g, err := fair.NewSlots("slots", fair.SlotOptions{InFlight: 10, Revocation: time.Second,
		Classes: []fair.ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	now := clock.Instant(time.Second)
	var free []held
	for i := 0; i < 12; i++ {
		if h, ok := take(t, g, "free", 500*time.Millisecond, now); ok {
			free = append(free, h)
		}
	}
	if len(free) != 10 {
		t.Fatalf("free holds %d units with premium idle, want all 10", len(free))
	}
	if _, ok := take(t, g, "free", 0, now); ok {
		t.Fatal("a request without a deadline borrowed")
	}
	if _, ok := take(t, g, "premium", 500*time.Millisecond, now); ok {
		t.Fatal("premium admitted beyond the usable units")
	}
	// Premium wants its reserve: each borrowed unit that comes back is not
	// lent again.
	var premium []held
	for len(free) > 4 {
		h := free[len(free)-1]
		free = free[:len(free)-1]
		g.Release(h.r, h.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now})
		if _, ok := take(t, g, "free", 100*time.Millisecond, now); ok {
			t.Fatal("free borrowed again while premium wanted its reserve")
		}
		p, ok := take(t, g, "premium", 0, now)
		if !ok {
			t.Fatal("premium did not get a unit that came back")
		}
		premium = append(premium, p)
	}
	if len(premium) != 6 {
		t.Fatalf("premium holds %d, want its reserve 6", len(premium))
	}
	// After the revocation time with premium at its reserve, nothing is
	// idle to lend; releases of premium's units may be lent again.
	later := now.Add(2 * time.Second)
	h := premium[0]
	g.Release(h.r, h.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: later})
	if _, ok := take(t, g, "free", 100*time.Millisecond, later); !ok {
		t.Fatal("premium's idle unit was not lent after the revocation time")
	}
	if _, ok := take(t, g, "free", 2*time.Second, later); ok {
		t.Fatal("a request whose deadline is past the revocation time borrowed")
	}
}

func TestSlotsRejectBadOptions(t *testing.T) {
	for _, o := range []fair.SlotOptions{
		{},
		{InFlight: 10, Recovery: 10},
		{InFlight: 10, Classes: []fair.ClassShare{{Class: "a", Reserve: 6}, {Class: "b", Reserve: 5}}},
		{InFlight: 10, Classes: []fair.ClassShare{{Class: "a", Reserve: 2, Tenant: 1}}},
		{InFlight: 10, Classes: []fair.ClassShare{{Class: "a", Reserve: 5, Max: 4}}},
		{InFlight: 10, Revocation: time.Hour},
	} {
		if _, err := fair.NewSlots("s", o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
}

// Whatever arrives and leaves, the units held never pass inflight −
// recovery, a class never holds more than its max, and a class within its
// reserve is admitted whenever the units are free.
func TestSlotsNeverAboveUsable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		inflight := rapid.Int64Range(1, 40).Draw(t, "inflight")
		recovery := rapid.Int64Range(0, inflight-1).Draw(t, "recovery")
		usable := inflight - recovery
		ra := rapid.Int64Range(0, usable).Draw(t, "reserveA")
		rb := rapid.Int64Range(0, usable-ra).Draw(t, "reserveB")
		maxA := rapid.Int64Range(0, usable).Draw(t, "maxA")
		if maxA > 0 && maxA < ra {
			maxA = ra
		}
		g, err := fair.NewSlots("s", fair.SlotOptions{InFlight: inflight, Recovery: recovery, Revocation: 100 * time.Millisecond,
			Classes: []fair.ClassShare{{Class: "a", Reserve: ra, Max: maxA}, {Class: "b", Reserve: rb}}})
		if err != nil {
			t.Fatal(err)
		}
		var live []held
		units := map[string]int64{}
		total := int64(0)
		now := clock.Instant(0)
		for i, n := 0, rapid.IntRange(1, 200).Draw(t, "n"); i < n; i++ {
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(50*time.Millisecond)).Draw(t, "gap")))
			if len(live) > 0 && rapid.Bool().Draw(t, "release") {
				j := rapid.IntRange(0, len(live)-1).Draw(t, "which")
				h := live[j]
				live = append(live[:j], live[j+1:]...)
				g.Release(h.r, h.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now})
				units[h.r.Class] -= h.r.Cost
				total -= h.r.Cost
				continue
			}
			r := &sluice.Request{Class: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "class"),
				Cost: rapid.Int64Range(1, 5).Draw(t, "cost")}
			if rapid.Bool().Draw(t, "deadline") {
				r.Deadline = now.Add(time.Duration(rapid.Int64Range(1, int64(200*time.Millisecond)).Draw(t, "left")))
			}
			d, p := g.Decide(context.Background(), r, now)
			if !d.Admitted {
				continue
			}
			live = append(live, held{r, p})
			units[r.Class] += r.Cost
			total += r.Cost
			if total > usable {
				t.Fatalf("%d units held, usable %d", total, usable)
			}
			if maxA > 0 && units["a"] > maxA {
				t.Fatalf("class a holds %d, max %d", units["a"], maxA)
			}
		}
	})
}

// Behind a wait queue that ranks premium first, a premium request that
// finds its reserve lent waits, and gets the first unit that comes back.
func TestSlotsBehindAQueue(t *testing.T) {
	clk := fakeclock.New(int64(time.Second))
	s, _ := fair.NewSlots("slots", fair.SlotOptions{InFlight: 4,
		Classes: []fair.ClassShare{{Class: "premium", Reserve: 3}, {Class: "free", Reserve: 1}}})
	q, err := queue.New("slots", s, queue.Options{MaxWait: time.Second, Classes: []string{"premium", "free"}, Clock: clk, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	var ready []uint64
	park := &queue.Park{Ready: func(tag uint64, d sluice.Decision) {
		if d.Admitted {
			ready = append(ready, tag)
		}
	}}
	ctx := queue.ContextWithPark(context.Background(), park)
	var free []held
	for i := 0; i < 4; i++ {
		r := &sluice.Request{Class: "free", Deadline: clk.Now().Add(500 * time.Millisecond)}
		park.Queue = nil
		d, p := q.Decide(ctx, r, clk.Now())
		if !d.Admitted || park.Queue != nil {
			t.Fatalf("free %d: %+v parked %v", i, d, park.Queue != nil)
		}
		free = append(free, held{r, p})
	}
	park.Queue, park.Tag = nil, 7
	d, _ := q.Decide(ctx, &sluice.Request{Class: "premium"}, clk.Now())
	if !d.Admitted || park.Queue == nil {
		t.Fatalf("premium: %+v, want to wait", d)
	}
	park.Queue, park.Tag = nil, 8
	q.Decide(ctx, &sluice.Request{Class: "free", Deadline: clk.Now().Add(100 * time.Millisecond)}, clk.Now())
	q.Release(free[0].r, free[0].p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now()})
	if len(ready) != 1 || ready[0] != 7 {
		t.Fatalf("granted %v after a free unit came back, want the premium waiter (7)", ready)
	}
}

// Units no class reserves go to any request past its reserve, whatever its
// deadline (they need no reclaim); a request that could never be admitted
// is refused as not retryable, so a queue in front does not hold it.
func TestSlotsUnreservedUnits(t *testing.T) {
	g, _ := fair.NewSlots("slots", fair.SlotOptions{InFlight: 10,
		Classes: []fair.ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 2}, {Class: "fixed", NoBorrow: true}}})
	now := clock.Instant(time.Second)
	for i := 0; i < 2; i++ {
		if _, ok := take(t, g, "default", 0, now); !ok {
			t.Fatalf("unlisted request %d without a deadline: refused with 2 units unreserved", i)
		}
	}
	if _, ok := take(t, g, "default", 0, now); ok {
		t.Fatal("a third unlisted request took a reserved unit without a deadline within the revocation time")
	}
	d, _ := g.Decide(context.Background(), &sluice.Request{Class: "fixed"}, now)
	if d.Admitted || d.Retryable {
		t.Fatalf("a class with no reserve that never borrows: %+v, want a final rejection", d)
	}
	d, _ = g.Decide(context.Background(), &sluice.Request{Class: "premium", Cost: 11}, now)
	if d.Admitted || d.Retryable {
		t.Fatalf("a cost above every unit: %+v, want a final rejection", d)
	}
}
