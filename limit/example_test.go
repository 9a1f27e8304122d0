package limit_test

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

// A token bucket of 200 tokens/s and a burst of 400, stepped at explicit
// instants: a full bucket admits 400 at once, the 401st waits exactly one
// emission interval (5 ms), and an empty bucket is full again 2 s later.
func ExampleTokenBucket() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(200), 400)
	var s limit.TokenBucketState // the zero value is a full bucket
	var now clock.Instant
	admitted := 0
	for range 400 {
		if tb.Take(&s, now, 1).OK() {
			admitted++
		}
	}
	r := tb.Take(&s, now, 1)
	fmt.Println(admitted, r.Status, r.RetryAfter, r.ResetAfter)
	fmt.Println(tb.Tokens(&s, now.Add(2*time.Second)))
	// Output:
	// 400 denied 5ms 2s
	// 400
}

// A leaky bucket as a paced queue: 6 ms per request with 15 waiting gives a
// worst wait of 90 ms; a request that would start after its deadline is
// refused before it waits, and one that finds the queue full is told when
// there is room.
func ExampleLeakyBucket_TakeBy() {
	pace, _ := limit.NewRate(1, 6*time.Millisecond)
	lb, _ := limit.NewLeakyBucket(pace, 15)
	var s limit.LeakyBucketState
	var now clock.Instant
	for range 10 {
		lb.TakeBy(&s, now, 1, 0) // waits of 0, 6, ..., 54 ms
	}
	r := lb.TakeBy(&s, now, 1, now.Add(50*time.Millisecond)) // would start at 60 ms
	fmt.Println(r.Status)
	for range 6 {
		r = lb.TakeBy(&s, now, 1, 0)
	}
	fmt.Println(lb.Window(), r.Wait)
	r = lb.TakeBy(&s, now, 1, 0)
	fmt.Println(r.Status, r.RetryAfter)
	// Output:
	// too_late
	// 90ms 90ms
	// denied 6ms
}
