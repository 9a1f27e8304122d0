package lease_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/lease"
)

// flaky is a Leaser that fails while down is set.
type flaky struct {
	lease.Local
	down bool
}

func (f *flaky) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	if f.down {
		return lease.Grant{}, errors.New("allocator unreachable")
	}
	return f.Local.Lease(ctx, budget, a, r)
}

// offer sends rate requests/s for d on clk and returns how many were
// admitted.
func offer(g *lease.Gate, clk *fakeclock.Clock, rate int, d time.Duration) int {
	n := 0
	step := time.Second / time.Duration(rate)
	for t := time.Duration(0); t < d; t += step {
		now := clk.Advance(step)
		if dec, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, now); dec.Admitted {
			n++
		}
	}
	return n
}

func newGate(t *testing.T, clk *fakeclock.Clock, l lease.Leaser, mode lease.Failure, safe int64) *lease.Gate {
	t.Helper()
	g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: "p1", Leaser: l, Clock: clk, OnFailure: mode, SafeShare: safe,
		Allocator: lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// One process spends its whole lease: a fresh allocator learns for one
// lease time (nothing granted), then grants the capacity; the gate admits
// it, and no more, from its local bucket.
func TestGateSpendsItsLease(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	g := newGate(t, clk, l, lease.FailClosed, 0)
	g.Refresh(context.Background())
	if n := offer(g, clk, 2000, 900*time.Millisecond); n != 0 {
		t.Fatalf("admitted %d while the allocator learns (grant 0)", n)
	}
	clk.Advance(100 * time.Millisecond)
	g.Refresh(context.Background()) // learning is over
	total := 0
	for s := 0; s < 4; s++ {
		total += offer(g, clk, 2000, 250*time.Millisecond)
		g.Refresh(context.Background())
	}
	if total < 990 || total > 1000+100+1 { // 1 s at 1,000/s, plus at most the 100 ms bucket
		t.Fatalf("admitted %d in 1 s of a 1,000/s lease", total)
	}
}

// Without a live lease the gate follows its failure mode: the safe share,
// everything, or nothing; a refresh that fails leaves the lease running
// until its expiry.
func TestGateFailureModes(t *testing.T) {
	for _, tc := range []struct {
		mode     lease.Failure
		safe     int64
		min, max int
	}{
		{lease.FailSafe, 300, 290, 331},
		{lease.FailOpen, 0, 2000, 2000},
		{lease.FailClosed, 0, 0, 0},
	} {
		clk := fakeclock.New(int64(time.Hour))
		l := &flaky{Local: lease.Local{Clock: clk}}
		g := newGate(t, clk, l, tc.mode, tc.safe)
		g.Refresh(context.Background())
		offer(g, clk, 2000, time.Second) // demand while the allocator learns
		g.Refresh(context.Background())
		l.down = true
		if _, err := g.Refresh(context.Background()); err == nil {
			t.Fatal("a refresh of an unreachable allocator succeeded")
		}
		if n := offer(g, clk, 2000, 500*time.Millisecond); n < 450 { // the lease runs on (1,000/s)
			t.Fatalf("mode %d: %d admitted in the 500 ms the lease still ran", tc.mode, n)
		}
		fc, ok := sluice.As[sluice.FailureCounter](g)
		if !ok {
			t.Fatal("a lease gate counts no failures")
		}
		base := fc.Failures() // at most the decision at the learning grant's expiry itself
		if base > 1 {
			t.Fatalf("mode %d: %d failures counted while the lease ran: %v", tc.mode, base, ok)
		}
		clk.Advance(600 * time.Millisecond) // expired
		if n := offer(g, clk, 2000, time.Second); n < tc.min || n > tc.max {
			t.Errorf("mode %d without a lease: %d admitted in 1 s, want [%d, %d]", tc.mode, n, tc.min, tc.max)
		}
		// Each decision without a lease counts for the store-failure
		// metric and its alerts (a lease gate had none).
		if n := fc.Failures() - base; n != 2000 {
			t.Errorf("mode %d: %d failures counted for the 2,000 decisions without a lease", tc.mode, n)
		}
	}
}

// A request a later gate rejected gets its units back; a cost above what
// the bucket can hold is refused but retryable (a larger grant may hold it).
func TestGateRefundsAndBigCosts(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	g := newGate(t, clk, l, lease.FailClosed, 0)
	g.Refresh(context.Background())
	offer(g, clk, 2000, time.Second) // demand while the allocator learns
	g.Refresh(context.Background())
	clk.Advance(500 * time.Millisecond) // the bucket fills: 100 units, the lease still live
	r := &sluice.Request{Cost: 100}
	d, p := gatetest.Decide(context.Background(), g, r, clk.Now())
	if !d.Admitted {
		t.Fatalf("a full bucket refused its depth: %+v", d)
	}
	if d, _ := gatetest.Decide(context.Background(), g, r, clk.Now()); d.Admitted {
		t.Fatal("an empty bucket admitted")
	}
	g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: clk.Now()})
	if d, _ := gatetest.Decide(context.Background(), g, r, clk.Now()); !d.Admitted {
		t.Fatal("the units of a request a later gate rejected did not come back")
	}
	if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 101}, clk.Now()); d.Admitted || !d.Retryable || d.Reason != sluice.ReasonPolicyRate {
		t.Fatalf("a cost above the bucket: %+v", d)
	}
}

