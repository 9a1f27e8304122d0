// Package settle measures how an adaptive limit answers a step change in a
// time series, for `sluice sim` and `sluice demo`: how many windows it takes
// to settle, and how much it swings afterwards.
//
//	s := settle.Measure(windows, 30, 60) // the step at window 30, the next at 60
//	fmt.Println(s.Windows, s.Final, s.Swing)
package settle

import "slices"

// Window is one window of a series: the limit at its end, and whether the
// limit bound admission in it (a request waited for a slot or was turned
// away for want of one).
type Window struct {
	Limit   int
	Binding bool
}

// Settling is how a limit answered a change at window From of a series.
//
// Final is the limit it settled to: the median over the last 5 windows
// before window To (the next change) of the windows where it bound, or of
// all 5 when it bound in none. A window is settled when the limit is
// within ±max(2, 10%) of Final, or did not bind: a limit above the demand
// admits the same whatever its value. Windows is how many windows the
// limit took to be settled for good, staying so for at least the last 5
// windows; -1 if it never was. Swing is the range (max − min) of the limit
// over the binding windows from then on: 0 means it held still where it
// mattered.
type Settling struct {
	From, To int
	Final    int
	Windows  int
	Swing    int
}

// Measure measures the settling of a series between windows from and to.
func Measure(ws []Window, from, to int) Settling {
	st := Settling{From: from, To: to, Windows: -1}
	if from < 0 || to > len(ws) || to-from < 5 {
		return st
	}
	var last []int
	for _, w := range ws[to-5 : to] {
		if w.Binding {
			last = append(last, w.Limit)
		}
	}
	if len(last) == 0 {
		for _, w := range ws[to-5 : to] {
			last = append(last, w.Limit)
		}
	}
	slices.Sort(last)
	st.Final = last[len(last)/2]
	band := max(2, st.Final/10)
	settled := func(w Window) bool { return !w.Binding || w.Limit >= st.Final-band && w.Limit <= st.Final+band }
	for i := to - 1; i >= from && settled(ws[i]); i-- {
		st.Windows = i - from + 1
	}
	if st.Windows < 0 || to-(from+st.Windows-1) < 5 {
		st.Windows = -1 // settled for less than the last 5 windows
		return st
	}
	lo, hi := -1, -1
	for _, w := range ws[from+st.Windows-1 : to] {
		if w.Binding {
			if lo < 0 {
				lo, hi = w.Limit, w.Limit
			}
			lo, hi = min(lo, w.Limit), max(hi, w.Limit)
		}
	}
	st.Swing = hi - lo
	return st
}
