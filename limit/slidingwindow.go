package limit

import (
	"math"
	"math/bits"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// SlidingWindow is the sliding window counter (as described in Cloudflare's
// "How we built rate limiting capable of scaling to millions of domains"):
// it keeps the counts of the current and the previous aligned window and
// estimates the count of the sliding window (now−Window, now] as
//
//	prev·(Window − elapsed)/Window + cur
//
// admitting a request while that estimate plus its cost stays within Limit.
// The products are computed exactly in 128-bit integers.
//
// Error bound: the estimate assumes the previous window's traffic was spread
// evenly. It never lets an aligned window exceed Limit, and it is exact for
// evenly spread traffic, but when the previous window's traffic arrived at
// its very end the true count of a sliding window can reach
// Limit + prev·elapsed/Window < 2·Limit. So over any interval of length
// Window at most 2·Limit − 1 units are admitted, and over any interval T at
// most Limit·(⌈T/Window⌉+1). Use SlidingLog where the bound must be exact.
//
// RetryAfter is the exact time until the estimate falls enough, assuming no
// other arrivals.
type SlidingWindow struct {
	limit  int64
	window int64
}

// SlidingWindowState is one key's pair of counters. The zero value is empty.
type SlidingWindowState struct {
	// Start is the start of the current aligned window (monotonic ns).
	Start int64
	// Cur is the units admitted in the current window.
	Cur int64
	// Prev is the units admitted in the window before it.
	Prev int64
}

var _ Algorithm[SlidingWindowState] = (*SlidingWindow)(nil)

// NewSlidingWindow returns an approximate limit of limit units per sliding
// window (see the type doc for the bound).
func NewSlidingWindow(limit int64, window time.Duration) (*SlidingWindow, error) {
	if limit < 1 {
		return nil, paramErr("limit", "sliding window: limit %d, want ≥ 1", limit)
	}
	if window <= 0 || window > maxWindow {
		return nil, paramErr("window", "sliding window: window %v, want (0, 366 days]", window)
	}
	if limit > maxScaled {
		return nil, paramErr("limit", "sliding window: limit %d too large", limit)
	}
	return &SlidingWindow{limit: limit, window: int64(window)}, nil
}

// Limit returns the units allowed per sliding window.
func (w *SlidingWindow) Limit() int64 { return w.limit }

// Window returns the window length.
func (w *SlidingWindow) Window() time.Duration { return time.Duration(w.window) }

// roll moves s to the window containing now and returns the elapsed part of
// it. A stale now before s.Start keeps the window and counts the previous
// window fully; one more than ClockTolerance before it is a clock step
// back, and the counts move to now's window.
func (w *SlidingWindow) roll(s *SlidingWindowState, now int64) int64 {
	ws := floorDiv(now, w.window) * w.window
	if ws <= s.Start && s.Start-now > tolerance {
		s.Start = ws
	}
	if ws > s.Start {
		if ws == s.Start+w.window {
			s.Prev = s.Cur
		} else {
			s.Prev = 0
		}
		s.Cur, s.Start = 0, ws
	}
	return min(max(now-s.Start, 0), w.window-1)
}

// fits reports whether prev·(W−el) + (cur+cost)·W ≤ limit·W.
func (w *SlidingWindow) fits(prev, el, cur, cost int64) bool {
	W := uint64(w.window)
	ah, al := bits.Mul64(uint64(prev), W-uint64(el))
	bh, bl := bits.Mul64(uint64(cur+cost), W)
	sl, carry := bits.Add64(al, bl, 0)
	sh, _ := bits.Add64(ah, bh, carry)
	lh, ll := bits.Mul64(uint64(w.limit), W)
	return sh < lh || (sh == lh && sl <= ll)
}

// mulDiv returns ⌊a·b/c⌋ for non-negative a, b and c > 0, saturating at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// mulDivCeil returns ⌈a·b/c⌉ for non-negative a, b and c > 0, saturating.
func mulDivCeil(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	lo, carry := bits.Add64(lo, uint64(c-1), 0)
	hi += carry
	if hi >= uint64(c) {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, uint64(c))
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// Take counts cost units in the current window if the estimate allows.
func (w *SlidingWindow) Take(s *SlidingWindowState, at clock.Instant, cost int64) Result {
	now := int64(at)
	el := w.roll(s, now)
	r := Result{Limit: w.limit}
	switch {
	case cost <= 0:
		r.Status = Invalid
	case cost > w.limit:
		r.Status = Exceeded
	case w.fits(s.Prev, el, s.Cur, cost):
		s.Cur += cost
	default:
		r.Status = Denied
		r.RetryAfter = time.Duration(w.retryAfter(s, el, cost))
	}
	// Remaining = limit − cur − ⌈prev·(W−el)/W⌉.
	weighted := mulDivCeil(s.Prev, w.window-el, w.window)
	r.Remaining = max(w.limit-s.Cur-weighted, 0)
	switch {
	case s.Cur > 0:
		r.ResetAfter = time.Duration(s.Start + 2*w.window - now)
	case s.Prev > 0:
		r.ResetAfter = time.Duration(s.Start + w.window - now)
	}
	return r
}

func (w *SlidingWindow) retryAfter(s *SlidingWindowState, el, cost int64) int64 {
	if s.Cur+cost <= w.limit {
		// In this window: need prev·(W−el') ≤ (limit−cur−cost)·W.
		k := mulDiv(w.limit-s.Cur-cost, w.window, s.Prev)
		return w.window - k - el
	}
	// Next window, where prev' = cur: need cur·(W−el'') ≤ (limit−cost)·W.
	k := mulDiv(w.limit-cost, w.window, s.Cur)
	return w.window - el + max(w.window-k, 0)
}

// Refund uncounts cost units taken at now from the window that counted
// them: the current one, or the previous one if the state rolled over since.
func (w *SlidingWindow) Refund(s *SlidingWindowState, at clock.Instant, cost int64) {
	now := int64(at)
	if cost <= 0 {
		return
	}
	switch floorDiv(now, w.window) * w.window {
	case s.Start:
		s.Cur = max(s.Cur-cost, 0)
	case s.Start - w.window:
		s.Prev = max(s.Prev-cost, 0)
	}
}

// Debit counts cost more units in the current window, whatever it holds,
// up to the limit at most (Debiter).
func (w *SlidingWindow) Debit(s *SlidingWindowState, at clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	w.roll(s, int64(at))
	s.Cur = max(s.Cur, min(s.Cur+min(cost, w.limit), w.limit))
}

// Fresh reports whether the estimate is zero at now and stays zero.
func (w *SlidingWindow) Fresh(s *SlidingWindowState, at clock.Instant) bool {
	now := int64(at)
	if now >= s.Start+2*w.window {
		return true
	}
	return s.Start <= now && s.Cur == 0 && (s.Prev == 0 || now >= s.Start+w.window)
}