// Run keeps the lease fresh and gives it back when its context ends, so
// another process gets the whole budget at its next refresh.
func TestGateRunGivesTheLeaseBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := &lease.Local{}
		a := lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}
		mk := func(client string) *lease.Gate {
			g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: client, Leaser: l, Allocator: a})
			if err != nil {
				t.Fatal(err)
			}
			return g
		}
		g1, g2 := mk("p1"), mk("p2")
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { g1.Run(ctx); close(done) }()
		time.Sleep(2 * time.Second) // past learning; p1 holds a lease (of its idle demand)
		st := g1.ReportState(clock.System.Now()).(lease.GateState)
		cancel()
		<-done
		if !st.Live || st.Rate < 1 {
			t.Fatalf("p1 running alone: %+v", st)
		}
		g2.Refresh(context.Background())
		if st := g2.ReportState(clock.System.Now()).(lease.GateState); st.Rate != 1000 {
			t.Fatalf("p2 after p1 shut down: %+v, want the whole 1,000 (p1 gave its lease back)", st)
		}
	})
}

// A brand-new budget with the default lease of 10 s is spent from the
// start: four processes starting together, each offering 5,000/s against
// a budget of 10,000/s, admit within [0.97, 1.01] of it in every second
// after the first (which loses what the first process was told it may
// spend beyond its demand until its next refresh, a quarter refresh
// interval), through the learning period and after it; with
// FailClosed the same fleet admits nothing until the learning ends. The
// gates refresh inline, as Run would: at the interval the allocator
// names, early when they turn requests away.
func TestGateColdStart(t *testing.T) {
	for _, mode := range []lease.Failure{lease.FailSafe, lease.FailClosed} {
		clk := fakeclock.New(int64(time.Hour))
		l := &lease.Local{Clock: clk}
		a := lease.Allocator{Capacity: 10000, Lease: 10 * time.Second}
		var gates []*lease.Gate
		for i := range 4 {
			g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: string(rune('a' + i)), Leaser: l, Clock: clk,
				Allocator: a, OnFailure: mode, Inline: true})
			if err != nil {
				t.Fatal(err)
			}
			gates = append(gates, g)
		}
		perSecond := make([]int, 14)
		for ms := range 14000 {
			now := clock.Instant(int64(time.Hour) + int64(ms)*int64(time.Millisecond))
			clk.Set(int64(now))
			for _, g := range gates {
				for range 5 {
					if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, now); d.Admitted {
						perSecond[ms/1000]++
					}
				}
			}
		}
		t.Logf("mode %d: admitted per second %v", mode, perSecond)
		for s, n := range perSecond {
			switch {
			case mode == lease.FailClosed && s < 10:
				if n != 0 {
					t.Errorf("FailClosed, second %d of learning: %d admitted, want 0", s+1, n)
				}
			case mode == lease.FailClosed && s == 10: // the grants arrive within the first refresh round
			case s == 0: // the first process takes all until the others are seen (a quarter refresh interval)
				if n < 6000 || n > 10100 {
					t.Errorf("mode %d, second 1: %d admitted, want within [0.6, 1.01] x 10000", mode, n)
				}
			case n < 9700 || n > 10100:
				t.Errorf("mode %d, second %d: %d admitted, want within [0.97, 1.01] x 10000", mode, s+1, n)
			}
		}
	}
}

