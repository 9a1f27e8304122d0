package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/lease"
)

// during is a Local leaser that runs hook inside the allocator call, before
// the step: what the process does while its refresh is on the wire (a
// Redis round trip), when the gate decides on its old grant.
type during struct {
	lease.Local
	hook func(r lease.Request)
}

func (d *during) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	if h := d.hook; h != nil {
		d.hook = nil
		h(r)
	}
	return d.Local.Lease(ctx, budget, a, r)
}

func inFlight(gs ...*lease.Concurrency) int {
	n := 0
	for _, g := range gs {
		_, in := g.ConcurrencyLimit()
		n += in
	}
	return n
}

// A concurrency gate keeps deciding on its old grant while its refresh is
// on the wire. It reports what it had in flight when the refresh left; the
// slots it admits meanwhile are not in that report, so when the grant
// shrinks the allocator hands them to another process: the fleet has more
// in flight than the budget although every process reaches the allocator.
func TestConcurrencyAdmitsDuringItsRefreshWithinBudget(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &during{Local: lease.Local{Clock: clk}}
	a := lease.Allocator{Capacity: 10, Lease: time.Second, Refresh: 250 * time.Millisecond}
	ga, gb := newConcurrency(t, clk, l, "a", a), newConcurrency(t, clk, l, "b", a)
	ctx := context.Background()
	ga.Refresh(ctx) // learning; a spends its safe share of 10
	var early []*sluice.Request
	for range 10 { // demand on a: 10 at once, then ended
		r := &sluice.Request{Cost: 1}
		if d, _ := gatetest.Decide(ctx, ga, r, clk.Now()); d.Admitted {
			early = append(early, r)
		}
	}
	for _, r := range early {
		ga.Release(r, 1, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * time.Millisecond})
	}
	clk.Advance(1100 * time.Millisecond) // past learning
	ga.Refresh(ctx)
	if got := ga.Lease(clk.Now()).Granted; got != 10 {
		t.Fatalf("a granted %d, want all 10", got)
	}
	gb.Refresh(ctx) // b: nothing while a holds 10
	for range 3 {   // b's demand, turned away
		gatetest.Decide(ctx, gb, &sluice.Request{Cost: 1}, clk.Now())
	}
	clk.Advance(250 * time.Millisecond)
	// a's demand fell, so its refresh asks for little; while the refresh
	// is on the wire, ten requests arrive and a admits them on its live
	// grant of 10
	var held []*sluice.Request
	l.hook = func(lease.Request) {
		for range 10 {
			r := &sluice.Request{Cost: 1}
			if d, _ := gatetest.Decide(ctx, ga, r, clk.Now()); d.Admitted {
				held = append(held, r)
			}
		}
	}
	ga.Refresh(ctx)
	gb.Refresh(ctx)
	for range 10 {
		gatetest.Decide(ctx, gb, &sluice.Request{Cost: 1}, clk.Now())
	}
	if n := inFlight(ga, gb); n > 10 {
		t.Fatalf("%d slots in flight on a budget of 10 (a %d admitted during its refresh, a granted %d, b granted %d)",
			n, len(held), ga.Lease(clk.Now()).Granted, gb.Lease(clk.Now()).Granted)
	}
}

