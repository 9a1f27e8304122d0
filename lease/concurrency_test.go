package lease_test

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/lease"
)

func newConcurrency(t testing.TB, clk *fakeclock.Clock, l lease.Leaser, client string, a lease.Allocator) *lease.Concurrency {
	t.Helper()
	g, err := lease.NewConcurrency("pool", lease.GateOptions{Budget: "pool", Client: client, Leaser: l, Clock: clk, Allocator: a,
		RetryHint: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Two processes share 10 slots. The first holds all ten when the second
// arrives: the allocator gives the second nothing while the first's ten
// are in flight, even after the first's grant shrank to its fair 5, and
// the second's share grows as the first's requests end; the fleet never
// has more than 10 in flight.
func TestConcurrencyLeaseNeverTakesSlotsInFlight(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	a := lease.Allocator{Capacity: 10, Lease: time.Second, Refresh: 250 * time.Millisecond}
	ga, gb := newConcurrency(t, clk, l, "a", a), newConcurrency(t, clk, l, "b", a)
	ctx := context.Background()
	ga.Refresh(ctx) // learning: a is told a safe share of all 10
	var held []*sluice.Request
	for range 12 {
		r := &sluice.Request{Cost: 1}
		if d, _ := gatetest.Decide(ctx, ga, r, clk.Now()); d.Admitted {
			held = append(held, r)
		} else if d.Reason != sluice.ReasonConcurrency || d.Scope != sluice.ScopeService || d.RetryAfter != 50*time.Millisecond {
			t.Fatalf("rejection %+v, want concurrency at scope service, retry after the hint", d)
		}
	}
	if len(held) != 10 {
		t.Fatalf("a admitted %d of 12 on its safe share of 10", len(held))
	}
	clk.Set(int64(time.Hour + 600*time.Millisecond))
	ga.Refresh(ctx)                                   // still learning: 10 in use
	clk.Set(int64(time.Hour + 1100*time.Millisecond)) // past learning
	gb.Refresh(ctx)
	ga.Refresh(ctx) // a wants 10, b wants 10: a's fair 5, but 10 are in flight
	gb.Refresh(ctx)
	if granted := gb.Lease(clk.Now()).Granted; granted != 0 {
		t.Fatalf("b granted %d while a has 10 in flight", granted)
	}
	if granted := ga.Lease(clk.Now()).Granted; granted != 5 {
		t.Fatalf("a granted %d, want its fair 5", granted)
	}
	for _, r := range held[:5] {
		ga.Release(r, 1, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 20 * time.Millisecond})
	}
	if d, _ := gatetest.Decide(ctx, ga, &sluice.Request{Cost: 1}, clk.Now()); d.Admitted {
		t.Fatal("a admitted a sixth on a grant of 5")
	}
	ga.Refresh(ctx)
	gb.Refresh(ctx)
	if granted := gb.Lease(clk.Now()).Granted; granted != 5 {
		t.Fatalf("b granted %d after a's in flight fell to 5, want 5", granted)
	}
	if lim, in := ga.ConcurrencyLimit(); lim != 5 || in != 5 {
		t.Fatalf("a's ConcurrencyLimit %d, %d; want 5, 5", lim, in)
	}
}

// The concurrency a gate asks for follows Little's law: 400 requests/s
// held 50 ms each want 20 slots (22 with the 10% headroom, plus one).
func TestConcurrencyLeaseWantsLittlesLaw(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	rec := &recorder{Local: lease.Local{Clock: clk}}
	a := lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}
	g := newConcurrency(t, clk, rec, "a", a)
	ctx := context.Background()
	g.Refresh(ctx)
	clk.Advance(1100 * time.Millisecond)
	g.Refresh(ctx)
	for range 100 { // 100 requests over 250 ms, each held 50 ms: 400/s
		now := clk.Advance(2500 * time.Microsecond)
		r := &sluice.Request{Cost: 1}
		if d, _ := gatetest.Decide(ctx, g, r, now); !d.Admitted {
			t.Fatalf("rejected %+v", d)
		}
		g.Release(r, 1, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * time.Millisecond})
	}
	g.Refresh(ctx)
	if w := rec.last.Wants; w != 23 {
		t.Fatalf("wants %d, want 20 x 1.1 + 1 = 23", w)
	}
}

// recorder is a Local leaser that keeps the last request.
type recorder struct {
	lease.Local
	last lease.Request
}

func (r *recorder) Lease(ctx context.Context, budget string, a lease.Allocator, q lease.Request) (lease.Grant, error) {
	r.last = q
	return r.Local.Lease(ctx, budget, a, q)
}

