package adaptive

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

// drive admits up to n requests at now and completes every admitted one at
// now+rtt with outcome o, returning how many were admitted.
func drive(g *Gate, now clock.Instant, n int, rtt time.Duration, o sluice.Outcome) int {
	var permits []sluice.Permit
	for range n {
		if d, p := gatetest.Decide(context.Background(), g, &sluice.Request{}, now); d.Admitted {
			permits = append(permits, p)
		}
	}
	for _, p := range permits {
		g.Release(&sluice.Request{}, p, sluice.Completion{Outcome: o, Now: now.Add(rtt), Latency: rtt})
	}
	return len(permits)
}

// The gate holds at most its limit in flight, the controller moves the
// limit from completed windows (Gradient2: steady 10 ms windows grow it,
// a window five times slower shrinks it), failed work teaches it nothing,
// and Pin overrides it.
func TestGateFollowsItsController(t *testing.T) {
	ctrl, _ := newGradient2(Gradient2Config{Initial: 20, Min: 5, Max: 100, Tolerance: 1})
	g, err := NewGate("adaptive", ctrl, GateOptions{Window: WindowConfig{MinTime: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	now := clock.Instant(time.Second)
	if got := drive(g, now, 30, 10*time.Millisecond, sluice.OutcomeUseful); got != 20 {
		t.Fatalf("admitted %d of 30 at a limit of 20", got)
	}
	for range 50 { // 50 windows of 100 ms at 10 ms, 20 in flight: the limit grows
		now = now.Add(100 * time.Millisecond)
		drive(g, now, 40, 10*time.Millisecond, sluice.OutcomeUseful)
	}
	grown, _ := g.ConcurrencyLimit()
	if grown <= 20 {
		t.Fatalf("limit %d after 50 fast windows", grown)
	}
	for range 10 { // the service got five times slower under load: the limit shrinks
		now = now.Add(200 * time.Millisecond)
		drive(g, now, 200, 50*time.Millisecond, sluice.OutcomeUseful)
	}
	shrunk, _ := g.ConcurrencyLimit()
	if shrunk >= grown {
		t.Fatalf("limit %d after slow windows, was %d", shrunk, grown)
	}
	for range 20 { // failures say nothing: the limit stays
		now = now.Add(200 * time.Millisecond)
		drive(g, now, 200, time.Millisecond, sluice.OutcomeErrored)
	}
	if l, n := g.ConcurrencyLimit(); l != shrunk || n != 0 {
		t.Fatalf("failed work moved the limit %d → %d (in flight %d)", shrunk, l, n)
	}
	g.Pin(3)
	if got := drive(g, now, 10, 10*time.Millisecond, sluice.OutcomeUseful); got != 3 {
		t.Fatalf("pinned at 3: admitted %d", got)
	}
	g.Unpin()
	if l, _ := g.ConcurrencyLimit(); l != ctrl.Limit() {
		t.Fatalf("unpinned limit %d, controller %d", l, ctrl.Limit())
	}
}

// Under concurrent callers the in-flight count never passes the limit.
func TestGateNeverAboveLimit(t *testing.T) {
	ctrl, _ := newAIMD(AIMDConfig{Initial: 8, Min: 1, Max: 8})
	g, _ := NewGate("adaptive", ctrl, GateOptions{})
	var inflight, worst atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				d, p := gatetest.Decide(context.Background(), g, &sluice.Request{}, clock.Now())
				if !d.Admitted {
					continue
				}
				n := inflight.Add(1)
				for w := worst.Load(); n > w && !worst.CompareAndSwap(w, n); w = worst.Load() {
				}
				inflight.Add(-1)
				g.Release(&sluice.Request{}, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clock.Now(), Latency: time.Millisecond})
			}
		}()
	}
	wg.Wait()
	if worst.Load() > 8 {
		t.Fatalf("%d in flight under a limit of 8", worst.Load())
	}
	if _, n := g.ConcurrencyLimit(); n != 0 {
		t.Fatalf("%d still held after every release", n)
	}
}

// The runtime's scheduling latency is a queueing-delay source: goroutines
// outnumbering the processors make it grow.
func TestSchedulingDelay(t *testing.T) {
	delay := SchedulingDelay()
	delay() // from now on
	var wg sync.WaitGroup
	stop := time.Now().Add(50 * time.Millisecond)
	for range 64 { // far more runnable goroutines than processors
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
			}
		}()
	}
	wg.Wait()
	if d := delay(); d <= 0 {
		t.Fatalf("scheduling delay %v with 64 spinning goroutines", d)
	}
}

// Late completions reach the controller as drops with their latency: AIMD
// backs off on them (in front of an upstream whose answers all came past
// their deadline, booked as errors, it never did).
func TestLateCompletionsTeachTheController(t *testing.T) {
	ctrl, _ := newAIMD(AIMDConfig{Initial: 20, Min: 1, Max: 100})
	g, _ := NewGate("adaptive", ctrl, GateOptions{Window: WindowConfig{MinTime: 100 * time.Millisecond}})
	now := clock.Instant(time.Second)
	for range 10 {
		now = now.Add(200 * time.Millisecond)
		drive(g, now, 20, 600*time.Millisecond, sluice.OutcomeLate)
	}
	if l, _ := g.ConcurrencyLimit(); l >= 20 {
		t.Fatalf("limit %d after ten windows of late work", l)
	}
}

// The gate's state shows the controller's estimates when it reports them
// (BBR's capacity and no-load RTT, for the admin API).
func TestGateStateShowsTheController(t *testing.T) {
	ctrl, _ := newBBR(BBRConfig{})
	g, _ := NewGate("adaptive", ctrl, GateOptions{Window: WindowConfig{MinTime: 100 * time.Millisecond}})
	now := clock.Instant(time.Second)
	for range 100 {
		now = now.Add(20 * time.Millisecond)
		drive(g, now, 20, 10*time.Millisecond, sluice.OutcomeUseful)
	}
	st := g.ReportState(now).(gateState)
	bs, ok := st.Controller.(bbrState)
	if !ok || bs.NoLoadMs < 9 || bs.NoLoadMs > 11 || bs.Capacity <= 0 {
		t.Fatalf("state %+v", st)
	}
}
