package fair

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"pgregory.net/rapid"
)

var bg = context.Background()

// Regression: a request of the legal cost sluice.MaxCost overflows cost*nano.
func TestRegressMaxCostOverflow(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: 1000, Classes: []ClassShare{{Class: "a", Reserve: 500}}})
	if err != nil {
		t.Fatal(err)
	}
	r := &sluice.Request{Class: "a", Cost: sluice.MaxCost}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	d, p := gatetest.Decide(bg, g, r, 1)
	c := &g.classes[0]
	t.Logf("cost 1<<40 against capacity 1000 units/s: admitted=%v permit=%d own.n=%d (size %d) admittedCounter=%d", d.Admitted, p, c.own.n, c.own.size, c.admitted)
	if d.Admitted {
		t.Errorf("a request of %d units was admitted by a %d units/s reservation whose depth is %d units", r.Cost, 1000, g.Depth())
	}
	if c.own.n > c.own.size {
		t.Errorf("own bucket above its size: %d > %d", c.own.n, c.own.size)
	}
	// and the next requests: how much more is admitted in 1 s?
	n := int64(0)
	for i := 0; i < 100000; i++ {
		if d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 1}, clock.Instant(2+i)); d.Admitted {
			n++
		}
	}
	t.Logf("then admitted %d unit requests within 100 µs (bound ≈ %d)", n, g.Depth()+1)
}

// Regression: Capacity = MaxRate with Revocation/Burst = MaxDepth: sizes overflow int64.
func TestRegressMaxRateMaxDepthOverflow(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: MaxRate, Burst: maxDepth, Revocation: maxDepth,
		Classes: []ClassShare{{Class: "a", Reserve: MaxRate / 2}}})
	if err != nil {
		t.Fatal(err)
	}
	trueDepth := (float64(MaxRate) * 60) + float64(MaxRate/2)*60
	t.Logf("pool.size=%d own.size=%d Depth()=%d, true depth %.3g units", g.pool.size, g.classes[0].own.size, g.Depth(), trueDepth)
	if float64(g.Depth()) < trueDepth*0.99 || g.pool.size < 0 {
		t.Errorf("Depth() = %d, true depth %.3g units: int64 overflow", g.Depth(), trueDepth)
	}
	// Drive it: admit at rate for a while; check balances stay sane.
	now := clock.Instant(0)
	gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 1}, now)
	for i := 0; i < 5; i++ {
		now += clock.Instant(10 * time.Second)
		gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 1}, now)
		gatetest.Decide(bg, g, &sluice.Request{Class: "b", Cost: 1}, now)
		t.Logf("t=%v pool.n=%d own.n=%d", time.Duration(now), g.pool.n, g.classes[0].own.n)
		if g.pool.n < 0 || g.classes[0].own.n < 0 {
			t.Errorf("negative balance after a fill: pool %d own %d", g.pool.n, g.classes[0].own.n)
		}
	}
	// smallest revocation with MaxRate that still overflows in pool.add (2·size)
	g2, _ := newReservation("r", ReservationOptions{Capacity: MaxRate, Revocation: 5 * time.Second})
	gatetest.Decide(bg, g2, &sluice.Request{Cost: 1}, 0)
	gatetest.Decide(bg, g2, &sluice.Request{Cost: 1}, clock.Instant(time.Second))
	t.Logf("revocation 5s: pool.size=%d pool.n=%d", g2.pool.size, g2.pool.n)
	if g2.pool.n < 0 {
		t.Errorf("revocation 5s, capacity MaxRate: pool balance wrapped negative: %d", g2.pool.n)
	}
}

// Regression: reserves that sum past int64 pass the "reserves ≤ usable" check.
func TestRegressReserveSumOverflow(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: 1000,
		Classes: []ClassShare{{Class: "a", Reserve: 1 << 62}, {Class: "b", Reserve: 1 << 62}}})
	if err == nil {
		t.Errorf("reserves 2·2^62 against capacity 1000 accepted: own.size=%d Depth()=%d", g.classes[0].own.size, g.Depth())
	}
}

// Regression: tenant map grows with tenants that were never admitted.
func TestRegressTenantMapGrowth(t *testing.T) {
	g, _ := newReservation("r", ReservationOptions{Capacity: 1000, Burst: maxDepth,
		Classes: []ClassShare{{Class: "a", Reserve: 500, Tenant: 1}}})
	now := clock.Instant(1)
	admitted := 0
	for i := 0; i < 50000; i++ {
		now += 100 // 50k requests in 5 ms
		d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: "a", Tenant: fmt.Sprint("t", i), Cost: 61}, now)
		if d.Admitted {
			admitted++
		}
	}
	t.Logf("admitted %d, tenant map size %d", admitted, len(g.classes[0].tenants))
	if len(g.classes[0].tenants) > 1000 {
		t.Errorf("%d tenant buckets kept for %d admitted requests (all full: never admitted)", len(g.classes[0].tenants), admitted)
	}
}

