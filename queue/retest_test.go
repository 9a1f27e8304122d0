package queue_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/shed"
)

// A deadline gate's retest passes the queue's own start-in-time test: both
// learned the latencies of a limit's overshoot (100 ms against deadlines of
// twice a 50 ms service), and the queue refused every retest the gate let
// through (one a second), so neither estimate could learn that the
// service was fast again and the service idled for seconds. A mark set
// before the chain does not carry over.
func TestDeadlineRetestPassesTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk,
			ServiceTime: func(string) time.Duration { return 100 * time.Millisecond }})
		dl, _ := shed.NewDeadline("in-time", shed.DeadlineOptions{})
		chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, dl, q)
		for range 20 {
			dl.Release(&sluice.Request{}, 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 100 * time.Millisecond, Now: clk.Now()})
		}
		ctx := context.Background()
		ask := func() (*sluice.Request, sluice.Decision, sluice.Ticket) {
			r := &sluice.Request{Deadline: clk.Now().Add(100 * time.Millisecond)}
			d, tk := chain.Decide(ctx, r)
			return r, d, tk
		}
		r, d, tk := ask()
		if !d.Admitted || !r.Retest() {
			t.Fatalf("the retest: admitted %v (%v %s), marked %v; want admitted past the queue", d.Admitted, d.Reason, d.Gate, r.Retest())
		}
		if qd, _ := gatetest.Decide(ctx, q, &sluice.Request{Deadline: clk.Now().Add(100 * time.Millisecond)}, clk.Now()); qd.Admitted || qd.Reason != sluice.ReasonDeadline {
			t.Fatalf("an unmarked request at the queue alone: %+v; want refused for its deadline", qd)
		}
		time.Sleep(50 * time.Millisecond)
		tk.Done(sluice.OutcomeUseful) // back in time: the next retest may go at once
		r, d, tk = ask()
		if !d.Admitted || !r.Retest() {
			t.Fatalf("the second retest: admitted %v (%v %s), marked %v", d.Admitted, d.Reason, d.Gate, r.Retest())
		}
		pre := &sluice.Request{Deadline: clk.Now().Add(100 * time.Millisecond)}
		pre.MarkRetest() // while the second is out: refused, the caller's mark cleared
		if d, _ := chain.Decide(ctx, pre); d.Admitted || pre.Retest() {
			t.Fatalf("while a retest is out: admitted %v, marked %v; want refused, unmarked", d.Admitted, pre.Retest())
		}
		tk.Done(sluice.OutcomeUseful)
	})
}

// A queue that shares a deadline gate's estimates reads them: it never
// saw a completion, and still turns away a request whose 20 ms left cannot
// hold the 30 ms its class takes.
func TestQueueSharesServiceTimes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk})
		times := shed.NewDecayingServiceTimes(time.Second)
		for range 20 {
			times.ObserveAt("default", 30*time.Millisecond, clk.Now())
		}
		ctx := context.Background()
		r := &sluice.Request{Class: "default", Deadline: clk.Now().Add(20 * time.Millisecond)}
		if d, p := gatetest.Decide(ctx, q, r, clk.Now()); !d.Admitted {
			t.Fatalf("on its own (no completions seen): %+v; want admitted", d)
		} else {
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeCancelled, Now: clk.Now()})
		}
		q.ShareServiceTimes(times)
		if d, _ := gatetest.Decide(ctx, q, r, clk.Now()); d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("sharing 30 ms estimates: %+v; want refused for its deadline", d)
		}
	})
}

// A queue sharing a deadline gate's estimates that learn nothing (the
// gate switched off: the chain skips it) still tests deadlines on its own.
func TestQueueSharingFallsBackToItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk})
		q.ShareServiceTimes(shed.NewDecayingServiceTimes(time.Second))
		ctx := context.Background()
		for range 20 {
			r := &sluice.Request{Class: "default"}
			_, p := gatetest.Decide(ctx, q, r, clk.Now())
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 30 * time.Millisecond, Now: clk.Now()})
		}
		r := &sluice.Request{Class: "default", Deadline: clk.Now().Add(20 * time.Millisecond)}
		if d, _ := gatetest.Decide(ctx, q, r, clk.Now()); d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("own estimates of 30 ms, shared ones empty: %+v; want refused for its deadline", d)
		}
	})
}

// Once the shared estimates have known a class, they alone decide, also
// when a retest cut them below what they trust: the queue's own, which no
// retest cuts, held a limit overshoot's 106 ms against a 100 ms deadline
// and turned away every request for 3 s (4 workers × 50 ms, the capacity
// matrix).
func TestQueueSharingOutweighsItsOwnOnceKnown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk})
		shared := shed.NewDecayingServiceTimes(time.Second)
		q.ShareServiceTimes(shared)
		ctx := context.Background()
		for range 40 { // both learn the overshoot
			shared.ObserveAt("default", 110*time.Millisecond, clk.Now())
			r := &sluice.Request{Class: "default"}
			_, p := gatetest.Decide(ctx, q, r, clk.Now())
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 110 * time.Millisecond, Now: clk.Now()})
		}
		shared.Scale("default", 0.05) // retests came back in time: cut to 2 samples' weight
		r := &sluice.Request{Class: "default", Deadline: clk.Now().Add(100 * time.Millisecond)}
		d, p := gatetest.Decide(ctx, q, r, clk.Now())
		if !d.Admitted {
			t.Fatalf("shared estimates cut, own ones at 110 ms: %+v; want admitted (the shared ones decide)", d)
		}
		q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * time.Millisecond, Now: clk.Now()})
	})
}

// Sharing nil estimates shares nothing: the queue keeps its own (a nil
// *shed.ServiceTimes once made every start test panic).
func TestQueueSharingNilKeepsItsOwn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := bubbleClock{time.Now()}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 200 * time.Millisecond, Clock: clk})
		var none *shed.ServiceTimes
		q.ShareServiceTimes(none)
		q.ShareServiceTimes(nil)
		ctx := context.Background()
		for range 20 {
			r := &sluice.Request{Class: "default"}
			_, p := gatetest.Decide(ctx, q, r, clk.Now())
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 30 * time.Millisecond, Now: clk.Now()})
		}
		r := &sluice.Request{Class: "default", Deadline: clk.Now().Add(20 * time.Millisecond)}
		if d, _ := gatetest.Decide(ctx, q, r, clk.Now()); d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("own estimates of 30 ms, nil shared: %+v; want refused for its deadline", d)
		}
		q.ReportState(clk.Now())
	})
}