// An Inline gate refreshes as it decides, on its own clock (the
// simulator's virtual one): with no Run loop it still learns, spends its
// safe share, then its grant, and asks again at each interval.
func TestGateInlineRefresh(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: "p1", Leaser: l, Clock: clk, Inline: true,
		Allocator: lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	for s := range 4 {
		n := offer(g, clk, 2000, time.Second)
		if s > 0 && (n < 970 || n > 1010) {
			t.Fatalf("second %d: %d admitted at 2000/s offered, want about 1000", s+1, n)
		}
	}
	if st := g.ReportState(clk.Now()).(lease.GateState); !st.Live || st.Learning || st.Rate != 1000 {
		t.Fatalf("after 4 s: %+v, want a live grant of 1000", st)
	}
}

// The local bucket trues a charge up to the work's actual cost: a request
// admitted at 10 units whose work cost 30 takes 20 more, one whose work
// cost 1 gives 9 back, never below an empty bucket; exact to the unit.
func TestGateTruesUpTheCost(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &lease.Local{Clock: clk}
	g := newGate(t, clk, l, lease.FailClosed, 0)
	g.Refresh(context.Background())
	offer(g, clk, 2000, time.Second) // demand while the allocator learns
	g.Refresh(context.Background())
	clk.Advance(500 * time.Millisecond) // the bucket fills: 100 units
	now := clk.Now()
	take := func(cost int64) (sluice.Request, sluice.Permit, bool) {
		r := sluice.Request{Cost: cost}
		d, p := gatetest.Decide(context.Background(), g, &r, now)
		return r, p, d.Admitted
	}
	r, p, ok := take(10) // 90 left
	if !ok {
		t.Fatal("a full bucket refused 10 units")
	}
	g.Release(&r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Cost: 30}) // 70 left
	r, p, _ = take(10)                                                                     // 60 left
	g.Release(&r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Cost: 1})  // 69 left
	if _, _, ok := take(69); !ok {
		t.Fatal("69 units left after the true-ups were refused")
	}
	if _, _, ok := take(1); ok {
		t.Fatal("a unit more than the true-ups left was admitted")
	}
	r = sluice.Request{Cost: 1}
	g.Release(&r, 1, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Cost: 1 << 40}) // past empty: empty
	clk.Advance(10 * time.Millisecond)                                                          // 1,000/s: 10 units back
	now = clk.Now()
	if _, _, ok := take(10); !ok {
		t.Fatal("a huge debit left the bucket below empty")
	}
}

// swapLeaser is an allocator that can lose its state at once (a Redis
// restarted empty): lose puts a fresh one in its place.
type swapLeaser struct {
	mu  sync.Mutex
	clk *fakeclock.Clock
	l   *lease.Local
}

func (s *swapLeaser) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	s.mu.Lock()
	l := s.l
	s.mu.Unlock()
	return l.Lease(ctx, budget, a, r)
}

func (s *swapLeaser) lose() {
	s.mu.Lock()
	s.l = &lease.Local{Clock: s.clk}
	s.mu.Unlock()
}

