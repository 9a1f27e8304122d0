package sluice_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

// slowGate admits after moving the clock on by wait, as a gate that waits
// for capacity does; it counts what it holds.
type slowGate struct {
	name    string
	clk     *fakeclock.Clock
	wait    time.Duration
	held    int
	decided int
}

func (g *slowGate) Name() string  { return g.name }
func (g *slowGate) MayWait() bool { return g.wait > 0 }
func (g *slowGate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

func (g *slowGate) decide(context.Context, *sluice.Request, clock.Instant) (sluice.Decision, sluice.Permit) {
	g.decided++
	g.clk.Advance(g.wait)
	g.held++
	return sluice.Decision{Admitted: true}, 1
}
func (g *slowGate) Release(*sluice.Request, sluice.Permit, sluice.Completion) { g.held-- }

// A deadline that passes while a gate waits rejects the request (reason
// deadline) before the gates after it run, with what it held given back;
// the gates after a wait decide at its end. Before, they decided at the
// instant read before the wait, and the request went on past its deadline.
func TestDeadlinePassedDuringAWait(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	waits := &slowGate{name: "queue", clk: clk, wait: 100 * time.Millisecond}
	after := &slowGate{name: "after", clk: clk}
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: clk}, waits, after)
	if err != nil {
		t.Fatal(err)
	}
	d, tk := chain.Decide(context.Background(), &sluice.Request{Deadline: clk.Now().Add(50 * time.Millisecond)})
	if d.Admitted || d.Reason != sluice.ReasonDeadline || d.Gate != "queue" {
		tk.Done(sluice.OutcomeUseful)
		t.Fatalf("past its deadline after the wait: %+v", d)
	}
	if waits.held != 0 || after.decided != 0 {
		t.Fatalf("the waiting gate holds %d, the gate after it decided %d times", waits.held, after.decided)
	}
	// Within its deadline it goes on, and its work is timed from the wait's end.
	d, tk = chain.Decide(context.Background(), &sluice.Request{Deadline: clk.Now().Add(time.Second)})
	if !d.Admitted {
		t.Fatalf("within its deadline: %+v", d)
	}
	tk.Done(sluice.OutcomeUseful)
	if waits.held != 0 || after.held != 0 {
		t.Fatalf("held after Done: %d, %d", waits.held, after.held)
	}
}
