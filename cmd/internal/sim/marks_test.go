package sim

import (
	"testing"

	"github.com/sluice-go/sluice/cmd/internal/goodplot"
)

// A time series' plot marks each change of the configured load (a phase
// of the scenario), at the first step of the new load.
func TestPhaseMarks(t *testing.T) {
	r := &Report{Series: true, Runs: []Run{{Name: "x", Steps: []Row{{T: 0, Load: 100}, {T: 1, Load: 100}, {T: 2, Load: 3000}, {T: 3, Load: 100}}}}}
	got := r.phaseMarks()
	want := []goodplot.Mark{{X: 2, Label: "load 100 → 3000"}, {X: 3, Label: "load 3000 → 100"}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("%+v", got)
	}
	if (&Report{}).phaseMarks() != nil {
		t.Fatal("marks with no runs")
	}
}
