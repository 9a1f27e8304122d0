package sim

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/examples"
	"github.com/sluice-go/sluice/internal/leakcheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }

func builtin(t testing.TB, name string) Scenario {
	t.Helper()
	s, ok := Builtin(name)
	if !ok {
		t.Fatalf("no built-in scenario %q", name)
	}
	return s
}

func examplePolicy(t testing.TB, name string) *Policy {
	t.Helper()
	data, file, ok := examples.ByName(name)
	if !ok {
		t.Fatalf("no example policy %q", name)
	}
	return &Policy{Name: file, Data: data}
}

// The acceptance run: the Mercury scenario reproduces the published collapse
// curve without admission (each point within 10%) and mercury.yaml keeps
// goodput at or above 3,950 units/s at 10,000 offered.
func TestMercuryReproducesSeed(t *testing.T) {
	s := builtin(t, "mercury")
	if raceEnabled || testing.Short() {
		s.Step, s.Warmup = 25*time.Second, 10*time.Second
	}
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "mercury")})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.WriteTable(&b)
	t.Log("\n" + b.String())
	for i, d := range rep.Deviation() {
		if math.Abs(d) > 0.10 {
			p := rep.Reference[i]
			t.Errorf("at %.0f offered: goodput %.0f, seed %.0f (%+.1f%%)", p.Offered, rep.Runs[0].Steps[i].Goodput, p.Goodput, 100*d)
		}
	}
	if len(rep.Deviation()) != 4 {
		t.Fatalf("deviation at %d points, want 4", len(rep.Deviation()))
	}
	with := rep.Runs[1].Steps
	if g := with[len(with)-1].Goodput; g < 3950 {
		t.Errorf("with admission at 10k: goodput %.0f < 3950", g)
	}
	for i := range with {
		if with[i].Goodput <= rep.Runs[0].Steps[i].Goodput && with[i].Load > s.Capacity {
			t.Errorf("at %.0f: admission %.0f ≤ no admission %.0f", with[i].Load, with[i].Goodput, rep.Runs[0].Steps[i].Goodput)
		}
		if with[i].Late > 0.01*with[i].Goodput {
			t.Errorf("at %.0f: %.0f units/s late with admission", with[i].Load, with[i].Late)
		}
	}
}

// shortRoutes is routes-api at 5 s steps: cheap enough to run many times.
func shortRoutes(t testing.TB) Scenario {
	s := builtin(t, "routes-api")
	s.Step, s.Warmup = 5*time.Second, time.Second
	s.Loads = []float64{100, 400, 1000}
	return s
}