// Regression: a Release with a permit never issued (or large) wrecks the pool.
func TestRegressReleaseBogusPermit(t *testing.T) {
	g, _ := newReservation("r", ReservationOptions{Capacity: 1000, Classes: []ClassShare{{Class: "a", Reserve: 500}}})
	gatetest.Decide(bg, g, &sluice.Request{Class: "b", Cost: 1}, 1)
	before := g.pool.n
	g.Release(&sluice.Request{Class: "b", Cost: 1}, sluice.Permit(1<<40), sluice.Completion{Outcome: sluice.OutcomeRejected, Now: 2})
	t.Logf("pool before %d, after a Release with permit 1<<40: %d (size %d)", before, g.pool.n, g.pool.size)
	if g.pool.n < 0 {
		t.Errorf("pool balance negative after a bogus release: %d", g.pool.n)
	}
	g.Release(&sluice.Request{Class: "b", Cost: 1}, sluice.Permit(math.MaxUint64), sluice.Completion{Outcome: sluice.OutcomeRejected, Now: 2})
	t.Logf("after permit MaxUint64: pool %d, own(a) %d", g.pool.n, g.classes[0].own.n)
}

// Regression: clock steps back an hour: nothing refills until it catches up.
func TestRegressClockBackwards(t *testing.T) {
	g, _ := newReservation("r", ReservationOptions{Capacity: 1000, Classes: []ClassShare{{Class: "a", Reserve: 1000}}})
	t0 := clock.Instant(time.Hour)
	gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 100}, t0) // drain
	n := 0
	for s := 1; s <= 10; s++ {
		now := clock.Instant(time.Duration(s) * time.Second) // an hour earlier, moving forward
		if d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 1}, now); d.Admitted {
			n++
		}
	}
	t.Logf("after the clock stepped back 1h: %d of 10 requests admitted over 10 s at 1000 units/s", n)
	if n < 9 {
		t.Errorf("after a step back of the clock, %d of 10 admitted: the gate froze", n)
	}
}

// Regression: pool.add(n) computes b.n+n: with pool.size > MaxInt64/2 a full pool wraps.
func TestRegressPoolAddWrap(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: MaxRate, Revocation: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for s := 0; s <= 30; s += 10 {
		now := clock.Instant(time.Duration(s) * time.Second)
		d, _ := gatetest.Decide(bg, g, &sluice.Request{Cost: 1}, now)
		t.Logf("t=%ds pool.n=%d (size %d) admitted=%v", s, g.pool.n, g.pool.size, d.Admitted)
		if s > 0 && !d.Admitted {
			t.Errorf("t=%ds: a unit request refused by an idle reservation of %d units/s (pool %d)", s, MaxRate, g.pool.n)
		}
	}
}

// Regression: a reserve whose bucket (Reserve·Burst) is below one request's cost
// never serves that class from its reserve: under borrowers that keep the
// pool empty, the class admits nothing although its demand ≥ its reserve.
func TestRegressSmallReserveBucketStarves(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: 1000, // Burst default 100ms
		Classes: []ClassShare{{Class: "a", Reserve: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	// 10 s: b every 333 µs (cost 1, 3,000/s), a every 500 ms (2 units/s = reserve 2)
	for i := int64(0); i < 30_030; i++ {
		now := clock.Instant(i * 333_000)
		if d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: "b", Cost: 1}, now); d.Admitted {
			got["b"]++
		}
		if i%1500 == 0 {
			if d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: "a", Cost: 1}, now+1); d.Admitted {
				got["a"]++
			}
		}
	}
	t.Logf("10 s: a (reserve 2/s, demand 2/s) admitted %d units, b (borrower) %d", got["a"], got["b"])
	if got["a"] < 2*10-1 {
		t.Errorf("class a admitted %d units in 10 s, want ≥ reserve·T − depth = %d", got["a"], 2*10-1)
	}
}

