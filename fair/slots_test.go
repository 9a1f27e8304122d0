package fair

import (
	"context"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/queue"
)

type held struct {
	r *sluice.Request
	p sluice.Permit
}

func take(t *testing.T, g *slots, class string, deadline time.Duration, now clock.Instant) (held, bool) {
	t.Helper()
	r := &sluice.Request{Class: class, Cost: 1}
	if deadline > 0 {
		r.Deadline = now.Add(deadline)
	}
	d, p := gatetest.Decide(context.Background(), g, r, now)
	if !d.Admitted && (d.Reason != sluice.ReasonConcurrency || !d.Retryable) {
		t.Fatalf("%s: %+v, want a retryable concurrency rejection", class, d)
	}
	return held{r, p}, d.Admitted
}

// Premium reserves 6 units in flight, free 4, of 10 usable, with a
// recovery headroom of 3 (13 in all). With premium idle, free borrows its
// 4 and 3 of premium's (the headroom's size; its requests' deadlines are
// within the revocation time), never more; premium, back, is admitted at
// once to its whole reserve, into the headroom, and nothing is lent
// again until the revocation time has passed.
func TestSlotsLendAndReclaim(t *testing.T) {
	g, err := newSlots("slots", SlotOptions{InFlight: 13, Recovery: 3, Revocation: time.Second,
		Classes: []ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 4}}})
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
	if len(free) != 7 {
		t.Fatalf("free holds %d units with premium idle, want its 4 and 3 lent", len(free))
	}
	if _, ok := take(t, g, "free", 0, now); ok {
		t.Fatal("a request without a deadline borrowed")
	}
	var premium []held
	for i := 0; i < 6; i++ {
		p, ok := take(t, g, "premium", 0, now)
		if !ok {
			t.Fatalf("premium refused at %d units of its reserve of 6, its units lent", i)
		}
		premium = append(premium, p)
	}
	if _, ok := take(t, g, "premium", 500*time.Millisecond, now); ok {
		t.Fatal("premium admitted past its reserve with every unit held")
	}
	// The loans end: nothing is lent again while premium reclaims.
	for _, h := range free[4:] {
		g.Release(h.r, h.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now})
	}
	g.Release(premium[0].r, premium[0].p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now})
	if _, ok := take(t, g, "free", 100*time.Millisecond, now.Add(500*time.Millisecond)); ok {
		t.Fatal("free borrowed again within the revocation time of premium's reclaim")
	}
	// After the revocation time premium's idle unit is lent again.
	later := now.Add(2 * time.Second)
	if _, ok := take(t, g, "free", 100*time.Millisecond, later); !ok {
		t.Fatal("premium's idle unit was not lent after the revocation time")
	}
	if _, ok := take(t, g, "free", 2*time.Second, later); ok {
		t.Fatal("a request whose deadline is past the revocation time borrowed")
	}
}

// Without recovery headroom no reserved unit is lent: the owner's reserve
// is always free for it.
func TestSlotsLendNothingWithoutRecovery(t *testing.T) {
	g, _ := newSlots("slots", SlotOptions{InFlight: 10,
		Classes: []ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 4}}})
	now := clock.Instant(time.Second)
	n := 0
	for i := 0; i < 12; i++ {
		if _, ok := take(t, g, "free", 100*time.Millisecond, now); ok {
			n++
		}
	}
	if n != 4 {
		t.Fatalf("free holds %d units, want its reserve of 4", n)
	}
	for i := 0; i < 6; i++ {
		if _, ok := take(t, g, "premium", 0, now); !ok {
			t.Fatalf("premium refused at %d units of its reserve", i)
		}
	}
}

func TestSlotsRejectBadOptions(t *testing.T) {
	for _, o := range []SlotOptions{
		{},
		{InFlight: 10, Recovery: 10},
		{InFlight: 10, Classes: []ClassShare{{Class: "a", Reserve: 6}, {Class: "b", Reserve: 5}}},
		{InFlight: 10, Classes: []ClassShare{{Class: "a", Reserve: 2, Tenant: 1}}},
		{InFlight: 10, Classes: []ClassShare{{Class: "a", Reserve: 5, Max: 4}}},
		{InFlight: 10, Revocation: time.Hour},
	} {
		if _, err := newSlots("s", o); err == nil {
			t.Errorf("%+v: accepted", o)
		}
	}
}

