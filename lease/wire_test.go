package lease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/lease"
)

// wire is one process's way to a shared Local allocator whose answers the
// test hands over: each call runs the step at once, signals stepped, and
// waits for deliver: true, the answer arrives; false, it is lost (the
// caller sees an error although the step ran).
type wire struct {
	l       *lease.Local
	stepped chan struct{}
	deliver chan bool
}

func (w wire) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	g, err := w.l.Lease(ctx, budget, a, r)
	w.stepped <- struct{}{}
	if !<-w.deliver {
		return lease.Grant{}, errors.New("answer lost")
	}
	return g, err
}

// Whatever the processes offer and whenever they refresh, with each
// answer held on the wire for as long as the others go on (their own
// refreshes answered meanwhile), or lost after the step ran: the rate
// grants the processes hold live never sum above the budget, from the new
// budget's first step, through learning and after.
func TestGateLiveGrantsNeverAboveCapacityWithAnswersOnTheWire(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		clk := fakeclock.New(int64(time.Hour))
		l := &lease.Local{Clock: clk}
		a := lease.Allocator{Capacity: rapid.Int64Range(1, 5000).Draw(t, "capacity"), Lease: time.Second, Refresh: 250 * time.Millisecond}
		n := rapid.IntRange(2, 4).Draw(t, "processes")
		gates := make([]*lease.Gate, n)
		wires := make([]wire, n)
		done := make([]chan struct{}, n)
		onWire := make([]bool, n)
		for i := range gates {
			wires[i] = wire{l: l, stepped: make(chan struct{}), deliver: make(chan bool)}
			done[i] = make(chan struct{})
			g, err := lease.NewGate("rate", lease.GateOptions{Budget: "api", Client: fmt.Sprint("p", i), Leaser: wires[i], Clock: clk, Allocator: a})
			if err != nil {
				t.Fatal(err)
			}
			gates[i] = g
		}
		ctx := context.Background()
		defer func() { // the answers still on the wire
			for i := range gates {
				if onWire[i] {
					wires[i].deliver <- false
					<-done[i]
				}
			}
		}()
		for step, steps := 0, rapid.IntRange(1, 200).Draw(t, "steps"); step < steps; step++ {
			now := clk.Advance(time.Duration(rapid.Int64Range(0, int64(100*time.Millisecond)).Draw(t, "gap")))
			i := rapid.IntRange(0, n-1).Draw(t, "process")
			switch op := rapid.IntRange(0, 2).Draw(t, "op"); {
			case op == 0 && !onWire[i]: // a refresh: the step runs, the answer is on the wire
				go func() { gates[i].Refresh(ctx); done[i] <- struct{}{} }()
				<-wires[i].stepped
				onWire[i] = true
			case op == 0 || op == 1 && onWire[i]: // the answer arrives, or is lost
				if onWire[i] {
					wires[i].deliver <- rapid.IntRange(0, 3).Draw(t, "lost") > 0
					<-done[i]
					onWire[i] = false
				}
			default: // demand
				for range rapid.IntRange(1, 50).Draw(t, "requests") {
					gatetest.Decide(ctx, gates[i], &sluice.Request{Cost: 1}, now)
				}
			}
			sum, what := int64(0), ""
			for k, g := range gates {
				if st := g.Lease(now); st.Live {
					sum += st.Granted
					what += fmt.Sprintf(" p%d %d", k, st.Granted)
				}
			}
			if sum > a.Capacity {
				t.Fatalf("step %d: the live grants sum to %d (%s), capacity %d", step, sum, what, a.Capacity)
			}
		}
	})
}