func reportJSON(t testing.TB, s Scenario, opts Options) []byte {
	t.Helper()
	rep, err := Simulate(s, opts)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Same seed → the same bytes; another seed → other bytes.
func TestDeterministic(t *testing.T) {
	s := shortRoutes(t)
	opts := Options{Policy: examplePolicy(t, "routes-api"), Seed: 7}
	a, b := reportJSON(t, s, opts), reportJSON(t, s, opts)
	if !bytes.Equal(a, b) {
		t.Fatalf("two runs with seed 7 differ:\n%s\n%s", a, b)
	}
	opts.Seed = 8
	if c := reportJSON(t, s, opts); bytes.Equal(a, c) {
		t.Fatal("seeds 7 and 8 gave identical reports")
	}
	// Time series too (the ladder and the controllers run on the virtual
	// clock).
	ls := builtin(t, "load-step")
	ls.Length, ls.Phases[1].At, ls.Phases[2].At = 40*time.Second, 10*time.Second, 25*time.Second
	opts = Options{Policy: examplePolicy(t, "routes-api-shedding"), Seed: 3}
	if x, y := reportJSON(t, ls, opts), reportJSON(t, ls, opts); !bytes.Equal(x, y) {
		t.Fatal("load-step: two runs with seed 3 differ")
	}
}

// Different seeds: the Mercury curve without admission moves by a few
// percent at most (the package doc records the measured spread).
func TestSeedSpread(t *testing.T) {
	if testing.Short() {
		t.Skip("several simulated minutes")
	}
	s := builtin(t, "mercury")
	s.Loads = []float64{5000, 10000}
	if raceEnabled {
		s.Step = 25 * time.Second
	}
	var g [2][]float64
	for seed := uint64(1); seed <= 3; seed++ {
		rep, err := Simulate(s, Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		for i, row := range rep.Runs[0].Steps {
			g[i] = append(g[i], row.Goodput)
		}
	}
	for i, vals := range g {
		lo, hi := slices.Min(vals), slices.Max(vals)
		if spread := (hi - lo) / lo; spread > 0.05 {
			t.Errorf("at %.0f: goodput over seeds 1–3 %v, spread %.1f%% > 5%%", s.Loads[i], vals, 100*spread)
		}
	}
}

// The engine's bookkeeping holds for every row of every run: each attempt
// is admitted or rejected, started work was admitted, finished work was
// started, and nothing is answered twice.
// errorer is what checkRow needs of a *testing.T or a *rapid.T.
type errorer interface {
	Helper()
	Errorf(format string, args ...any)
}

func checkRow(t errorer, s *Scenario, run string, r Row) {
	t.Helper()
	const eps = 1e-6
	le := func(a, b float64) bool { return a <= b+eps*math.Max(1, math.Abs(b)) }
	eq := func(a, b float64) bool { return le(a, b) && le(b, a) }
	fail := func(what string) { t.Errorf("%s at load %.0f: %s: %+v", run, r.Load, what, r) }
	if !eq(r.Attempts, r.Offered+r.Retried) {
		fail("attempts ≠ offered + retried")
	}
	if !eq(r.Attempts, r.Admitted+r.RejectedTotal()) {
		fail("attempts ≠ admitted + rejected")
	}
	if !le(r.Started, r.Admitted) {
		fail("started > admitted")
	}
	if !le(r.Goodput+r.Late+r.Abandoned, r.Started) {
		fail("goodput + late + abandoned > started")
	}
	if !le(r.Goodput+r.TimedOut+r.RejectedTotal(), r.Attempts) {
		fail("an attempt answered twice")
	}
	if !le(r.Retried, float64(s.Client.Attempts-1)*r.Offered) {
		fail("more retries than the client's attempts allow")
	}
	if r.Utilization < 0 || r.Utilization > 1+eps {
		fail("utilization outside [0, 1]")
	}
	if r.Goodput > 0 && (r.P50Ms <= 0 || r.P99Ms < r.P50Ms) {
		fail("latency quantiles out of order")
	}
	checkProcesses(t, run, r)
}

// checkProcesses: with several processes, their rows add up to the row.
func checkProcesses(t errorer, run string, r Row) {
	t.Helper()
	if len(r.Processes) == 0 {
		return
	}
	var sum ProcessRow
	for _, p := range r.Processes {
		sum.Offered += p.Offered
		sum.Attempts += p.Attempts
		sum.Admitted += p.Admitted
		sum.Goodput += p.Goodput
	}
	near := func(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }
	if !near(sum.Offered, r.Offered) || !near(sum.Attempts, r.Attempts) || !near(sum.Admitted, r.Admitted) || !near(sum.Goodput, r.Goodput) {
		t.Errorf("%s at load %.0f: the processes' rows sum to %+v, not the row's offered %v, attempts %v, admitted %v, goodput %v",
			run, r.Load, sum, r.Offered, r.Attempts, r.Admitted, r.Goodput)
	}
}

// A slow dependency of the critical class drives the ladder to SHED; once
// the dependency is healthy again, the ladder must come back down and the
// service serve its load. (It once stayed in SHED: the work of the cheap
// requests it shed was estimated from the latency of the costly critical
// ones it still admitted, so demand looked above the exit threshold at a
// load the service handles.)
func TestDependencyIncidentRecovers(t *testing.T) {
	s := builtin(t, "dependency")
	rep, err := Simulate(s, Options{Policy: examplePolicy(t, "routes-api-shedding")})
	if err != nil {
		t.Fatal(err)
	}
	no, with := rep.Runs[0].Steps, rep.Runs[1].Steps
	for i, r := range with {
		switch {
		case r.T >= 24 && r.T < 60: // during the incident: critical solves still served
			if r.Level != "shed" || r.Goodput < 30 || no[i].Goodput > 1 {
				t.Errorf("t=%vs: level %s, goodput %.0f with the policy, %.0f without", r.T, r.Level, r.Goodput, no[i].Goodput)
			}
		case r.T >= 80: // 20 s after it ended
			if r.Level == "shed" || r.Level == "recover" || r.Goodput < 0.9*r.Offered {
				t.Errorf("t=%vs: level %s, goodput %.0f of %.0f offered", r.T, r.Level, r.Goodput, r.Offered)
			}
		}
	}
}

// The retry storm in the simulator agrees with the end-to-end run on the
// direction: with package client's retries the callers send at most 1.1
// attempts per operation, the naive callers multiply them, and goodput is
// no lower through the policy and far higher without admission.
func TestRetryStormClients(t *testing.T) {
	pol := examplePolicy(t, "mercury")
	run := func(retry string) *Report {
		s, _ := Builtin("retry-storm")
		s.Client.Retry = retry
		s.Loads = []float64{8000}
		s.Step, s.Warmup = 20*time.Second, 5*time.Second
		rep, err := Simulate(s, Options{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}
	naive, sl := run(RetryNaive), run(RetrySluice)
	for i := range naive.Runs {
		n, s := naive.Runs[i].Steps[0], sl.Runs[i].Steps[0]
		t.Logf("%s: naive %.0f attempts for %.0f offered, goodput %.0f; sluice %.0f for %.0f, goodput %.0f (throttled %.0f)",
			naive.Runs[i].Name, n.Attempts, n.Offered, n.Goodput, s.Attempts, s.Offered, s.Goodput, s.Throttled)
		if s.Attempts > 1.1*s.Offered || n.Attempts < 2*n.Offered {
			t.Errorf("%s: attempts per operation %.2f (sluice) and %.2f (naive)", naive.Runs[i].Name, s.Attempts/s.Offered, n.Attempts/n.Offered)
		}
		if s.Goodput < 0.99*n.Goodput {
			t.Errorf("%s: goodput %.0f with the sluice client, %.0f naive", naive.Runs[i].Name, s.Goodput, n.Goodput)
		}
	}
	if n, s := naive.Runs[0].Steps[0], sl.Runs[0].Steps[0]; s.Goodput < 2*n.Goodput+100 {
		t.Errorf("without admission: goodput %.0f with the sluice client, %.0f naive", s.Goodput, n.Goodput)
	}
}

// The retry storm of sluice demo --scenario retry-storm, modeled: the
// demo's upstream (2 workers, 10 ms reads, 200 req/s), 20 tenants, an even
// load, examples/routes-api.yaml, each operation 300 ms in all
// (Client.Deadline) and up to 5 attempts; the naive loop retries any
// failure 10 ms later, ignores Retry-After and resends the first attempt's
// budget, the sluice client runs package client's defaults. Through the
// policy the sim agrees with the end-to-end run on the direction: the
// sluice client sends at most 1.1 attempts per operation while the naive
// loop multiplies them, and its goodput is higher (the naive loop's stale
// budgets let the wait queue admit attempts that finish after their
// caller has left). Without the operation deadline (every attempt with its
// own budget) goodput ties: the deadline is what the storm wastes.
func TestRetryStormAgreesWithEndToEnd(t *testing.T) {
	pol := examplePolicy(t, "routes-api")
	run := func(retry string, load float64) Row {
		s := RoutesAPI
		s.Name, s.Workers = "retry-storm-e2e", 2
		s.Classes = []Class{{Name: "read", Method: "GET", Path: "/v1/routes/42", Share: 100, Tenants: 20, Service: Const(10 * time.Millisecond)}}
		s.Client = Client{Timeout: Const(300 * time.Millisecond), Deadline: 300 * time.Millisecond, Attempts: 5, Arrivals: "uniform",
			Retry: retry, RetryOn: []string{"timeout", "overload", "policy"}}
		if retry == RetryNaive {
			s.Client.Backoff, s.Client.BackoffMax, s.Client.IgnoreRetryAfter = 10*time.Millisecond, 10*time.Millisecond, true
		} else {
			s.Client.Backoff, s.Client.BackoffMax, s.Client.Budget = 100*time.Millisecond, 10*time.Second, 0.1
		}
		s.Loads, s.Step, s.Warmup = []float64{load}, 20*time.Second, 5*time.Second
		rep, err := Simulate(s, Options{Policy: pol})
		if err != nil {
			t.Fatal(err)
		}
		return rep.Runs[len(rep.Runs)-1].Steps[0] // through the policy
	}
	for _, load := range []float64{400, 800} { // 2x and 4x
		n, s := run(RetryNaive, load), run(RetrySluice, load)
		t.Logf("%.0f/s: naive %.2f attempts per operation, goodput %.0f; sluice %.2f, goodput %.0f",
			load, n.Attempts/n.Offered, n.Goodput, s.Attempts/s.Offered, s.Goodput)
		if s.Attempts > 1.1*s.Offered || n.Attempts < 1.5*n.Offered {
			t.Errorf("%.0f/s: attempts per operation %.2f (sluice) and %.2f (naive)", load, s.Attempts/s.Offered, n.Attempts/n.Offered)
		}
		if s.Goodput <= n.Goodput {
			t.Errorf("%.0f/s: goodput %.0f with the sluice client, %.0f naive", load, s.Goodput, n.Goodput)
		}
	}
}

// A policy whose tenants are not one header is refused: the simulated
// tenants would all be one without a word.
func TestNonHeaderTenantIsRefused(t *testing.T) {
	s, _ := Builtin("mercury")
	_, err := Simulate(s, Options{Policy: &Policy{Name: "ip.yaml", Data: []byte("version: 1\nidentity: {tenant: {ip: true}}\ngates:\n  - {name: r, kind: token_bucket, rate: 10/s, burst: 1}\n")}})
	if err == nil || !strings.Contains(err.Error(), "keys them by ip") {
		t.Fatalf("%v", err)
	}
}
