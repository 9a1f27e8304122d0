package limit

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// GCRA is the generic cell rate algorithm (ITU-T I.371, the "virtual
// scheduling" form), as used by redis-cell and go-redis/redis_rate: each key
// keeps one theoretical arrival time (TAT). With emission interval T =
// 1/Rate and tolerance τ = (Burst−1)·T, a request of cost c at t is
// admitted iff max(TAT, t) + c·T − t ≤ τ + T (the "check after increment"
// form), and then TAT becomes max(TAT, t) + c·T.
//
// Burst and delay contract: the same as TokenBucket with the same rate and
// burst (GCRA is its virtual-time dual): at most Burst units at once, at
// most Burst + Rate·T over any interval T. Results follow redis-cell's
// reply: Remaining is ⌊(τ + T − (TAT − t))/T⌋ after the step, ResetAfter is
// TAT − t, RetryAfter is the excess over τ + T. A cost above Burst is
// Exceeded (redis-cell answers retry_after −1; redis_rate wrongly gives a
// finite wait).
//
// TAT is exact: T = per/tokens is kept as q + r/tokens ns (see Rate), so
// emission intervals such as 1/3 s never drift. Construction requires
// Burst × max(Rate.Per(), Rate.Tokens()) ≤ 2^61.
type GCRA struct {
	rate  Rate
	burst int64
	t     interval
	dvt   vtime   // τ + T = Burst·T
	step  vtime   // τ + T + ClockTolerance: a TAT further ahead means the clock stepped back
	perT  divider // by T, when Integral
}

// GCRAState is one key's state. The zero value is fresh (TAT in the past).
type GCRAState struct {
	// TAT is the theoretical arrival time, whole nanoseconds.
	TAT int64
	// TATFrac is the fraction of a nanosecond, in units of 1/Rate.Tokens().
	TATFrac int64
}

var _ Algorithm[GCRAState] = (*GCRA)(nil)

// NewGCRA returns the GCRA with emission interval 1/rate and tolerance
// (burst−1)/rate.
func NewGCRA(rate Rate, burst int64) (*GCRA, error) {
	if rate.isZero() {
		return nil, paramErr("rate", "gcra: rate must be > 0")
	}
	if burst < 1 {
		return nil, paramErr("burst", "gcra: burst %d, want ≥ 1", burst)
	}
	if burst > maxScaled/max(rate.per, rate.tokens) {
		return nil, paramErr("burst", "gcra: burst %d too large for rate %v", burst, rate)
	}
	g := &GCRA{rate: rate, burst: burst, t: newInterval(rate)}
	g.dvt = g.t.times(burst)
	g.step = g.dvt.add(vtime{ns: tolerance}, g.t.n)
	g.perT = newDivider(max(g.t.q, 1))
	return g, nil
}

// Rate returns the rate (1 / emission interval).
func (g *GCRA) Rate() Rate { return g.rate }

// Limit returns the burst, in units.
func (g *GCRA) Limit() int64 { return g.burst }

// Window returns τ + T = Burst·T, rounded up to the nanosecond.
func (g *GCRA) Window() time.Duration { return time.Duration(g.dvt.ceil()) }

// Refills reports true: the quota comes back continuously, at the rate
// (store.Refiller).
func (g *GCRA) Refills() bool { return true }

// emissionInterval returns T rounded up to the nanosecond (exact internally).
func (g *GCRA) emissionInterval() time.Duration { return time.Duration(g.t.times(1).ceil()) }

// tolerance returns τ = (Burst−1)·T rounded up to the nanosecond.
func (g *GCRA) tolerance() time.Duration { return time.Duration(g.t.times(g.burst - 1).ceil()) }

// remaining returns ⌊(τ + T − x)/T⌋ for a span x ≥ 0, 0 if x exceeds τ + T.
func (g *GCRA) remaining(x vtime) int64 {
	if g.dvt.less(x) {
		return 0
	}
	return g.dvt.sub(x, g.t.n).scaled(g.t.n) / g.rate.per
}

// tat returns max(TAT, now). A TAT more than τ + T + ClockTolerance ahead
// of now cannot come from this rate and burst: the clock stepped back (or
// the burst was lowered a lot), and the bucket becomes empty at now.
func (g *GCRA) tat(s *GCRAState, now int64) vtime {
	tat, nowv := vtime{ns: s.TAT, f: s.TATFrac}, vtime{ns: now}
	if tat.less(nowv) {
		return nowv
	}
	if g.step.less(tat.sub(nowv, g.t.n)) {
		tat = nowv.add(g.dvt, g.t.n)
		s.TAT, s.TATFrac = tat.ns, tat.f
	}
	return tat
}

// Take applies one arrival of cost at now.
func (g *GCRA) Take(s *GCRAState, at clock.Instant, cost int64) Result {
	now := int64(at)
	n := g.t.n
	nowv := vtime{ns: now}
	tat := g.tat(s, now)
	ahead := tat.sub(nowv, n)
	r := Result{Limit: g.burst, Remaining: g.remaining(ahead), ResetAfter: time.Duration(ahead.ceil())}
	switch {
	case cost <= 0:
		r.Status = Invalid
		return r
	case cost > g.burst:
		r.Status = Exceeded
		return r
	}
	next := tat.add(g.t.times(cost), n)
	diff := next.sub(nowv, n)
	if g.dvt.less(diff) {
		r.Status = Denied
		r.RetryAfter = time.Duration(diff.sub(g.dvt, n).ceil())
		return r
	}
	s.TAT, s.TATFrac = next.ns, next.f
	r.Remaining = g.remaining(diff)
	r.ResetAfter = time.Duration(diff.ceil())
	return r
}

