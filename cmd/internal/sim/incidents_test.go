package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/examples"
)

// Every shipped example policy with an adaptive gate (the demo's default,
// routes-api, among them) through every incident of the library, at the
// reduced length CI runs (long phases 4 minutes; the full hour is `sluice
// sim --incidents`, BENCHMARKS.md): each judged minute keeps goodput at
// 90% of min(offered, capacity) and late work under 5%, and admission is
// full again within 30 s of an overload's end.
func TestIncidentLibrary(t *testing.T) {
	var policies []string
	for _, name := range examples.Names() {
		data, _, _ := examples.ByName(name)
		if strings.Contains(string(data), "kind: adaptive_concurrency") {
			policies = append(policies, name)
		}
	}
	if len(policies) == 0 {
		t.Fatal("no example policy with an adaptive gate")
	}
	for _, name := range policies {
		pol := examplePolicy(t, name)
		for _, in := range Incidents() {
			t.Run(name+"/"+in.Name, func(t *testing.T) {
				t.Parallel()
				res, err := RunIncident(in, pol, true, 0)
				if err != nil {
					t.Fatal(err)
				}
				if len(res.Minutes) == 0 {
					t.Fatal("no minute judged")
				}
				for _, f := range res.Failures {
					t.Error(f)
				}
				t.Logf("worst goodput %.1f%%, worst late %.2f%%, recoveries %v", 100*res.WorstGoodput, 100*res.WorstLate, res.Recoveries)
			})
		}
	}
}

// The judge fails what fails: a minute of goodput under the bar, late work
// over it, and an overload that never gives way to full admission.
func TestIncidentJudge(t *testing.T) {
	s := incidentBase("judge", "")
	phases(&s, false, span{3 * time.Minute, false, Phase{Load: 600}}, span{3 * time.Minute, false, Phase{Load: 100}})
	s, err := s.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	rows := make([]Row, int(s.Length/time.Second))
	for i := range rows {
		rows[i] = Row{Offered: 600, Attempts: 600, Goodput: 200, Started: 200, Rejected: map[string]float64{"queue": 400}}
		if i >= 180 {
			rows[i] = Row{Offered: 100, Attempts: 100, Goodput: 100, Started: 100, Rejected: map[string]float64{}}
		}
	}
	for i := 150; i < 160; i++ { // 10 bad seconds in the overload's third minute
		rows[i].Goodput, rows[i].Late = 0, 200
	}
	for i := 180; i < 220; i++ { // 40 s before admission is full again
		rows[i].Rejected["queue"] = 50
	}
	res := IncidentResult{Rows: rows}
	judge(&res, &s)
	if res.Pass || len(res.Recoveries) != 1 || res.Recoveries[0] != 40 {
		t.Fatalf("%+v", res)
	}
	got := strings.Join(res.Failures, "\n")
	for _, want := range []string{"minute at 2m0s: goodput", "minute at 2m0s: 16.7% of started work late", "admission full again after 40 s"} {
		if !strings.Contains(got, want) {
			t.Errorf("failures %q lack %q", got, want)
		}
	}
}

// The model against a real run: over real HTTP, sluice proxy as it was
// (slots freed at the caller's deadline, requests booked as errored, the
// routes-api policy on gradient2), in front of the demo's upstream at 3x
// capacity, held 196 req/s for 6 minutes, 130 in the 7th and none from the
// 8th on, its limit frozen at 99. Modeled the same way (release_at_deadline)
// the simulator collapses between minutes 7 and 10, its limit frozen at
// 100; with the slot held to the upstream's answer and the shipped policy,
// goodput holds.
func TestModelReproducesTheProxyCollapse(t *testing.T) {
	s := RoutesAPI
	s.Name, s.Loads, s.Reference, s.ReferenceName = "collapse", nil, nil, ""
	s.Client.Arrivals = "uniform"
	s.Phases = []Phase{{Load: 600}}
	s.Length, s.Interval = 12*time.Minute, time.Minute
	old := s
	old.Server.ReleaseAtDeadline = true
	data, _, _ := examples.ByName("routes-api")
	gradient2 := strings.Replace(string(data), "kind: adaptive_concurrency,", "kind: adaptive_concurrency, controller: gradient2, smoothing: 0.5,", 1)
	gradient2 = strings.Replace(gradient2, "  - {name: in-time, kind: deadline, percentile: 90%}\n", "", 1)            // as it shipped
	gradient2 = strings.Replace(gradient2, "queue: {max_wait: 200ms}", "queue: {max_wait: 200ms, percentile: 50%}", 1) // the queue's default then
	rep, err := Simulate(old, Options{Policy: &Policy{Name: "routes-api-gradient2.yaml", Data: []byte(gradient2)}, PolicyOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Runs[0].Steps
	collapsed := -1
	for i, r := range rows {
		if r.Goodput < 20 {
			collapsed = i + 1
			break
		}
	}
	if rows[2].Goodput < 180 || collapsed < 7 || collapsed > 10 {
		t.Errorf("as sluice proxy was: minute 3 goodput %.0f, collapse in minute %d; real HTTP: 196 then 0 from the 8th", rows[2].Goodput, collapsed)
	}
	rep, err = Simulate(s, Options{Policy: examplePolicy(t, "routes-api"), PolicyOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rep.Runs[0].Steps[1:] {
		if r.Goodput < 180 {
			t.Errorf("held slots, shipped policy: minute %d goodput %.0f", i+2, r.Goodput)
		}
	}
}
