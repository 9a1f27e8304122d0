package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Concurrency bounds in-flight work: a request takes cost slots when it is
// admitted and gives them back (Refund) when it ends, whatever the outcome.
// The caller must hold the slots for the request's whole resource-consuming
// lifetime and release them on every path; sluice's Ticket does that.
//
// Contract: in-flight units never exceed Limit. A Denied result carries no
// RetryAfter (RetryAfter 0): when a slot frees up depends on the work in
// flight, not on time, so callers pick a retry hint.
type Concurrency struct {
	limit int64
}

// ConcurrencyState is one key's in-flight count. The zero value is idle.
type ConcurrencyState struct {
	// InFlight is the units held.
	InFlight int64
}

var _ Algorithm[ConcurrencyState] = (*Concurrency)(nil)

// NewConcurrency returns a limit of limit units in flight.
func NewConcurrency(limit int64) (*Concurrency, error) {
	if limit < 1 {
		return nil, paramErr("limit", "concurrency: limit %d, want ≥ 1", limit)
	}
	if limit > maxScaled {
		return nil, paramErr("limit", "concurrency: limit %d too large", limit)
	}
	return &Concurrency{limit: limit}, nil
}

// Limit returns the in-flight limit.
func (c *Concurrency) Limit() int64 { return c.limit }

// Window returns 0: a concurrency limit has no time window.
func (c *Concurrency) Window() time.Duration { return 0 }

// Take acquires cost slots if they are free.
func (c *Concurrency) Take(s *ConcurrencyState, now clock.Instant, cost int64) Result {
	r := Result{Limit: c.limit}
	switch {
	case cost <= 0:
		r.Status = Invalid
	case cost > c.limit:
		r.Status = Exceeded
	case s.InFlight+cost <= c.limit:
		s.InFlight += cost
	default:
		r.Status = Denied
	}
	r.Remaining = max(c.limit-s.InFlight, 0)
	return r
}

// Refund releases cost slots, never below zero.
func (c *Concurrency) Refund(s *ConcurrencyState, now clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	s.InFlight = max(s.InFlight-cost, 0)
}

// Fresh reports whether nothing is in flight.
func (c *Concurrency) Fresh(s *ConcurrencyState, now clock.Instant) bool { return s.InFlight == 0 }
