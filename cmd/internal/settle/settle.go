// Package settle measures how an adaptive limit answers a step change in a
// time series, for `sluice sim` and `sluice demo`: how many windows it takes
// to settle, and how much it swings afterwards.
//
//	s := settle.Measure(limits, 30, 60) // the step at window 30, the next at 60
//	fmt.Println(s.Windows, s.Final, s.Swing)
package settle

import "slices"

// Settling is how a limit answered a change at window From of a series:
// Windows is how many windows it took to enter, for good, the band of
// ±max(2, 10%) around Final, its median over the last 5 windows before
// window To (the next change), and to stay there at least 5 windows; -1
// if it never did. Swing is the limit's
// range (max − min) from then on to To.
type Settling struct {
	From, To int
	Final    int
	Windows  int
	Swing    int
}

// Measure measures the settling of limits (one per window) between
// windows from and to.
func Measure(limits []int, from, to int) Settling {
	st := Settling{From: from, To: to, Windows: -1}
	if from < 0 || to > len(limits) || to-from < 5 {
		return st
	}
	last := slices.Clone(limits[to-5 : to])
	slices.Sort(last)
	st.Final = last[2]
	band := max(2, st.Final/10)
	in := func(l int) bool { return l >= st.Final-band && l <= st.Final+band }
	for i := to - 1; i >= from && in(limits[i]); i-- {
		st.Windows = i - from + 1
	}
	if st.Windows < 0 || to-(from+st.Windows-1) < 5 {
		st.Windows = -1 // in the band for less than the last 5 windows: not settled
		return st
	}
	after := limits[from+st.Windows-1 : to]
	st.Swing = slices.Max(after) - slices.Min(after)
	return st
}
