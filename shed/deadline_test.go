package shed

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

const ms = time.Millisecond

// The published fixture: Q + S + R + U < D with 45 + 35 + 10 + 15 = 105 ms
// rejects at 80 ms and admits at 120 ms; a 10 ms queue makes 70 ms, which
// admits at 80 ms.
func TestDeadlineFixture(t *testing.T) {
	if Fits(45*ms, 35*ms, 10*ms, 15*ms, 80*ms) {
		t.Error("105 ms fits 80 ms")
	}
	if !Fits(45*ms, 35*ms, 10*ms, 15*ms, 120*ms) {
		t.Error("105 ms does not fit 120 ms")
	}
	if !Fits(10*ms, 35*ms, 10*ms, 15*ms, 80*ms) {
		t.Error("70 ms does not fit 80 ms")
	}
	if Fits(10*ms, 35*ms, 10*ms, 25*ms, 80*ms) {
		t.Error("exactly the budget fits: the test is strict")
	}
}

// The gate learns a class's service time from its completions and applies
// the test with the queue's prediction, Reserve and Margin.
func TestDeadlineGate(t *testing.T) {
	queue := 45 * ms
	g, err := NewDeadline("deadline", DeadlineOptions{Reserve: 10 * ms, Margin: 15 * ms, MinSamples: 5,
		Queue: func(string) time.Duration { return queue }, Retest: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := clock.Instant(time.Second)
	req := func(budget time.Duration) *sluice.Request {
		return &sluice.Request{Class: "default", Deadline: now.Add(budget)}
	}
	// Unknown class: admitted (nothing to predict from).
	if d, _ := gatetest.Decide(ctx, g, req(80*ms), now); !d.Admitted {
		t.Fatalf("before any sample: %+v", d)
	}
	for range 10 {
		g.Release(req(0), 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 34 * ms})
		g.Release(req(0), 0, sluice.Completion{Outcome: sluice.OutcomeErrored, Latency: time.Microsecond}) // censored
	}
	s, n := g.ServiceTimes().Percentile("default", 0.9)
	if n != 10 || s < 34*ms || s > 37*ms {
		t.Fatalf("service time %v from %d samples, want 34 ms within a bucket", s, n)
	}
	if d, _ := gatetest.Decide(ctx, g, req(80*ms), now); d.Admitted || d.Reason != sluice.ReasonDeadline || d.Retryable || d.Entitlement() {
		t.Fatalf("45 + ~35 + 10 + 15 against 80 ms: %+v", d)
	}
	if d, _ := gatetest.Decide(ctx, g, req(120*ms), now); !d.Admitted {
		t.Fatalf("against 120 ms: %+v", d)
	}
	queue = 10 * ms
	if d, _ := gatetest.Decide(ctx, g, req(80*ms), now); !d.Admitted {
		t.Fatalf("a 10 ms queue against 80 ms: %+v", d)
	}
	if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Class: "default"}, now); !d.Admitted {
		t.Fatalf("no deadline: %+v", d)
	}
}

// A class the test turns away still lets one request through a second, so
// that an estimate learned while the service was slow (analytics at 600
// ms against a 500 ms budget) gives way once the service is fast again;
// late completions teach the gate as useful ones do.
func TestDeadlineRetest(t *testing.T) {
	g, err := NewDeadline("deadline", DeadlineOptions{MinSamples: 5, Retest: time.Second, HalfLife: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := clock.Instant(time.Hour)
	req := func() *sluice.Request { return &sluice.Request{Class: "analytics", Deadline: now.Add(500 * ms)} }
	for range 20 {
		g.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 600 * ms})
	}
	admitted := 0
	for i := range 100 { // 100 requests over 2 s: the first refused and one a second after it go through
		now = clock.Instant(time.Hour + time.Duration(i)*20*ms)
		if d, _ := gatetest.Decide(ctx, g, req(), now); d.Admitted {
			admitted++
		} else if d.Reason != sluice.ReasonDeadline {
			t.Fatalf("rejected for %v", d.Reason)
		}
	}
	if admitted != 2 {
		t.Fatalf("%d of 100 through in 2 s of a failing class, want 2 (at 0 and 1 s)", admitted)
	}
	for range 300 { // the retests find the service fast again
		g.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 150 * ms})
	}
	if d, _ := gatetest.Decide(ctx, g, req(), now); !d.Admitted {
		t.Fatalf("after 300 completions of 150 ms: %+v", d)
	}
}

