package queue_test

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

var useful = sluice.Completion{Outcome: sluice.OutcomeUseful}

// Two releases back to back hand one slot to a waiter and leave one free;
// a request arriving before the waiter runs takes the free one. (Waiters
// were once woken to try the gate themselves: the arrival saw a woken
// waiter, queued behind it, and waited out MaxWait beside the free slot.)
func TestArrivalDuringAHandOffUsesTheFreeSlot(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // keep the woken waiter from running before the arrival
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 2), queue.Options{MaxWait: time.Second})
		ctx := context.Background()
		a, b := &sluice.Request{}, &sluice.Request{}
		_, pa := gatetest.Decide(ctx, q, a, clock.Now())
		_, pb := gatetest.Decide(ctx, q, b, clock.Now())
		w1 := make(chan result, 1)
		go decide(q, ctx, &sluice.Request{}, w1)
		synctest.Wait()
		q.Release(a, pa, useful) // wakes w1 (woken = 1)
		q.Release(b, pb, useful) // no waiter left to wake
		c := make(chan result, 1)
		go decide(q, ctx, &sluice.Request{}, c) // arrives while woken = 1
		r1 := <-w1
		if !r1.d.Admitted {
			t.Fatalf("w1: %+v", r1.d)
		}
		rc := <-c
		if !rc.d.Admitted {
			// Show the slot was free all along.
			d, p := gatetest.Decide(ctx, q, &sluice.Request{}, clock.Now())
			t.Errorf("C: %+v after %v with one of two slots free (a fresh Decide now: admitted=%v)", rc.d, rc.waited, d.Admitted)
			if d.Admitted {
				q.Release(a, p, useful)
			}
		} else {
			q.Release(a, rc.p, useful)
		}
		q.Release(a, r1.p, useful)
	})
}

func weighted(t *testing.T, n int64) sluice.Gate {
	c, _ := limit.NewConcurrency(n)
	g, err := gate.NewWeightedInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A weighted pool of 2: the release of a cost-2 request serves both cost-1
// waiters. (A release once woke one waiter, whatever it freed.)
func TestWeightedReleaseServesEveryWaiterThatFits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", weighted(t, 2), queue.Options{MaxWait: time.Second})
		ctx := context.Background()
		h := &sluice.Request{Cost: 2}
		d, ph := gatetest.Decide(ctx, q, h, clock.Now())
		if !d.Admitted {
			t.Fatal(d)
		}
		out := make(chan result, 2)
		x, y := &sluice.Request{Cost: 1}, &sluice.Request{Cost: 1}
		go decide(q, ctx, x, out)
		synctest.Wait()
		go decide(q, ctx, y, out)
		synctest.Wait()
		q.Release(h, ph, useful)
		for range 2 {
			r := <-out
			if !r.d.Admitted || r.waited != 0 {
				t.Errorf("waiter after a cost-2 release: %+v after %v", r.d, r.waited)
			}
		}
	})
}

// A weighted pool of 2: a request of cost 3 can never fit (the gate's
// rejection is not retryable), so it is answered at once and does not
// block the cost-1 request behind it. (It once queued, and each release
// woke it at the head only to fail.)
func TestRequestAboveTheLimitDoesNotWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", weighted(t, 2), queue.Options{MaxWait: time.Second})
		ctx := context.Background()
		h := &sluice.Request{Cost: 1}
		_, ph := gatetest.Decide(ctx, q, h, clock.Now())
		big, small := make(chan result, 1), make(chan result, 1)
		go decide(q, ctx, &sluice.Request{Cost: 3}, big)
		synctest.Wait()
		go decide(q, ctx, &sluice.Request{Cost: 1}, small) // 1 of 2 slots free
		synctest.Wait()
		q.Release(h, ph, useful) // 2 of 2 free now
		rs := <-small
		rb := <-big
		if !rs.d.Admitted || rs.waited != 0 {
			t.Errorf("cost-1 request with free slots: %+v after %v", rs.d, rs.waited)
		}
		if rb.waited != 0 || rb.d.Retryable {
			t.Errorf("cost-3 request over a limit of 2: %+v after %v (want the inner gate's non-retryable rejection at once)", rb.d, rb.waited)
		}
	})
}

// flaky is a pool whose next Decide fails with reason dependency (a store
// error under FailClosed, or a gate that honours a cancelled ctx).
type flaky struct {
	sluice.Gate
	mu   sync.Mutex
	fail bool
}

func (f *flaky) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = f.decide(ctx, r, now)
	return p
}

func (f *flaky) decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	f.mu.Lock()
	fail := f.fail
	f.fail = false
	f.mu.Unlock()
	if fail {
		return sluice.Decision{Reason: sluice.ReasonDependency, Gate: "pool", Retryable: true}, 0
	}
	return gatetest.Decide(ctx, f.Gate, r, now)
}

