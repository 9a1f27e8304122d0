package fair

import "math"

// MaxMin returns the weighted max-min fair allocation of capacity between
// claimants with the given demands and weights (a nil weights slice means
// all 1): every claimant's allocation grows in proportion to its weight
// until it reaches its demand or the capacity runs out, and then the rest
// grow on among themselves (water-filling). No claimant gets more than it
// demands; when demand exceeds capacity the allocations sum to capacity.
// Demands and weights must be non-negative; a claimant of weight 0 gets
// only what is left once every weighted one is satisfied.
//
// This is the allocation of Google Doorman's FAIR_SHARE algorithm
// (youtube/doorman, doc/algorithms.md: capacity 120, demands 1000, 50
// and 10 → 60, 50 and 10), here in O(n²) for the handful of claimants a
// class or a lease has.
func MaxMin(capacity float64, demands, weights []float64) []float64 {
	n := len(demands)
	alloc := make([]float64, n)
	active := make([]bool, n)
	left := max(capacity, 0)
	// Weights count only relative to each other: scale them so that the
	// largest is 1 (sums of huge or subnormal weights lose nothing).
	top := 0.0
	for i := range weights {
		top = max(top, weights[i])
	}
	w := func(i int) float64 {
		if weights == nil {
			return 1
		}
		if math.IsInf(top, 1) {
			if math.IsInf(weights[i], 1) {
				return 1
			}
			return 0
		}
		return weights[i] / top
	}
	count := 0
	for i := range demands {
		if demands[i] > 0 {
			active[i] = true
			count++
		}
	}
	for pass := 0; pass < 2; pass++ {
		for count > 0 && left > 0 {
			sum := 0.0
			for i := range demands {
				if active[i] {
					sum += weight(w(i), pass)
				}
			}
			if sum == 0 {
				break
			}
			share := func(i int) float64 { return left * (weight(w(i), pass) / sum) }
			satisfied := false
			for i := range demands {
				if active[i] && demands[i]-alloc[i] <= share(i) {
					left -= demands[i] - alloc[i]
					alloc[i] = demands[i]
					active[i] = false
					count--
					satisfied = true
				}
			}
			if !satisfied {
				for i := range demands {
					if active[i] {
						alloc[i] = min(alloc[i]+share(i), demands[i])
					}
				}
				left = 0
			}
		}
		// The second pass shares what is left between weight-0 claimants.
	}
	return alloc
}

// weight is a claimant's weight in a pass: its own in the first, and in
// the second 1 for the weight-0 claimants (the others are done by then).
func weight(w float64, pass int) float64 {
	if pass == 0 {
		return w
	}
	if w == 0 {
		return 1
	}
	return 0
}
