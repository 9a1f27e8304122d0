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
	"github.com/sluice-go/sluice/internal/gatetest"
)

// eventReq is one request of the random event loop.
type eventReq struct {
	r      *sluice.Request
	p      sluice.Permit
	id     uint64
	parked bool
	ready  int
	slot   bool
	done   bool
}

// eventLoop drives an event-mode queue as the simulator does, at random.
type eventLoop struct {
	t     *testing.T
	rng   *rand.Rand
	clk   *fakeclock.Clock
	inner sluice.Gate
	q     *Queue
	park  *Park
	ctx   context.Context
	reqs  []*eventReq
	byTag map[uint64]*eventReq
}

func newEventLoop(t *testing.T, seed uint64) *eventLoop {
	l := &eventLoop{t: t, rng: rand.New(rand.NewPCG(seed, 1)), clk: fakeclock.New(1000), byTag: map[uint64]*eventReq{}}
	c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: 2, Min: 1, Max: 10})
	g, _ := adaptive.NewGate("pool", c, adaptive.GateOptions{})
	g.Pin(2)
	l.inner = g
	if seed%2 == 1 {
		l.inner = staticPool(t, 2)
	}
	opts := Options{MaxWait: 10 * time.Millisecond, Clock: l.clk, Events: true,
		Target: time.Millisecond, Interval: 3 * time.Millisecond, Classes: []string{"a"}}
	if seed%4 >= 2 { // fair queues, a full queue making room
		opts.Fair, opts.MaxLen = &Fairness{Weights: map[string]float64{"t0": 3}, Burst: 2}, 4
	}
	l.q, _ = New("pool", l.inner, opts)
	l.park = &Park{Ready: func(tag uint64, d sluice.Decision) {
		x := l.byTag[tag]
		if x.ready++; x.ready > 1 {
			t.Errorf("tag %d: %d Ready calls", tag, x.ready)
		}
		x.slot = d.Admitted
	}}
	l.ctx = ContextWithPark(context.Background(), l.park)
	return l
}

// held counts the requests that hold an inner slot.
func (l *eventLoop) held() int {
	n := 0
	for _, x := range l.reqs {
		if !x.done && (x.slot || (!x.parked && x.p != 0)) {
			n++
		}
	}
	return n
}

func (l *eventLoop) pick() *eventReq { return l.reqs[l.rng.IntN(len(l.reqs))] }

// step does one random thing: decide, release (twice at times), expire,
// cancel, or move the limit and release an unknown permit.
func (l *eventLoop) step() {
	l.clk.Advance(time.Duration(l.rng.IntN(2000)) * time.Microsecond)
	k := l.rng.IntN(10)
	if k >= 4 && k < 9 && len(l.reqs) == 0 {
		k = 0
	}
	switch {
	case k < 4:
		x := &eventReq{r: &sluice.Request{Class: []string{"a", "b"}[l.rng.IntN(2)], Tenant: fmt.Sprint("t", l.rng.IntN(3)),
			Cost: 1 + int64(l.rng.IntN(3))}}
		tag := uint64(len(l.reqs) + 1)
		l.byTag[tag] = x
		l.park.Tag, l.park.Queue = tag, nil
		d, p := gatetest.Decide(l.ctx, l.q, x.r, l.clk.Now())
		if !d.Admitted {
			return
		}
		x.p = p
		if l.park.Queue != nil {
			x.parked, x.id = true, l.park.ID
		}
		l.reqs = append(l.reqs, x)
	case k < 7:
		if x := l.pick(); !x.done || l.rng.IntN(4) == 0 {
			l.q.Release(x.r, x.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: l.clk.Now()})
			x.done = true
		}
	case k < 8:
		if x := l.pick(); x.parked {
			l.q.Expire(x.id)
		}
	case k < 9:
		if x := l.pick(); x.parked {
			l.q.Cancel(x.id)
		}
	default:
		if ag, ok := l.inner.(*adaptive.Gate); ok {
			ag.Pin(1 + l.rng.IntN(4))
		}
		l.q.Release(&sluice.Request{}, sluice.Permit(l.rng.Uint64()), sluice.Completion{})
	}
}

// Random single-threaded event loop over an event-mode queue. Invariants:
// the inner gate's in-flight count equals the requests holding slots after
// every step, a parked request gets at most one Ready, and at the end
// nothing is held, waiting or in flight.
func TestEventModeRandom(t *testing.T) {
	for seed := range uint64(40) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			l := newEventLoop(t, seed)
			for step := range 400 {
				l.step()
				if sz, ok := l.inner.(sluice.Sizer); ok {
					if _, f := sz.ConcurrencyLimit(); f != l.held() {
						t.Fatalf("step %d: inner in flight %d, requests holding slots %d", step, f, l.held())
					}
				}
			}
			for _, x := range l.reqs {
				if !x.done {
					l.q.Release(x.r, x.p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: l.clk.Now()})
					x.done = true
				}
			}
			if len(l.q.held) != 0 || l.q.n != 0 {
				t.Errorf("end: held %d, waiting %d", len(l.q.held), l.q.n)
			}
			if sz, ok := l.inner.(sluice.Sizer); ok {
				if _, f := sz.ConcurrencyLimit(); f != 0 {
					t.Errorf("end: %d in flight", f)
				}
			} else if d, p := gatetest.Decide(context.Background(), l.inner, &sluice.Request{}, clock.Now()); !d.Admitted {
				t.Errorf("end: static pool still full")
			} else {
				l.inner.Release(&sluice.Request{}, p, sluice.Completion{})
			}
		})
	}
}
