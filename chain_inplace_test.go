package sluice_test

import (
	"context"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

// scripted is a gate whose verdicts a test sets: it records whether the
// Decision it was handed was the zero Decision (the Gate contract), and
// counts its releases by outcome.
type scripted struct {
	name     string
	verdict  sluice.Decision // written as is when admitting or rejecting
	spends   bool            // SpendsAtAdmission
	dirty    atomic.Int64    // calls whose *d was not zero on entry
	released [sluice.OutcomeRejected + 1]atomic.Int64
	costs    atomic.Int64 // releases that carried a cost
}

func (g *scripted) Name() string { return g.name }

func (g *scripted) Decide(_ context.Context, _ *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	if *d != (sluice.Decision{}) {
		g.dirty.Add(1)
	}
	*d = g.verdict
	if d.Admitted {
		return 7
	}
	return 0
}

func (g *scripted) Release(_ *sluice.Request, p sluice.Permit, c sluice.Completion) {
	if p != 7 {
		panic(fmt.Sprintf("%s: released permit %d", g.name, p))
	}
	g.released[c.Outcome].Add(1)
	if c.Cost > 0 {
		g.costs.Add(1)
	}
}

func (g *scripted) SpendsAtAdmission() bool { return g.spends }

// reference is what a chain decides over verdicts vs with modes ms, by the
// rule Chain.Decide documents: the first enforcing refusal, else the
// tightest admitting verdict with a quota (per caller first) with the
// highest level of all, computed in floating point.
func reference(vs []sluice.Decision, ms []sluice.Mode) sluice.Decision {
	best := sluice.Decision{Admitted: true}
	level := sluice.LevelNormal
	for i, v := range vs {
		switch {
		case ms[i] == sluice.ModeOff:
		case !v.Admitted && ms[i] == sluice.ModeEnforce:
			v.EffectPossible = false
			return v
		case !v.Admitted:
		case v.Limit <= 0:
			level = max(level, v.Level)
		default:
			level = max(level, v.Level)
			if best.Limit <= 0 || (v.Scope.PerCaller() && !best.Scope.PerCaller()) ||
				(v.Scope.PerCaller() == best.Scope.PerCaller() &&
					float64(v.Remaining)/float64(v.Limit) < float64(best.Remaining)/float64(best.Limit)) {
				best = v
			}
		}
	}
	best.Admitted, best.Level = true, level
	return best
}

// TestChainVerdictsInPlace: for any gates' verdicts and modes, every gate
// is handed the zero Decision, the chain's decision is the documented one,
// and the permits of admitting gates are released exactly once: at the
// refusal, or when the work ends (a gate that spends at admission only for
// a refusal, the work turned away after admission included, or a cost).
func TestChainVerdictsInPlace(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(1, sluice.MaxGates).Draw(rt, "gates")
		gs := make([]sluice.Gate, n)
		sc := make([]*scripted, n)
		vs := make([]sluice.Decision, n)
		ms := make([]sluice.Mode, n)
		modes := map[string]sluice.Mode{}
		for i := range n {
			lim := rapid.Int64Range(0, 1<<40).Draw(rt, "limit")
			v := sluice.Decision{
				Admitted:  rapid.Float64Range(0, 1).Draw(rt, "p") < 0.85,
				Scope:     sluice.Scope(rapid.IntRange(0, 5).Draw(rt, "scope")),
				Gate:      fmt.Sprint("g", i),
				Limit:     lim,
				Remaining: rapid.Int64Range(0, lim).Draw(rt, "remaining"),
				Level:     sluice.Level(rapid.IntRange(0, 3).Draw(rt, "level")),
				Window:    time.Duration(i + 1),
			}
			if !v.Admitted {
				v.Reason, v.Retryable, v.EffectPossible = sluice.ReasonPolicyRate, true, true
				v.Level = 0
			}
			vs[i] = v
			ms[i] = sluice.Mode(rapid.IntRange(0, 2).Draw(rt, "mode"))
			modes[v.Gate] = ms[i]
			sc[i] = &scripted{name: v.Gate, verdict: v, spends: rapid.Bool().Draw(rt, "spends")}
			gs[i] = sc[i]
		}
		clk := &fakeclock.Clock{}
		c, err := sluice.NewChain(sluice.ChainOptions{Clock: clk, Modes: modes}, gs...)
		if err != nil {
			rt.Fatal(err)
		}
		cost := rapid.Int64Range(0, 3).Draw(rt, "done cost")
		// The work ends useful, or is turned away after its admission
		// (a server that admitted it and then could not start it).
		outcome := rapid.SampledFrom([]sluice.Outcome{sluice.OutcomeUseful, sluice.OutcomeRejected}).Draw(rt, "outcome")
		for range 2 { // the second decision reuses the first's ticket
			d, tk := c.Decide(context.Background(), &sluice.Request{Tenant: "a"})
			if want := reference(vs, ms); d != want {
				rt.Fatalf("decided %+v, want %+v", d, want)
			}
			if d.Admitted != tk.Valid() {
				rt.Fatalf("admitted %v with a valid ticket %v", d.Admitted, tk.Valid())
			}
			tk.DoneCost(outcome, cost)
		}
		refused := false
		for i, g := range sc {
			if g.dirty.Load() != 0 {
				rt.Fatalf("%s was handed a used Decision %d times", g.name, g.dirty.Load())
			}
			decided := ms[i] != sluice.ModeOff && !refused
			if decided && !vs[i].Admitted && ms[i] == sluice.ModeEnforce {
				refused = true
				continue
			}
			held := decided && vs[i].Admitted
			var wantRejected, wantUseful int64
			switch {
			case !held:
			case refusedLater(vs, ms, i) || outcome == sluice.OutcomeRejected:
				wantRejected = 2
			case !g.spends || cost > 0:
				wantUseful = 2
			}
			if got := g.released[sluice.OutcomeRejected].Load(); got != wantRejected {
				rt.Fatalf("%s: %d releases as rejected, want %d", g.name, got, wantRejected)
			}
			if got := g.released[sluice.OutcomeUseful].Load(); got != wantUseful {
				rt.Fatalf("%s: %d useful releases, want %d", g.name, got, wantUseful)
			}
		}
	})
}

