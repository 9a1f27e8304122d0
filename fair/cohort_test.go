package fair

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

// At a shed fraction of 13% the cut sheds 13% ± 1% of arrivals in every
// period, and over 20 rotation periods no tenant is shed in more than its
// share of the periods + 1.
func TestCohortShedsAnExactFractionAndRotates(t *testing.T) {
	const f, periods, tenants = 0.13, 20, 5000
	g, err := NewCohort("cut", CohortOptions{Tiers: []string{"sheddable", "critical"}, Period: time.Second,
		Window: 100 * time.Millisecond, Fraction: func(clock.Instant) float64 { return f }})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	shedPeriods := make([]int, tenants)
	const perPeriod = 20000
	for p := 0; p < periods; p++ {
		shedNow := make([]bool, tenants)
		offered, shed := 0, 0
		for i := 0; i < perPeriod; i++ {
			now := clock.Instant(int64(p)*int64(time.Second) + int64(i)*int64(time.Second)/perPeriod)
			tenant := rng.IntN(tenants)
			r := &sluice.Request{Tenant: fmt.Sprintf("tenant-%d", tenant), Class: "sheddable"}
			if g.Shed(r, f, now) {
				shedNow[tenant] = true
				if i >= perPeriod/10 { // after the first window of the run
					shed++
				}
			}
			if i >= perPeriod/10 {
				offered++
			}
		}
		{
			if got := float64(shed) / float64(offered); math.Abs(got-f) > 0.01 {
				t.Errorf("period %d: shed %.4f of arrivals, want %.2f ± 0.01", p, got, f)
			}
		}
		for i, s := range shedNow {
			if s {
				shedPeriods[i]++
			}
		}
	}
	bound := int(math.Floor(f*periods + 1))
	worst := 0
	for _, n := range shedPeriods {
		worst = max(worst, n)
	}
	if worst > bound {
		t.Errorf("a tenant was shed in %d of %d periods, want ≤ %d (its share + 1)", worst, periods, bound)
	}
	t.Logf("most periods any tenant was shed in: %d of %d (bound %d)", worst, periods, bound)
}

// The cut takes the lowest tier first: at a fraction below its share of
// arrivals, no request of a higher tier is shed.
func TestCohortShedsTheLowestTierFirst(t *testing.T) {
	g, _ := NewCohort("cut", CohortOptions{Tiers: []string{"sheddable", "critical"}})
	shed := map[string]int{}
	for i := 0; i < 100000; i++ {
		class := "critical"
		if i%2 == 0 {
			class = "sheddable"
		}
		now := clock.Instant(int64(i) * int64(time.Second) / 10000)
		if g.Shed(&sluice.Request{Tenant: fmt.Sprint("t", i%997), Class: class}, 0.3, now) {
			shed[class]++
		}
	}
	if shed["critical"] != 0 {
		t.Errorf("shed %d critical requests at a fraction below the sheddable share", shed["critical"])
	}
	if got := float64(shed["sheddable"]) / 100000; math.Abs(got-0.3) > 0.01 {
		t.Errorf("shed %.3f of all arrivals, want 0.30", got)
	}
}

// A class the tiers leave out is shed last, as in shed.Utilization's coin
// mode: tiers [sheddable] with critical unlisted (the footgun that once
// refused 92% of critical traffic: an unlisted class was the lowest tier).
func TestCohortShedsAnUnlistedClassLast(t *testing.T) {
	g, _ := NewCohort("cut", CohortOptions{Tiers: []string{"sheddable"}})
	shed := map[string]int{}
	for i := 0; i < 100000; i++ {
		class := "critical"
		if i%2 == 0 {
			class = "sheddable"
		}
		now := clock.Instant(int64(i) * int64(time.Second) / 10000)
		if g.Shed(&sluice.Request{Tenant: fmt.Sprint("t", i%997), Class: class}, 0.4, now) {
			shed[class]++
		}
	}
	if shed["critical"] != 0 || shed["sheddable"] < 35000 {
		t.Errorf("shed %v at a fraction of 0.4: want sheddable's 40%% of arrivals and no critical", shed)
	}
}

func TestCohortDecideUsesItsFraction(t *testing.T) {
	g, _ := NewCohort("cut", CohortOptions{Fraction: func(clock.Instant) float64 { return 1 }})
	d, _ := gatetest.Decide(t.Context(), g, &sluice.Request{Tenant: "a"}, 1)
	if d.Admitted || d.Reason != sluice.ReasonOverload || !d.Retryable || d.RetryAfter != time.Second {
		t.Fatalf("fraction 1: %+v, want a retryable overload rejection", d)
	}
	g, _ = NewCohort("cut", CohortOptions{})
	if d, _ := gatetest.Decide(t.Context(), g, &sluice.Request{Tenant: "a"}, 1); !d.Admitted {
		t.Fatal("no fraction source shed a request")
	}
}

// Doorman's worked example of its FAIR_SHARE algorithm, and weights.
func TestMaxMin(t *testing.T) {
	for _, tc := range []struct {
		capacity float64
		demands  []float64
		weights  []float64
		want     []float64
	}{
		{120, []float64{1000, 50, 10}, nil, []float64{60, 50, 10}},
		{100, []float64{100, 100, 100}, []float64{2, 1, 1}, []float64{50, 25, 25}},
		{100, []float64{10, 100, 100}, []float64{2, 1, 1}, []float64{10, 45, 45}},
		{100, []float64{30, 30}, nil, []float64{30, 30}},
		{100, []float64{100, 100}, []float64{1, 0}, []float64{100, 0}},
		{100, []float64{50, 100}, []float64{1, 0}, []float64{50, 50}},
		{0, []float64{10}, nil, []float64{0}},
	} {
		got := MaxMin(tc.capacity, tc.demands, tc.weights)
		for i := range got {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("MaxMin(%v, %v, %v) = %v, want %v", tc.capacity, tc.demands, tc.weights, got, tc.want)
				break
			}
		}
	}
}
