package client

import (
	"math"
	"time"
)

// Backoff is exponential backoff with full jitter (Marc Brooker, "Exponential
// Backoff And Jitter", AWS Architecture Blog, 2015): the wait before retry n
// (n = 1 for the first retry) is uniform over [0, min(Cap, Base·2^(n−1))).
// Full jitter spreads the retries of clients that failed together over the
// whole interval, so they do not come back together.
type Backoff struct {
	// Base is the ceiling of the first retry's wait. Default 100 ms.
	Base time.Duration
	// Cap bounds every wait's ceiling. Default 10 s.
	Cap time.Duration
}

// ceiling returns the upper end of retry n's wait: min(Cap, Base·2^(n−1)),
// Base for n ≤ 1. It does not overflow for any n.
func (b Backoff) ceiling(n int) time.Duration {
	if n < 1 {
		n = 1
	}
	if n-1 >= 62 || b.Base > b.Cap>>(n-1) {
		return b.Cap
	}
	return b.Base << (n - 1)
}

// Delay returns retry n's wait for a uniform draw u in [0, 1): u times the
// ceiling, so the wait lies in [0, Ceiling(n)). A u outside [0, 1) is
// clamped.
func (b Backoff) Delay(n int, u float64) time.Duration {
	return time.Duration(clamp01(u) * float64(b.ceiling(n)))
}

// Floor returns the wait before a retry the server asked to delay by at
// least floor (Retry-After, gRPC pushback): floor plus an upward jitter of
// up to spread × floor, for a uniform draw u in [0, 1). The server's value
// is a floor, never shortened; the jitter keeps clients the server rejected
// together, and told the same wait, from returning at the same instant (a
// sluice server spreads Retry-After itself; other servers send one value to
// all). A floor ≤ 0 returns 0.
func Floor(floor time.Duration, spread, u float64) time.Duration {
	if floor <= 0 {
		return 0
	}
	extra := clamp01(u) * max(spread, 0) * float64(floor)
	if extra >= float64(math.MaxInt64-floor) {
		return math.MaxInt64
	}
	return floor + time.Duration(extra)
}

func clamp01(u float64) float64 {
	if !(u >= 0) { // NaN too
		return 0
	}
	if u >= 1 {
		return math.Nextafter(1, 0)
	}
	return u
}
