package fair_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/fair"
)

// Google Doorman's FAIR_SHARE vector: a capacity of 120 over demands of
// 1000, 50 and 10 gives 60, 50 and 10; with the first claimant's weight
// doubled, the same (the others want less than their share).
func ExampleMaxMin() {
	fmt.Println(fair.MaxMin(120, []float64{1000, 50, 10}, nil))
	fmt.Println(fair.MaxMin(120, []float64{1000, 1000, 10}, []float64{2, 1, 1}))
	// Output:
	// [60 50 10]
	// [73.33333333333333 36.666666666666664 10]
}

// Concurrent work units divided between classes: premium always finds its
// reserve of 6, even with free holding every unit it may (its own 2, the
// 2 no class reserves, and 2 of premium's idle ones lent within the
// recovery headroom of 2 units).
func ExampleNewSlots() {
	g, _ := fair.NewSlots("units", fair.SlotOptions{InFlight: 12, Recovery: 2, Revocation: time.Second,
		Classes: []fair.ClassShare{{Class: "premium", Reserve: 6}, {Class: "free", Reserve: 2}}})
	ctx := context.Background()
	now := clock.Instant(time.Second)
	take := func(class string) int {
		n := 0
		for range 20 {
			r := &sluice.Request{Class: class, Deadline: now.Add(500 * time.Millisecond)}
			var d sluice.Decision
			if g.Decide(ctx, r, now, &d); d.Admitted {
				n++
			}
		}
		return n
	}
	fmt.Println("free:", take("free"))
	fmt.Println("premium:", take("premium"))
	// Output:
	// free: 6
	// premium: 6
}
