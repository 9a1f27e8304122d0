package queue_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

// pool is a service-wide concurrency gate of n slots.
func pool(t *testing.T, n int64) sluice.Gate {
	c, _ := limit.NewConcurrency(n)
	g, err := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// result is what one waiting request got.
type result struct {
	d      sluice.Decision
	p      sluice.Permit
	waited time.Duration
}

func decide(q *queue.Queue, ctx context.Context, r *sluice.Request, out chan<- result) {
	start := time.Now()
	d, p := gatetest.Decide(ctx, q, r, clock.Now())
	out <- result{d, p, time.Since(start)}
}

// A request that finds no slot waits for one, and gets it when a slot
// frees; one that waits longer than MaxWait is turned away with reason
// queue, retryable.
func TestWaitsForASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 100 * time.Millisecond})
		ctx := context.Background()
		a := &sluice.Request{}
		d, pa := gatetest.Decide(ctx, q, a, clock.Now())
		if !d.Admitted {
			t.Fatal(d)
		}
		out := make(chan result, 2)
		go decide(q, ctx, &sluice.Request{}, out)
		time.Sleep(30 * time.Millisecond) // fake time: the work of a
		q.Release(a, pa, sluice.Completion{Outcome: sluice.OutcomeUseful})
		b := <-out
		if !b.d.Admitted || b.waited != 30*time.Millisecond {
			t.Fatalf("the waiter: %+v after %v, want admitted after 30ms", b.d, b.waited)
		}
		go decide(q, ctx, &sluice.Request{}, out) // b holds the slot for good
		c := <-out
		if c.d.Admitted || c.d.Reason != sluice.ReasonQueue || !c.d.Retryable || c.waited != 100*time.Millisecond {
			t.Fatalf("past MaxWait: %+v after %v", c.d, c.waited)
		}
		q.Release(a, b.p, sluice.Completion{Outcome: sluice.OutcomeUseful})
	})
}

// Classes are served in priority order: a critical request that arrives
// after a backlog of sheddable ones gets the next slot.
func TestPriorityBetweenClasses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second, Classes: []string{"critical", "sheddable"}})
		ctx := context.Background()
		holder := &sluice.Request{}
		_, p := gatetest.Decide(ctx, q, holder, clock.Now())
		out := make(chan result, 10)
		for range 3 {
			go decide(q, ctx, &sluice.Request{Class: "sheddable"}, out)
		}
		synctest.Wait()
		crit := make(chan result, 1)
		go decide(q, ctx, &sluice.Request{Class: "critical"}, crit)
		synctest.Wait()
		q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
		got := <-crit
		if !got.d.Admitted {
			t.Fatalf("critical: %+v", got.d)
		}
		select {
		case r := <-out:
			t.Fatalf("a sheddable request went before the critical one: %+v", r.d)
		default:
		}
		q.Release(holder, got.p, sluice.Completion{Outcome: sluice.OutcomeUseful})
		for range 3 {
			r := <-out
			if r.d.Admitted {
				q.Release(holder, r.p, sluice.Completion{Outcome: sluice.OutcomeUseful})
			}
		}
	})
}

// A request predicted to start too late for its deadline does not wait:
// with one slot, a service time of 50 ms and two waiting ahead, a 120 ms
// budget cannot be met (the slot frees after 50/2 ms on average, the two
// ahead take 2 × 50 ms, then 50 ms of work: 175 ms).
func TestPredictedLateIsRejectedAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second,
			ServiceTime: func(string) time.Duration { return 50 * time.Millisecond }})
		ctx := context.Background()
		holder := &sluice.Request{}
		_, p := gatetest.Decide(ctx, q, holder, clock.Now())
		out := make(chan result, 3)
		for range 2 {
			go decide(q, ctx, &sluice.Request{}, out)
		}
		synctest.Wait()
		if got := q.QueueDelay("default"); got != 125*time.Millisecond {
			t.Fatalf("predicted queue delay %v, want 50/2 + 2 × 50 ms", got)
		}
		now := clock.Now()
		d, _ := gatetest.Decide(ctx, q, &sluice.Request{Deadline: now.Add(120 * time.Millisecond)}, now)
		if d.Admitted || d.Reason != sluice.ReasonDeadline || d.Retryable {
			t.Fatalf("predicted late: %+v", d)
		}
		for range 2 {
			q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
			if r := <-out; r.d.Admitted {
				p = r.p
			}
		}
		q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
	})
}

// A waiter whose caller gives up leaves at once and holds nothing; the
// next slot goes to the next waiter.
func TestCancelledWaiterLeaves(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second})
		holder := &sluice.Request{}
		_, p := gatetest.Decide(context.Background(), q, holder, clock.Now())
		ctx, cancel := context.WithCancel(context.Background())
		gone, next := make(chan result, 1), make(chan result, 1)
		go decide(q, ctx, &sluice.Request{}, gone)
		synctest.Wait()
		go decide(q, context.Background(), &sluice.Request{}, next)
		synctest.Wait()
		cancel()
		if r := <-gone; r.d.Admitted || r.waited != 0 {
			t.Fatalf("cancelled waiter: %+v after %v", r.d, r.waited)
		}
		q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
		if r := <-next; !r.d.Admitted {
			t.Fatalf("the next waiter: %+v", r.d)
		}
	})
}

