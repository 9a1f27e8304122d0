// Package fakeclock is a manual monotonic clock for tests: time moves only
// when a test moves it, so every algorithm and gate replays exactly.
//
//	clk := fakeclock.New(0)
//	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, gates...)
//	clk.Advance(5 * time.Millisecond)
package fakeclock

import (
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Clock is a manual clock; each instance is independent. It is safe for
// concurrent use.
type Clock struct {
	ns atomic.Int64
}

// New returns a clock reading start nanoseconds.
func New(start int64) *Clock {
	c := &Clock{}
	c.ns.Store(start)
	return c
}

// Now returns the current reading in nanoseconds.
func (c *Clock) Now() clock.Instant { return clock.Instant(c.ns.Load()) }

// Set moves the clock to ns, forwards or backwards (to test clock steps).
func (c *Clock) Set(ns int64) { c.ns.Store(ns) }

// Advance moves the clock forward by d and returns the new reading.
func (c *Clock) Advance(d time.Duration) clock.Instant { return clock.Instant(c.ns.Add(int64(d))) }