// Whatever arrives and leaves, a class within its reserve is admitted,
// the units held never pass inflight, and pass inflight − recovery only
// by the units lent while an owner reclaims; a class never holds more
// than its max.
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
		g, err := newSlots("s", SlotOptions{InFlight: inflight, Recovery: recovery, Revocation: 100 * time.Millisecond,
			Classes: []ClassShare{{Class: "a", Reserve: ra, Max: maxA}, {Class: "b", Reserve: rb}}})
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
			d, p := gatetest.Decide(context.Background(), g, r, now)
			own := map[string]int64{"a": ra, "b": rb}[r.Class]
			if !d.Admitted {
				if inReserve(live, r.Class)+r.Cost <= own && (maxA == 0 || r.Class != "a" || units["a"]+r.Cost <= maxA) {
					t.Fatalf("class %s refused %d units within its reserve of %d", r.Class, r.Cost, own)
				}
				continue
			}
			live = append(live, held{r, p})
			units[r.Class] += r.Cost
			total += r.Cost
			if total > inflight || (total > usable && p != 1) {
				t.Fatalf("%d units held (permit %d), usable %d, inflight %d", total, p, usable, inflight)
			}
			if maxA > 0 && units["a"] > maxA {
				t.Fatalf("class a holds %d, max %d", units["a"], maxA)
			}
		}
	})
}

// Behind a wait queue, a premium request whose reserve is lent is
// admitted at once (into the recovery headroom), not parked.
func TestSlotsBehindAQueue(t *testing.T) {
	clk := fakeclock.New(int64(time.Second))
	s, _ := newSlots("slots", SlotOptions{InFlight: 6, Recovery: 2,
		Classes: []ClassShare{{Class: "premium", Reserve: 3}, {Class: "free", Reserve: 1}}})
	q, err := queue.New("slots", s, queue.Options{MaxWait: time.Second, Classes: []string{"premium", "free"}, Clock: clk, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	park := &queue.Park{Ready: func(uint64, sluice.Decision) {}}
	ctx := queue.ContextWithPark(context.Background(), park)
	for i := 0; i < 3; i++ { // free's 1 and 2 of premium's 3 lent
		park.Queue = nil
		d, _ := gatetest.Decide(ctx, q, &sluice.Request{Class: "free", Deadline: clk.Now().Add(500 * time.Millisecond)}, clk.Now())
		if !d.Admitted || park.Queue != nil {
			t.Fatalf("free %d: %+v parked %v", i, d, park.Queue != nil)
		}
	}
	for i := 0; i < 3; i++ {
		park.Queue = nil
		d, _ := gatetest.Decide(ctx, q, &sluice.Request{Class: "premium"}, clk.Now())
		if !d.Admitted || park.Queue != nil {
			t.Fatalf("premium %d: %+v parked %v, want admitted at once", i, d, park.Queue != nil)
		}
	}
}

// Units no class reserves go to any request past its reserve, whatever its
// deadline (they need no reclaim); a request that could never be admitted
// is refused as not retryable, so a queue in front does not hold it.
func TestSlotsUnreservedUnits(t *testing.T) {
	g, _ := newSlots("slots", SlotOptions{InFlight: 10,
		Classes: []ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 2}, {Class: "fixed", NoBorrow: true}}})
	now := clock.Instant(time.Second)
	for i := 0; i < 2; i++ {
		if _, ok := take(t, g, "default", 0, now); !ok {
			t.Fatalf("unlisted request %d without a deadline: refused with 2 units unreserved", i)
		}
	}
	if _, ok := take(t, g, "default", 0, now); ok {
		t.Fatal("a third unlisted request took a reserved unit without a deadline within the revocation time")
	}
	d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Class: "fixed"}, now)
	if d.Admitted || d.Retryable {
		t.Fatalf("a class with no reserve that never borrows: %+v, want a final rejection", d)
	}
	d, _ = gatetest.Decide(context.Background(), g, &sluice.Request{Class: "premium", Cost: 11}, now)
	if d.Admitted || d.Retryable {
		t.Fatalf("a cost above every unit: %+v, want a final rejection", d)
	}
}

// inReserve is what class holds within its reserve among live.
func inReserve(live []held, class string) int64 {
	n := int64(0)
	for _, h := range live {
		if h.r.Class == class && h.p == 1 {
			n += h.r.Cost
		}
	}
	return n
}