// Refund moves TAT back by cost·T, never before now (a full bucket).
func (g *GCRA) Refund(s *GCRAState, at clock.Instant, cost int64) {
	now := int64(at)
	if cost <= 0 || cost > g.burst {
		return
	}
	tat := vtime{ns: s.TAT, f: s.TATFrac}.sub(g.t.times(cost), g.t.n)
	if tat.less(vtime{ns: now}) {
		tat = vtime{ns: now}
	}
	if tat.less(vtime{ns: s.TAT, f: s.TATFrac}) {
		s.TAT, s.TATFrac = tat.ns, tat.f
	}
}

// Fresh reports whether TAT ≤ now.
func (g *GCRA) Fresh(s *GCRAState, at clock.Instant) bool {
	now := int64(at)
	return !(vtime{ns: now}).less(vtime{ns: s.TAT, f: s.TATFrac})
}

// Integral reports whether the emission interval is a whole number of
// nanoseconds (true for every rate that divides its period evenly, such as
// 100/s or 1/h), so that TAT is a single int64 and TATFrac is always 0. Then
// TakeTAT lets a store update TAT with one compare-and-swap.
func (g *GCRA) Integral() bool { return g.t.r == 0 }

// Debit moves TAT on by cost·T (Debiter), from TAT itself and not from
// now, so that a debit after a take leaves the TAT a take of the whole
// cost would have; never past an empty bucket (now + τ + T).
func (g *GCRA) Debit(s *GCRAState, at clock.Instant, cost int64) {
	if cost <= 0 {
		return
	}
	old := vtime{ns: s.TAT, f: s.TATFrac}
	tat := old.add(g.t.times(min(cost, g.burst)), g.t.n)
	if full := (vtime{ns: int64(at)}).add(g.dvt, g.t.n); full.less(tat) {
		tat = full
	}
	if old.less(tat) {
		s.TAT, s.TATFrac = tat.ns, tat.f
	}
}

// debitTAT is Debit for an Integral GCRA on a bare TAT.
func (g *GCRA) debitTAT(tat int64, at clock.Instant, cost int64) int64 {
	if cost <= 0 {
		return tat
	}
	return max(tat, min(tat+min(cost, g.burst)*g.t.q, int64(at)+g.dvt.ns))
}

// TakeTAT is Take for an Integral GCRA on a bare TAT: it returns the new TAT
// (unchanged unless Allowed or the clock stepped back) and the result.
// REQUIRES: g.Integral().
func (g *GCRA) TakeTAT(tat int64, at clock.Instant, cost int64) (int64, Result) {
	now := int64(at)
	t := max(tat, now)
	if t-now > g.step.ns {
		t = now + g.dvt.ns // the clock stepped back (see tat)
		tat = t
	}
	ahead := t - now
	switch {
	case cost <= 0:
		return tat, Result{Status: Invalid, Limit: g.burst, Remaining: g.remainingTAT(ahead), ResetAfter: time.Duration(ahead)}
	case cost > g.burst:
		return tat, Result{Status: Exceeded, Limit: g.burst, Remaining: g.remainingTAT(ahead), ResetAfter: time.Duration(ahead)}
	}
	next := t + cost*g.t.q
	diff := next - now
	if diff > g.dvt.ns {
		return tat, Result{Status: Denied, Limit: g.burst, Remaining: g.remainingTAT(ahead),
			RetryAfter: time.Duration(diff - g.dvt.ns), ResetAfter: time.Duration(ahead)}
	}
	return next, Result{Limit: g.burst, Remaining: g.remainingTAT(diff), ResetAfter: time.Duration(diff)}
}

// AdmitTAT is the bare decision of TakeTAT: it returns the new TAT and
// whether cost was admitted, without the result's remaining and reset
// figures. Costs outside [1, burst] are never admitted.
// REQUIRES: g.Integral().
func (g *GCRA) AdmitTAT(tat int64, at clock.Instant, cost int64) (int64, bool) {
	now := int64(at)
	if cost <= 0 || cost > g.burst {
		return tat, false
	}
	t := max(tat, now)
	if t-now > g.step.ns {
		t = now + g.dvt.ns // the clock stepped back (see tat)
		tat = t
	}
	next := t + cost*g.t.q
	if next-now > g.dvt.ns {
		return tat, false
	}
	return next, true
}

// RefundTAT is Refund for an Integral GCRA on a bare TAT.
func (g *GCRA) RefundTAT(tat int64, at clock.Instant, cost int64) int64 {
	now := int64(at)
	if cost <= 0 || cost > g.burst {
		return tat
	}
	return max(tat-cost*g.t.q, min(now, tat))
}

// remainingTAT is remaining for an integral interval: ⌊(τ+T − x)/T⌋.
func (g *GCRA) remainingTAT(x int64) int64 {
	if x >= g.dvt.ns {
		return 0
	}
	return g.perT.floor(g.dvt.ns - x)
}
