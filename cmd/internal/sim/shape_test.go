package sim

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/cmd/internal/demo"
)

// The simulator and the real demo (real HTTP, real goroutines, an
// open-loop load generator) agree on the shape of the curve: at every
// overloaded step, admission keeps more useful work than no admission, in
// both. Small scale: 4 workers, 2x and 5x capacity.
func TestSimAndDemoAgree(t *testing.T) {
	if testing.Short() {
		t.Skip("real load for several seconds")
	}
	multiples := []float64{2, 5}
	// Both with 4 workers, under the demo's own policy: its adaptive limit
	// sizes itself to the smaller pool.
	pol := examplePolicy(t, "routes-api").Data

	s := builtin(t, "routes-api")
	s.Workers = 4
	s.Step, s.Warmup = 10*time.Second, 2*time.Second
	d, err := s.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	s.Loads = nil
	for _, m := range multiples {
		s.Loads = append(s.Loads, m*d.ModeledCapacity())
	}
	simRep, err := Simulate(s, Options{Policy: &Policy{Name: "routes-api.yaml", Data: pol}})
	if err != nil {
		t.Fatal(err)
	}
	demoRep, err := demo.Run(context.Background(), demo.Options{
		Policy: pol, Workers: 4, Multipliers: multiples,
		Step: 3 * time.Second, CapacityWindow: 2 * time.Second, Tenants: 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range multiples {
		sNo, sYes := simRep.Runs[0].Steps[i].Goodput, simRep.Runs[1].Steps[i].Goodput
		dNo, dYes := demoRep.Runs[0].Steps[i].GoodputRPS, demoRep.Runs[1].Steps[i].GoodputRPS
		t.Logf("%.0fx: sim goodput %.0f without, %.0f with admission; demo %.0f without, %.0f with", m, sNo, sYes, dNo, dYes)
		if sYes <= sNo {
			t.Errorf("sim at %.0fx: admission %.0f ≤ no admission %.0f", m, sYes, sNo)
		}
		if dYes <= dNo {
			t.Errorf("demo at %.0fx: admission %.0f ≤ no admission %.0f", m, dYes, dNo)
		}
	}
}