// An idle fleet whose allocator loses its state (a Redis restarted empty
// while the load is low), then gets its load back while the allocator
// learns: each holder is confirmed its idle grant and, once every holder
// has reported (one refresh interval into learning), a safe share of what
// the confirmed holdings leave for what it wants beyond it, so the fleet
// spends its whole budget again within that interval and a learning
// refresh, and never more. Holders were confirmed their idle grants only,
// and the fleet admitted 4 a second of 200 until learning ended, a lease
// time after it began.
func TestIdleFleetRegainsItsBudgetAfterALoss(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	sw := &swapLeaser{clk: clk, l: &lease.Local{Clock: clk}}
	a := lease.Allocator{Capacity: 200, Lease: 10 * time.Second} // refresh 2.5 s; 625 ms while learning
	var gates []*lease.Gate
	for _, c := range []string{"a", "b"} {
		g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: c, Leaser: sw, Clock: clk, Allocator: a, Inline: true})
		if err != nil {
			t.Fatal(err)
		}
		gates = append(gates, g)
	}
	// run offers rate a second to each gate for secs seconds and returns
	// the fleet's admitted per tenth of a second.
	run := func(rate, secs int) []int {
		per := make([]int, 10*secs)
		step := time.Second / time.Duration(rate)
		for i := 0; i < secs*rate; i++ {
			now := clk.Advance(step)
			for _, g := range gates {
				if d, _ := gatetest.Decide(context.Background(), g, &sluice.Request{Cost: 1}, now); d.Admitted {
					per[10*i/rate]++
				}
			}
		}
		return per
	}
	busy := run(400, 15)
	idle := run(1, 20) // the grants shrink to the idle demand
	sw.lose()
	idle = append(idle, run(1, 1)...) // an idle refresh finds the state lost: learning for 10 s
	back := run(400, 8)
	t.Logf("per 100 ms: busy %v; idle %v; load back while learning %v", busy[140:], idle[190:], back)
	// Learning began with the first idle refresh after the loss, within
	// the second before the load came back; a refresh interval (2.5 s)
	// later every holder has reported, the holders ask again right then
	// (their learning refreshes are timed to it), and the budget is spent
	// whole: within one refresh interval of the load's return.
	full := -1
	for i, n := range back {
		if n > 21 {
			t.Errorf("%.1f s after the load came back: %d admitted in 100 ms of a budget of 200/s", float64(i)/10, n)
		}
		if n < 19 {
			full = -1
		} else if full < 0 {
			full = i
		}
	}
	if full < 0 || full > 26 {
		t.Errorf("the whole budget from %.1f s after the load came back, want within the refresh interval (2.5 s) and the 100 ms it ends in", float64(full)/10)
	}
	t.Logf("the whole budget from %.1f s after the load came back", float64(full)/10)
}

// A process that starts while its allocator is unreachable decides by its
// failure mode from the first failed refresh, and each such decision
// counts for the store-failure metric: a process restarting during an
// outage (fail_closed refusing everything) counted none, and no alert saw
// it. Before any answer at all nothing counts.
func TestGateCountsFailuresBeforeItsFirstGrant(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	l := &flaky{Local: lease.Local{Clock: clk}, down: true}
	g := newGate(t, clk, l, lease.FailClosed, 0)
	fc, _ := sluice.As[sluice.FailureCounter](g)
	offer(g, clk, 100, 100*time.Millisecond)
	if n := fc.Failures(); n != 0 {
		t.Fatalf("%d failures before any refresh", n)
	}
	if _, err := g.Refresh(context.Background()); err == nil {
		t.Fatal("a refresh of an unreachable allocator succeeded")
	}
	offer(g, clk, 1000, time.Second)
	if n := fc.Failures(); n != 1000 {
		t.Fatalf("%d failures counted for 1,000 decisions after a failed refresh, before any grant", n)
	}
}
