package sim

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/cmd/internal/settle"
)

// The service-time step (5 ms → 25 ms for 30 s at three times the slow
// capacity) under the demo's own policy: goodput holds through the step
// from its third second on (the limit's window of a second in which the
// step falls shows it, and the next holds the two probes that tell a
// slower service from a smaller one; a step on a probe slot's boundary, as
// this one at 30 s, would pass a second earlier only by that chance),
// everything offered is served
// outside it, from the first second (the limit's startup doubles every few
// round trips), and while the step binds the limit's median stays where
// the service is full without a queue: its 8 workers, plus at most a
// quarter (the service's size did not change, its speed did).
func TestServiceStep(t *testing.T) {
	s := builtin(t, "service-step")
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "routes-api")})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Runs[1].Steps
	const up, down = 30, 60 // the rows where the service time changes
	slowCap := float64(s.Workers) / 0.025
	var limits []int
	for _, r := range rows[up+2 : down] {
		if r.Goodput < 0.85*slowCap {
			t.Errorf("t=%vs: goodput %.0f < 85%% of the slow capacity %.0f", r.T, r.Goodput, slowCap)
		}
		limits = append(limits, r.Limit)
	}
	for _, r := range rows {
		if (r.T < up || r.T >= down+1) && r.Goodput < 0.95*r.Offered {
			t.Errorf("t=%vs: goodput %.0f of %.0f offered outside the step", r.T, r.Goodput, r.Offered)
		}
	}
	slices.Sort(limits)
	if med := limits[len(limits)/2]; med < s.Workers || float64(med) > 1.25*float64(s.Workers)+1 {
		t.Errorf("median limit %d through the step, want [%d, %.0f]", med, s.Workers, 1.25*float64(s.Workers)+1)
	}
	for _, ch := range []settle.Settling{Settle(rows, up, down), Settle(rows, down, len(rows))} {
		t.Logf("after row %d: settled at %d within %d windows, swing %d after", ch.From, ch.Final, ch.Windows, ch.Swing)
	}
}

// The free and premium example on the Mercury model, under
// examples/mercury.yaml's reservations (premium 2,400 units/s, free 1,560,
// 40 kept back): the split while both are busy, free borrowing what premium
// leaves, and premium's reserve back as soon as it returns. Each phase's
// mean from its second second on is within 5% of the reservation's
// promise, and the 800 / 1,600 queries/s split.
func TestReservationScenario(t *testing.T) {
	s := builtin(t, "reservation")
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "mercury")})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Runs[1].Steps
	mean := func(from, to, class int) float64 {
		sum := 0.0
		for _, r := range rows[from:to] {
			sum += r.Classes[class].Goodput
		}
		return sum / float64(to-from)
	}
	const premium, free = 0, 1
	usable := 3960.0
	for _, c := range []struct {
		what     string
		from, to int
		class    int
		want     float64
	}{
		{"premium, both busy (800 queries/s)", 1, 20, premium, 2400},
		{"free, both busy (1,600 queries/s)", 1, 20, free, 1600},
		{"premium at 400 queries/s", 21, 40, premium, 1200},
		{"free borrowing what premium leaves", 21, 40, free, usable - 1200},
		{"premium back", 41, 60, premium, 2400},
		{"free after the reclaim", 41, 60, free, 1600},
	} {
		got := mean(c.from, c.to, c.class)
		t.Logf("%s: %.0f units/s (want %.0f)", c.what, got, c.want)
		if math.Abs(got-c.want) > 0.05*c.want {
			t.Errorf("%s: %.0f units/s, want %.0f ± 5%%", c.what, got, c.want)
		}
	}
	// Within the revocation time (500 ms) of coming back, premium admits its
	// reserve: the first second back has at least 95% of it.
	if got := rows[40].Classes[premium].Admitted; got < 0.95*2400 {
		t.Errorf("premium's first second back: %.0f units/s admitted, want ≥ 95%% of 2,400", got)
	}
}

// A policy whose routes match none of the scenario's requests says so: the
// classes run as class default at cost 1, which would make any figure of
// the run meaningless without the note.
func TestUnmatchedRoutesAreNoted(t *testing.T) {
	s := builtin(t, "reservation")
	s.Phases = s.Phases[:1]
	s.Length = 2 * s.Interval
	pol := &Policy{Name: "gold.yaml", Data: []byte("version: 1\nroutes:\n  - {match: {path: \"/gold/*\"}, class: critical}\ngates:\n  - {name: c, kind: concurrency, limit: 100}\n")}
	rep, err := Simulate(s, Options{Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rep.Note, "no route of gold.yaml matches scenario class premium") {
		t.Fatalf("note %q", rep.Note)
	}
	rep, _ = Simulate(s, Options{Policy: examplePolicy(t, "mercury")})
	if rep.Note != "" {
		t.Fatalf("mercury.yaml matches every class, yet: %q", rep.Note)
	}
}