// Estimates forget by time too: a class turned away for the latencies of a
// passing overload (256 completions at 120 ms against a 100 ms budget) is
// admitted again within a few seconds: every retest that comes back in
// time cuts what the class learned before to a quarter and lets the next
// through, and the counts halve with every second besides; the count-only
// halving took hundreds of retests (minutes).
func TestDeadlineForgetsByTime(t *testing.T) {
	g, err := NewDeadline("deadline", DeadlineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := clock.Instant(time.Hour)
	now := start
	req := func() *sluice.Request { return &sluice.Request{Class: "default", Deadline: now.Add(100 * ms)} }
	for range 256 {
		g.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 120 * ms, Now: now})
	}
	var rejected int
	var lastRejected time.Duration
	type out struct {
		at clock.Instant
		p  sluice.Permit
	}
	var pending []out
	for i := range 1000 { // 100 requests a second for 10 s; the admitted take 50 ms
		now = start.Add(time.Duration(i) * 10 * ms)
		for len(pending) > 0 && pending[0].at <= now {
			g.Release(req(), pending[0].p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * ms, Now: pending[0].at})
			pending = pending[1:]
		}
		if d, p := gatetest.Decide(ctx, g, req(), now); d.Admitted {
			pending = append(pending, out{now.Add(50 * ms), p})
		} else {
			rejected++
			lastRejected = now.Sub(start)
		}
	}
	back := lastRejected + 10*ms
	if rejected < 5 || back > 4*time.Second {
		t.Fatalf("%d rejected, admitted again for good after %v; want the class turned away first, then admitted within 4 s", rejected, back)
	}
	t.Logf("%d rejected; admitted for good from %v", rejected, back)
}

// A retest that comes back in time lets the next through at once, one at
// a time: a class turned away for the latencies of a limit's overshoot (a
// window of answers at twice the service time against a deadline of
// twice the service time) is admitted again within a few service times,
// where one retest a second took two seconds of an idle service. Retests
// that come back late keep to one a second.
func TestDeadlineRetestsChainWhileInTime(t *testing.T) {
	g, err := NewDeadline("deadline", DeadlineOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	start := clock.Instant(time.Hour)
	now := start
	req := func() *sluice.Request { return &sluice.Request{Class: "default", Deadline: now.Add(100 * ms)} }
	for range 20 { // the overshoot: 20 answers at 50 ms, then 20 at 100 ms
		g.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * ms, Now: now})
	}
	for range 20 {
		g.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 100 * ms, Now: now})
	}
	// 40 requests a second for 2 s; an admitted one answers in 50 ms.
	type out struct {
		at clock.Instant
		p  sluice.Permit
	}
	var pending []out
	var retests int
	back := time.Duration(-1)
	for i := range 80 {
		now = start.Add(time.Duration(i) * 25 * ms)
		for len(pending) > 0 && pending[0].at <= now {
			g.Release(req(), pending[0].p, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * ms, Now: pending[0].at})
			pending = pending[1:]
		}
		d, p := gatetest.Decide(ctx, g, req(), now)
		if !d.Admitted {
			back = -1
			continue
		}
		if p != 0 {
			retests++
		}
		if back < 0 {
			back = now.Sub(start)
		}
		pending = append(pending, out{now.Add(50 * ms), p})
	}
	if back < 0 || back > 300*ms {
		t.Fatalf("admitted for good from %v (%d retests); want within 300 ms", back, retests)
	}

	// Retests that come back late: not one at a time, but after twice the
	// late one's latency, twice as long after each late one, up to one a
	// second: at 0, 0.3, 0.9 and 1.9 s, then a second apart.
	g2, _ := NewDeadline("deadline", DeadlineOptions{})
	for range 40 {
		g2.Release(req(), 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 150 * ms, Now: now})
	}
	start = now
	var at []time.Duration
	for i := range 160 { // 4 s at 40 a second; every answer 150 ms, late
		now = start.Add(time.Duration(i) * 25 * ms)
		for len(pending) > 0 && pending[0].at <= now {
			g2.Release(req(), pending[0].p, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 150 * ms, Now: pending[0].at})
			pending = pending[1:]
		}
		if d, p := gatetest.Decide(ctx, g2, req(), now); d.Admitted {
			at = append(at, now.Sub(start))
			pending = append(pending, out{now.Add(150 * ms), p})
		}
	}
	want := []time.Duration{0, 300 * ms, 900 * ms, 1900 * ms, 2900 * ms, 3900 * ms}
	if !slices.Equal(at, want) {
		t.Fatalf("retests of late answers at %v, want %v", at, want)
	}

	// A retest a later gate turned away measured nothing: the next request
	// goes instead.
	r := req()
	d, p := gatetest.Decide(ctx, g2, r, now.Add(time.Second))
	g2.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeRejected, Now: now.Add(time.Second)})
	if d2, _ := gatetest.Decide(ctx, g2, req(), now.Add(time.Second)); !d.Admitted || !d2.Admitted {
		t.Fatalf("a retest, then one after it was turned away later: admitted %v, %v; want both", d.Admitted, d2.Admitted)
	}
}

