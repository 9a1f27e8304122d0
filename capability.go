package sluice

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// A gate may offer optional behaviour beyond Gate: a quota to advertise, a
// count of the decisions its store could not make, a degradation level, a
// shed fraction, a state to show operators. Each is a small named
// interface below. A gate that wraps another (a class filter, for example)
// implements Wrapper, and callers find a capability with As, which looks
// through wrappers as errors.As looks through wrapped errors, so that
// wrapping a gate never hides what it can do.

// Wrapper is a gate that decides by delegating to another gate. Unwrap
// returns the gate inside.
type Wrapper interface {
	Unwrap() Gate
}

// As returns the first gate in g's chain of wrappers (g itself, then each
// Unwrap in turn) that implements T, and whether there is one. T is
// usually one of the capability interfaces of this package.
func As[T any](g Gate) (T, bool) {
	for g != nil {
		if t, ok := g.(T); ok {
			return t, true
		}
		w, ok := g.(Wrapper)
		if !ok {
			break
		}
		g = w.Unwrap()
	}
	var zero T
	return zero, false
}

// Advertiser is a gate that enforces a quota a client may see: the Chain
// lists it in Policies, and the HTTP layer in the RateLimit-Policy field.
type Advertiser interface {
	Policy() Policy
}

// FailureCounter is a gate whose state lives in a store that can fail.
// Failures returns how many of its decisions the store could not make
// (each decided by the gate's failure policy instead); it only grows.
// FailurePolicy names that policy ("fail_open", "fail_closed" or
// "local_fallback"), so that the rate of decisions made without the store,
// and the fail-open rate above all, can be watched.
type FailureCounter interface {
	Failures() int64
	FailurePolicy() string
}

// Leveler is a gate that moves the service through degradation levels.
// Levels returns the level at now and the total time spent in each level
// so far, indexed by Level.
type Leveler interface {
	Levels(now clock.Instant) (Level, [LevelRecover + 1]time.Duration)
}

// Shedder is a gate that sheds a fraction of the load it sees. ShedFraction
// returns the fraction at now, in [0, 1].
type Shedder interface {
	ShedFraction(now clock.Instant) float64
}

// StateReporter is a gate with a state worth showing an operator (the admin
// API's gate list). ReportState returns a snapshot at now that encodes as
// JSON.
type StateReporter interface {
	ReportState(now clock.Instant) any
}

// Sizer is a gate whose concurrency limit moves at run time (an adaptive
// limit). ConcurrencyLimit returns the limit now and the requests in flight
// under it.
type Sizer interface {
	ConcurrencyLimit() (limit, inFlight int)
}

// Waiter is a gate that may hold a request inside Decide before admitting
// it (a pacer until its departure slot, a wait queue until a slot frees).
// A Chain with such a gate starts a request's latency clock after all its
// gates have decided, so Completion.Latency, which adaptive limits and
// service-time estimates learn from, measures the work and not the wait.
type Waiter interface {
	MayWait() bool
}

// Queuer is a gate where requests wait for capacity (a wait queue).
// QueueStats returns, at now, the requests waiting, the age of the oldest,
// and how many requests have waited and how many of those were turned away
// after waiting; the last two only grow.
type Queuer interface {
	QueueStats(now clock.Instant) (waiting int, oldest time.Duration, waited, dropped int64)
}

// ClassQueuer is a wait queue with a queue per class. ClassQueues returns,
// at now, each class queue's waiting requests and the age of its oldest,
// highest priority first; the classes without a queue of their own share
// the last, named "other".
type ClassQueuer interface {
	ClassQueues(now clock.Instant) []ClassQueue
}

// ClassQueue is one class queue of a ClassQueuer.
type ClassQueue struct {
	Class   string        `json:"class"`
	Waiting int           `json:"waiting"`
	Oldest  time.Duration `json:"oldest_ns"`
}

// Leaseholder is a gate that spends a lease of a fleet-wide budget.
type Leaseholder interface {
	Lease(now clock.Instant) LeaseStatus
}

// LeaseStatus is a lease gate's budget and share at an instant, and the
// bounds its package states for the fleet.
type LeaseStatus struct {
	Capacity int64 // the fleet-wide budget: units/s for a rate, slots for a concurrency budget
	Granted  int64 // this process's grant
	Spending int64 // what it spends now: the grant while live, else its failure mode's (-1: unlimited)
	Live     bool  // granted, unexpired, and not a learning allocator's nothing
	// Overshoot is the most the fleet admits above the budget while the
	// allocator keeps its state and every process reaches it: units above
	// capacity·T in any window T for a rate (capacity × the local
	// burst), slots for a concurrency budget (none).
	Overshoot float64
	// Unused is the most of the budget processes whose demand fell leave
	// unused until their next refresh: units (capacity × the refresh
	// interval) for a rate, slots held idle for one refresh interval for
	// a concurrency budget (capacity).
	Unused float64
}
