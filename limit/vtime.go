package limit

// vtime is an exact virtual instant or span: ns + f/n nanoseconds, where the
// denominator n is the owning algorithm's Rate.Tokens() and 0 ≤ f < n. GCRA
// and the leaky bucket keep their theoretical arrival time in it, so an
// emission interval such as 1/3 s is exact and never drifts.
type vtime struct {
	ns int64
	f  int64
}

// interval is an emission interval T = per/n held as q + r/n ns, with the
// multiples the algorithms need.
type interval struct {
	n, q, r int64
}

func newInterval(rate Rate) interval {
	return interval{n: rate.tokens, q: rate.per / rate.tokens, r: rate.per % rate.tokens}
}

// times returns c·T. REQUIRES: c·max(per, n) ≤ 2^61 (checked at construction).
func (t interval) times(c int64) vtime {
	cr := c * t.r
	return vtime{ns: c*t.q + cr/t.n, f: cr % t.n}
}

func (a vtime) add(b vtime, n int64) vtime {
	s := vtime{ns: a.ns + b.ns, f: a.f + b.f}
	if s.f >= n {
		s.ns++
		s.f -= n
	}
	return s
}

func (a vtime) sub(b vtime, n int64) vtime {
	s := vtime{ns: a.ns - b.ns, f: a.f - b.f}
	if s.f < 0 {
		s.ns--
		s.f += n
	}
	return s
}

func (a vtime) less(b vtime) bool { return a.ns < b.ns || (a.ns == b.ns && a.f < b.f) }

// ceil rounds up to whole nanoseconds.
func (a vtime) ceil() int64 {
	if a.f > 0 {
		return a.ns + 1
	}
	return a.ns
}

// scaled returns a·n: the span in units of 1/n ns. REQUIRES: it fits in int64.
func (a vtime) scaled(n int64) int64 { return a.ns*n + a.f }
