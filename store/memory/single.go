package memory

import (
	"sync"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

// single is one limiter without keys: algorithm A over one state S behind a
// mutex, reading its own clock. It is the in-process counterpart of
// golang.org/x/time/rate.Limiter for any algorithm of package limit.
// A single is safe for concurrent use; Allow allocates nothing.
type single[S any, A limit.Algorithm[S]] struct {
	mu    sync.Mutex
	state S
	alg   A
	clk   clock.Clock // nil: clock.Now
}

// newSingle returns a limiter running alg on clk (nil: clock.System).
func newSingle[S any, A limit.Algorithm[S]](alg A, clk clock.Clock) *single[S, A] {
	return &single[S, A]{alg: alg, clk: clk}
}

func (l *single[S, A]) now() clock.Instant {
	if l.clk == nil {
		return clock.Now()
	}
	return l.clk.Now()
}

// Allow reports whether cost units can be taken now, and takes them if so.
func (l *single[S, A]) Allow(cost int64) bool { return l.TakeAt(l.now(), cost).OK() }

// Take takes cost units now and reports the full result.
func (l *single[S, A]) Take(cost int64) limit.Result { return l.TakeAt(l.now(), cost) }

// TakeAt takes cost units at now.
func (l *single[S, A]) TakeAt(now clock.Instant, cost int64) limit.Result {
	l.mu.Lock()
	r := l.alg.Take(&l.state, now, cost)
	l.mu.Unlock()
	return r
}

// Refund gives back cost units taken by an allowed call.
func (l *single[S, A]) Refund(cost int64) {
	now := l.now()
	l.mu.Lock()
	l.alg.Refund(&l.state, now, cost)
	l.mu.Unlock()
}
