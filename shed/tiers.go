package shed

// tierShed returns the probability of shedding a request of tier i (0 is
// the lowest, first shed) out of k tiers at shed fraction f: the fraction
// is spread over the tiers in order, so tier i is shed with probability
// clamp(f·k − i, 0, 1) and a higher tier starts losing requests only once
// every lower tier is shed entirely.
func tierShed(f float64, i, k int) float64 {
	if k <= 0 {
		return 0
	}
	return min(max(f*float64(k)-float64(i), 0), 1)
}
