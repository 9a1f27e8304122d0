package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

type slots struct{ n, used int }

func (s *slots) Name() string { return "slots" }
func (s *slots) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = s.decide(ctx, r, now)
	return p
}

func (s *slots) decide(context.Context, *sluice.Request, clock.Instant) (sluice.Decision, sluice.Permit) {
	if s.used >= s.n {
		return sluice.Decision{Reason: sluice.ReasonConcurrency, Gate: "slots", Retryable: true}, 0
	}
	s.used++
	return sluice.Decision{Admitted: true}, 1
}
func (s *slots) Release(*sluice.Request, sluice.Permit, sluice.Completion) { s.used-- }

// fq is an event-mode fair queue over one slot driven by hand.
type fq struct {
	t       testing.TB
	clk     *fakeclock.Clock
	q       *Queue
	inner   *slots
	park    *Park
	ctx     context.Context
	reqs    map[uint64]*sluice.Request
	ids     map[uint64]sluice.Permit
	served  []uint64 // tags in the order they got the slot
	next    uint64
	holding []uint64
	refused map[uint64]bool
}

func newFQ(t testing.TB, f *Fairness, maxLen int) *fq {
	x := &fq{t: t, clk: fakeclock.New(1), inner: &slots{n: 1}, reqs: map[uint64]*sluice.Request{},
		ids: map[uint64]sluice.Permit{}, refused: map[uint64]bool{}}
	var err error
	x.q, err = New("q", x.inner, Options{MaxWait: time.Hour, MaxLen: maxLen, Clock: x.clk, Events: true, Fair: f,
		Target: time.Hour, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	x.park = &Park{Ready: func(tag uint64, d sluice.Decision) {
		if d.Admitted {
			x.served = append(x.served, tag)
			x.holding = append(x.holding, tag)
		} else {
			x.refused[tag] = true
		}
	}}
	x.ctx = ContextWithPark(context.Background(), x.park)
	return x
}

// arrive decides a request; it returns its tag.
func (x *fq) arrive(tenant string, cost int64) uint64 {
	x.next++
	tag := x.next
	r := &sluice.Request{Tenant: tenant, Cost: cost}
	x.reqs[tag] = r
	x.park.Tag, x.park.Queue = tag, nil
	d, p := gatetest.Decide(x.ctx, x.q, r, x.clk.Now())
	switch {
	case !d.Admitted:
		x.refused[tag] = true
	case x.park.Queue != nil:
		x.ids[tag] = sluice.Permit(x.park.ID)
	default:
		x.ids[tag] = p
		x.served = append(x.served, tag)
		x.holding = append(x.holding, tag)
	}
	return tag
}

// finish releases the oldest holder.
func (x *fq) finish() {
	if len(x.holding) == 0 {
		x.t.Fatal("nothing holds the slot")
	}
	tag := x.holding[0]
	x.holding = x.holding[1:]
	x.clk.Advance(time.Microsecond)
	x.q.Release(x.reqs[tag], x.ids[tag], sluice.Completion{Outcome: sluice.OutcomeUseful, Now: x.clk.Now()})
}

func (x *fq) check() {
	x.q.mu.Lock()
	defer x.q.mu.Unlock()
	n := 0
	for i := range x.q.fair {
		m := 0
		for _, t := range x.q.fair[i].tenants {
			m += len(t.ws)
		}
		if m != x.q.fair[i].n {
			x.t.Fatalf("class %d: %d waiters in FIFOs, n %d", i, m, x.q.fair[i].n)
		}
		n += m
	}
	if n != x.q.n {
		x.t.Fatalf("q.n %d, waiters %d", x.q.n, n)
	}
	if x.q.n > 0 && x.inner.used < x.inner.n {
		x.t.Fatalf("%d waiting beside a free slot", x.q.n)
	}
}

func (x *fq) isServed(tag uint64) bool {
	for _, s := range x.served {
		if s == tag {
			return true
		}
	}
	return false
}

// Regression: a tenant served once waits behind every new tenant that shows up:
// the virtual time never moves while only first-time tenants are served.
func TestRegressFairStarvedByNewTenants(t *testing.T) {
	x := newFQ(t, &Fairness{}, 1000)
	x.arrive("holder", 1) // takes the slot
	x.arrive("victim", 1) // waits
	x.finish()            // victim served: its finish tag is now V+1
	victim := x.arrive("victim", 1)
	for i := 0; i < 5000 && !x.isServed(victim); i++ {
		x.arrive(fmt.Sprint("once-", i), 1) // a new tenant, one request each
		x.finish()
		x.check()
	}
	ahead := 0
	for _, s := range x.served {
		if s == victim {
			break
		}
		ahead++
	}
	t.Logf("victim's second request (cost 1, weight 1, burst 0): served=%v after %d others; V=%v, last map %d entries",
		x.isServed(victim), ahead-3, x.q.fair[0].v, len(x.q.fair[0].idle))
	if !x.isServed(victim) {
		t.Errorf("a weight-1 tenant's request waited behind 5000 one-request tenants (stated bound: Σ_j (burst + C_max,j) = 1 unit per tenant waiting with it, here at most 2 waiting)")
	}
}

// Regression: the finish-tag map grows with every distinct tenant ever served.
func TestRegressFairLastMapGrows(t *testing.T) {
	x := newFQ(t, &Fairness{}, 1000)
	x.arrive("holder", 1)
	for _, n := range []int{2500, 5000, 10000, 20000} {
		st := time.Now()
		for i := 0; i < n; i++ {
			x.arrive(fmt.Sprint("tenant-", n, "-", i), 1)
			x.finish()
		}
		t.Logf("%d more one-request tenants: %v (%v per request), last map %d", n, time.Since(st), time.Since(st)/time.Duration(n), len(x.q.fair[0].idle))
	}
	x.check()
	t.Logf("after 37500 one-request tenants, nobody waiting: %d entries in last, V=%v", len(x.q.fair[0].idle), x.q.fair[0].v)
	if len(x.q.fair[0].idle) > 1000 {
		t.Errorf("finish-tag map holds %d tenants with an empty queue", len(x.q.fair[0].idle))
	}
}

// Regression: after large costs the virtual time passes 2^53 and unit costs no
// longer move a tag: weights stop mattering.
func TestRegressFairFloatPrecision(t *testing.T) {
	x := newFQ(t, &Fairness{Weights: map[string]float64{"a": 2}}, 1000)
	x.arrive("holder", 1)
	for i := 0; i < 10000; i++ { // one tenant alone, costly requests
		x.arrive("big", sluice.MaxCost)
		x.finish()
	}
	t.Logf("V = %g", x.q.fair[0].v)
	for x.finish(); len(x.holding) > 0; x.finish() {
	}
	x.arrive("holder", 1)
	for i := 0; i < 300; i++ { // a (weight 2) and b (weight 1), both backlogged
		x.arrive("a", 1)
		x.arrive("b", 1)
	}
	got := map[string]int{}
	for i := 0; i < 300; i++ {
		x.finish()
		tag := x.holding[len(x.holding)-1]
		got[x.reqs[tag].Tenant]++
	}
	t.Logf("300 slots between a (weight 2) and b (weight 1): %v", got)
	if got["a"] > 210 || got["b"] < 90 {
		t.Errorf("weights 2:1 served %d:%d", got["a"], got["b"])
	}
}

// Regression: a full queue of the newcomer's own tenant refuses the newcomer;
// a full queue of another tenant's backlog makes room.
func TestRegressFairEvictionPaths(t *testing.T) {
	x := newFQ(t, &Fairness{}, 3)
	x.arrive("hog", 1)
	for i := 0; i < 3; i++ {
		x.arrive("hog", 1)
	}
	me := x.arrive("hog", 1)
	x.check()
	if !x.refused[me] {
		t.Errorf("hog's 5th request not refused in a full queue of hog's")
	}
	other := x.arrive("light", 1)
	x.check()
	if x.refused[other] {
		t.Errorf("light refused although hog holds the whole queue")
	}
	refusedHog := 0
	for tag, ok := range x.refused {
		if ok && x.reqs[tag].Tenant == "hog" {
			refusedHog++
		}
	}
	t.Logf("hog refused %d, queue n %d", refusedHog, x.q.n)
	for len(x.holding) > 0 {
		x.finish()
		x.check()
	}
	for tag, id := range x.ids { // the tickets of parked requests turned away are done too
		if x.refused[tag] {
			x.q.Release(x.reqs[tag], id, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: x.clk.Now()})
		}
	}
	if x.q.n != 0 || len(x.q.held) != 0 {
		t.Errorf("end: n %d held %d", x.q.n, len(x.q.held))
	}
}

// Regression: the random event loop, fair seeds only, longer, with the count and
// free-slot invariants after every step.
func TestRegressEventModeRandomFairLong(t *testing.T) {
	for seed := uint64(2); seed < 2000; seed += 4 {
		for _, s := range []uint64{seed, seed + 1} {
			l := newEventLoop(t, s)
			for step := range 2000 {
				l.step()
				l.q.mu.Lock()
				n := 0
				for i := range l.q.fair {
					m := 0
					for _, tf := range l.q.fair[i].tenants {
						m += len(tf.ws)
						if len(tf.ws) == 0 {
							t.Fatalf("seed %d step %d: empty tenant FIFO kept", s, step)
						}
					}
					if m != l.q.fair[i].n {
						t.Fatalf("seed %d step %d: class %d n %d, FIFOs %d", s, step, i, l.q.fair[i].n, m)
					}
					n += m
				}
				qn := l.q.n
				l.q.mu.Unlock()
				if n != qn {
					t.Fatalf("seed %d step %d: q.n %d, waiters %d", s, step, qn, n)
				}
				if sz, ok := l.inner.(sluice.Sizer); ok {
					lim, f := sz.ConcurrencyLimit()
					if f != l.held() {
						t.Fatalf("seed %d step %d: inner in flight %d, holding %d", s, step, f, l.held())
					}
					_ = lim // Pin moves the limit without telling the queue (pre-existing)
				} else if qn > 0 {
					if d, p := gatetest.Decide(context.Background(), l.inner, &sluice.Request{}, l.clk.Now()); d.Admitted {
						l.inner.Release(&sluice.Request{}, p, sluice.Completion{})
						t.Fatalf("seed %d step %d: %d waiting beside a free slot", s, step, qn)
					}
				}
			}
		}
	}
}

func TestRegressStressFairMany(t *testing.T) {
	for seed := uint64(100); seed < 112; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			stressWith(t, seed, seed%3 == 0, seed%2 == 0, &Fairness{Weights: map[string]float64{"t1": MinWeight, "t2": MaxWeight}, Burst: float64(seed % 5)})
		})
	}
}