// A new concurrency budget is shared by the processes that use it within
// two rounds of learning refreshes (package doc). A process spending its
// safe share with slots in flight has them counted twice by the allocator
// (as in use and as its safe share), so the other process is told a safe
// share of nothing for the whole learning period, with half the budget
// idle.
func TestConcurrencyLearningSharesANewBudget(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	a := lease.Allocator{Capacity: 10, Lease: 10 * time.Second, Refresh: 2500 * time.Millisecond}
	ga, gb := newConcurrency(t, clk, l, "a", a), newConcurrency(t, clk, l, "b", a)
	ctx := context.Background()
	ga.Refresh(ctx)
	for range 5 { // a holds 5 of its safe share of 10
		if d, _ := gatetest.Decide(ctx, ga, &sluice.Request{Cost: 1}, clk.Now()); !d.Admitted {
			t.Fatalf("a rejected %+v", d)
		}
	}
	for range 8 { // four rounds of learning refreshes (R/16 each), well within the 10 s learning
		clk.Advance(200 * time.Millisecond)
		ga.Refresh(ctx)
		gb.Refresh(ctx)
		gatetest.Decide(ctx, gb, &sluice.Request{Cost: 1}, clk.Now()) // b's demand
	}
	if lim, _ := gb.ConcurrencyLimit(); lim == 0 {
		limA, inA := ga.ConcurrencyLimit()
		t.Fatalf("b may hold nothing of 10 while a holds %d (a's limit %d)", inA, limA)
	}
}

// A gate whose Run ended has given its lease back, and the allocator
// grants the share to the others at once; the gate must not go on
// spending the grant it gave back.
func TestGateStopsSpendingTheLeaseItGaveBack(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	a := lease.Allocator{Capacity: 10, Lease: time.Second, Refresh: 250 * time.Millisecond}
	g1, g2 := newConcurrency(t, clk, l, "p1", a), newConcurrency(t, clk, l, "p2", a)
	ctx := context.Background()
	g1.Refresh(ctx)
	clk.Advance(1100 * time.Millisecond)
	g1.Refresh(ctx) // p1 holds all 10
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	g1.Run(stopped) // shut down with nothing in flight: the lease goes back
	g2.Refresh(ctx) // p2 is granted the 10
	for range 10 {
		gatetest.Decide(ctx, g1, &sluice.Request{Cost: 1}, clk.Now())
		gatetest.Decide(ctx, g2, &sluice.Request{Cost: 1}, clk.Now())
	}
	if n := inFlight(g1, g2); n > 10 {
		t.Fatalf("%d in flight on a budget of 10 after p1 gave its lease back (p1 still spends %d)", n, g1.Lease(clk.Now()).Spending)
	}
}

// FailClosed admits nothing once the lease lapsed: not even the one unit
// the bucket kept from the grant it spent before (a bucket at rate 0 still
// held up to one unit).
func TestGateFailClosedAdmitsNothingAfterTheLapse(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	g := newGate(t, clk, l, lease.FailClosed, 0)
	g.Refresh(context.Background())
	offer(g, clk, 2000, 1100*time.Millisecond) // demand, while learning (nothing admitted)
	g.Refresh(context.Background())            // past learning: 1,000/s
	clk.Advance(50 * time.Millisecond)
	gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, clk.Now()) // the bucket fills (50 units)
	clk.Advance(2 * time.Second)                                                  // lapsed, unrefreshed
	if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, clk.Now()); d.Admitted {
		t.Fatal("FailClosed admitted a request after the lease lapsed")
	}
}

// onReply is a Local leaser whose next answer is held back after the
// allocator's step: hook runs while it is on the wire, and lose drops it
// (the caller sees an error although the step ran: a timeout after Redis
// ran the script).
type onReply struct {
	lease.Local
	hook func()
	lose bool
}

func (o *onReply) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	g, err := o.Local.Lease(ctx, budget, a, r)
	if h := o.hook; h != nil {
		o.hook = nil
		h()
	}
	if o.lose {
		o.lose = false
		return lease.Grant{}, errors.New("timed out after the step ran")
	}
	return g, err
}

// liveGrants is the sum of the gates' live grants at now.
func liveGrants(now clock.Instant, gs ...*lease.Gate) int64 {
	sum := int64(0)
	for _, g := range gs {
		if st := g.Lease(now); st.Live {
			sum += st.Granted
		}
	}
	return sum
}

