package fair

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

// Regression: the rotation: over many periods each cohort is shed in its share of
// them to within one period; try cohort counts whose stride 5n/8|1 is not
// coprime with n.
func TestRegressCohortRotation(t *testing.T) {
	for _, n := range []int{24, 40, 56, 120, 128, 3, 7} {
		for _, f := range []float64{0.05, 0.3, 0.5} {
			g, err := NewCohort("c", CohortOptions{Cohorts: n, Period: time.Second, Window: 100 * time.Millisecond,
				Fraction: func(clock.Instant) float64 { return f }})
			if err != nil {
				t.Fatal(err)
			}
			// one request per cohort every ms, tenants chosen by cohort
			tenants := make([]string, n)
			for c, found := 0, 0; found < n; c++ {
				tn := fmt.Sprint("t", c)
				if k := g.cohortOf(tn); tenants[k] == "" {
					tenants[k] = tn
					found++
				}
			}
			shed, offered := 0, 0
			for ms := int64(0); ms < 40_000; ms += 4 { // 40 periods
				now := clock.Instant(ms * int64(time.Millisecond))
				for c := 0; c < n; c++ {
					offered++
					if g.Shed(&sluice.Request{Tenant: tenants[c]}, f, now) {
						shed++
					}
				}
			}
			lo, hi := slices.Min(g.shedIn), slices.Max(g.shedIn)
			got := float64(shed) / float64(offered)
			t.Logf("n=%d f=%.2f: shed %.4f; periods shed per cohort min %d max %d", n, f, got, lo, hi)
			if hi-lo > 1 {
				t.Errorf("n=%d f=%.2f: periods shed per cohort spread %d..%d (> 1)", n, f, lo, hi)
			}
			if math.Abs(got-f) > 0.01 {
				t.Errorf("n=%d f=%.2f: shed fraction %.4f", n, f, got)
			}
		}
	}
}

// Regression: Fraction NaN / >1 / negative RetryHint.
func TestRegressCohortOddInputs(t *testing.T) {
	g, _ := NewCohort("c", CohortOptions{Fraction: func(clock.Instant) float64 { return math.NaN() }})
	shed := 0
	for i := 0; i < 1000; i++ {
		if d, _ := gatetest.Decide(bg, g, &sluice.Request{Tenant: fmt.Sprint(i)}, clock.Instant(i)); !d.Admitted {
			shed++
		}
	}
	t.Logf("Fraction NaN: %d of 1000 shed", shed)
	if shed != 0 {
		t.Errorf("a NaN fraction shed %d of 1000 (everything)", shed)
	}
	_, err := NewCohort("c", CohortOptions{RetryHint: -time.Second})
	if err == nil {
		g2, _ := NewCohort("c", CohortOptions{RetryHint: -time.Second, Fraction: func(clock.Instant) float64 { return 1 }})
		d, _ := gatetest.Decide(bg, g2, &sluice.Request{}, 1)
		t.Errorf("negative RetryHint accepted: a shed request has RetryAfter %v", d.RetryAfter)
	}
}