// Regression: a class cap or tenant cap whose bucket is below one unit rejects every request.
func TestRegressSubUnitCaps(t *testing.T) {
	g, err := newReservation("r", ReservationOptions{Capacity: 1000,
		Classes: []ClassShare{{Class: "a", Reserve: 5, Max: 5}, {Class: "b", Tenant: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	var n [2]int
	var last [2]sluice.Decision
	for i := int64(1); i <= 100; i++ {
		now := clock.Instant(i * int64(time.Second))
		for k, c := range []string{"a", "b"} {
			d, _ := gatetest.Decide(bg, g, &sluice.Request{Class: c, Tenant: "x", Cost: 1}, now)
			if d.Admitted {
				n[k]++
			}
			last[k] = d
		}
	}
	t.Logf("100 s, one cost-1 request per second: a (max 5/s) admitted %d, b (tenant 5/s) admitted %d; last b: %+v", n[0], n[1], last[1])
	if n[0] == 0 || n[1] == 0 {
		t.Errorf("a class capped at 5 units/s (or a tenant at 5/s) admitted nothing at 1 unit/s: options accepted but unusable")
	}
}

// Whatever arrives, the work admitted in any window of length T is at
// most (capacity − recovery)·T plus the gate's depth: with maxima, tenant
// caps, classes that never borrow, refunds of later rejections and
// readings a little out of order, over the whole range of start times.
func TestReservationNeverAdmitsAboveUsable(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		capacity := rapid.Int64Range(1, 1<<20).Draw(t, "capacity")
		recovery := rapid.Int64Range(0, capacity-1).Draw(t, "recovery")
		usable := capacity - recovery
		ra := rapid.Int64Range(0, usable).Draw(t, "ra")
		rb := rapid.Int64Range(0, usable-ra).Draw(t, "rb")
		maxA := int64(0)
		if rapid.Bool().Draw(t, "hasMax") {
			maxA = rapid.Int64Range(max(ra, 1), usable).Draw(t, "maxA")
		}
		g, err := newReservation("r", ReservationOptions{Capacity: capacity, Recovery: recovery,
			Burst:      time.Duration(rapid.Int64Range(1, 2000).Draw(t, "burstMs")) * time.Millisecond,
			Revocation: time.Duration(rapid.Int64Range(1, 2000).Draw(t, "revMs")) * time.Millisecond,
			Classes: []ClassShare{{Class: "a", Reserve: ra, Max: maxA, Tenant: rapid.Int64Range(0, usable).Draw(t, "tenA")},
				{Class: "b", Reserve: rb, NoBorrow: rapid.Bool().Draw(t, "nb")}}})
		if err != nil {
			t.Fatal(err)
		}
		type adm struct {
			at   clock.Instant
			cost int64
		}
		var admitted []adm
		now := clock.Instant(rapid.Int64Range(0, 1<<40).Draw(t, "t0"))
		hi := now
		for i, n := 0, rapid.IntRange(1, 300).Draw(t, "n"); i < n; i++ {
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(50*time.Millisecond)).Draw(t, "gap")))
			at := now
			if rapid.IntRange(0, 9).Draw(t, "stale") == 0 {
				at = now - clock.Instant(rapid.Int64Range(0, int64(time.Millisecond)).Draw(t, "back"))
			}
			hi = max(hi, at) // the gate's own instant
			r := &sluice.Request{Class: rapid.SampledFrom([]string{"a", "b", "c"}).Draw(t, "class"),
				Tenant: rapid.SampledFrom([]string{"x", "y", "z"}).Draw(t, "tenant"),
				Cost:   rapid.Int64Range(1, 2*capacity+1).Draw(t, "cost")}
			d, p := gatetest.Decide(bg, g, r, at)
			if !d.Admitted {
				continue
			}
			if rapid.IntRange(0, 4).Draw(t, "later") == 0 {
				g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: at})
				continue
			}
			admitted = append(admitted, adm{hi, r.Cost})
		}
		depth := g.Depth()
		for i := range admitted {
			sum := int64(0)
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].cost
				window := admitted[j].at.Sub(admitted[i].at)
				if bound := float64(usable)*window.Seconds() + float64(depth); float64(sum) > bound+1e-6 {
					t.Fatalf("%d units admitted in %v, above usable %d/s × T + depth %d", sum, window, usable, depth)
				}
			}
		}
	})
}

// C1: concurrent Decide/Release/ReportState/Usage under -race, with stale readings.
func TestRegressConcurrentReservation(t *testing.T) {
	g, _ := newReservation("r", ReservationOptions{Capacity: 10000, Recovery: 100,
		Classes: []ClassShare{{Class: "a", Reserve: 4000, Tenant: 500}, {Class: "b", Reserve: 3000, Max: 6000, NoBorrow: true}}})
	base := clock.System.Now()
	done := make(chan int64)
	for w := 0; w < 8; w++ {
		go func(w int) {
			var n int64
			for i := 0; i < 5000; i++ {
				now := clock.System.Now()
				r := &sluice.Request{Class: []string{"a", "b", "c"}[i%3], Tenant: fmt.Sprint(i % 50), Cost: int64(1 + i%7)}
				d, p := gatetest.Decide(bg, g, r, now)
				if d.Admitted {
					n += r.Cost
					if i%5 == 0 {
						g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: now})
						n -= r.Cost
					}
				}
				if i%1000 == 0 {
					_ = g.ReportState(now)
				}
			}
			done <- n
		}(w)
	}
	var total int64
	for w := 0; w < 8; w++ {
		total += <-done
	}
	el := clock.System.Now().Sub(base)
	var counted int64
	for _, u := range g.Usage() {
		counted += u.Admitted
	}
	bound := float64(9900)*el.Seconds() + float64(g.Depth())
	t.Logf("admitted %d units in %v (bound %.0f), Usage sums to %d", total, el, bound, counted)
	if float64(total) > bound || counted != total {
		t.Errorf("admitted %d (Usage %d), bound %.0f", total, counted, bound)
	}
}
