package queue_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/queue"
)

// spy is a concurrency gate of n slots that records what it releases.
type spy struct {
	n, used  int
	released []sluice.Completion
}

func (s *spy) Name() string { return "spy" }
func (s *spy) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = s.decide(ctx, r, now)
	return p
}

func (s *spy) decide(_ context.Context, _ *sluice.Request, _ clock.Instant) (sluice.Decision, sluice.Permit) {
	if s.used >= s.n {
		return sluice.Decision{Reason: sluice.ReasonConcurrency, Gate: "spy", Retryable: true}, 0
	}
	s.used++
	return sluice.Decision{Admitted: true}, sluice.Permit(100 + s.used)
}
func (s *spy) Release(_ *sluice.Request, _ sluice.Permit, c sluice.Completion) {
	s.used--
	s.released = append(s.released, c)
}

type readiness struct {
	tag uint64
	d   sluice.Decision
}

// eventQueue is a queue in event mode over one slot, and the Park of its
// event loop.
func eventQueue(t *testing.T, clk clock.Clock) (*queue.Queue, *spy, *queue.Park, *[]readiness, context.Context) {
	inner := &spy{n: 1}
	q, err := queue.New("pool", inner, queue.Options{MaxWait: 100 * time.Millisecond, Clock: clk, Events: true})
	if err != nil {
		t.Fatal(err)
	}
	var got []readiness
	park := &queue.Park{Ready: func(tag uint64, d sluice.Decision) { got = append(got, readiness{tag, d}) }}
	return q, inner, park, &got, queue.ContextWithPark(context.Background(), park)
}

// In event mode a request that must wait is admitted at once with its wait
// ahead (Park.Queue set, Until = now + MaxWait); a release gives it the
// slot through Ready, and the latency the inner gate learns leaves out the
// wait.
func TestEventModeParksAndGrants(t *testing.T) {
	clk := fakeclock.New(1000)
	q, inner, park, got, ctx := eventQueue(t, clk)
	if q.MayWait() {
		t.Fatal("an event-mode queue must not say it blocks")
	}
	first := &sluice.Request{}
	d, p1 := gatetest.Decide(ctx, q, first, clk.Now())
	if !d.Admitted || park.Queue != nil {
		t.Fatalf("first request: %+v, parked %v", d, park.Queue != nil)
	}
	park.Tag = 7
	second := &sluice.Request{Class: "default"}
	d, p2 := gatetest.Decide(ctx, q, second, clk.Now())
	if !d.Admitted || park.Queue != q || park.Until != clk.Now().Add(100*time.Millisecond) {
		t.Fatalf("second request: %+v, park %+v", d, park)
	}
	if w, _, _, _ := q.QueueStats(clk.Now()); w != 1 {
		t.Fatalf("%d waiting, want 1", w)
	}
	clk.Advance(30 * time.Millisecond)
	q.Release(first, p1, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 30 * time.Millisecond})
	if len(*got) != 1 || (*got)[0].tag != 7 || !(*got)[0].d.Admitted {
		t.Fatalf("ready calls %+v, want one for tag 7, admitted", *got)
	}
	clk.Advance(10 * time.Millisecond)
	// The chain's clock for the second request started at its Decide: 40 ms,
	// of which 30 ms were the wait.
	q.Release(second, p2, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 40 * time.Millisecond})
	if inner.used != 0 || len(inner.released) != 2 || inner.released[1].Latency != 10*time.Millisecond {
		t.Fatalf("inner gate: %d used, released %+v; want 0 and the second at 10ms", inner.used, inner.released)
	}
}

