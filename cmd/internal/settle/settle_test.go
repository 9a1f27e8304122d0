package settle

import "testing"

func TestMeasure(t *testing.T) {
	// A limit that falls from 31 to 20 after a change at window 2: in the
	// band 20±2 from window 6 on (28 26 24 23 21: the fifth window).
	limits := []int{31, 31, 28, 26, 24, 23, 21, 20, 20, 20, 20, 20, 20, 21, 20, 20}
	got := Measure(limits, 2, len(limits))
	if got.Final != 20 || got.Windows != 5 || got.Swing != 1 {
		t.Fatalf("%+v: want final 20, settled in 5 windows, swing 1", got)
	}
	// One that never holds still.
	if got := Measure([]int{10, 40, 10, 40, 10, 40, 10, 40}, 0, 8); got.Windows != -1 {
		t.Fatalf("%+v: an oscillating limit never settles", got)
	}
	// Too short a phase to judge.
	if got := Measure([]int{1, 2, 3}, 0, 3); got.Windows != -1 {
		t.Fatalf("%+v", got)
	}
}
