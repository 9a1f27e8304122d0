package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// SlidingLog keeps the timestamp and cost of every admitted request of the
// last Window and admits a request while the logged cost in (now−Window,
// now] plus its cost stays within Limit. It is exact: no interval of length
// Window ever holds more than Limit admitted units. The price is memory: a
// key holds up to Limit entries (16 bytes each), so keep Limit modest.
//
// Burst and delay contract: at most Limit units in any window of length
// Window (so at most Limit·⌈T/Window⌉ over any T); RetryAfter is the exact
// time until enough logged cost expires for the request to fit.
type SlidingLog struct {
	limit  int64
	window int64
}

type logEntry struct {
	at, cost int64
}

// SlidingLogState is one key's log. The zero value is an empty log. Taking
// into a log may grow its buffer (amortized, up to Limit entries); a
// steady-state key does not allocate.
//
// Entries are logged on the log's own time line: now plus shift, where
// shift grows by the length of every clock step back (see ClockTolerance),
// so the entries of a key keep their order and age across a step.
type SlidingLogState struct {
	entries []logEntry // entries[head:] are live, oldest first
	head    int
	sum     int64 // cost of entries[head:]
	last    int64 // the latest instant seen, on the log's time line
	shift   int64 // log time − clock time
}

var _ Algorithm[SlidingLogState] = (*SlidingLog)(nil)

// NewSlidingLog returns an exact limit of limit units per sliding window.
func NewSlidingLog(limit int64, window time.Duration) (*SlidingLog, error) {
	if limit < 1 {
		return nil, paramErr("limit", "sliding log: limit %d, want ≥ 1", limit)
	}
	if window <= 0 || window > maxWindow {
		return nil, paramErr("window", "sliding log: window %v, want (0, 366 days]", window)
	}
	if limit > maxScaled {
		return nil, paramErr("limit", "sliding log: limit %d too large", limit)
	}
	return &SlidingLog{limit: limit, window: int64(window)}, nil
}

// Limit returns the units allowed per window.
func (l *SlidingLog) Limit() int64 { return l.limit }

// Window returns the window length.
func (l *SlidingLog) Window() time.Duration { return time.Duration(l.window) }

// expire drops entries at or before now−Window.
func (l *SlidingLog) expire(s *SlidingLogState, now int64) {
	for s.head < len(s.entries) && s.entries[s.head].at+l.window <= now {
		s.sum -= s.entries[s.head].cost
		s.head++
	}
	if s.head == len(s.entries) {
		s.entries, s.head = s.entries[:0], 0
	} else if s.head > 32 && s.head*2 > len(s.entries) {
		n := copy(s.entries, s.entries[s.head:])
		s.entries, s.head = s.entries[:n], 0
	}
}

// logTime returns now on s's time line. A now behind the latest instant the
// log has seen by more than ClockTolerance is a clock step back: the time
// line shifts so that now continues from that instant.
func (s *SlidingLogState) logTime(now int64) int64 {
	t := now + s.shift
	if s.last-t > tolerance {
		s.shift += s.last - t
		t = s.last
	}
	return t
}

// Take logs cost units at now if they fit. A stale now (earlier than the
// latest instant the log has seen) is logged at that instant, so entries
// stay ordered and none expires early, even after a refund removed the
// newest entry.
func (l *SlidingLog) Take(s *SlidingLogState, at clock.Instant, cost int64) Result {
	now := s.logTime(int64(at))
	l.expire(s, now)
	r := Result{Limit: l.limit}
	switch {
	case cost <= 0:
		r.Status = Invalid
	case cost > l.limit:
		r.Status = Exceeded
	case s.sum+cost <= l.limit:
		s.entries = append(s.entries, logEntry{at: max(now, s.last), cost: cost})
		s.sum += cost
	default:
		r.Status = Denied
		freed := int64(0)
		for _, e := range s.entries[s.head:] {
			freed += e.cost
			if s.sum-freed+cost <= l.limit {
				r.RetryAfter = time.Duration(e.at + l.window - now)
				break
			}
		}
	}
	r.Remaining = max(l.limit-s.sum, 0) // sum > limit: kept across a lowered limit
	if n := len(s.entries); n > s.head {
		r.ResetAfter = time.Duration(max(s.entries[n-1].at+l.window-now, 0))
	}
	s.last = max(s.last, now)
	return r
}

// Refund removes the entry of a take of cost units at now: the newest
// entry logged at or after now with that cost (a take is logged at now, or
// later after a clock step back). If other takes were logged after it, it is
// still that entry that goes, so the log stays exact. Nothing matching:
// nothing is removed (the limit only errs strict).
func (l *SlidingLog) Refund(s *SlidingLogState, at clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	now := s.logTime(int64(at))
	for i := len(s.entries) - 1; i >= s.head && s.entries[i].at >= now; i-- {
		if s.entries[i].at == now && s.entries[i].cost == cost {
			s.sum -= cost
			s.entries = append(s.entries[:i], s.entries[i+1:]...)
			return
		}
	}
}

// Fresh reports whether no logged entry is inside the window at now.
func (l *SlidingLog) Fresh(s *SlidingLogState, at clock.Instant) bool {
	now := int64(at) + s.shift
	n := len(s.entries)
	return s.last <= now && (n == s.head || s.entries[n-1].at+l.window <= now)
}
