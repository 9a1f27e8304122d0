package shed_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/shed"
)

// The deadline test Q + S + R + U < D: a queueing delay of 45 ms, a
// service time of 35 ms, 10 ms back to the caller and a margin of 15 ms
// make 105 ms, which an 80 ms budget cannot hold and a 120 ms one can;
// with the queue at 10 ms, 70 ms fits in 80.
func ExampleFits() {
	ms := time.Millisecond
	fmt.Println(shed.Fits(45*ms, 35*ms, 10*ms, 15*ms, 80*ms), shed.Fits(45*ms, 35*ms, 10*ms, 15*ms, 120*ms), shed.Fits(10*ms, 35*ms, 10*ms, 15*ms, 80*ms))
	// Output: false true true
}

// A deadline gate learns a class's service times from its completions (20
// of 35 ms here) and turns away, before it takes any slot, a request whose
// budget cannot hold them: reason deadline (503), not retryable as it is.
func ExampleNewDeadline() {
	g, _ := shed.NewDeadline("in-time", shed.DeadlineOptions{Margin: 5 * time.Millisecond})
	ctx := context.Background()
	now := clock.Instant(time.Second)
	for range 20 {
		r := &sluice.Request{Class: "default"}
		var d sluice.Decision
		p := g.Decide(ctx, r, now, &d)
		g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 35 * time.Millisecond, Now: now})
	}
	// 35 ms of work and a 5 ms margin do not fit 30 ms: the first such
	// request goes through as a retest (the estimate may be stale), the
	// next is refused while the retest is out; 100 ms fits.
	for _, budget := range []time.Duration{30 * time.Millisecond, 30 * time.Millisecond, 100 * time.Millisecond} {
		var d sluice.Decision // the gate writes its verdict here
		g.Decide(ctx, &sluice.Request{Class: "default", Deadline: now.Add(budget)}, now, &d)
		fmt.Println(budget, d.Admitted, d.Reason, d.Retryable)
	}
	// Output:
	// 30ms true  false
	// 30ms false deadline false
	// 100ms true  false
}
