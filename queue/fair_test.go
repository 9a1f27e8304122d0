package queue_test

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/queue"
)

// tenantLoad is one tenant's evenly spaced arrivals, or, closed, one
// request at a time: the next sent as the last one ends (served, refused
// or expired).
type tenantLoad struct {
	name   string
	rate   float64 // requests/s (open loop)
	cost   int64   // work units per request
	closed bool
	keys   int           // the tenant spreads its requests over this many keys (name-0, name-1, ...)
	from   time.Duration // it starts then
}

type fairEvent struct {
	at   int64
	kind int // 0 arrival (ref: tenant), 1 done (ref: request), 2 expire (ref: request)
	ref  int
}

type fairHeap []fairEvent

func (h fairHeap) Len() int           { return len(h) }
func (h fairHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h fairHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *fairHeap) Push(x any)        { *h = append(*h, x.(fairEvent)) }
func (h *fairHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type fairResult struct {
	served  map[string]int64         // work units served after the warmup
	maxWait map[string]time.Duration // longest wait of a request that got a slot
}

// runFair drives an event-mode fair queue over slots slots of a spy gate
// on a fake clock: every request holds its slot for cost × unit. It
// returns the work served per tenant between warmup and length.
func runFair(t *testing.T, fq *queue.Fairness, slots int, unit time.Duration, maxWait time.Duration, warmup, length time.Duration, loads []tenantLoad) fairResult {
	t.Helper()
	clk := fakeclock.New(0)
	inner := &spy{n: slots}
	q, err := queue.New("pool", inner, queue.Options{MaxWait: maxWait, MaxLen: 1000, Clock: clk, Events: true, Fair: fq})
	if err != nil {
		t.Fatal(err)
	}
	type req struct {
		r        sluice.Request
		id       uint64 // park id or permit
		since    int64
		parked   bool
		tenantIx int
	}
	var reqs []*req
	var h fairHeap
	res := fairResult{served: map[string]int64{}, maxWait: map[string]time.Duration{}}
	start := func(i int, permit uint64, now int64) {
		rq := reqs[i]
		rq.id = permit
		if now >= int64(warmup) {
			w := time.Duration(now - rq.since)
			res.maxWait[loads[rq.tenantIx].name] = max(res.maxWait[loads[rq.tenantIx].name], w)
		}
		heap.Push(&h, fairEvent{now + int64(rq.r.Cost)*int64(unit), 1, i})
	}
	park := &queue.Park{}
	park.Ready = func(tag uint64, d sluice.Decision) {
		if d.Admitted {
			start(int(tag), reqs[tag].id, int64(clk.Now()))
		}
	}
	ctx := queue.ContextWithPark(context.Background(), park)
	for i, l := range loads {
		if l.closed {
			heap.Push(&h, fairEvent{int64(i), 0, i})
			continue
		}
		heap.Push(&h, fairEvent{int64(l.from) + int64(float64(i)*1e9/l.rate/float64(len(loads))), 0, i})
	}
	sent := make([]int, len(loads))
	again := func(i int, at int64) { // a closed-loop tenant's next request
		if loads[i].closed {
			heap.Push(&h, fairEvent{at, 0, i})
		}
	}
	for h.Len() > 0 {
		e := heap.Pop(&h).(fairEvent)
		if e.at >= int64(length) {
			break
		}
		clk.Set(e.at)
		now := clk.Now()
		switch e.kind {
		case 0:
			l := loads[e.ref]
			if !l.closed {
				heap.Push(&h, fairEvent{e.at + int64(1e9/l.rate), 0, e.ref})
			}
			tenant := l.name
			if l.keys > 0 {
				tenant = fmt.Sprintf("%s-%d", l.name, sent[e.ref]%l.keys)
			}
			sent[e.ref]++
			rq := &req{r: sluice.Request{Tenant: tenant, Cost: l.cost}, since: e.at, tenantIx: e.ref}
			reqs = append(reqs, rq)
			i := len(reqs) - 1
			park.Tag, park.Queue = uint64(i), nil
			d, p := gatetest.Decide(ctx, q, &rq.r, now)
			switch {
			case !d.Admitted:
				again(e.ref, e.at+int64(unit))
			case park.Queue != nil:
				rq.parked, rq.id = true, park.ID
				heap.Push(&h, fairEvent{int64(park.Until), 2, i})
			default:
				start(i, uint64(p), e.at)
			}
		case 1:
			rq := reqs[e.ref]
			if e.at >= int64(warmup) {
				res.served[loads[rq.tenantIx].name] += rq.r.Cost
			}
			q.Release(&rq.r, sluice.Permit(rq.id), sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now,
				Latency: time.Duration(rq.r.Cost) * unit})
			again(rq.tenantIx, e.at)
		case 2:
			if q.Expire(reqs[e.ref].id) {
				again(reqs[e.ref].tenantIx, e.at)
			}
		}
	}
	return res
}

