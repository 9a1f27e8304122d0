package limit

import (
	"cmp"
	"math/big"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"pgregory.net/rapid"
)

type admitted struct{ at, cost int64 }

var periods = []time.Duration{time.Millisecond, time.Second, 3 * time.Second, time.Minute, time.Hour}

func genRate(t *rapid.T) Rate {
	n := rapid.Int64Range(1, 1000).Draw(t, "tokens")
	per := rapid.SampledFrom(periods).Draw(t, "per")
	r, err := NewRate(n, per)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// arrivals draws real (monotonic) arrival times spread over a few refill
// periods, and for each a possibly stale reading of the clock.
func arrivals(t *rapid.T, span int64, stale bool) (real, seen []int64) {
	count := rapid.IntRange(1, 120).Draw(t, "count")
	now := rapid.Int64Range(0, span).Draw(t, "start")
	for i := range count {
		now += rapid.Int64Range(0, span/8+1).Draw(t, "gap")
		real = append(real, now)
		s := now
		if stale && i > 0 && rapid.IntRange(0, 2).Draw(t, "is stale") == 0 {
			s -= rapid.Int64Range(0, min(span/4+1, tolerance)).Draw(t, "stale")
		}
		seen = append(seen, s)
	}
	return real, seen
}

// checkRateBound asserts that admitted cost in every interval [a, b] of real
// time is ≤ burst + rate·(b − a), in exact rational arithmetic.
func checkRateBound(t *rapid.T, adm []admitted, rate Rate, burst int64) {
	slices.SortStableFunc(adm, func(a, b admitted) int { return cmp.Compare(a.at, b.at) })
	per := big.NewInt(int64(rate.Per()))
	for i := range adm {
		sum := int64(0)
		for j := i; j < len(adm); j++ {
			sum += adm[j].cost
			// sum·per ≤ burst·per + tokens·(t_j − t_i)
			lhs := new(big.Int).Mul(big.NewInt(sum), per)
			rhs := new(big.Int).Mul(big.NewInt(burst), per)
			rhs.Add(rhs, new(big.Int).Mul(big.NewInt(rate.Tokens()), big.NewInt(adm[j].at-adm[i].at)))
			if lhs.Cmp(rhs) > 0 {
				t.Fatalf("admitted %d units in [%d, %d]: more than burst %d + rate %v × %v",
					sum, adm[i].at, adm[j].at, burst, rate, time.Duration(adm[j].at-adm[i].at))
			}
		}
	}
}

func checkResult(t *rapid.T, r Result, limit int64) {
	if r.Remaining < 0 || r.Remaining > limit || r.RetryAfter < 0 || r.ResetAfter < 0 || r.Wait < 0 {
		t.Fatalf("result out of range: %+v (limit %d)", r, limit)
	}
	if r.Status == Denied && r.RetryAfter == 0 {
		t.Fatalf("denied without a retry-after: %+v", r)
	}
	if r.Status != Denied && r.RetryAfter != 0 {
		t.Fatalf("retry-after on a non-denied result: %+v", r)
	}
}

// rateProperty runs random arrivals (with stale clock readings and
// occasional refunds) through a and checks the burst + rate·T bound, the
// result ranges, and that every RetryAfter is exact.
func rateProperty[S any](t *rapid.T, a Algorithm[S], rate Rate, burst int64, onReadings bool, invariant func(*S) bool) {
	var s S
	span := int64(rate.Per()) / rate.Tokens() * burst * 2
	real, seen := arrivals(t, max(span, 1), true)
	// Where the bound holds: GCRA (TAT only) satisfies it on the clock
	// readings themselves, in any order. TokenBucket accounts a call at
	// max(its reading, the latest reading already applied), so a stale
	// reading never creates tokens, and the bound holds on those instants.
	eff := make([]int64, len(seen))
	latest := seen[0]
	for i, s := range seen {
		latest = max(latest, s)
		eff[i] = latest
		if onReadings {
			eff[i] = s
		}
	}
	var adm []admitted
	for i := range real {
		cost := rapid.Int64Range(1, burst+1).Draw(t, "cost")
		probe := s
		r := a.Take(&s, clock.Instant(seen[i]), cost)
		checkResult(t, r, a.Limit())
		if !invariant(&s) {
			t.Fatalf("state invariant broken: %+v", s)
		}
		switch r.Status {
		case Allowed:
			if rapid.IntRange(0, 9).Draw(t, "refund") == 0 {
				a.Refund(&s, clock.Instant(seen[i]), cost) // a later gate rejected it
				if !invariant(&s) {
					t.Fatalf("refund broke the state: %+v", s)
				}
				continue
			}
			adm = append(adm, admitted{at: eff[i], cost: cost})
		case Denied:
			// Exact retry-after: 1 ns earlier is still denied, at it admitted.
			early := probe
			at := seen[i] + int64(r.RetryAfter)
			if a.Take(&early, clock.Instant(at-1), cost).OK() {
				t.Fatalf("admitted 1ns before retry-after %v", r.RetryAfter)
			}
			if !a.Take(&probe, clock.Instant(at), cost).OK() {
				t.Fatalf("denied at retry-after %v", r.RetryAfter)
			}
		case Exceeded:
			if cost <= burst {
				t.Fatalf("cost %d ≤ burst %d reported as exceeded", cost, burst)
			}
		}
	}
	checkRateBound(t, adm, rate, burst)
}

func TestTokenBucketProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := genRate(t)
		burst := rapid.Int64Range(1, 40).Draw(t, "burst")
		b, err := NewTokenBucket(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		rateProperty(t, b, rate, burst, false, func(s *TokenBucketState) bool {
			return s.Deficit >= 0 && s.Deficit <= b.capacity
		})
	})
}

func TestGCRAProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := genRate(t)
		burst := rapid.Int64Range(1, 40).Draw(t, "burst")
		g, err := NewGCRA(rate, burst)
		if err != nil {
			t.Fatal(err)
		}
		rateProperty(t, g, rate, burst, true, func(s *GCRAState) bool {
			return s.TATFrac >= 0 && s.TATFrac < rate.Tokens()
		})
	})
}

// windowProperty runs random arrivals through a window algorithm, with
// stale clock readings (up to a window or ClockTolerance late) and refunds,
// and returns what it admitted, each at the latest instant the algorithm had
// seen by then: a stale reading is counted no earlier than that, so bounds
// checked on those instants show a log that forgot a time it had seen.
func windowProperty[S any](t *rapid.T, a Algorithm[S], window int64, clone func(S) S) []admitted {
	var s S
	real, seen := arrivals(t, window*3, true)
	var adm []admitted
	latest := seen[0]
	for i := range real {
		at := seen[i]
		latest = max(latest, at)
		cost := rapid.Int64Range(1, a.Limit()+1).Draw(t, "cost")
		probe := clone(s)
		r := a.Take(&s, clock.Instant(at), cost)
		checkResult(t, r, a.Limit())
		if r.OK() {
			if rapid.IntRange(0, 7).Draw(t, "refund") == 0 {
				a.Refund(&s, clock.Instant(at), cost) // a later gate rejected it
				continue
			}
			adm = append(adm, admitted{at: latest, cost: cost})
		}
		if r.Status == Denied && at == latest {
			early := clone(probe)
			if a.Take(&early, clock.Instant(at+int64(r.RetryAfter)-1), cost).OK() || !a.Take(&probe, clock.Instant(at+int64(r.RetryAfter)), cost).OK() {
				t.Fatalf("retry-after %v not exact", r.RetryAfter)
			}
		}
	}
	return adm
}

// maxIn returns the most cost admitted in any interval [a, a+length) (or
// (a−length, a] when closedRight).
func maxIn(adm []admitted, length int64) int64 {
	best := int64(0)
	for i := range adm {
		sum := int64(0)
		for j := i; j < len(adm) && adm[j].at < adm[i].at+length; j++ {
			sum += adm[j].cost
		}
		best = max(best, sum)
	}
	return best
}

func TestFixedWindowProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 30).Draw(t, "limit")
		window := rapid.Int64Range(1, 1e9).Draw(t, "window")
		w, _ := NewFixedWindow(limit, time.Duration(window))
		adm := windowProperty(t, w, window, same[FixedWindowState])
		perWindow := map[int64]int64{}
		for _, a := range adm {
			perWindow[floorDiv(a.at, window)] += a.cost
			if perWindow[floorDiv(a.at, window)] > limit {
				t.Fatalf("aligned window over its limit %d", limit)
			}
		}
		if m := maxIn(adm, window); m > 2*limit {
			t.Fatalf("%d in one window length, bound 2×%d", m, limit)
		}
	})
}

func TestSlidingLogProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 30).Draw(t, "limit")
		window := rapid.Int64Range(1, 1e9).Draw(t, "window")
		l, _ := NewSlidingLog(limit, time.Duration(window))
		adm := windowProperty(t, l, window, cloneLog)
		if m := maxIn(adm, window); m > limit {
			t.Fatalf("%d in one window, limit %d: the log is not exact", m, limit)
		}
	})
}

func TestSlidingWindowProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 30).Draw(t, "limit")
		window := rapid.Int64Range(2, 1e9).Draw(t, "window")
		w, _ := NewSlidingWindow(limit, time.Duration(window))
		adm := windowProperty(t, w, window, same[SlidingWindowState])
		perWindow := map[int64]int64{}
		for _, a := range adm {
			perWindow[floorDiv(a.at, window)] += a.cost
			if perWindow[floorDiv(a.at, window)] > limit {
				t.Fatalf("aligned window over its limit %d", limit)
			}
		}
		// The documented bound: < 2·limit in any interval of one window length.
		if m := maxIn(adm, window); m > 2*limit-1 {
			t.Fatalf("%d in one window length, documented bound %d", m, 2*limit-1)
		}
	})
}

func TestLeakyBucketProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		rate := genRate(t)
		queue := rapid.Int64Range(0, 30).Draw(t, "queue")
		l, err := NewLeakyBucket(rate, queue)
		if err != nil {
			t.Fatal(err)
		}
		var s LeakyBucketState
		real, _ := arrivals(t, int64(rate.Per())/rate.Tokens()*(queue+2), false)
		var starts []admitted
		for _, at := range real {
			cost := rapid.Int64Range(1, 2).Draw(t, "cost")
			deadline := int64(0)
			if rapid.Bool().Draw(t, "has deadline") {
				deadline = at + rapid.Int64Range(1, int64(l.Window())+2).Draw(t, "budget")
			}
			r := l.TakeBy(&s, clock.Instant(at), cost, clock.Instant(deadline))
			checkResult(t, r, l.Limit())
			if !r.OK() {
				continue
			}
			if r.Wait > l.Window() {
				t.Fatalf("wait %v beyond max %v", r.Wait, l.Window())
			}
			if deadline != 0 && at+int64(r.Wait) >= deadline {
				t.Fatal("held past its deadline")
			}
			starts = append(starts, admitted{at: at + int64(r.Wait), cost: cost})
		}
		// Paced: the units started in any interval [a, b] fit in rate·(b−a)
		// plus the one request starting at b.
		for i := range starts {
			sum := int64(0)
			for j := i; j < len(starts); j++ {
				if j > i {
					// Only units that started strictly before starts[j].
					lhs := new(big.Int).Mul(big.NewInt(sum), big.NewInt(int64(rate.Per())))
					rhs := new(big.Int).Mul(big.NewInt(rate.Tokens()), big.NewInt(starts[j].at-starts[i].at+1))
					if lhs.Cmp(rhs) > 0 {
						t.Fatalf("%d units started in %v at rate %v", sum, time.Duration(starts[j].at-starts[i].at), rate)
					}
				}
				sum += starts[j].cost
			}
		}
	})
}

func TestConcurrencyProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.Int64Range(1, 20).Draw(t, "limit")
		c, _ := NewConcurrency(limit)
		var s ConcurrencyState
		var held []int64
		for range rapid.IntRange(1, 200).Draw(t, "ops") {
			if len(held) > 0 && rapid.Bool().Draw(t, "release") {
				i := rapid.IntRange(0, len(held)-1).Draw(t, "which")
				c.Refund(&s, 0, held[i])
				held = append(held[:i], held[i+1:]...)
				continue
			}
			cost := rapid.Int64Range(1, 3).Draw(t, "cost")
			if c.Take(&s, 0, cost).OK() {
				held = append(held, cost)
			}
			sum := int64(0)
			for _, h := range held {
				sum += h
			}
			if s.InFlight != sum || s.InFlight > limit {
				t.Fatalf("in flight %d (held %d), limit %d", s.InFlight, sum, limit)
			}
		}
	})
}

func same[S any](s S) S { return s }

func cloneLog(s SlidingLogState) SlidingLogState {
	s.entries = append([]logEntry(nil), s.entries...)
	return s
}