// The waiter served first gets the gate's other rejection (a store
// failure), and the slot goes on to the next waiter. (It was once lost
// until the next release.)
func TestWaiterRejectedForAnotherReasonPassesTheSlotOn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		inner := &flaky{Gate: pool(t, 1)}
		q, _ := queue.New("pool", inner, queue.Options{MaxWait: time.Second})
		ctx := context.Background()
		h := &sluice.Request{}
		_, ph := gatetest.Decide(ctx, q, h, clock.Now())
		w1, w2 := make(chan result, 1), make(chan result, 1)
		go decide(q, ctx, &sluice.Request{}, w1)
		synctest.Wait()
		go decide(q, ctx, &sluice.Request{}, w2)
		synctest.Wait()
		inner.mu.Lock()
		inner.fail = true
		inner.mu.Unlock()
		q.Release(h, ph, useful)
		if r := <-w1; r.d.Reason != sluice.ReasonDependency {
			t.Fatalf("w1: %+v", r.d)
		}
		r := <-w2
		if !r.d.Admitted || r.waited != 0 {
			t.Errorf("w2 with the only slot free: %+v after %v", r.d, r.waited)
		} else {
			q.Release(h, r.p, useful)
		}
	})
}

// The same in event mode.
func TestEventWaiterRejectedForAnotherReasonPassesTheSlotOn(t *testing.T) {
	clk := fakeclock.New(1000)
	inner := &flaky{Gate: pool(t, 1)}
	q, _ := queue.New("pool", inner, queue.Options{MaxWait: 100 * time.Millisecond, Clock: clk, Events: true})
	var got []readiness
	park := &queue.Park{Ready: func(tag uint64, d sluice.Decision) { got = append(got, readiness{tag, d}) }}
	ctx := queue.ContextWithPark(context.Background(), park)
	h := &sluice.Request{}
	_, ph := gatetest.Decide(ctx, q, h, clk.Now())
	for tag := uint64(1); tag <= 2; tag++ {
		park.Tag, park.Queue = tag, nil
		gatetest.Decide(ctx, q, &sluice.Request{}, clk.Now())
	}
	inner.mu.Lock()
	inner.fail = true
	inner.mu.Unlock()
	q.Release(h, ph, useful)
	if len(got) != 2 || !got[1].d.Admitted {
		t.Errorf("ready calls %+v: want tag 1 rejected (dependency) and tag 2 granted the free slot", got)
	}
}

// A moving limit grows under two sheddable waiters; a critical arrival,
// admitted at once, also lets them take the new slots. (The arrival once
// returned without looking at lower classes.)
func TestGrownLimitServesLowerClassesOnAnArrival(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: 1, Min: 1, Max: 10})
		g, _ := adaptive.NewGate("pool", c, adaptive.GateOptions{})
		g.Pin(1)
		q, _ := queue.New("pool", g, queue.Options{MaxWait: time.Second, Classes: []string{"critical", "sheddable"}})
		ctx := context.Background()
		holder := &sluice.Request{}
		_, ph := gatetest.Decide(ctx, q, holder, clock.Now())
		out := make(chan result, 2)
		for range 2 {
			go decide(q, ctx, &sluice.Request{Class: "sheddable"}, out)
		}
		synctest.Wait()
		g.Pin(4)
		d, pc := gatetest.Decide(ctx, q, &sluice.Request{Class: "critical"}, clock.Now())
		if !d.Admitted {
			t.Fatal(d)
		}
		for range 2 {
			r := <-out
			if !r.d.Admitted || r.waited != 0 {
				l, n := g.ConcurrencyLimit()
				t.Errorf("sheddable waiter: %+v after %v (limit %d, in flight %d)", r.d, r.waited, l, n)
			} else {
				q.Release(holder, r.p, useful)
			}
		}
		q.Release(holder, pc, useful)
		q.Release(holder, ph, useful)
	})
}

// The same in event mode.
func TestEventGrownLimitServesLowerClassesOnAnArrival(t *testing.T) {
	clk := fakeclock.New(1000)
	c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: 1, Min: 1, Max: 10})
	g, _ := adaptive.NewGate("pool", c, adaptive.GateOptions{})
	g.Pin(1)
	q, _ := queue.New("pool", g, queue.Options{MaxWait: 100 * time.Millisecond, Clock: clk, Events: true, Classes: []string{"critical", "sheddable"}})
	var got []readiness
	park := &queue.Park{Ready: func(tag uint64, d sluice.Decision) { got = append(got, readiness{tag, d}) }}
	ctx := queue.ContextWithPark(context.Background(), park)
	gatetest.Decide(ctx, q, &sluice.Request{}, clk.Now())
	for tag := uint64(1); tag <= 2; tag++ {
		park.Tag, park.Queue = tag, nil
		gatetest.Decide(ctx, q, &sluice.Request{Class: "sheddable"}, clk.Now())
	}
	g.Pin(4)
	park.Tag, park.Queue = 3, nil
	if d, _ := gatetest.Decide(ctx, q, &sluice.Request{Class: "critical"}, clk.Now()); !d.Admitted || park.Queue != nil {
		t.Fatalf("critical: %+v parked=%v", d, park.Queue != nil)
	}
	l, n := g.ConcurrencyLimit()
	if len(got) != 2 {
		t.Errorf("ready calls %+v with limit %d, in flight %d: want both sheddable waiters granted", got, l, n)
	}
}
