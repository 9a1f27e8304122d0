package memory

import (
	"sync"
	"sync/atomic"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

// Bucket is one token bucket (or GCRA; the two are duals with identical
// decisions) without keys, the in-process counterpart of
// golang.org/x/time/rate.Limiter with exact integer state.
//
// When the emission interval is a whole number of nanoseconds (every rate
// that divides its period, e.g. 100/s, 1/h, 1e9/s) the state is one word
// updated with a compare-and-swap, so a decision is one clock read, one
// atomic load and one CAS; otherwise it falls back to a mutex over the
// exact fractional state. A Bucket is safe for concurrent use and Allow
// allocates nothing. Allow is the bare decision (one clock read, one
// atomic load, one CAS); Take adds the remaining and reset figures.
type Bucket struct {
	tat atomic.Int64 // Integral path
	g   *limit.GCRA
	clk clock.Clock // nil: clock.Now

	mu    sync.Mutex // fractional path
	state limit.GCRAState
}

// NewBucket returns a single-key bucket of burst units refilled at rate,
// on clk (nil: clock.System). It runs GCRA (limit.NewGCRA), the dual of the
// token bucket with identical decisions, which bounds burst × max(period,
// tokens) instead of burst × period: a few extreme buckets (a burst of 1e18
// at 1e10/s) are refused with an error wrapping limit.ErrInvalidParams.
func NewBucket(rate limit.Rate, burst int64, clk clock.Clock) (*Bucket, error) {
	g, err := limit.NewGCRA(rate, burst)
	if err != nil {
		return nil, err
	}
	return &Bucket{g: g, clk: clk}, nil
}

func (b *Bucket) now() clock.Instant {
	if b.clk == nil {
		return clock.Now()
	}
	return b.clk.Now()
}

// Allow reports whether cost units can be taken now, and takes them if so.
// It is the decision alone; Take also reports remaining, retry-after and
// reset-after.
func (b *Bucket) Allow(cost int64) bool {
	now := b.now()
	if !b.g.Integral() {
		return b.takeAt(now, cost).OK()
	}
	for {
		old := b.tat.Load()
		next, ok := b.g.AdmitTAT(old, now, cost)
		if !ok || b.tat.CompareAndSwap(old, next) {
			return ok
		}
	}
}

// Take takes cost units now and reports the full result.
func (b *Bucket) Take(cost int64) limit.Result { return b.takeAt(b.now(), cost) }

// takeAt takes cost units at now and reports the full result.
func (b *Bucket) takeAt(now clock.Instant, cost int64) limit.Result {
	if !b.g.Integral() {
		b.mu.Lock()
		r := b.g.Take(&b.state, now, cost)
		b.mu.Unlock()
		return r
	}
	for {
		old := b.tat.Load()
		next, r := b.g.TakeTAT(old, now, cost)
		if next == old || b.tat.CompareAndSwap(old, next) {
			return r
		}
	}
}

// Refund gives back cost units taken by an allowed call, never above a full
// bucket.
func (b *Bucket) Refund(cost int64) {
	now := b.now()
	if !b.g.Integral() {
		b.mu.Lock()
		b.g.Refund(&b.state, now, cost)
		b.mu.Unlock()
		return
	}
	for {
		old := b.tat.Load()
		if next := b.g.RefundTAT(old, now, cost); next == old || b.tat.CompareAndSwap(old, next) {
			return
		}
	}
}
