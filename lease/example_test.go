package lease_test

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/lease"
)

// A budget of 120 units/s leased to three processes that want 1000, 50
// and 10 (Doorman's FAIR_SHARE vector). A new budget learns for one lease
// time; then the first process to ask is granted what is free, and once
// every process has refreshed the grants are the max-min shares 60, 50
// and 10, never more than 120 in all.
func ExampleAllocator_Step() {
	a := lease.Allocator{Capacity: 120, Lease: 10 * time.Second}
	var st lease.State
	now := clock.Instant(time.Hour)
	wants := map[string]int64{"web-1": 1000, "web-2": 50, "web-3": 10}
	has := map[string]int64{}
	for round := 0; round < 4; round++ {
		for _, c := range []string{"web-1", "web-2", "web-3"} {
			g := a.Step(&st, lease.Request{Client: c, Wants: wants[c], Has: has[c]}, now)
			has[c] = g.Has
			now = now.Add(time.Second)
		}
		if round == 0 {
			now = now.Add(a.Lease) // past the new budget's learning period
		}
	}
	fmt.Println(has["web-1"], has["web-2"], has["web-3"])
	// Output: 60 50 10
}
