package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sluice whatif on a recorded log (the command docs/whatif.md shows): the
// table of both runs, the JSON report and the plot; and its mistakes
// answered with what is wrong.
func TestWhatifCommand(t *testing.T) {
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	out, errOut, err := run("whatif", "--log", "../internal/whatif/testdata/sluice.log", "--json", js, "--plot", filepath.Join(dir, "w"),
		"../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "recorded") || !strings.Contains(out, "candidate") || !strings.Contains(out, "request-rate (policy_rate)") ||
		!strings.Contains(out, "are not replayed") || !strings.Contains(errOut, "3 requests (sluice format)") {
		t.Fatalf("%v\n%s\n%s", err, out, errOut)
	}
	for _, f := range []string{"r.json", "w.png", "w.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Fatalf("%s not written", f)
		}
	}
	var rep struct {
		Requests  int64
		Candidate struct{ Admitted, Rejected int64 }
		Baseline  struct {
			Name     string
			Rejected int64
		}
	}
	data, _ := os.ReadFile(js)
	if err := json.Unmarshal(data, &rep); err != nil || rep.Requests != 3 || rep.Baseline.Name != "recorded" || rep.Baseline.Rejected != 2 {
		t.Fatalf("json %v: %s", err, data)
	}
	// --follow: the timing gates decide as the log says.
	out, _, err = run("whatif", "--log", "../internal/whatif/testdata/sluice.log", "--follow", "../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "decided as the recording says (--follow): concurrent-requests, in-time, worker-pool") {
		t.Fatalf("--follow: %v\n%s", err, out)
	}
	// --current replays the policy in force as the baseline.
	out, _, err = run("whatif", "--log", "../internal/whatif/testdata/combined.log", "--current", "../../examples/routes-api.yaml", "../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "current") || !strings.Contains(out, "same decision for 100.00%") {
		t.Fatalf("--current: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"whatif", "../../examples/routes-api.yaml"}, "--log"},
		{[]string{"whatif", "--log", "../internal/whatif/testdata/sluice.log", "nope.yaml"}, "nope.yaml"},
		{[]string{"whatif", "--log", "nope.log", "../../examples/routes-api.yaml"}, "nope.log"},
		{[]string{"whatif", "--log", "../internal/whatif/testdata/sluice.log", "--format", "apache", "../../examples/routes-api.yaml"}, "apache"},
		{[]string{"whatif", "--log", "../internal/whatif/testdata/sluice.log", "--interval", "0s", "../../examples/routes-api.yaml"}, "--interval"},
		{[]string{"whatif", "--log", "../internal/whatif/testdata/combined.log", "--follow", "../../examples/routes-api.yaml"}, "--follow"},
	} {
		if _, _, err := run(c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
