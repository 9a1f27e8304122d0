package limit

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

func mustGCRA(t *testing.T, rate Rate, burst int64) *GCRA {
	t.Helper()
	g, err := NewGCRA(rate, burst)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

type gcraStep struct {
	at        clock.Instant
	cost      int64
	status    Status
	remaining int64
	reset     time.Duration
	retry     time.Duration
}

func runGCRA(t *testing.T, g *GCRA, steps []gcraStep) {
	t.Helper()
	var s GCRAState
	for i, st := range steps {
		r := g.Take(&s, st.at, st.cost)
		if r.Status != st.status || r.Remaining != st.remaining || r.ResetAfter != st.reset || r.RetryAfter != st.retry {
			t.Fatalf("step %d (t=%v cost %d): got %v rem %d reset %v retry %v; want %v rem %d reset %v retry %v",
				i, time.Duration(st.at), st.cost, r.Status, r.Remaining, r.ResetAfter, r.RetryAfter,
				st.status, st.remaining, st.reset, st.retry)
		}
	}
}

// The unit-test table of brandur/redis-cell (src/cell/mod.rs): limit 5
// (max_burst 4), 1 per second. Quantity 0 (peek) is not a take in sluice.
func TestGCRARedisCellTable(t *testing.T) {
	g := mustGCRA(t, PerSecond(1), 5)
	s1 := time.Second
	runGCRA(t, g, []gcraStep{
		{0, 6, Exceeded, 5, 0, 0},
		{0, 1, Allowed, 4, 1 * s1, 0},
		{0, 1, Allowed, 3, 2 * s1, 0},
		{0, 1, Allowed, 2, 3 * s1, 0},
		{0, 1, Allowed, 1, 4 * s1, 0},
		{0, 1, Allowed, 0, 5 * s1, 0},
		{0, 1, Denied, 0, 5 * s1, 1 * s1},
		{3 * sec, 1, Allowed, 2, 3 * s1, 0},
		{3100 * ms, 1, Allowed, 1, 3900 * time.Millisecond, 0},
		{4 * sec, 1, Allowed, 1, 4 * s1, 0},
		{8 * sec, 1, Allowed, 4, 1 * s1, 0},
		{9500 * ms, 1, Allowed, 4, 1 * s1, 0},
		{9500 * ms, 2, Allowed, 2, 3 * s1, 0},
		{9500 * ms, 5, Denied, 2, 3 * s1, 3 * s1},
		{9500 * ms, 3, Denied, 2, 3 * s1, 1 * s1},
	})
}

// CL.THROTTLE k 15 30 60 from the redis-cell README: max_burst 15 (burst
// 16), 30 per 60 s.
func TestGCRARedisCellReadme(t *testing.T) {
	g := mustGCRA(t, mustRate(t, "30/60s"), 16)
	var s GCRAState
	r := g.Take(&s, 0, 1)
	if !r.OK() || r.Remaining != 15 || r.ResetAfter != 2*time.Second {
		t.Fatalf("fresh: %+v", r)
	}
	for range 14 {
		g.Take(&s, 0, 1)
	}
	r = g.Take(&s, 0, 1)
	if !r.OK() || r.Remaining != 0 || r.ResetAfter != 32*time.Second {
		t.Fatalf("16th: %+v", r)
	}
	r = g.Take(&s, 0, 1)
	if r.Status != Denied || r.RetryAfter != 2*time.Second || r.ResetAfter != 32*time.Second {
		t.Fatalf("17th: %+v", r)
	}
	r = g.Take(&s, 3*sec, 1)
	if !r.OK() || r.Remaining != 0 || r.ResetAfter != 31*time.Second {
		t.Fatalf("+3s: %+v", r)
	}
}

// Standard form (algorithms.md §8.6): T = 100 ms, burst 10, τ = 900 ms.
func TestGCRAStandardForm(t *testing.T) {
	g := mustGCRA(t, PerSecond(10), 10)
	if g.emissionInterval() != 100*time.Millisecond || g.tolerance() != 900*time.Millisecond {
		t.Fatalf("T=%v τ=%v", g.emissionInterval(), g.tolerance())
	}
	var s GCRAState
	if got := takeN(g, &s, 0, 10); got != 10 {
		t.Fatalf("admitted %d of 10 at t=0", got)
	}
	if r := g.Take(&s, 0, 1); r.Status != Denied || r.RetryAfter != 100*time.Millisecond {
		t.Fatalf("11th: %+v", r)
	}
	r := g.Take(&s, 250*ms, 1)
	if !r.OK() || r.Remaining != 1 {
		t.Fatalf("t=250ms: %+v, want allowed with remaining 1", r)
	}
	if clock.Instant(s.TAT) != 1100*ms {
		t.Fatalf("TAT %v, want 1.1s", time.Duration(s.TAT))
	}
}

// go-redis/redis_rate PerSecond(10) at a fixed now (its own test), except
// that a cost above the burst is Exceeded rather than given a finite wait.
func TestGCRARedisRateVectors(t *testing.T) {
	g := mustGCRA(t, PerSecond(10), 10)
	runGCRA(t, g, []gcraStep{
		{0, 1, Allowed, 9, 100 * time.Millisecond, 0},
		{0, 2, Allowed, 7, 300 * time.Millisecond, 0},
		{0, 7, Allowed, 0, time.Second, 0},
		{0, 1000, Exceeded, 0, time.Second, 0},
	})
}

func TestGCRAMatchesTokenBucket(t *testing.T) {
	// The two are duals: same rate and burst, same admissions at every probe.
	for _, rs := range []string{"200/s", "3/s", "7/3s", "1/h", "1e9/s"} {
		rate := mustRate(t, rs)
		g := mustGCRA(t, rate, 4)
		b := mustTB(t, rate, 4)
		var gs GCRAState
		var bs TokenBucketState
		step := max(int64(rate.Per())/rate.Tokens()/3, 1)
		for i := int64(0); i < 200; i++ {
			now := clock.Instant(i * step)
			cost := i%3 + 1
			gr, br := g.Take(&gs, now, cost), b.Take(&bs, now, cost)
			if gr.Status != br.Status || gr.RetryAfter != br.RetryAfter || gr.Remaining != br.Remaining {
				t.Fatalf("%s i=%d: gcra %+v vs bucket %+v", rs, i, gr, br)
			}
		}
	}
}

func TestGCRAStaleReadingsCreateNoCapacity(t *testing.T) {
	g := mustGCRA(t, PerSecond(200), 400)
	var s GCRAState
	takeN(g, &s, 10*sec, 400)
	tat := s
	for _, back := range []clock.Instant{10*sec - 1, 9 * sec} {
		if r := g.Take(&s, back, 1); r.OK() || r.RetryAfter != time.Duration(10*sec-back+5*ms) {
			t.Fatalf("now=%v after the bucket was emptied at 10s: %+v", time.Duration(back), r)
		}
	}
	if s != tat {
		t.Fatal("a rejected stale take moved TAT")
	}
}

// A TAT further ahead than τ + T + ClockTolerance means the clock stepped
// back: the bucket counts as empty at the new time, never fresh, and frees
// one unit per emission interval from there.
func TestGCRAClockStepBack(t *testing.T) {
	for _, g := range []*GCRA{mustGCRA(t, PerSecond(200), 400), mustGCRA(t, mustRate(t, "7/3s"), 4)} {
		var s GCRAState
		hour := clock.Instant(time.Hour)
		takeN(g, &s, hour, int(g.Limit()))
		for _, back := range []clock.Instant{10 * sec, 0} {
			if r := g.Take(&s, back, 1); r.OK() || r.RetryAfter != g.emissionInterval() || r.Remaining != 0 {
				t.Fatalf("%v: step back to %v: %+v, want denied for one emission interval", g.Rate(), time.Duration(back), r)
			}
			if !g.Take(&s, back+clock.Instant(g.emissionInterval()), 1).OK() {
				t.Fatalf("%v: locked out after the step back", g.Rate())
			}
		}
		// The integral fast path (memory.Bucket) agrees.
		if g.Integral() {
			tat, r := g.TakeTAT(int64(hour)*2, 0, 1)
			if r.OK() || r.RetryAfter != g.emissionInterval() || tat != int64(g.Window()) {
				t.Fatalf("TakeTAT after a step: %+v, TAT %v (want the new time plus the window)", r, time.Duration(tat))
			}
			tat, ok := g.AdmitTAT(int64(hour)*2, 0, 1)
			if ok || tat != int64(g.Window()) {
				t.Fatalf("AdmitTAT at the step: %v, TAT %v", ok, time.Duration(tat))
			}
			if _, ok := g.AdmitTAT(tat, clock.Instant(g.emissionInterval()), 1); !ok {
				t.Fatal("AdmitTAT locked out after a step")
			}
		}
	}
}

func TestGCRARefundNeverAboveBurst(t *testing.T) {
	g := mustGCRA(t, mustRate(t, "3/s"), 5)
	var s GCRAState
	g.Take(&s, 0, 2)
	g.Refund(&s, 0, 2)
	g.Refund(&s, 0, 2)
	if !g.Fresh(&s, 0) {
		t.Fatalf("not fresh after refund: %+v", s)
	}
	if got := takeN(g, &s, 0, 6); got != 5 {
		t.Fatalf("admitted %d after refunds, want exactly the burst 5", got)
	}
}

func TestGCRAExtremeRates(t *testing.T) {
	g := mustGCRA(t, mustRate(t, "1/h"), 1)
	var s GCRAState
	g.Take(&s, 0, 1)
	if r := g.Take(&s, clock.Instant(time.Hour)-1, 1); r.RetryAfter != 1 {
		t.Fatalf("1/h: %+v", r)
	}
	g = mustGCRA(t, mustRate(t, "1e9/s"), 1_000_000_000)
	s = GCRAState{}
	if !g.Take(&s, 0, 1_000_000_000).OK() || g.Take(&s, 0, 1).RetryAfter != 1 {
		t.Fatal("1e9/s: not one unit per ns")
	}
	thirtyDays := clock.Instant(30 * 24 * time.Hour)
	if got := takeN(g, &s, thirtyDays, 10); got != 10 {
		t.Fatalf("after 30 days admitted %d of 10", got)
	}
}

func TestGCRABadInput(t *testing.T) {
	if _, err := NewGCRA(Rate{}, 1); err == nil {
		t.Error("zero rate accepted")
	}
	if _, err := NewGCRA(PerSecond(1), 0); err == nil {
		t.Error("burst 0 accepted")
	}
	g := mustGCRA(t, PerSecond(10), 10)
	var s GCRAState
	for _, cost := range []int64{0, -3} {
		if r := g.Take(&s, 0, cost); r.Status != Invalid || s != (GCRAState{}) {
			t.Fatalf("cost %d: %+v", cost, r)
		}
	}
	if r := g.Take(&s, 0, 1<<62); r.Status != Exceeded || r.RetryAfter != 0 {
		t.Fatalf("huge cost: %+v", r)
	}
}