// Estimates follow a change of service time within a few hundred
// completions, and percentiles land within one bucket (9%).
func TestServiceTimesFollowChange(t *testing.T) {
	st := newServiceTimes()
	for i := range 1000 {
		st.Observe("c", time.Duration(1+i%10)*ms) // 1..10 ms, uniform
	}
	if p, _ := st.Percentile("c", 0.9); p < 9*ms || p > 10*ms*110/100 {
		t.Fatalf("p90 of 1..10 ms: %v", p)
	}
	for range 2000 {
		st.Observe("c", 50*ms)
	}
	if p, _ := st.Percentile("c", 0.5); p < 50*ms || p > 55*ms {
		t.Fatalf("after the service got slower, p50 %v", p)
	}
}

// A request refused for the queue ahead of it is no retest: the queue's
// part is read live, and a retest there cost a tiny service (one worker of
// 50 ms, deadlines of 100 ms) one late answer a second, 5% of its work.
func TestDeadlineNoRetestForTheQueue(t *testing.T) {
	g, _ := NewDeadline("deadline", DeadlineOptions{})
	g.UseQueue(func(string) time.Duration { return 75 * ms })
	ctx := context.Background()
	now := clock.Instant(time.Hour)
	for range 40 {
		g.Release(&sluice.Request{}, 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * ms, Now: now})
	}
	for i := range 300 { // 3 s, 100 a second
		now = clock.Instant(time.Hour + time.Duration(i)*10*ms)
		if d, _ := gatetest.Decide(ctx, g, &sluice.Request{Deadline: now.Add(100 * ms)}, now); d.Admitted {
			t.Fatalf("at +%v: admitted behind 75 ms of queue with 50 ms of work and 100 ms left", time.Duration(i)*10*ms)
		}
	}
}

// The gate reports each class's estimate at its percentile and its
// retest, for GET /v1/gates.
func TestDeadlineReportsItsEstimates(t *testing.T) {
	g, _ := NewDeadline("deadline", DeadlineOptions{})
	now := clock.Instant(time.Hour)
	for range 30 {
		g.Release(&sluice.Request{Class: "default"}, 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Latency: 50 * ms, Now: now})
	}
	r := &sluice.Request{Class: "default", Deadline: now.Add(40 * ms)}
	if d, _ := gatetest.Decide(context.Background(), g, r, now); !d.Admitted || !r.Retest() {
		t.Fatalf("the class's first refusal: %+v, retest %v; want a retest", d, r.Retest())
	}
	st := g.ReportState(now.Add(10 * ms)).(deadlineState)
	if len(st.Classes) != 1 {
		t.Fatalf("state %+v", st)
	}
	c := st.Classes[0]
	if c.Class != "default" || c.Ms < 50 || c.Ms > 55 || c.Samples != 30 || !c.RetestOut || c.LastRetestAgoMs != 10 {
		t.Fatalf("class state %+v; want default at 50-55 ms, 30 samples, a retest out 10 ms ago", c)
	}
}

