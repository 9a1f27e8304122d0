package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

func staticPool(t *testing.T, n int64) sluice.Gate {
	c, _ := limit.NewConcurrency(n)
	g, err := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// counting wraps the inner gate and counts the slots held through it.
type counting struct {
	sluice.Gate
	held  atomic.Int64
	limit func() int64
	over  atomic.Int64
	pinMu *sync.Mutex
}

func (c *counting) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = c.decide(ctx, r, now)
	return p
}

func (c *counting) decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	if c.pinMu != nil { // no Pin between the gate's decision and the check
		c.pinMu.Lock()
		defer c.pinMu.Unlock()
	}
	d, p := gatetest.Decide(ctx, c.Gate, r, now)
	if d.Admitted {
		n := c.held.Add(1)
		if n > c.limit() {
			c.over.Add(1)
		}
	}
	return d, p
}
func (c *counting) Release(r *sluice.Request, p sluice.Permit, x sluice.Completion) {
	c.held.Add(-1)
	c.Gate.Release(r, p, x)
}

// Unwrap lets As find the adaptive gate's Sizer.
func (c *counting) Unwrap() sluice.Gate { return c.Gate }

// quiescentCheck checks q with every goroutine blocked: its count matches
// its queues; it reports a waiter beside a free slot of a static gate.
func quiescentCheck(t *testing.T, q *Queue, inner *counting, static bool, slots int64) (stranded bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, x := range q.queues {
		n += len(x)
	}
	for _, f := range q.fair {
		k := 0
		for _, tq := range f.tenants {
			k += len(tq.ws)
		}
		if k != f.n {
			t.Errorf("fair class counts %d, its tenants hold %d", f.n, k)
		}
		n += k
	}
	if n != q.n {
		t.Errorf("q.n=%d, queues hold %d", q.n, n)
	}
	return static && q.n > 0 && inner.held.Load() < slots
}

// Random load with cancels and timeouts; at every quiescent point (all
// goroutines durably blocked) check: n matches the queues, and (static) no
// waiter while a slot is free; at the end nothing is held or waiting, and
// the slots were never exceeded.
func stress(t *testing.T, seed uint64, sized bool, classes bool) {
	stressWith(t, seed, sized, classes, nil)
}

func stressWith(t *testing.T, seed uint64, sized bool, classes bool, fair *Fairness) {
	synctest.Test(t, func(t *testing.T) {
		var inner *counting
		var pinMu sync.Mutex
		var ag *adaptive.Gate
		const slots = 3
		if sized {
			c, _ := adaptive.NewAIMD(adaptive.AIMDConfig{Initial: slots, Min: 1, Max: 10})
			ag, _ = adaptive.NewGate("pool", c, adaptive.GateOptions{})
			ag.Pin(slots)
			inner = &counting{Gate: ag, pinMu: &pinMu, limit: func() int64 { l, _ := ag.ConcurrencyLimit(); return int64(l) }}
		} else {
			inner = &counting{Gate: staticPool(t, slots), limit: func() int64 { return slots }}
		}
		opts := Options{MaxWait: 20 * time.Millisecond, MaxLen: 6, Target: time.Millisecond, Interval: 5 * time.Millisecond}
		if classes {
			opts.Classes = []string{"a", "b"}
		}
		opts.Fair = fair
		q, _ := New("pool", inner, opts)
		var wg sync.WaitGroup
		var adm, rej atomic.Int64
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(seed, uint64(i)))
				for range 60 {
					time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
					r := &sluice.Request{Class: []string{"a", "b", "c"}[rng.IntN(3)], Tenant: fmt.Sprint("t", rng.IntN(4))}
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if rng.IntN(3) == 0 {
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(20))*time.Millisecond)
					}
					if sized && rng.IntN(4) == 0 {
						pinMu.Lock()
						ag.Pin(1 + rng.IntN(5))
						pinMu.Unlock()
					}
					d, p := gatetest.Decide(ctx, q, r, clock.Now())
					cancel()
					if !d.Admitted {
						rej.Add(1)
					}
					if d.Admitted {
						adm.Add(1)
						time.Sleep(time.Duration(rng.IntN(4)) * time.Millisecond)
						q.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: time.Millisecond})
					}
				}
			}()
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		checks, stranded := 0, 0
		for {
			select {
			case <-finished:
				goto end
			default:
			}
			synctest.Wait()
			if quiescentCheck(t, q, inner, !sized, slots) {
				stranded++
			}
			checks++
			time.Sleep(50 * time.Microsecond)
		}
	end:
		if inner.held.Load() != 0 || inner.over.Load() != 0 {
			t.Errorf("held %d at the end, %d over-admissions", inner.held.Load(), inner.over.Load())
		}
		q.mu.Lock()
		if q.n != 0 {
			t.Errorf("end: %d waiting", q.n)
		}
		q.mu.Unlock()
		_, _, waits, dropped := q.QueueStats(clock.Now())
		t.Logf("seed %d sized=%v: %d checks, waits %d, dropped %d, admitted %d, rejected %d", seed, sized, checks, waits, dropped, adm.Load(), rej.Load())
		if stranded > 0 {
			t.Errorf("seed %d: %d of %d quiescent checks had waiters beside a free static slot", seed, stranded, checks)
		}
	})
}

func TestStressStatic(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { stress(t, seed, false, seed%2 == 0) })
	}
}

func TestStressSized(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { stress(t, seed, true, seed%2 == 0) })
	}
}

func TestStressFair(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			stressWith(t, seed, seed%3 == 0, seed%2 == 0, &Fairness{Weights: map[string]float64{"t1": 2}, Burst: 1})
		})
	}
}
