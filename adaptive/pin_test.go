package adaptive

import (
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// A pin holds against windows closing at the same time: a close that had
// read "not pinned" stored its limit over the pin (38 of 3,000 rounds,
// before Pin took the lock that closes take).
func TestPinHoldsAgainstAClosingWindow(t *testing.T) {
	lost := 0
	for round := 0; round < 1000; round++ {
		a, _ := newAIMD(AIMDConfig{Initial: 50, Min: 20, Max: 200})
		g, _ := NewGate("g", a, GateOptions{Window: WindowConfig{MinTime: time.Nanosecond, MaxTime: time.Nanosecond, MinSamples: 1, MinRTT: time.Nanosecond}})
		var wg sync.WaitGroup
		start := make(chan struct{})
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				for i := 0; i < 400; i++ {
					r := &sluice.Request{}
					g.Release(r, 60, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clock.Now(), Latency: time.Millisecond})
				}
			}()
		}
		close(start)
		time.Sleep(time.Duration(round%20) * time.Microsecond)
		g.Pin(1)
		wg.Wait()
		if l, _ := g.ConcurrencyLimit(); l != 1 {
			lost++
		}
	}
	if lost > 0 {
		t.Errorf("Pin(1) overwritten by the controller in %d of 1000 rounds", lost)
	}
}
