package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

// Random single-threaded event loop over an event-mode queue: decide,
// release (granted or parked, twice, unknown ids), expire, cancel, pin.
// Invariants: inner in-flight never above limit at admission, a parked
// request gets at most one Ready, held empties, nothing in flight at end.
func TestEventModeRandom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 1))
			clk := fakeclock.New(1000)
			c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: 2, Min: 1, Max: 10})
			g, _ := adaptive.NewGate("pool", c, adaptive.GateOptions{})
			g.Pin(2)
			var inner sluice.Gate = g
			if seed%2 == 1 {
				inner = staticPool(t, 2)
			}
			q, _ := New("pool", inner, Options{MaxWait: 10 * time.Millisecond, Clock: clk, Events: true,
				Target: time.Millisecond, Interval: 3 * time.Millisecond, Classes: []string{"a"}})
			type req struct {
				r      *sluice.Request
				p      sluice.Permit
				id     uint64
				parked bool
				ready  int
				slot   bool
				done   bool
			}
			var reqs []*req
			byTag := map[uint64]*req{}
			park := &Park{Ready: func(tag uint64, d sluice.Decision) {
				x := byTag[tag]
				x.ready++
				if x.ready > 1 {
					t.Errorf("tag %d: %d Ready calls", tag, x.ready)
				}
				x.slot = d.Admitted
			}}
			ctx := ContextWithPark(context.Background(), park)
			slotsHeld := func() int {
				n := 0
				for _, x := range reqs {
					if !x.done && (x.slot || (!x.parked && x.p != 0)) {
						n++
					}
				}
				return n
			}
			for step := range 400 {
				clk.Advance(time.Duration(rng.IntN(2000)) * time.Microsecond)
				switch k := rng.IntN(10); {
				case k < 4:
					x := &req{r: &sluice.Request{Class: []string{"a", "b"}[rng.IntN(2)]}}
					tag := uint64(len(reqs) + 1)
					byTag[tag] = x
					park.Tag, park.Queue = tag, nil
					d, p := q.Decide(ctx, x.r, clk.Now())
					if !d.Admitted {
						continue
					}
					x.p = p
					if park.Queue != nil {
						x.parked, x.id = true, park.ID
					}
					reqs = append(reqs, x)
				case k < 7 && len(reqs) > 0:
					x := reqs[rng.IntN(len(reqs))]
					if x.done && rng.IntN(4) != 0 {
						continue
					}
					q.Release(x.r, x.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now()})
					x.done = true
				case k < 8 && len(reqs) > 0:
					x := reqs[rng.IntN(len(reqs))]
					if x.parked {
						q.Expire(x.id)
					}
				case k < 9 && len(reqs) > 0:
					x := reqs[rng.IntN(len(reqs))]
					if x.parked {
						q.Cancel(x.id)
					}
				default:
					if ag, ok := inner.(*adaptive.Gate); ok {
						ag.Pin(1 + rng.IntN(4))
					}
					q.Release(&sluice.Request{}, sluice.Permit(rng.Uint64()), sluice.Completion{})
				}
				if sz, ok := inner.(sluice.Sizer); ok {
					_, f := sz.ConcurrencyLimit()
					if f != slotsHeld() {
						t.Fatalf("step %d: inner in flight %d, requests holding slots %d", step, f, slotsHeld())
					}
				}
			}
			for _, x := range reqs {
				if !x.done {
					q.Release(x.r, x.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now()})
					x.done = true
				}
			}
			for _, x := range reqs {
				if x.slot && !x.done {
					t.Errorf("granted after its release")
				}
			}
			parked, granted, readies := 0, 0, 0
			for _, x := range reqs {
				if x.parked {
					parked++
				}
				if x.slot {
					granted++
				}
				readies += x.ready
			}
			_, _, _, dropped := q.QueueStats(clk.Now())
			t.Logf("reqs %d parked %d granted-after-wait %d ready %d dropped %d", len(reqs), parked, granted, readies, dropped)
			if len(q.held) != 0 || q.n != 0 {
				t.Errorf("end: held %d, waiting %d", len(q.held), q.n)
			}
			if sz, ok := inner.(sluice.Sizer); ok {
				if _, f := sz.ConcurrencyLimit(); f != 0 {
					t.Errorf("end: %d in flight", f)
				}
			} else if d, p := inner.Decide(context.Background(), &sluice.Request{}, clock.Now()); !d.Admitted {
				t.Errorf("end: static pool still full")
			} else {
				inner.Release(&sluice.Request{}, p, sluice.Completion{})
			}
		})
	}
}
