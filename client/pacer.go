package client

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// pacer spaces a client's requests to one server from the quota the server
// advertises in its RateLimit fields, so that the client slows down before
// its remaining quota reaches 0 rather than after its requests start to be
// refused. When a response reports r units remaining of a policy's quota q
// for t more seconds and r ≤ Below·q (or r = 0 whatever q), the next
// requests are spaced t / (r + 1) apart: what remains is spread over the
// time until the quota is restored, instead of being spent at once and
// refused for the rest. Above the threshold requests are not delayed.
//
// A pacer is not safe for concurrent use; a Retrier guards its own.
type pacer struct {
	below    float64
	interval time.Duration // between requests; 0: not pacing
	until    clock.Instant // pacing ends (the quota is restored)
	next     clock.Instant // the earliest the next request may go
}

// newPacer returns a pacer that starts pacing once remaining ≤ below ×
// quota (below in [0, 1]).
func newPacer(below float64) *pacer { return &pacer{below: min(max(below, 0), 1)} }

// Observe reads a response's RateLimit members and policies at now. A
// member whose policy is not listed in quotas paces only at r = 0.
func (p *pacer) Observe(now clock.Instant, limits []Limit, quotas []Quota) {
	var interval time.Duration
	var until, hold clock.Instant
	for _, l := range limits {
		if l.Reset <= 0 {
			continue // nothing says when the quota comes back
		}
		q := int64(-1)
		for _, pq := range quotas {
			if pq.Policy == l.Policy {
				q = pq.Quota
			}
		}
		if l.Remaining > 0 && (q < 0 || float64(l.Remaining) > p.below*float64(q)) {
			continue
		}
		if l.Remaining == 0 {
			hold = max(hold, now.Add(l.Reset)) // nothing left: none may go before the reset
		}
		if iv := l.Reset / time.Duration(l.Remaining+1); iv > interval {
			interval, until = iv, now.Add(l.Reset)
		}
	}
	if interval == 0 {
		if len(limits) > 0 && now >= p.until {
			p.interval = 0 // the server reports room again
		}
		return
	}
	p.interval, p.until = interval, max(until, hold)
	p.next = max(p.next, hold)
}

// Reserve returns how long a request must wait at now to keep the pace (0:
// send now) and books its slot. A request that will not wait (its
// deadline is nearer) should call Cancel with the returned wait.
func (p *pacer) Reserve(now clock.Instant) time.Duration {
	if p.interval == 0 || now >= p.until {
		p.interval = 0
		return 0
	}
	if p.next >= p.until {
		// Booked past the reset: the quota is back by then, so the request
		// waits for the reset, not for its place in the old pace.
		at := p.until
		p.next = at
		return max(at.Sub(now), 0)
	}
	at := max(p.next, now)
	p.next = at.Add(p.interval)
	return at.Sub(now)
}

// Cancel gives back a slot Reserve booked that the request will not use.
func (p *pacer) Cancel() {
	if p.interval > 0 {
		p.next = p.next.Add(-p.interval)
	}
}
