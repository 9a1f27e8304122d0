package shed

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"

	"github.com/sluice-go/sluice"
)

func newLadder(t *testing.T) *Ladder {
	t.Helper()
	l, err := NewLadder("ladder", LadderConfig{Workers: 8, Rand: func() float64 { return 0.6 }})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Through the gate: SHED rejects non-protected requests and admits
// critical ones at level shed; RECOVER admits the step's share.
func TestLadderDecisions(t *testing.T) {
	l := newLadder(t)
	ctx := context.Background()
	gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 0) // starts the clock
	l.mu.Lock()
	l.toLocked(0, sluice.LevelShed)
	l.mu.Unlock()
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 1); d.Admitted || d.Reason != sluice.ReasonOverload || d.Level != sluice.LevelShed {
		t.Fatalf("shed: %+v", d)
	}
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: sluice.ClassCritical}, 1); !d.Admitted || d.Level != sluice.LevelShed {
		t.Fatalf("critical in shed: %+v", d)
	}
	l.mu.Lock()
	l.toLocked(2, sluice.LevelRecover)
	l.mu.Unlock()
	// Rand returns 0.6: step 0 admits 25% (0.6 ≥ 0.25: shed), step 2 admits 75%.
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 3); d.Admitted {
		t.Fatal("recover step 0 admitted at draw 0.6")
	}
	l.mu.Lock()
	l.step = 2
	l.mu.Unlock()
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 4); !d.Admitted || d.Level != sluice.LevelRecover {
		t.Fatalf("recover step 2: %+v", d)
	}
	st := l.State(5 * sec)
	if st.Level != sluice.LevelRecover || st.Spent[sluice.LevelRecover] == 0 || len(st.History) != 2 {
		t.Fatalf("%+v", st)
	}
}

// Demand, not admitted work: shedding does not lower the reading.
func TestLadderMeasuresDemand(t *testing.T) {
	l, _ := NewLadder("ladder", LadderConfig{Workers: 2, SampleEvery: time.Second, MinDwell: time.Second})
	ctx := context.Background()
	r := &sluice.Request{Class: "default"}
	type job struct{ end clock.Instant }
	var running []job
	now := clock.Instant(0)
	// Offered: 4 requests per second of 0.5 s each = 2 busy workers = demand 1.
	step := func(n int) {
		for range n {
			now += sec / 4
			kept := running[:0]
			for _, j := range running {
				if j.end <= now {
					l.Release(r, 1, sluice.Completion{Now: j.end, Latency: time.Second / 2})
				} else {
					kept = append(kept, j)
				}
			}
			running = kept
			if d, _ := gatetest.Decide(ctx, l, r, now); d.Admitted {
				running = append(running, job{end: now + sec/2})
			}
		}
	}
	step(40)
	if st := l.State(now); st.Level != sluice.LevelShed || st.Pressure < 0.95 {
		t.Fatalf("did not reach shed on demand: %+v", st)
	}
	// The same offered load while shedding: demand stays high, SHED holds.
	step(40)
	if st := l.State(now); st.Level != sluice.LevelShed || st.Pressure < 0.95 {
		t.Fatalf("left SHED while the overload lasted: %+v", st)
	}
}

func TestLadderConfigErrors(t *testing.T) {
	for _, c := range []LadderConfig{
		{}, {Workers: 1, DegradeEnter: 0.7, DegradeExit: 0.8}, {Workers: 1, ShedEnter: 0.9, ShedExit: 0.95},
		{Workers: 1, DegradeEnter: 0.99, ShedEnter: 0.9, ShedExit: 0.8}, {Workers: 1, RecoverSteps: []float64{0.5, 0.25}},
		{Workers: 1, RecoverSteps: []float64{1.5}}, {Workers: 1, MinDwell: -1},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// The demand of a shed request is the latency of its own class: with only
// a costly protected class admitted (200 ms), a shed cheap request (10 ms
// when it was admitted) adds 10 ms of work, not 200.
func TestShedDemandPerClass(t *testing.T) {
	m := newMeter(8, time.Second, true)
	for range 200 {
		m.admit()
		m.release("cheap", 10*time.Millisecond)
	}
	for range 200 {
		m.admit()
		m.release("critical", 200*time.Millisecond)
	}
	m.area = 0
	m.shed("cheap")
	if got := time.Duration(m.area); got < 9*time.Millisecond || got > 11*time.Millisecond {
		t.Fatalf("shed cheap request counted %v of work, want its class's 10ms", got)
	}
	m.area = 0
	m.shed("never-admitted")
	if got := time.Duration(m.area); got < 100*time.Millisecond {
		t.Fatalf("a class never admitted counts the overall mean, got %v", got)
	}
}

// cutSpy records the fractions a shedder hands its cut, and sheds above
// one half.
type cutSpy struct{ fractions []float64 }

func (c *cutSpy) Shed(_ *sluice.Request, f float64, _ clock.Instant) bool {
	c.fractions = append(c.fractions, f)
	return f > 0.5
}

// With a Cut, RECOVER hands it the fraction its step does not admit (1 −
// the step's share) for non-protected requests, and never a protected one.
func TestLadderRecoverUsesItsCut(t *testing.T) {
	cut := &cutSpy{}
	l, err := NewLadder("ladder", LadderConfig{Workers: 8, Cut: cut})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 0)
	l.mu.Lock()
	l.toLocked(1, sluice.LevelRecover)
	l.mu.Unlock()
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 2); d.Admitted {
		t.Fatal("step 0 (25% admitted): the cut at 0.75 did not shed")
	}
	l.mu.Lock()
	l.step = 2
	l.mu.Unlock()
	if d, _ := gatetest.Decide(ctx, l, &sluice.Request{Class: "default"}, 3); !d.Admitted {
		t.Fatal("step 2 (75% admitted): shed at 0.25")
	}
	gatetest.Decide(ctx, l, &sluice.Request{Class: sluice.ClassCritical}, 4)
	if len(cut.fractions) != 2 || cut.fractions[0] != 0.75 || cut.fractions[1] != 0.25 {
		t.Fatalf("cut saw %v, want [0.75 0.25]", cut.fractions)
	}
}
