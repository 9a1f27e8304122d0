// Package adaptive holds sluice's concurrency-limit controllers: each turns
// what a window of completed requests showed (their round-trip times, the
// in-flight count they saw, whether any was dropped, how long they queued)
// into a new concurrency limit, so that protection sizes itself to the
// service instead of to a number a person guessed.
//
//	bbr, _ := adaptive.NewBBR(adaptive.BBRConfig{})
//	g, _ := adaptive.NewGate("worker-pool", bbr, adaptive.GateOptions{})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g) // the gate gathers windows, runs the controller
//
// The controllers are exact step functions of their state and a Window,
// with no clock, lock or randomness of their own (Vegas' probe draws from
// an injected source): tests replay them as traces. Gradient2, Vegas and
// AIMD follow Netflix's concurrency-limits (Gradient2Limit.java,
// VegasLimit.java, AIMDLimit.java, with their defaults); QueueDelay follows
// Breakwater's credit controller (Cho et al., OSDI 2020) on queueing delay,
// the overload signal of DAGOR and Breakwater. Every controller keeps its
// limit within [Min, Max].
//
// What a window holds is the caller's to censor: only requests whose
// latency says something about the service belong in it. Rejected and
// cancelled requests, and those that failed fast, must not teach a
// controller that latency is low (Netflix/concurrency-limits#176: dropped
// requests with near-zero RTT pushed Gradient2 the wrong way).
package adaptive

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// Window is what one window of samples showed.
type Window struct {
	// Samples is how many requests completed in the window.
	Samples int
	// RTT is the window's round-trip time: the mean of its samples (or a
	// percentile, see WindowConfig.Percentile).
	RTT time.Duration
	// MinRTT is the window's shortest round trip.
	MinRTT time.Duration
	// InFlight is the most requests in flight that any sample saw at its
	// admission (itself included).
	InFlight int
	// Dropped reports whether any request of the window was dropped: it
	// ran past its deadline or the service shed it.
	Dropped bool
	// QueueDelay is the longest time a request of the window waited before
	// it started (QueueDelay controller).
	QueueDelay time.Duration
	// Late is how many of the samples ran past their deadline (Dropped
	// tells whether any did).
	Late int
	// Start and End are when the window began (the previous window's end)
	// and ended (its last sample's completion): Samples ÷ (End − Start) is
	// the rate at which the service completed work. Zero in windows built
	// by hand without them.
	Start, End clock.Instant
	// FreshRTT is the mean RTT of the samples admitted after Start (0 when
	// none was): unlike RTT, it leaves out requests that were admitted
	// under the window before, which a controller that has just lowered
	// its limit to drain the service's queue (BBR's probe) wants to skip.
	FreshRTT time.Duration
	// FreshSamples is how many samples FreshRTT is the mean of.
	FreshSamples int
	// RTTDev is the standard deviation of the samples' RTTs (0 for one
	// sample): with Samples it says how far RTT may be from the service's
	// mean by chance, which for a mix of cheap and costly requests is far.
	RTTDev time.Duration
	// keys are the samples by kind of work (Sample.Key), in the order the
	// kinds first completed; nil in windows built by hand.
	keys []keyStats
}

// Rate returns the window's completion rate in requests per second (0
// when its span is unknown).
func (w Window) Rate() float64 {
	if w.End <= w.Start {
		return 0
	}
	return float64(w.Samples) / w.End.Sub(w.Start).Seconds()
}

// Controller sets a concurrency limit from windows of samples. A
// Controller is not safe for concurrent use; the gate serializes it. One
// that also has a NextWindow(rtt time.Duration) time.Duration method picks
// the length of its windows (see shortWindows), as BBR does.
type Controller interface {
	// Update takes one window and returns the new limit.
	Update(w Window) int
	// Limit returns the current limit, in [Min, Max].
	Limit() int
}

// shortWindows is a Controller that may want a window shorter than the
// gate's: a Controller with a NextWindow(rtt time.Duration) time.Duration
// method gets the length of the window after an Update, or of the first
// window when asked with the first sample's RTT (0: the gate's own
// windows, GateOptions.Window). BBR's startup and probes last a few round
// trips.
type shortWindows interface {
	NextWindow(rtt time.Duration) time.Duration
}

// controller returns c as a Controller, or err (never a typed nil).
func controller[C Controller](c C, err error) (Controller, error) {
	if err != nil {
		return nil, err
	}
	return c, nil
}

// ErrInvalidConfig wraps every configuration error of a controller.
var ErrInvalidConfig = errors.New("adaptive: invalid configuration")

func configErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// paramErr is configErr about one named setting (so that a policy file
// reports it on that field).
func paramErr(name, format string, args ...any) error {
	return param.Errorf(name, "%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
}

// bounds checks and fills the limits every controller has.
func bounds(initial, lo, hi *int, defInitial, defMin, defMax int) error {
	if *lo == 0 {
		*lo = defMin
	}
	if *hi == 0 {
		*hi = defMax
	}
	if *initial == 0 {
		*initial = min(max(defInitial, *lo), *hi)
	}
	switch {
	case *lo < 1:
		return paramErr("min", "min limit %d, want ≥ 1", *lo)
	case *hi < *lo:
		return paramErr("max", "max limit %d below min %d", *hi, *lo)
	case *initial < *lo || *initial > *hi:
		return paramErr("initial", "initial limit %d outside [%d, %d]", *initial, *lo, *hi)
	}
	return nil
}

// clamp returns v within [lo, hi].
func clamp(v float64, lo, hi int) float64 { return min(max(v, float64(lo)), float64(hi)) }
