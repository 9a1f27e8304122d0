package sim

import (
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// Small policies, one per kind of gate the engine must drive: a bucket,
// a concurrency limit (permits released on every path), a leased bucket
// (shared by the processes, refreshed as it decides), a paced queue
// (the engine schedules its wait on the virtual clock), a shedder, and wait
// queues in front of a static and an adaptive limit (requests park and are
// woken by releases).
var propPolicies = []*Policy{
	nil,
	{Name: "bucket.yaml", Data: []byte("version: 1\nidentity: {tenant: {header: X-Api-Key}}\ngates:\n  - {name: rate, kind: token_bucket, scope: tenant, rate: 20/s, burst: 40}\n")},
	{Name: "inflight.yaml", Data: []byte("version: 1\ngates:\n  - {name: inflight, kind: concurrency, scope: service, limit: 6}\n")},
	{Name: "queued.yaml", Data: []byte("version: 1\ngates:\n  - {name: inflight, kind: concurrency, scope: service, limit: 4, queue: {max_wait: 80ms, max_len: 30}}\n")},
	{Name: "adaptive.yaml", Data: []byte(`version: 1
routes:
  - {match: {path: /c0}, class: critical}
gates:
  - {name: pool, kind: adaptive_concurrency, controller: gradient2, min: 2, max: 40, initial: 4, window: 200ms, queue: {max_wait: 50ms, classes: [critical]}}
`)},
	{Name: "leased.yaml", Data: []byte("version: 1\ngates:\n  - {name: fleet, kind: token_bucket, scope: service, rate: 100/s, burst: 20, lease: {time: 1s}}\n")},
	{Name: "paced.yaml", Data: []byte("version: 1\ngates:\n  - {name: paced, kind: leaky_bucket, scope: service, rate: 150/s, queue: 20}\n")},
	{Name: "shed.yaml", Data: []byte(`version: 1
routes:
  - {match: {path: /c0}, class: sheddable}
  - {match: {path: /c2}, class: critical}
gates:
  - {name: busy, kind: utilization, source: workers, workers: 4, good: 0.7, bad: 0.8, delay: 1s, shed_all_after: 5s, sample_every: 250ms, tiers: [sheddable, default, critical]}
`)},
}

func genDist(t *rapid.T, label string, mean time.Duration) Dist {
	switch rapid.IntRange(0, 4).Draw(t, label+".kind") {
	case 0:
		return Const(mean)
	case 1:
		return Dist{Kind: "exponential", Mean: mean}
	case 2:
		return Dist{Kind: "lognormal", Mean: mean, CV: rapid.Float64Range(0.1, 2).Draw(t, label+".cv")}
	case 3:
		return Dist{Kind: "uniform", Min: mean / 2, Max: mean * 3 / 2}
	default:
		return Dist{Kind: "loguniform", Min: mean / 4, Max: mean * 2}
	}
}

// genScenario draws a small random service and client: every mechanism of
// the model appears in some draws.
func genScenario(t *rapid.T) Scenario {
	s := Scenario{
		Name:    "prop",
		Unit:    "req",
		Workers: rapid.IntRange(1, 12).Draw(t, "workers"),
		Server: Server{
			CheckQueue:  rapid.Bool().Draw(t, "check_queue"),
			ScanCost:    time.Duration(rapid.IntRange(0, 2000).Draw(t, "scan_us")) * time.Microsecond,
			CancelPoint: rapid.SampledFrom([]float64{0, 0.3, 0.9}).Draw(t, "cancel_point"),
		},
		Client: Client{
			Timeout:          genDist(t, "timeout", time.Duration(rapid.IntRange(20, 800).Draw(t, "timeout_ms"))*time.Millisecond),
			Attempts:         rapid.IntRange(1, 4).Draw(t, "attempts"),
			Backoff:          time.Duration(rapid.IntRange(1, 300).Draw(t, "backoff_ms")) * time.Millisecond,
			Budget:           rapid.SampledFrom([]float64{0, 0.05, 1}).Draw(t, "budget"),
			RetryOn:          rapid.SliceOfDistinct(rapid.SampledFrom([]string{"timeout", "overload", "policy"}), rapid.ID[string]).Draw(t, "retry_on"),
			IgnoreRetryAfter: rapid.Bool().Draw(t, "ignore_retry_after"),
			Arrivals:         rapid.SampledFrom([]string{"poisson", "uniform"}).Draw(t, "arrivals"),
		},
		Step: 3 * time.Second,
		Seed: rapid.Uint64Range(1, 1<<40).Draw(t, "seed"),
	}
	for i := range rapid.IntRange(1, 3).Draw(t, "classes") {
		c := Class{
			Name:    fmt.Sprintf("c%d", i),
			Path:    fmt.Sprintf("/c%d", i),
			Units:   int64(rapid.IntRange(1, 3).Draw(t, "units")),
			Share:   rapid.Float64Range(0.1, 10).Draw(t, "share"),
			Tenants: rapid.IntRange(1, 5).Draw(t, "tenants"),
			Service: genDist(t, "service", time.Duration(rapid.IntRange(1, 40).Draw(t, "service_ms"))*time.Millisecond),
		}
		s.Classes = append(s.Classes, c)
	}
	// One process, or a few in front of the service, evenly or not.
	s.Processes = rapid.IntRange(1, 3).Draw(t, "processes")
	if s.Processes > 1 && rapid.Bool().Draw(t, "uneven") {
		s.Balance = []float64{rapid.Float64Range(0.1, 5).Draw(t, "weight")}
		for range s.Processes - 1 {
			s.Balance = append(s.Balance, rapid.SampledFrom([]float64{0, 0.5, 1, 4}).Draw(t, "weight"))
		}
	}
	if raceEnabled {
		s.Step = time.Second
	}
	s.Loads = []float64{1}
	d, err := s.withDefaults()
	if err != nil {
		t.Fatalf("generated scenario invalid: %v", err)
	}
	// From idle to 5x the modeled capacity.
	s.Loads = []float64{rapid.Float64Range(0.2, 5).Draw(t, "load") * d.ModeledCapacity()}
	return s
}

// Random scenarios, with and without admission: the bookkeeping holds
// (checkRow) and a second run is identical.
func TestEngineInvariants(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := genScenario(t)
		pol := rapid.SampledFrom(propPolicies).Draw(t, "policy")
		rep, err := Simulate(s, Options{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		for _, run := range rep.Runs {
			for _, row := range run.Steps {
				checkRow(t, &s, run.Name, row)
			}
		}
		again, err := Simulate(s, Options{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		for i, run := range again.Runs {
			for j, row := range run.Steps {
				if fmt.Sprint(row) != fmt.Sprint(rep.Runs[i].Steps[j]) {
					t.Fatalf("second run differs:\n%+v\n%+v", row, rep.Runs[i].Steps[j])
				}
			}
		}
	})
}

// With no admission and no one ever leaving, a service below capacity
// serves everything: goodput equals offered load up to the work still in
// progress at the end.
func TestUnderloadServesAll(t *testing.T) {
	s := Scenario{
		Name: "underload", Workers: 4,
		Client:  Client{Timeout: Const(time.Hour), Attempts: 1, Arrivals: "uniform"},
		Classes: []Class{{Name: "a", Path: "/a", Share: 1, Service: Const(10 * time.Millisecond)}},
		Loads:   []float64{200}, Step: 10 * time.Second, Warmup: time.Second,
	}
	rep, err := Simulate(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := rep.Runs[0].Steps[0]
	if r.Offered != 200 || r.Goodput < 199.8 || r.Goodput > 200.2 {
		t.Fatalf("offered %v goodput %v, want 200 and 200", r.Offered, r.Goodput)
	}
	// 4 workers, 10 ms each: capacity 400 req/s, so half busy; evenly
	// spaced arrivals never queue, so every request takes exactly 10 ms.
	if r.Utilization < 0.49 || r.Utilization > 0.51 {
		t.Fatalf("utilization %v, want 0.5", r.Utilization)
	}
	if r.P99Ms < 10 || r.P99Ms > 10.7 {
		t.Fatalf("p99 %v ms, want 10 ms within the histogram's 1/16", r.P99Ms)
	}
}

// The histogram's quantiles are within 1/16 of the exact ones.
func TestHistQuantile(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		vals := rapid.SliceOfN(rapid.Int64Range(1, int64(time.Hour)), 1, 500).Draw(t, "ns")
		q := rapid.Float64Range(0.01, 1).Draw(t, "q")
		var h hist
		for _, v := range vals {
			h.add(v)
		}
		sorted := append([]int64(nil), vals...)
		slices.Sort(sorted)
		rank := int(math.Ceil(q*float64(len(sorted)))) - 1
		exact := float64(sorted[max(rank, 0)])
		got := h.quantile(q)
		if got < exact*(1-1.0/16) || got > exact*(1+1.0/16) {
			t.Fatalf("q%.2f of %d values: %v, exact %v", q, len(vals), got, exact)
		}
	})
}

// Extreme draws are clamped, never wrapped: a vanishing load means no
// arrivals (not one every nanosecond), and durations near the limit of
// time.Duration do not overflow the clock.
func TestExtremeValues(t *testing.T) {
	s := Scenario{
		Name: "extreme", Workers: 1,
		Server:  Server{CheckQueue: true, ScanCost: time.Duration(math.MaxInt64)},
		Client:  Client{Timeout: Dist{Kind: "loguniform", Min: 1, Max: time.Duration(math.MaxInt64)}, Attempts: 3, Backoff: time.Duration(math.MaxInt64), BackoffMax: time.Duration(math.MaxInt64), RetryOn: []string{"timeout"}},
		Classes: []Class{{Name: "a", Path: "/a", Share: 1, Service: Dist{Kind: "exponential", Mean: time.Duration(math.MaxInt64)}}},
		Loads:   []float64{math.SmallestNonzeroFloat64, 1000}, Step: 2 * time.Second, Warmup: 0,
	}
	rep, err := Simulate(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := rep.Runs[0].Steps[0]; r.Offered != 0 || r.Attempts != 0 {
		t.Fatalf("load 5e-324: %+v", r)
	}
	for _, r := range rep.Runs[0].Steps {
		checkRow(t, &s, "extreme", r)
	}
}
