package adaptive_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/clock"
)

// An adaptive concurrency gate run by BBR, the default controller, in
// front of a service of 4 workers that serve a request in 10 ms, offered
// more than it can take (on a fake clock, a step every 10 ms): the limit
// starts at one request in flight and settles at the workers, with no
// number in the configuration saying "4".
func ExampleNewBBR() {
	bbr, _ := adaptive.NewBBR(adaptive.BBRConfig{Epoch: time.Unix(0, 0)})
	g, _ := adaptive.NewGate("worker-pool", bbr, adaptive.GateOptions{})
	ctx := context.Background()
	type job struct {
		p  sluice.Permit
		at clock.Instant
	}
	var fifo []job // admitted, at the service, in order
	now := clock.Instant(0)
	for step := 0; step < 6000; step++ { // a minute
		for range 8 { // the offered load: 8 a step, twice what 4 workers serve
			var d sluice.Decision // the gate writes its verdict here
			p := g.Decide(ctx, &sluice.Request{}, now, &d)
			if d.Admitted {
				fifo = append(fifo, job{p, now})
			}
		}
		now = now.Add(10 * time.Millisecond)
		n := min(len(fifo), 4) // 4 workers finish a request each
		for _, j := range fifo[:n] {
			g.Release(&sluice.Request{}, j.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Latency: now.Sub(j.at)})
		}
		fifo = fifo[n:]
	}
	limit, _ := g.ConcurrencyLimit()
	fmt.Println("limit", limit)
	// Output: limit 4
}