// A parked request whose wait runs out is turned away by Expire (once),
// one whose caller leaves by Cancel; neither takes or frees a slot, and
// releasing their tickets afterwards changes nothing.
func TestEventModeExpireAndCancel(t *testing.T) {
	clk := fakeclock.New(1000)
	q, inner, park, got, ctx := eventQueue(t, clk)
	holder := &sluice.Request{}
	_, ph := gatetest.Decide(ctx, q, holder, clk.Now())
	var ids []uint64
	var permits []sluice.Permit
	for range 2 {
		park.Queue = nil
		_, p := gatetest.Decide(ctx, q, &sluice.Request{}, clk.Now())
		ids, permits = append(ids, park.ID), append(permits, p)
	}
	if !q.Expire(ids[0]) || q.Expire(ids[0]) {
		t.Fatal("Expire must end a waiting request's wait exactly once")
	}
	if !q.Cancel(ids[1]) || q.Cancel(ids[1]) {
		t.Fatal("Cancel must end a waiting request's wait exactly once")
	}
	for _, p := range permits {
		q.Release(&sluice.Request{}, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
	}
	if inner.used != 1 || len(inner.released) != 0 || len(*got) != 0 {
		t.Fatalf("turned-away waiters touched the slot: used %d, released %d, ready %+v", inner.used, len(inner.released), *got)
	}
	if w, _, waited, dropped := q.QueueStats(clk.Now()); w != 0 || waited != 2 || dropped != 1 {
		t.Fatalf("stats: %d waiting, %d waited, %d dropped; want 0, 2, 1", w, waited, dropped)
	}
	q.Release(holder, ph, sluice.Completion{Outcome: sluice.OutcomeUseful})
	if inner.used != 0 {
		t.Fatalf("%d slots used after every release", inner.used)
	}
}

// Without a Park in the context, an event-mode queue cannot wait: the
// request is turned away (reason queue) instead of blocking.
func TestEventModeWithoutPark(t *testing.T) {
	clk := fakeclock.New(1000)
	q, _, _, _, ctx := eventQueue(t, clk)
	gatetest.Decide(ctx, q, &sluice.Request{}, clk.Now())
	d, _ := gatetest.Decide(context.Background(), q, &sluice.Request{}, clk.Now())
	if d.Admitted || d.Reason != sluice.ReasonQueue {
		t.Fatalf("no park: %+v, want reason queue", d)
	}
}

// When the limit of a moving (adaptive) gate grows, waiting requests take
// the new slots without waiting for a release. (Each release once woke one
// waiter only, so a limit that grew under a queue was never used.)
func TestGrownLimitWakesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: 1, Min: 1, Max: 10})
		g, _ := adaptive.NewGate("pool", c, adaptive.GateOptions{})
		g.Pin(1)
		q, _ := queue.New("pool", g, queue.Options{MaxWait: time.Second})
		ctx := context.Background()
		holder := &sluice.Request{}
		_, ph := gatetest.Decide(ctx, q, holder, clock.Now())
		out := make(chan result, 3)
		for range 2 {
			go decide(q, ctx, &sluice.Request{}, out)
		}
		synctest.Wait()
		g.Pin(4)
		go decide(q, ctx, &sluice.Request{}, out) // its arrival sees the grown limit
		var ps []sluice.Permit
		for range 3 {
			r := <-out
			if !r.d.Admitted || r.waited != 0 {
				t.Fatalf("after the limit grew: %+v after %v", r.d, r.waited)
			}
			ps = append(ps, r.p)
		}
		if l, n := g.ConcurrencyLimit(); l != 4 || n != 4 {
			t.Fatalf("limit %d, in flight %d; want 4 and 4", l, n)
		}
		for _, p := range append(ps, ph) {
			q.Release(holder, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
		}
	})
}

// latencies is an Observer that records completions.
type latencies struct {
	mu  sync.Mutex
	got []time.Duration
}

func (l *latencies) Decided(*sluice.Request, *sluice.Decision, time.Duration) {}
func (l *latencies) ShadowRejected(*sluice.Request, *sluice.Decision)         {}
func (l *latencies) Done(_ *sluice.Request, c sluice.Completion) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, c.Latency)
}

// A chain with a queue starts a request's latency clock once the request
// holds its slot: 30 ms waiting and 10 ms of work is 10 ms of latency,
// which is what adaptive limits and service-time estimates learn from.
func TestChainLatencyLeavesOutTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q, _ := queue.New("pool", pool(t, 1), queue.Options{MaxWait: time.Second})
		obs := &latencies{}
		chain, err := sluice.NewChain(sluice.ChainOptions{Observer: obs}, q)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		_, first := chain.Decide(ctx, &sluice.Request{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			d, tk := chain.Decide(ctx, &sluice.Request{})
			if !d.Admitted {
				t.Errorf("waiter: %+v", d)
				return
			}
			time.Sleep(10 * time.Millisecond)
			tk.Done(sluice.OutcomeUseful)
		}()
		time.Sleep(30 * time.Millisecond)
		first.Done(sluice.OutcomeUseful)
		<-done
		obs.mu.Lock()
		defer obs.mu.Unlock()
		if len(obs.got) != 2 || obs.got[0] != 30*time.Millisecond || obs.got[1] != 10*time.Millisecond {
			t.Fatalf("latencies %v, want [30ms 10ms]", obs.got)
		}
	})
}