// refusedLater reports whether an enforcing gate after i refuses.
func refusedLater(vs []sluice.Decision, ms []sluice.Mode, i int) bool {
	for j := i + 1; j < len(vs); j++ {
		if ms[j] == sluice.ModeEnforce && !vs[j].Admitted {
			return true
		}
	}
	return false
}

// countingClock counts its readings.
type countingClock struct {
	fakeclock.Clock
	reads atomic.Int64
}

func (c *countingClock) Now() clock.Instant {
	c.reads.Add(1)
	return c.Clock.Now()
}

// TestChainSpentAtAdmissionReadsOneClock: a chain of rate gates without an
// observer reads the clock once per request (at the decision), calls no
// Release when the work ends, and still trues a cost up; with an observer,
// or a gate that holds something, it reads the clock at completion too.
func TestChainSpentAtAdmissionReadsOneClock(t *testing.T) {
	clk := &countingClock{}
	rate := rateGate(t, "rate", "1000/s", 1000, sluice.ScopeTenant)
	c, err := sluice.NewChain(sluice.ChainOptions{Clock: clk}, rate, rateGate(t, "rate2", "1000/s", 1000, sluice.ScopeService))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for range 10 {
		d, tk := c.Decide(ctx, &sluice.Request{Tenant: "a", Cost: 2})
		if !d.Admitted || !tk.Done(sluice.OutcomeUseful) {
			t.Fatalf("decided %+v", d)
		}
	}
	if got := clk.reads.Load(); got != 10 {
		t.Errorf("%d clock readings for 10 requests through rate gates, want 10", got)
	}
	// A true-up still reaches the gate: 2 taken, 5 spent, 993 left.
	_, tk := c.Decide(ctx, &sluice.Request{Tenant: "b", Cost: 2})
	tk.DoneCost(sluice.OutcomeUseful, 5)
	if d, _ := c.Decide(ctx, &sluice.Request{Tenant: "b", Cost: 1}); d.Remaining != 1000-5-1 {
		t.Errorf("after a true-up to 5 and one more, %d remaining at the tightest, want %d", d.Remaining, 1000-5-1)
	}

	for name, opts := range map[string]struct {
		obs   sluice.Observer
		gates []sluice.Gate
	}{
		"observer":                    {obs: nopObserver{}, gates: []sluice.Gate{rate}},
		"a gate holds":                {gates: []sluice.Gate{rate, concGate(t, "pool", 10, sluice.ScopeService)}},
		"a gate that holds, scripted": {gates: []sluice.Gate{&scripted{name: "holds", verdict: sluice.Decision{Admitted: true}}}},
	} {
		clk.reads.Store(0)
		c, err := sluice.NewChain(sluice.ChainOptions{Clock: clk, Observer: opts.obs}, opts.gates...)
		if err != nil {
			t.Fatal(err)
		}
		_, tk := c.Decide(ctx, &sluice.Request{Tenant: "c"})
		tk.Done(sluice.OutcomeUseful)
		if got := clk.reads.Load(); got < 2 {
			t.Errorf("%s: %d clock readings for a decision and its completion, want 2 or more", name, got)
		}
	}
}

