package demo

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/cmd/internal/goodplot"
)

// A step whose load generator fell more than 5% short of its target is
// marked in the table and ringed in the plot, under a legend entry; one
// within 5% is not.
func TestBehindStepsAreMarked(t *testing.T) {
	rep := &Report{CapacityRPS: 1000, Workers: 8, Runs: []RunResult{{Name: "sluice", Steps: []Step{
		{Multiplier: 1, TargetRPS: 1000, OfferedRPS: 960, GoodputRPS: 900},  // 4% short: fine
		{Multiplier: 2, TargetRPS: 2000, OfferedRPS: 1238, GoodputRPS: 950}, // 38% short
	}}}}
	var b strings.Builder
	rep.WriteTable(&b)
	lines := strings.Split(b.String(), "\n")
	var one, two string
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "  1.0x"):
			one = l
		case strings.HasPrefix(l, "  2.0x"):
			two = l
		}
	}
	if strings.Contains(one, "(!)") || !strings.HasSuffix(two, "(!)") || !strings.Contains(b.String(), "on 1 step(s) the load generator sent less than 95%") {
		t.Fatalf("table:\n%s", b.String())
	}
	svg := filepath.Join(t.TempDir(), "p.svg")
	if err := rep.WritePlot(svg); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(svg); !bytes.Contains(data, []byte("load generator behind")) {
		t.Fatal("the plot has no legend entry for the step behind")
	}
	rep.Runs[0].Steps[1].OfferedRPS = 1990
	if err := rep.WritePlot(svg); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(svg); bytes.Contains(data, []byte("load generator behind")) {
		t.Fatal("a legend entry for steps behind with none behind")
	}
	if goodplot.BehindLabel != "load generator behind (< 95% of target)" {
		t.Fatal(goodplot.BehindLabel)
	}
}

// The service-time step's plot marks both changes of the service time,
// and its table the rows where it changes.
func TestServiceStepMarksPhases(t *testing.T) {
	rep := &StepReport{Workers: 8, Changes: []int{2, 4}}
	for i, svc := range []float64{5, 5, 25, 25, 5, 5} {
		rep.Rows = append(rep.Rows, StepRow{T: float64(i), ServiceMs: svc, CapacityPS: 8000 / svc, TargetRPS: 960, OfferedRPS: 960, GoodputRPS: 300, Limit: 8})
	}
	rep.Rows[3].OfferedRPS = 500
	rep.Behind = 1
	var b strings.Builder
	rep.WriteTable(&b)
	if n := strings.Count(b.String(), "<- service time steps"); n != 2 || strings.Count(b.String(), "(!)") != 2 { // row 3 and the note
		t.Fatalf("table:\n%s", b.String())
	}
	svg := filepath.Join(t.TempDir(), "s.svg")
	if err := rep.WritePlot(svg); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(svg)
	for _, want := range []string{"service 5 → 25 ms", "service 25 → 5 ms", "load generator behind"} {
		if !bytes.Contains(data, []byte(want)) {
			t.Errorf("the plot has no %q", want)
		}
	}
}