// A retest the caller cancelled (or that errored) says nothing of how long
// the work takes: the next waits the whole retest interval, not twice its
// latency.
func TestDeadlineCancelledRetestWaitsTheInterval(t *testing.T) {
	g, _ := NewDeadline("deadline", DeadlineOptions{})
	now := clock.Instant(time.Hour)
	for range 30 {
		g.Release(&sluice.Request{Class: "default"}, 0, sluice.Completion{Outcome: sluice.OutcomeLate, Latency: 150 * ms, Now: now})
	}
	req := func() *sluice.Request { return &sluice.Request{Class: "default", Deadline: now.Add(100 * ms)} }
	ctx := context.Background()
	r := req()
	d, p := gatetest.Decide(ctx, g, r, now)
	if !d.Admitted || p == 0 {
		t.Fatalf("the first refusal: %+v; want a retest", d)
	}
	g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeCancelled, Latency: time.Millisecond, Now: now.Add(ms)})
	now = now.Add(500 * ms)
	if d, _ := gatetest.Decide(ctx, g, req(), now); d.Admitted {
		t.Fatal("a retest 500 ms after a cancelled one; want the next after 1 s")
	}
	now = now.Add(500 * ms)
	if d, _ := gatetest.Decide(ctx, g, req(), now); !d.Admitted {
		t.Fatal("no retest 1 s after a cancelled one")
	}
}

// A class that completes once a second or less often (one worker of 1 s,
// a rare costly route) is known to the test: its decayed weight peaks at
// 2 under the default half-life of 1 s, and a threshold of 3 left it
// unknown for good, so a request with a tenth of the time it takes went
// through. Every second, every 2 s: the 100 ms request is refused.
func TestDeadlineKnowsASlowClass(t *testing.T) {
	for _, every := range []time.Duration{2 * time.Second, time.Second, 250 * time.Millisecond} {
		clk := fakeclock.New(int64(time.Hour))
		g, _ := NewDeadline("dl", DeadlineOptions{})
		for range 100 {
			clk.Advance(every)
			g.Release(&sluice.Request{Class: "report"}, 0, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: clk.Now(), Latency: time.Second})
		}
		clk.Advance(time.Millisecond)
		r := &sluice.Request{Class: "report", Deadline: clk.Now().Add(100 * time.Millisecond)}
		if d, _ := gatetest.Decide(context.Background(), g, r, clk.Now()); d.Admitted && !r.Retest() {
			t.Errorf("completions every %v of 1 s: a request with 100 ms left admitted outright", every)
		}
	}
}

// A sparse class (one completion of 300 ms a second) is known again after
// a retest that came back in time (its deadline between the latency and
// the estimate's bucket edge): the cut lasts until fresh samples weigh 3,
// which a sparse class never does, or more than 3 came; it was unknown
// for good, and every doomed request went through.
func TestDeadlineKnowsASlowClassAfterARetest(t *testing.T) {
	clk := fakeclock.New(int64(time.Hour))
	g, _ := NewDeadline("dl", DeadlineOptions{})
	doneO := func(l time.Duration, p sluice.Permit, o sluice.Outcome) {
		g.Release(&sluice.Request{Class: "report"}, p, sluice.Completion{Outcome: o, Now: clk.Now(), Latency: l})
	}
	done := func(l time.Duration, p sluice.Permit) { doneO(l, p, sluice.OutcomeUseful) }
	probe := func(left time.Duration) (bool, bool, sluice.Permit) {
		r := &sluice.Request{Class: "report", Deadline: clk.Now().Add(left)}
		d, p := gatetest.Decide(context.Background(), g, r, clk.Now())
		return d.Admitted, r.Retest(), p
	}
	for range 100 {
		clk.Advance(time.Second)
		done(300*time.Millisecond, 0)
	}
	clk.Advance(time.Millisecond)
	adm, rt, p := probe(100 * time.Millisecond)
	if adm && !rt {
		t.Fatalf("before: 100 ms admitted outright")
	}
	doneO(300*time.Millisecond, p, sluice.OutcomeLate)
	clk.Advance(time.Second)
	done(300*time.Millisecond, 0)
	clk.Advance(time.Millisecond)
	adm, rt, p = probe(300200 * time.Microsecond)
	t.Logf("310 ms left: admitted %v retest %v", adm, rt)
	done(300*time.Millisecond, p) // in time
	for i := range 60 {
		clk.Advance(time.Second)
		done(300*time.Millisecond, 0)
		if i%10 == 9 {
			clk.Advance(time.Millisecond)
			if adm, rt, p := probe(100 * time.Millisecond); adm && !rt {
				t.Errorf("%d s after an in-time retest: a request with 100 ms left (class takes 300 ms) admitted outright", i+1)
			} else if rt {
				doneO(300*time.Millisecond, p, sluice.OutcomeLate)
			}
		}
	}
}