// Whatever the processes offer, hold and release, and whenever they
// refresh (each at least every half lease time, so none is cut off): the
// fleet never has more slots in flight than the budget, from the new
// budget's first step, through learning and after.
func TestConcurrencyLeaseFleetNeverAboveCapacity(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := fakeclock.New(int64(time.Hour))
		l := &lease.Local{Clock: clk}
		a := lease.Allocator{Capacity: rapid.Int64Range(1, 50).Draw(t, "capacity"), Lease: time.Second, Refresh: 250 * time.Millisecond}
		n := rapid.IntRange(1, 4).Draw(t, "processes")
		gates := make([]*lease.Concurrency, n)
		last := make([]clock.Instant, n)
		held := make([][]*sluice.Request, n)
		for i := range gates {
			g, err := lease.NewConcurrency("pool", lease.GateOptions{Budget: "pool", Client: fmt.Sprint("p", i), Leaser: l, Clock: clk,
				Allocator: a, Weighted: true})
			if err != nil {
				t.Fatal(err)
			}
			gates[i] = g
		}
		ctx := context.Background()
		for step, steps := 0, rapid.IntRange(1, 300).Draw(t, "steps"); step < steps; step++ {
			now := clk.Advance(time.Duration(rapid.Int64Range(0, int64(100*time.Millisecond)).Draw(t, "gap")))
			for i, g := range gates {
				if now.Sub(last[i]) >= 500*time.Millisecond {
					g.Refresh(ctx)
					last[i] = now
				}
			}
			i := rapid.IntRange(0, n-1).Draw(t, "process")
			switch op := rapid.IntRange(0, 3).Draw(t, "op"); {
			case op == 0:
				gates[i].Refresh(ctx)
				last[i] = now
			case op == 1 && len(held[i]) > 0:
				k := rapid.IntRange(0, len(held[i])-1).Draw(t, "which")
				gates[i].Release(held[i][k], 1, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 10 * time.Millisecond})
				held[i] = append(held[i][:k], held[i][k+1:]...)
			default:
				r := &sluice.Request{Cost: rapid.Int64Range(1, 5).Draw(t, "cost")}
				if d, _ := gatetest.Decide(ctx, gates[i], r, now); d.Admitted {
					held[i] = append(held[i], r)
				}
			}
			total := 0
			for _, g := range gates {
				_, in := g.ConcurrencyLimit()
				total += in
			}
			if int64(total) > a.Capacity {
				t.Fatalf("step %d: %d slots in flight across the fleet, budget %d", step, total, a.Capacity)
			}
		}
	})
}

// A concurrency gate shut down while requests are still in flight gives
// its lease back but for those slots: the allocator keeps them counted
// until the holding expires, so another process is not granted slots the
// draining one still holds.
func TestConcurrencyLeaseDrainKeepsSlotsInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &lease.Local{}
		a := lease.Allocator{Capacity: 10, Lease: time.Second, Refresh: 250 * time.Millisecond}
		mk := func(client string) *lease.Concurrency {
			g, err := lease.NewConcurrency("pool", lease.GateOptions{Budget: "pool", Client: client, Leaser: l, Allocator: a})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		g1, g2 := mk("p1"), mk("p2")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { g1.Run(ctx); close(done) }()
		time.Sleep(10 * time.Millisecond) // learning: p1 spends its safe share of all 10
		for range 4 {
			if d, _ := gatetest.Decide(context.Background(), g1, &sluice.Request{Cost: 1}, clock.System.Now()); !d.Admitted {
				t.Fatalf("p1 rejected %+v", d)
			}
		}
		time.Sleep(1500 * time.Millisecond) // past learning, the 4 still in flight
		cancel()                            // p1 drains with 4 in flight
		<-done
		g2.Refresh(context.Background())
		if got := g2.Lease(clock.System.Now()).Granted; got != 6 {
			t.Fatalf("p2 granted %d beside p1's 4 draining, want 6", got)
		}
		for range 10 { // p2's demand: 10 at once (6 admitted)
			gatetest.Decide(context.Background(), g2, &sluice.Request{Cost: 1}, clock.System.Now())
		}
		time.Sleep(1100 * time.Millisecond) // p1's holding expires
		g2.Refresh(context.Background())
		// all it asks for: its peak of 7 (6 held and the one turned away)
		// plus 10% headroom, rounded up; nothing is kept for p1 now
		if got := g2.Lease(clock.System.Now()).Granted; got != 8 {
			t.Fatalf("p2 granted %d after p1's holding expired, want 8", got)
		}
	})
}
