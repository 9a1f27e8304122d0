package fair

import (
	"math"
	"testing"
)

func TestRegressMaxMinExtremeWeights(t *testing.T) {
	for _, tc := range []struct {
		w []float64
	}{
		{[]float64{1e308, 1e308}},
		{[]float64{math.MaxFloat64, 1}},
		{[]float64{5e-324, 5e-324}},
		{[]float64{1e-300, 1}},
	} {
		got := MaxMin(100, []float64{30, 200}, tc.w)
		sum := got[0] + got[1]
		t.Logf("weights %v, demands [30 200], capacity 100 → %v", tc.w, got)
		if math.IsNaN(sum) || math.Abs(sum-100) > 1e-9 || got[0] > 30 {
			t.Errorf("weights %v: allocation %v, want it to sum to 100 with none above its demand", tc.w, got)
		}
	}
}
