package settle

import "testing"

func series(binding bool, limits ...int) []Window {
	ws := make([]Window, len(limits))
	for i, l := range limits {
		ws[i] = Window{Limit: l, Binding: binding}
	}
	return ws
}

func TestMeasure(t *testing.T) {
	// A binding limit that falls from 31 to 20 after a change at window 2:
	// in the band 20±2 from window 6 on (28 26 24 23 21: the fifth window).
	ws := series(true, 31, 31, 28, 26, 24, 23, 21, 20, 20, 20, 20, 20, 20, 21, 20, 20)
	if got := Measure(ws, 2, len(ws)); got.Final != 20 || got.Windows != 5 || got.Swing != 1 {
		t.Fatalf("%+v: want final 20, settled in 5 windows, swing 1", got)
	}
	// One that never holds still.
	if got := Measure(series(true, 10, 40, 10, 40, 10, 40, 10, 40), 0, 8); got.Windows != -1 {
		t.Fatalf("%+v: an oscillating limit never settles", got)
	}
	// Too short a phase to judge.
	if got := Measure(series(true, 1, 2, 3), 0, 3); got.Windows != -1 {
		t.Fatalf("%+v", got)
	}
	// A limit that climbs while it binds nothing is settled from the start:
	// it admits the same at every value.
	if got := Measure(series(false, 20, 22, 24, 26, 28, 30, 32, 34), 0, 8); got.Windows != 1 || got.Final != 30 || got.Swing != 0 {
		t.Fatalf("%+v: an idle limit is settled at once", got)
	}
	// Binding only now and then: the binding windows decide.
	ws = series(false, 40, 40, 12, 40, 40, 12, 40, 40)
	ws[2].Binding, ws[5].Binding = true, true
	if got := Measure(ws, 0, 8); got.Final != 12 || got.Windows != 1 || got.Swing != 0 {
		t.Fatalf("%+v", got)
	}
}
