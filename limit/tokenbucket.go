package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// TokenBucket is a token bucket: tokens refill continuously at Rate up to
// Burst, and a request of cost c is admitted when at least c tokens are in
// the bucket. A fresh bucket is full. Source: the token bucket of RFC 2697
// (one bucket, no excess bucket), with lazy refill as in
// golang.org/x/time/rate, but on exact integers instead of float tokens.
//
// Burst and delay contract: at most Burst units at once; over any interval
// of length T at most Burst + Rate·T units are admitted; a Denied result's
// RetryAfter is the exact earliest instant the same cost fits, to the
// nanosecond. Nothing ever waits.
//
// State is fixed point: one token is Rate.Per() "scaled units" and every
// nanosecond refills Rate.Tokens() of them, so refill, take and refund are
// integer additions with no rounding at all. The construction bound
// Burst × Rate.Per() ≤ 2^61 keeps every sum inside int64 (per-second rates
// allow bursts up to 2.3e9; 1/h with bursts up to 640,000).
type TokenBucket struct {
	rate     Rate
	burst    int64
	unit     int64 // scaled units per token (rate.per)
	gain     int64 // scaled units per nanosecond (rate.tokens)
	capacity int64 // burst * unit
	fill     int64 // ns from empty to full: ceil(capacity / gain)
	perUnit  divider
	perGain  divider
}

// TokenBucketState is one bucket's state. The zero value is a full bucket.
type TokenBucketState struct {
	// Deficit is the scaled units missing from a full bucket.
	Deficit int64
	// Last is the latest instant the refill was applied (monotonic ns).
	// It moves backwards only on a clock step (see ClockTolerance).
	Last int64
}

var _ Algorithm[TokenBucketState] = (*TokenBucket)(nil)

// NewTokenBucket returns a token bucket refilling at rate up to burst units.
// It fails for a zero rate, burst < 1, or burst × period beyond 2^61.
func NewTokenBucket(rate Rate, burst int64) (*TokenBucket, error) {
	if rate.isZero() {
		return nil, paramErr("rate", "token bucket: rate must be > 0")
	}
	if burst < 1 {
		return nil, paramErr("burst", "token bucket: burst %d, want ≥ 1", burst)
	}
	if burst > maxScaled/rate.per {
		return nil, paramErr("burst", "token bucket: burst %d too large for rate %v (burst × period must stay below 2^61 ns)", burst, rate)
	}
	b := &TokenBucket{rate: rate, burst: burst, unit: rate.per, gain: rate.tokens, capacity: burst * rate.per}
	b.fill = ceilDiv(b.capacity, b.gain)
	b.perUnit, b.perGain = newDivider(b.unit), newDivider(b.gain)
	return b, nil
}

// Rate returns the refill rate.
func (b *TokenBucket) Rate() Rate { return b.rate }

// Limit returns the burst, in units.
func (b *TokenBucket) Limit() int64 { return b.burst }

// Window returns the time an empty bucket takes to refill completely.
func (b *TokenBucket) Window() time.Duration { return time.Duration(b.fill) }

// Refills reports true: tokens come back continuously, at the rate
// (store.Refiller).
func (b *TokenBucket) Refills() bool { return true }

// refill applies the refill up to now. A now earlier than s.Last (a
// timestamp read before another goroutine's update) adds nothing and leaves
// Last where it is; one more than ClockTolerance earlier is a clock step
// back, and Last moves to now with the deficit kept. A deficit beyond the
// capacity (state kept across a lowered burst) is an empty bucket.
func (b *TokenBucket) refill(s *TokenBucketState, now int64) {
	s.Deficit = min(s.Deficit, b.capacity)
	if now <= s.Last {
		if s.Last-now > tolerance {
			s.Last = now
		}
		return
	}
	e := now - s.Last
	s.Last = now
	if s.Deficit == 0 {
		return
	}
	if e >= b.fill {
		s.Deficit = 0
		return
	}
	// e < fill, so e*gain < capacity: no overflow.
	s.Deficit -= e * b.gain
	if s.Deficit < 0 {
		s.Deficit = 0
	}
}

// Take takes cost tokens at now if they are there.
func (b *TokenBucket) Take(s *TokenBucketState, at clock.Instant, cost int64) Result {
	now := int64(at)
	if cost <= 0 {
		return Result{Status: Invalid, Limit: b.burst, Remaining: b.Tokens(s, at)}
	}
	b.refill(s, now)
	// A now behind Last (stale reading) waits for Last first: refill is
	// only ever counted from Last.
	behind := max(s.Last-now, 0)
	status, retry := Allowed, int64(0)
	if cost > b.burst {
		status = Exceeded
	} else if need := cost * b.unit; s.Deficit+need <= b.capacity {
		s.Deficit += need
	} else {
		status = Denied
		retry = behind + b.perGain.ceil(s.Deficit+need-b.capacity)
	}
	reset := int64(0)
	if s.Deficit > 0 {
		reset = behind + b.perGain.ceil(s.Deficit)
	}
	return Result{
		Status:     status,
		Limit:      b.burst,
		Remaining:  b.perUnit.floor(b.capacity - s.Deficit),
		RetryAfter: time.Duration(retry),
		ResetAfter: time.Duration(reset),
	}
}

// Refund puts back cost tokens taken earlier, never above a full bucket.
// Costs outside [1, burst] are ignored.
func (b *TokenBucket) Refund(s *TokenBucketState, at clock.Instant, cost int64) {
	now := int64(at)
	if cost <= 0 || cost > b.burst {
		return
	}
	b.refill(s, now)
	s.Deficit -= cost * b.unit
	if s.Deficit < 0 {
		s.Deficit = 0
	}
}

// Debit takes cost more tokens at now, whatever the bucket holds, down to
// an empty bucket at most (Debiter).
func (b *TokenBucket) Debit(s *TokenBucketState, at clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	b.refill(s, int64(at))
	s.Deficit = min(s.Deficit+min(cost, b.burst)*b.unit, max(s.Deficit, b.capacity))
}

// Fresh reports whether the bucket is full at now.
func (b *TokenBucket) Fresh(s *TokenBucketState, at clock.Instant) bool {
	now := int64(at)
	if s.Deficit == 0 {
		return s.Last <= now
	}
	e := now - s.Last
	return e >= b.fill || (e > 0 && e*b.gain >= min(s.Deficit, b.capacity))
}

// Tokens returns the whole tokens in the bucket at now, without changing s.
func (b *TokenBucket) Tokens(s *TokenBucketState, at clock.Instant) int64 {
	now := int64(at)
	t := *s
	b.refill(&t, now)
	return b.perUnit.floor(b.capacity - t.Deficit)
}