// Under concurrent callers, waiting or not, the slots are never exceeded,
// and every request ends admitted or turned away.
func TestNeverAboveTheSlots(t *testing.T) {
	q, _ := queue.New("pool", pool(t, 3), queue.Options{MaxWait: 20 * time.Millisecond})
	var mu sync.Mutex
	inflight, worst := 0, 0
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 200 {
				r := &sluice.Request{}
				d, p := gatetest.Decide(context.Background(), q, r, clock.Now())
				if !d.Admitted {
					continue
				}
				mu.Lock()
				inflight++
				worst = max(worst, inflight)
				mu.Unlock()
				time.Sleep(50 * time.Microsecond)
				mu.Lock()
				inflight--
				mu.Unlock()
				q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
			}
		}()
	}
	wg.Wait()
	if worst > 3 {
		t.Fatalf("%d in flight through a queue in front of 3 slots", worst)
	}
}

// The wait ahead of a request is predicted from the mix's service time,
// whatever the request's own class: behind three waiters, with a mean of
// 30 ms over recent completions and one slot, a read (10 ms) and a route
// solve (50 ms) both expect 90 ms; their own service times decide only
// whether they can still finish in time. (The prediction once used the
// request's own service time for the requests ahead, so costly classes
// were turned away five times as readily.)
func TestPredictionUsesTheMixAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		own := map[string]time.Duration{"read": 10 * time.Millisecond, "solve": 50 * time.Millisecond}
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second,
			ServiceTime: func(c string) time.Duration { return own[c] }})
		ctx := context.Background()
		for range 20 {
			r := &sluice.Request{Class: "read"}
			_, p := gatetest.Decide(ctx, q, r, clock.Now())
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 30 * time.Millisecond})
		}
		holder := &sluice.Request{}
		_, p := gatetest.Decide(ctx, q, holder, clock.Now())
		out := make(chan result, 3)
		for range 3 {
			go decide(q, ctx, &sluice.Request{Class: "solve"}, out)
		}
		synctest.Wait()
		if r, s := q.QueueDelay("read"), q.QueueDelay("solve"); r != 105*time.Millisecond || s != r {
			t.Fatalf("predicted waits: read %v, solve %v; want 30/2 + 3 × 30 = 105ms both", r, s)
		}
		// Starting after 105 ms: a read fits 135 ms (105 + 10), a solve does not (105 + 50).
		now := clock.Now()
		if d, _ := gatetest.Decide(ctx, q, &sluice.Request{Class: "solve", Deadline: now.Add(135 * time.Millisecond)}, now); d.Reason != sluice.ReasonDeadline {
			t.Fatalf("solve: %+v, want reason deadline", d)
		}
		readOut := make(chan result, 1)
		go decide(q, ctx, &sluice.Request{Class: "read", Deadline: now.Add(135 * time.Millisecond)}, readOut)
		synctest.Wait()
		if w, _, _, _ := q.QueueStats(clock.Now()); w != 4 {
			t.Fatalf("%d waiting, want the read to wait as the 4th", w)
		}
		for range 4 {
			q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
			select {
			case r := <-out:
				p = r.p
			case r := <-readOut:
				p = r.p
			}
		}
		q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
	})
}

// The learned start-in-time test at Percentile 0.99 keeps the 99th
// percentile of a class's service times free before the deadline: of 100
// completions of 50 ms and 5 of 60 ms, a request 55 ms from its deadline
// may not start (the median lets it, and a 60 ms answer would come late),
// one 80 ms from it may.
func TestStartInTimeKeepsTheHighPercentile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second, Percentile: 0.99})
		ctx := context.Background()
		for i := range 105 {
			lat := 50 * time.Millisecond
			if i%21 == 20 {
				lat = 60 * time.Millisecond
			}
			r := &sluice.Request{Class: "read"}
			_, p := gatetest.Decide(ctx, q, r, clock.Now())
			q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: lat, Now: clock.Now()})
		}
		now := clock.Now()
		if d, _ := gatetest.Decide(ctx, q, &sluice.Request{Class: "read", Deadline: now.Add(55 * time.Millisecond)}, now); d.Admitted || d.Reason != sluice.ReasonDeadline {
			t.Fatalf("55 ms left: %+v, want reason deadline", d)
		}
		d, p := gatetest.Decide(ctx, q, &sluice.Request{Class: "read", Deadline: now.Add(80 * time.Millisecond)}, now)
		if !d.Admitted {
			t.Fatalf("80 ms left: %+v, want admitted", d)
		}
		q.Release(&sluice.Request{Class: "read"}, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
	})
}

// A MaxWait near the longest duration overflowed a wait's end to the past:
// every waiter was turned away at the first release. It is refused above
// 24 h; 24 h itself waits.
func TestMaxWaitBounded(t *testing.T) {
	if _, err := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Duration(1<<63 - 1)}); err == nil || !strings.Contains(err.Error(), "at most 24h") {
		t.Fatalf("the longest MaxWait: %v", err)
	}
	q, err := queue.New("pool", pool(t, 1), queue.Options{MaxWait: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := &sluice.Request{Cost: 1}
	var d sluice.Decision
	p := q.Decide(ctx, r, 1, &d)
	if !d.Admitted {
		t.Fatalf("first: %+v", d)
	}
	got := make(chan sluice.Decision, 1)
	go func() {
		var d2 sluice.Decision
		q.Decide(ctx, &sluice.Request{Cost: 1}, 2, &d2)
		got <- d2
	}()
	for n, _, _, _ := q.QueueStats(2); n == 0; n, _, _, _ = q.QueueStats(2) {
		time.Sleep(time.Millisecond)
	}
	q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: 3})
	if d2 := <-got; !d2.Admitted {
		t.Fatalf("a waiter under a MaxWait of 24h: %+v", d2)
	}
}