type nopObserver struct{}

func (nopObserver) Decided(*sluice.Request, *sluice.Decision, time.Duration) {}
func (nopObserver) ShadowRejected(*sluice.Request, *sluice.Decision)         {}
func (nopObserver) Done(*sluice.Request, sluice.Completion)                  {}

// seer is a gate that keeps a copy of the request it was handed.
type seer struct{ saw sluice.Request }

func (g *seer) Name() string { return "seer" }
func (g *seer) Decide(_ context.Context, r *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	g.saw = *r
	d.Admitted = true
	return 0
}
func (g *seer) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// TestGatesSeeTheWholeRequest: the chain copies the caller's request a
// field at a time (for the store buffer's sake), and a field added to
// Request without its copy would reach the gates as zero. Every exported
// field is set here, by reflection, so a new one is checked too.
func TestGatesSeeTheWholeRequest(t *testing.T) {
	var r sluice.Request
	v := reflect.ValueOf(&r).Elem()
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanSet() {
			continue
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString(fmt.Sprintf("field-%d", i))
		case reflect.Int64:
			f.SetInt(int64(1000 + i)) // a valid cost; a deadline ahead of the clock
		default:
			t.Fatalf("Request.%s: kind %v: teach this test to set it", v.Type().Field(i).Name, f.Kind())
		}
	}
	g := &seer{}
	c, err := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(0)}, g)
	if err != nil {
		t.Fatal(err)
	}
	want := r
	d, tk := c.Decide(context.Background(), &r)
	if !d.Admitted {
		t.Fatalf("rejected: %+v", d)
	}
	tk.Done(sluice.OutcomeUseful)
	if g.saw != want {
		t.Fatalf("the gate saw %+v, the caller sent %+v", g.saw, want)
	}
}

// The chain clears a request's retest mark when it begins deciding it,
// also when it refuses the request as invalid before any gate runs.
func TestInvalidRequestClearsTheRetestMark(t *testing.T) {
	c, err := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(0)}, &seer{})
	if err != nil {
		t.Fatal(err)
	}
	r := sluice.Request{Tenant: "a", Cost: -1}
	r.MarkRetest()
	if d, _ := c.Decide(context.Background(), &r); d.Admitted || d.Reason != sluice.ReasonInvalid {
		t.Fatalf("a cost of -1: %+v", d)
	}
	if r.Retest() {
		t.Error("the mark of an earlier decision outlived the refusal of an invalid request")
	}
}