// A rate gate spends its old grant until the answer to its refresh
// applies, and to that grant's expiry when the answer is lost although the
// step ran. The allocator gave the room a shrinking grant left to another
// process at once: the live grants summed to 1,500 on a budget of 1,000,
// while the reply was on the wire, or for the rest of the old lease when
// it was lost. Now the allocator keeps what the gate was spending until
// its next step, and a gate whose grant shrank asks again at once, so the
// other process gets the room one step later.
func TestGateShrinkingGrantNeverSumsAboveCapacity(t *testing.T) {
	for _, lost := range []bool{false, true} {
		clk := fakeclock.New(int64(time.Hour))
		l := &onReply{Local: lease.Local{Clock: clk}}
		a := lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}
		mk := func(client string) *lease.Gate {
			g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: client, Leaser: l, Clock: clk, Allocator: a})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		ga, gb := mk("a"), mk("b")
		ctx := context.Background()
		ga.Refresh(ctx)                             // the allocator learns
		offer(ga, clk, 1000, 1100*time.Millisecond) // a's demand: 1,000/s
		ga.Refresh(ctx)                             // a alone: all of it
		gb.Refresh(ctx)                             // b: nothing left while a holds it all
		offer(ga, clk, 1000, 100*time.Millisecond)
		offer(gb, clk, 1000, 100*time.Millisecond) // b's demand, turned away
		check := func(when string) {
			t.Helper()
			if sum := liveGrants(clk.Now(), ga, gb); sum > a.Capacity {
				t.Errorf("lost %v, %s: the live grants sum to %d (a %d, b %d), above the capacity %d", lost, when, sum,
					ga.Lease(clk.Now()).Granted, gb.Lease(clk.Now()).Granted, a.Capacity)
			}
		}
		// a's refresh shrinks it to its fair share of 500: b refreshes
		// while the answer is on the wire, or after it was lost
		if lost {
			l.lose = true
		} else {
			l.hook = func() { gb.Refresh(ctx); check("b refreshed while a's answer was on the wire") }
		}
		wait, err := ga.Refresh(ctx)
		check("a's answer in")
		if lost {
			if err == nil {
				t.Fatal("the lost answer reported no error")
			}
			offer(ga, clk, 1000, wait)
			gb.Refresh(ctx)
			check("b refreshed after a's lost answer")
			wait, err = ga.Refresh(ctx) // a asks again; the old grant still runs
		}
		if err != nil || wait != 0 || ga.Lease(clk.Now()).Granted >= a.Capacity {
			t.Fatalf("lost %v: a granted %d, next refresh in %v, %v: want its share, confirmed at once", lost, ga.Lease(clk.Now()).Granted, wait, err)
		}
		ga.Refresh(ctx) // the confirmation
		gb.Refresh(ctx)
		check("after a confirmed")
		if got, left := gb.Lease(clk.Now()).Granted, a.Capacity-ga.Lease(clk.Now()).Granted; got < left*9/10 {
			t.Errorf("lost %v: b granted %d after a confirmed, want the %d a left", lost, got, left)
		}
	}
}

// overlap is a Local leaser that records the most calls it had at once.
type overlap struct {
	lease.Local
	mu       sync.Mutex
	now, max int
}

func (o *overlap) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	o.mu.Lock()
	o.now++
	o.max = max(o.max, o.now)
	o.mu.Unlock()
	time.Sleep(time.Millisecond) // the step on the wire, while others decide
	g, err := o.Local.Lease(ctx, budget, a, r)
	o.mu.Lock()
	o.now--
	o.mu.Unlock()
	return g, err
}

// An Inline gate decided on by several goroutines refreshes one at a
// time: concurrent steps of one client could have their answers applied
// out of order, an older grant over a newer.
func TestGateInlineRefreshesOneAtATime(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &overlap{Local: lease.Local{Clock: clk}}
	g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: "p1", Leaser: l, Clock: clk, Inline: true,
		Allocator: lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, clk.Now())
			}
		}()
	}
	wg.Wait()
	if l.max > 1 {
		t.Errorf("%d refreshes of one Inline gate at once", l.max)
	}
}