// Ten tenants of equal weight over a saturated class, one offering ten
// times what each other one does: every light tenant gets its whole
// demand (it is below the fair share) and the heavy one the rest, as
// weighted max-min says; no light tenant waits longer than the stated
// starvation bound.
func TestFairQueueSharesASaturatedClass(t *testing.T) {
	const capacity = 1000.0 // units/s: one slot, 1 ms per unit
	var loads []tenantLoad
	demands := []float64{800}
	loads = append(loads, tenantLoad{name: "heavy", rate: 800, cost: 1})
	for i := 0; i < 9; i++ {
		loads = append(loads, tenantLoad{name: fmt.Sprintf("light-%d", i), rate: 80, cost: 1})
		demands = append(demands, 80)
	}
	want := fair.MaxMin(capacity, demands, nil)
	res := runFair(t, &queue.Fairness{}, 1, time.Millisecond, time.Second, 2*time.Second, 12*time.Second, loads)
	for i, l := range loads {
		got := float64(res.served[l.name]) / 10
		t.Logf("%s: offered %.0f units/s, served %.0f (max-min %.0f), longest wait %v", l.name, l.rate, got, want[i], res.maxWait[l.name])
		if math.Abs(got-want[i]) > 0.02*want[i] {
			t.Errorf("%s: served %.0f units/s, want %.0f ± 2%%", l.name, got, want[i])
		}
	}
	// Starvation bound: Σ over the other tenants of (burst 0 + their
	// largest cost 1) units, plus the request in its slot: 10 ms at
	// 1,000 units/s.
	bound := 10 * time.Millisecond
	for _, l := range loads[1:] {
		if res.maxWait[l.name] > bound {
			t.Errorf("%s waited %v, above the starvation bound %v", l.name, res.maxWait[l.name], bound)
		}
	}
}

// Weights 2:1:1 between three tenants that each offer the whole capacity:
// work shares 50/25/25% within 2%; and in work units, not requests: a
// tenant sending requests of 5 units gets the same units as one sending
// requests of 1.
func TestFairQueueWeightsInWorkUnits(t *testing.T) {
	res := runFair(t, &queue.Fairness{Weights: map[string]float64{"a": 2}}, 1, time.Millisecond, 500*time.Millisecond,
		2*time.Second, 12*time.Second, []tenantLoad{{name: "a", rate: 1000, cost: 1}, {name: "b", rate: 1000, cost: 1}, {name: "c", rate: 200, cost: 5}})
	total := float64(res.served["a"] + res.served["b"] + res.served["c"])
	for name, want := range map[string]float64{"a": 0.5, "b": 0.25, "c": 0.25} {
		got := float64(res.served[name]) / total
		t.Logf("%s: %.1f%% of the work (want %.0f%%)", name, 100*got, 100*want)
		if math.Abs(got-want) > 0.02*want {
			t.Errorf("%s: %.3f of the work, want %.2f ± 2%%", name, got, want)
		}
	}
}

// Without fairness the same load goes first come, first served: the heavy
// tenant's backlog makes the light ones wait behind it and lose requests
// (the baseline the fair queue is measured against).
func TestFIFOQueueLetsAHeavyTenantCrowdOut(t *testing.T) {
	loads := []tenantLoad{{name: "heavy", rate: 800, cost: 1}}
	for i := 0; i < 9; i++ {
		loads = append(loads, tenantLoad{name: fmt.Sprintf("light-%d", i), rate: 80, cost: 1})
	}
	res := runFair(t, nil, 1, time.Millisecond, time.Second, 2*time.Second, 12*time.Second, loads)
	if got := float64(res.served["light-0"]) / 10; got > 0.9*80 {
		t.Errorf("FIFO: a light tenant got %.0f of its 80 units/s; the fair test would prove nothing", got)
	}
}

