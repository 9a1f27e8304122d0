package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// FixedWindow counts demand units per aligned window: windows are
// [k·Window, (k+1)·Window) on the clock, and a request is admitted while the
// current window's count plus its cost stays within Limit. Rejected
// requests are not counted.
//
// Burst and delay contract: at most Limit units per aligned window, which
// allows up to 2·Limit in any interval of length Window that straddles a
// boundary (the classic boundary burst); over any interval T at most
// Limit·(⌈T/Window⌉+1). RetryAfter is the exact time to the window's end.
type FixedWindow struct {
	limit  int64
	window int64
}

// FixedWindowState is one key's window. The zero value is an empty window.
type FixedWindowState struct {
	// Start is the start of the window Used counts (monotonic ns).
	Start int64
	// Used is the units admitted in that window.
	Used int64
}

var _ Algorithm[FixedWindowState] = (*FixedWindow)(nil)

// NewFixedWindow returns a limit of limit units per window.
func NewFixedWindow(limit int64, window time.Duration) (*FixedWindow, error) {
	if limit < 1 {
		return nil, paramErr("limit", "fixed window: limit %d, want ≥ 1", limit)
	}
	if window <= 0 || window > maxWindow {
		return nil, paramErr("window", "fixed window: window %v, want (0, 366 days]", window)
	}
	if limit > maxScaled {
		return nil, paramErr("limit", "fixed window: limit %d too large", limit)
	}
	return &FixedWindow{limit: limit, window: int64(window)}, nil
}

// Limit returns the units allowed per window.
func (w *FixedWindow) Limit() int64 { return w.limit }

// Window returns the window length.
func (w *FixedWindow) Window() time.Duration { return time.Duration(w.window) }

// roll moves s forward to the window containing now. A stale now in an
// earlier window keeps the current one: a count is never reset, and a
// window once left is never reopened. A now more than ClockTolerance before
// s.Start is a clock step back: the count moves to now's window.
func (w *FixedWindow) roll(s *FixedWindowState, now int64) {
	ws := floorDiv(now, w.window) * w.window
	switch {
	case ws > s.Start:
		s.Start, s.Used = ws, 0
	case s.Start-now > tolerance:
		s.Start = ws
	}
}

// Take counts cost units in the current window if they fit.
func (w *FixedWindow) Take(s *FixedWindowState, at clock.Instant, cost int64) Result {
	now := int64(at)
	w.roll(s, now)
	r := Result{Limit: w.limit}
	switch {
	case cost <= 0:
		r.Status = Invalid
	case cost > w.limit:
		r.Status = Exceeded
	case s.Used+cost <= w.limit:
		s.Used += cost
	default:
		r.Status = Denied
		r.RetryAfter = time.Duration(s.Start + w.window - now)
	}
	r.Remaining = max(w.limit-s.Used, 0) // Used > limit: kept across a lowered limit
	if s.Used > 0 {
		r.ResetAfter = time.Duration(s.Start + w.window - now)
	}
	return r
}

// Refund uncounts cost units taken at now, only if the state still counts
// now's window: a refund never lands in a later window than its take.
func (w *FixedWindow) Refund(s *FixedWindowState, at clock.Instant, cost int64) {
	now := int64(at)
	if cost <= 0 || floorDiv(now, w.window)*w.window != s.Start {
		return
	}
	s.Used = max(s.Used-cost, 0)
}

// Debit counts cost more units in the window of now, whatever it holds, up
// to the limit at most (Debiter).
func (w *FixedWindow) Debit(s *FixedWindowState, at clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	w.roll(s, int64(at))
	s.Used = max(s.Used, min(s.Used+min(cost, w.limit), w.limit))
}

// Fresh reports whether the window is empty at now.
func (w *FixedWindow) Fresh(s *FixedWindowState, at clock.Instant) bool {
	now := int64(at)
	return (s.Used == 0 && s.Start <= now) || now >= s.Start+w.window
}
