package queue

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// CoDel's schedule (RFC 8289): with target 5 ms and interval 100 ms, a
// sojourn above the target for a whole interval starts dropping; drops
// then come interval/√count apart, and a sojourn under the target ends
// them.
func TestCoDelSchedule(t *testing.T) {
	c := codel{target: 5 * time.Millisecond, interval: 100 * time.Millisecond}
	at := func(ms float64) clock.Instant { return clock.Instant(ms * float64(time.Millisecond)) }
	for _, s := range []struct {
		at      float64
		sojourn time.Duration
		left    int
		drop    bool
	}{
		{0, 10 * time.Millisecond, 5, false},   // above: the interval starts
		{50, 10 * time.Millisecond, 5, false},  // still inside it
		{100, 10 * time.Millisecond, 5, true},  // a whole interval above: drop, next at 200
		{150, 10 * time.Millisecond, 5, false}, // before the next drop
		{200, 10 * time.Millisecond, 5, true},  // count 2: next at 200 + 100/√2 = 270.7
		{270, 10 * time.Millisecond, 5, false}, // not yet
		{271, 10 * time.Millisecond, 5, true},  // count 3: next at 270.7 + 57.7 = 328.4
		{300, 1 * time.Millisecond, 5, false},  // under the target: dropping ends
		{310, 10 * time.Millisecond, 5, false}, // above again: a new interval
		{400, 10 * time.Millisecond, 0, false}, // nothing left queued: no drop
		{420, 10 * time.Millisecond, 3, false}, // restarts the interval
		{520, 10 * time.Millisecond, 3, true},  // dropping again
	} {
		if got := c.drop(at(s.at), s.sojourn, s.left); got != s.drop {
			t.Fatalf("t=%vms sojourn %v: drop %v, want %v (state %+v)", s.at, s.sojourn, got, s.drop, c)
		}
		step := float64(100*time.Millisecond) / math.Sqrt(2)
		if want := at(200).Add(time.Duration(step)); s.at == 200 && c.dropNext != want {
			t.Fatalf("next drop at %v", time.Duration(c.dropNext))
		}
	}
}
