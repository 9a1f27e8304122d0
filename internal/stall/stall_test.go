package stall

import (
	"testing"
	"time"
)

// MaxIn sums the delays within a span: three delays of 4 ms 5 ms apart
// fit in a span of 10 ms (12 ms), two in a span of 5 ms (8 ms), one alone
// in a span of 1 ms (4 ms, also Max).
func TestMaxInSumsTheDelaysWithinASpan(t *testing.T) {
	m := &Meter{}
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		m.recent = append(m.recent, sample{at: t0.Add(time.Duration(i) * 5 * time.Millisecond), late: 4 * time.Millisecond})
	}
	m.recent = append(m.recent, sample{at: t0.Add(time.Second), late: time.Millisecond})
	m.max.Store(int64(4 * time.Millisecond))
	for _, c := range []struct{ w, want time.Duration }{
		{10 * time.Millisecond, 12 * time.Millisecond},
		{5 * time.Millisecond, 8 * time.Millisecond},
		{time.Millisecond, 4 * time.Millisecond},
		{2 * time.Second, 13 * time.Millisecond},
	} {
		if got := m.MaxIn(c.w); got != c.want {
			t.Errorf("MaxIn(%v) = %v, want %v", c.w, got, c.want)
		}
	}
	m.Reset()
	if got := m.MaxIn(time.Second); got != 0 {
		t.Errorf("after Reset: %v", got)
	}
}
