package queue_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/queue"
)

// A slot freed after a waiter's wait has run out on the queue's clock is
// not given to it: grant handed it over whatever the time, so a clock that
// moved past the deadline (or a release that beat the wait's timer) started
// the request late (found by a review run: 450 ms after its deadline).
func TestNoGrantPastTheWait(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second, Clock: clk})
	ctx := context.Background()
	a := &sluice.Request{}
	d, pa := gatetest.Decide(ctx, q, a, clk.Now())
	if !d.Admitted {
		t.Fatal(d)
	}
	out := make(chan result, 1)
	b := &sluice.Request{Deadline: clk.Now().Add(50 * time.Millisecond)}
	go decide(q, ctx, b, out)
	poll.Until(t, 10*time.Second, func() bool { n, _, _, _ := q.QueueStats(clk.Now()); return n == 1 })
	clk.Advance(500 * time.Millisecond)
	q.Release(a, pa, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now()})
	if r := <-out; r.d.Admitted || r.d.Reason != sluice.ReasonQueue {
		t.Fatalf("a waiter past its deadline: %+v", r.d)
	}
	// The slot it did not take is free for the next request.
	if d, p := gatetest.Decide(ctx, q, &sluice.Request{}, clk.Now()); !d.Admitted {
		t.Fatalf("the slot after the turned-away waiter: %+v", d)
	} else {
		q.Release(&sluice.Request{}, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now()})
	}
}

// A release at the very instant a wait ends (the request's deadline, with
// no service time known) does not start the request: it would start at
// its deadline. Before, it did in about a quarter of the runs.
func TestNoGrantAtTheDeadline(t *testing.T) {
	for range 50 {
		synctest.Test(t, func(t *testing.T) {
			q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second})
			ctx := context.Background()
			a := &sluice.Request{}
			_, pa := gatetest.Decide(ctx, q, a, clock.Now())
			b := &sluice.Request{Deadline: clock.Now().Add(50 * time.Millisecond)}
			out := make(chan result, 1)
			go decide(q, ctx, b, out)
			go func() {
				time.Sleep(50 * time.Millisecond)
				q.Release(a, pa, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clock.Now()})
			}()
			if r := <-out; r.d.Admitted && clock.Now() >= b.Deadline {
				t.Fatalf("admitted at %v, its deadline", clock.Now().Sub(b.Deadline))
			}
		})
	}
}
