// Package clock is sluice's time source: a monotonic clock read as a typed
// Instant (nanoseconds from a fixed epoch), injected per instance, so that
// every algorithm, store and gate decides at an explicit now and tests run
// on a manual clock without sleeping.
//
//	var c clock.Clock = clock.System
//	start := c.Now()
//	deadline := start.Add(250 * time.Millisecond)
//	left := deadline.Sub(c.Now()) // time.Duration
//
// It is a leaf package: the pipeline, the stores and the gates all import
// it, and it imports nothing of sluice.
package clock

import "time"

// Instant is a reading of a monotonic Clock: nanoseconds since the clock's
// fixed epoch. Instants of one clock compare with < and ==; they mean
// nothing across clocks. The zero Instant is the epoch itself, and APIs use
// it for "no instant" (no deadline).
type Instant int64

// Add returns the instant d after t.
func (t Instant) Add(d time.Duration) Instant { return t + Instant(d) }

// Sub returns the duration t − u.
func (t Instant) Sub(u Instant) time.Duration { return time.Duration(t - u) }

// Clock reads monotonic time. Implementations must be safe for concurrent
// use. Readings taken on different goroutines may be observed out of order;
// every sluice algorithm tolerates that, and a reading never goes backwards
// on one goroutine.
type Clock interface {
	Now() Instant
}

// System is the real monotonic clock: nanoseconds since the process loaded
// this package, from Go's monotonic clock (never affected by steps of the
// wall clock).
var System Clock = system{}

var epoch = time.Now()

type system struct{}

// Now returns the real monotonic reading.
func (system) Now() Instant { return Now() }

// Now reads the real monotonic clock: what System returns, callable without
// an interface dispatch on hot paths.
func Now() Instant { return Instant(time.Since(epoch)) }

// SystemEpoch returns the wall-clock time of System's zero Instant: an
// Instant of System is SystemEpoch plus that many nanoseconds of
// monotonic time. Processes that must act in the same wall-clock slots
// (the probes of a fleet's adaptive limits) place System's Instants with
// it.
func SystemEpoch() time.Time { return epoch }