// ClassQueues reports each class queue's length and oldest age, the
// classes without a queue of their own as "other".
func TestClassQueues(t *testing.T) {
	clk := fakeclock.New(0)
	q, err := queue.New("pool", &spy{n: 1}, queue.Options{Classes: []string{"a"}, Clock: clk, Events: true, Fair: &queue.Fairness{}})
	if err != nil {
		t.Fatal(err)
	}
	park := &queue.Park{Ready: func(uint64, sluice.Decision) {}}
	ctx := queue.ContextWithPark(context.Background(), park)
	for _, class := range []string{"a", "a", "z"} {
		park.Queue = nil
		gatetest.Decide(ctx, q, &sluice.Request{Class: class, Tenant: "t"}, clk.Now())
		clk.Advance(10 * time.Millisecond)
	}
	got := q.ClassQueues(clk.Now())
	if len(got) != 2 || got[0] != (sluice.ClassQueue{Class: "a", Waiting: 1, Oldest: 20 * time.Millisecond}) ||
		got[1] != (sluice.ClassQueue{Class: "other", Waiting: 1, Oldest: 10 * time.Millisecond}) {
		t.Fatalf("%+v", got)
	}
}

// A closed-loop tenant (one request at a time, the next sent as the last
// ends) beside a backlogged one gets its max-min share within 5%. Its
// demand is what it gets when every slot that frees after it sends goes
// to it: over N slots of 1 ms whose releases a backlog keeps evenly
// spread, it waits 1/N ms for the next release, so it is served 1 ms of
// every 1 + 1/N, a 1/(N+1) share of the work, below the fair half: its
// max-min share is that demand, whole. (It got 1/(N+2): its virtual time
// ran ahead while it was between requests, and it lost the next release
// to the backlog too.)
func TestFairQueueClosedLoopTenant(t *testing.T) {
	for _, c := range []struct {
		slots int
		want  float64 // the closed-loop tenant's share of the work
	}{{1, 1.0 / 2}, {2, 1.0 / 3}, {4, 1.0 / 5}, {8, 1.0 / 9}} {
		res := runFair(t, &queue.Fairness{}, c.slots, time.Millisecond, time.Second, time.Second, 5*time.Second,
			[]tenantLoad{{name: "bulk", rate: 3000 * float64(c.slots), cost: 1}, {name: "loop", cost: 1, closed: true}})
		total := float64(res.served["bulk"] + res.served["loop"])
		got := float64(res.served["loop"]) / total
		t.Logf("%d slots: the closed-loop tenant got %.1f%% of the work (max-min %.0f%%)", c.slots, 100*got, 100*c.want)
		if math.Abs(got-c.want) > 0.05*c.want {
			t.Errorf("%d slots: closed-loop share %.3f, want %.2f ± 5%%", c.slots, got, c.want)
		}
	}
}

// Sybil keys: one tenant spreads 2,000 units/s over 1,000 fresh keys
// beside nine established light tenants of 80 units/s on a capacity of
// 1,000, measured before any of its keys is Standing (8 s) old. With
// Standing, the 1,000 keys share one newcomers' flow and the
// light tenants keep their whole demand; without it, every fresh key is a
// flow of its own and the light tenants are crowded out. The attacker
// gains a share per key only by using each key for Standing first.
func TestFairQueueSybilKeysShareOneFlow(t *testing.T) {
	loads := []tenantLoad{{name: "sybil", rate: 2000, cost: 1, keys: 1000, from: 8500 * time.Millisecond}}
	for i := 0; i < 9; i++ {
		loads = append(loads, tenantLoad{name: fmt.Sprintf("light-%d", i), rate: 80, cost: 1})
	}
	for _, c := range []struct {
		standing time.Duration
		min, max float64 // a light tenant's share of its demand
	}{{8 * time.Second, 0.95, 1.01}, {0, 0, 0.5}} {
		res := runFair(t, &queue.Fairness{Standing: c.standing}, 1, time.Millisecond, time.Second, 9*time.Second, 16*time.Second, loads)
		var sum, sq float64
		for _, l := range loads[1:] {
			got := float64(res.served[l.name]) / 7 / l.rate
			sum, sq = sum+got, sq+got*got
			if got < c.min || got > c.max {
				t.Errorf("standing %v: %s got %.0f%% of its demand, want %.0f%% to %.0f%%", c.standing, l.name, 100*got, 100*c.min, 100*c.max)
			}
		}
		// Jain's index over the light tenants' shares of their demand.
		if jain := sum * sum / (9 * sq); c.standing > 0 && jain < 0.95 {
			t.Errorf("standing %v: Jain's index %.3f over the light tenants, want ≥ 0.95", c.standing, jain)
		}
		t.Logf("standing %v: light-0 %.0f%% of its demand, the sybil %.0f units/s", c.standing, 100*float64(res.served["light-0"])/7/80, float64(res.served["sybil"])/7)
	}
}
