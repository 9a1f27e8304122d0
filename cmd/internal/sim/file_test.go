package sim

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/yamlfile"
)

const goodScenario = `name: small
unit: req
workers: 4
server: {check_queue: true, scan_cost: 100us, cancel_point: 0.5, service: lognormal, service_cv: 0.5}
client:
  timeout: {dist: uniform, min: 100ms, max: 300ms}
  attempts: 2
  backoff: 20ms
  budget: 0.1
  retry_on: [timeout, overload]
  arrivals: uniform
classes:
  - {name: read, method: GET, path: /r, share: 3, tenants: 5, service: 10ms}
  - {name: write, method: POST, path: /w, units: 2, share: 1, headers: {X-Cost: "2"}, service: {dist: exponential, mean: 30ms}}
loads: [100, 300]
step: 5s
warmup: 1s
seed: 42
policy: routes-api
`

func TestParseScenario(t *testing.T) {
	s, err := ParseScenario("small.yaml", []byte(goodScenario))
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "small" || s.Workers != 4 || !s.Server.CheckQueue || s.Server.ScanCost != 100*time.Microsecond {
		t.Fatalf("service: %+v", s)
	}
	if c := s.Client; c.Attempts != 2 || c.Timeout.Kind != "uniform" || c.Timeout.Max != 300*time.Millisecond {
		t.Fatalf("client: %+v", c)
	}
	if len(s.Classes) != 2 || s.Classes[1].Units != 2 || s.Classes[1].Headers["X-Cost"] != "2" || s.Classes[0].Service != Const(10*time.Millisecond) {
		t.Fatalf("classes: %+v", s.Classes)
	}
	if len(s.Loads) != 2 || s.Seed != 42 || s.Policy != "routes-api" {
		t.Fatalf("run: %+v", s)
	}
	if _, err := Simulate(s, Options{}); err != nil {
		t.Fatal(err)
	}
}

// base: a built-in, with the file's fields on top.
func TestParseScenarioOnABase(t *testing.T) {
	s, err := ParseScenario("b.yaml", []byte("base: mercury\nclient: {attempts: 5}\nloads: [9000]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Workers != 40 || s.Client.Attempts != 5 || s.Client.Backoff != 200*time.Millisecond || len(s.Loads) != 1 || s.Reference != nil {
		t.Fatalf("%+v", s)
	}
	// loads over a time-series base make it a sweep; an explicit warmup of
	// 0 means none.
	s, err = ParseScenario("c.yaml", []byte("base: load-step\nloads: [50]\nstep: 30s\nwarmup: 0s\n"))
	if err != nil || len(s.Phases) != 0 || len(s.Loads) != 1 {
		t.Fatalf("%v %+v", err, s)
	}
	if d, _ := s.withDefaults(); d.Warmup != 0 {
		t.Fatalf("warmup %v, want none", d.Warmup)
	}
}

// Processes and their balance, for the scenario and a phase; a balance
// alone sets the number of processes, and processes alone over a base
// spread the load evenly.
func TestParseScenarioProcesses(t *testing.T) {
	src := "base: mercury\nprocesses: 3\nbalance: [3, 2, 1]\nloads: []\nphases:\n  - {at: 0s, load: 100}\n  - {at: 5s, load: 50, balance: [1, 1, 0]}\nlength: 10s\n"
	s, err := ParseScenario("p.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if s.Processes != 3 || !slices.Equal(s.Balance, []float64{3, 2, 1}) || !slices.Equal(s.Phases[1].Balance, []float64{1, 1, 0}) {
		t.Fatalf("%+v", s)
	}
	// The run follows the weights: 3:2:1, then nothing to process-3.
	rep, err := Simulate(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var before, after [3]float64
	for _, r := range rep.Runs[0].Steps {
		for i, p := range r.Processes {
			if r.T < 5 {
				before[i] += p.Offered
			} else {
				after[i] += p.Offered
			}
		}
	}
	if before[0] < 1.2*before[1] || before[1] < 1.2*before[2] || after[2] != 0 || after[1] == 0 {
		t.Fatalf("offered by process: %v before 5 s, %v after", before, after)
	}
	if s, err = ParseScenario("p.yaml", []byte("base: mercury\nbalance: [1, 4]\n")); err != nil || s.Processes != 0 {
		t.Fatalf("%v %+v", err, s)
	}
	if d, _ := s.withDefaults(); d.Processes != 2 {
		t.Fatalf("balance of 2: %d processes", d.Processes)
	}
	if s, err = ParseScenario("p.yaml", []byte("base: lease-fleet\nprocesses: 2\nphases:\n  - {at: 0s, load: 10}\n")); err != nil || s.Balance != nil {
		t.Fatalf("%v %+v", err, s)
	}
	if d, _ := builtin(t, "mercury").withDefaults(); d.Processes != 1 {
		t.Fatalf("default %d processes, want 1", d.Processes)
	}
}

// The example file parses and names its policy.
func TestParseScenarioExample(t *testing.T) {
	data, err := os.ReadFile("../../../examples/scenarios/retry-storm.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if s, err := ParseScenario("retry-storm.yaml", data); err != nil || s.Client.Attempts != 5 || s.Policy != "../mercury.yaml" {
		t.Fatalf("%v %+v", err, s)
	}
}

// Broken files: every error names the file, the line and the field.
func TestParseScenarioErrors(t *testing.T) {
	for _, tc := range []struct{ name, src, want string }{
		{"unknown field", "workers: 4\nwrokers: 5\n", "x.yaml:2: wrokers"},
		{"unknown base", "base: venus\n", "x.yaml:1: base: unknown built-in scenario \"venus\""},
		{"zero workers", "base: mercury\nworkers: 0\n", "x.yaml:2: workers"},
		{"negative load", "base: mercury\nloads: [100, -5]\n", "x.yaml:2: loads[1]"},
		{"load not a number", "base: mercury\nloads: [lots]\n", "x.yaml:2: loads[0]"},
		{"bad duration", "base: mercury\nstep: 60\n", "x.yaml:2: step"},
		{"unknown service", "base: mercury\nserver: {service: pareto}\n", "x.yaml:2: server.service"},
		{"cancel point above 1", "base: mercury\nserver:\n  cancel_point: 1.5\n", "x.yaml:3: server.cancel_point"},
		{"zero attempts", "base: mercury\nclient:\n  attempts: 0\n", "x.yaml:3: client.attempts"},
		{"unknown client retry", "base: mercury\nclient:\n  retry: clever\n", "x.yaml:3: client.retry"},
		{"zero clients", "base: mercury\nclient: {retry: sluice, clients: 0}\n", "x.yaml:2: client.clients"},
		{"unknown retry reason", "base: mercury\nclient: {retry_on: [errors]}\n", "x.yaml:2: client.retry_on[0]"},
		{"dist without kind", "base: mercury\nclient: {timeout: {mean: 1s}}\n", "x.yaml:2: client.timeout"},
		{"uniform without max", "base: mercury\nclient: {timeout: {dist: uniform, min: 1s}}\n", "x.yaml:2: client.timeout"},
		{"class field", "base: mercury\nclasses:\n  - {name: a, path: /a, share: 1, colour: red}\n", "x.yaml:3: classes[0].colour"},
		{"class without share", "base: mercury\nclasses:\n  - {name: a, path: /a}\n", "x.yaml:3: classes[0].share"},
		{"classes not a list", "base: mercury\nclasses: {a: 1}\n", "x.yaml:2: classes"},
		{"nothing to run", "workers: 2\nclasses:\n  - {name: a, path: /a, share: 1, service: 1ms}\n", "x.yaml:1: loads"},
		{"phase slowdown 0", "base: mercury\nloads: []\nphases:\n  - {at: 0s, load: 10, slowdown: 0}\nlength: 10s\n", "x.yaml:4: phases[0].slowdown"},
		{"tab", "base: mercury\n\tworkers: 3\n", "x.yaml:"},
		{"more work than the bound", "base: mercury\nloads: [10000000]\n", "x.yaml:2: loads[0]: 1e+07 units/s for a 1m0s step"},
		{"a day of 1 ms rows", "base: load-step\nlength: 24h\ninterval: 1ms\n", "x.yaml:3: interval"},
		{"a long time series", "base: load-step\nphases:\n  - {at: 0s, load: 2000}\nlength: 24h\n", "x.yaml:3: phases"},
		{"too many tenants", "base: mercury\nclasses:\n  - {name: a, share: 1, tenants: 1000000}\n  - {name: b, share: 1, tenants: 1000000}\n", "x.yaml:4: classes[1].tenants"},
		{"loads and phases", "base: mercury\nloads: [1]\nphases:\n  - {at: 0s, load: 1}\n", "x.yaml:4: phases: both loads"},
		{"no capacity", "base: mercury\ncapacity: 0\n", "x.yaml:2: capacity"},
		{"no processes", "base: mercury\nprocesses: 0\n", "x.yaml:2: processes"},
		{"too many processes", "base: mercury\nprocesses: 65\n", "x.yaml:2: processes"},
		{"balance for other processes", "base: mercury\nprocesses: 3\nbalance: [1, 2]\n", "x.yaml:3: balance: 2 weights for 3 processes"},
		{"negative weight", "base: mercury\nbalance:\n  - 1\n  - -2\n", "x.yaml:4: balance[1]"},
		{"balance not a list", "base: mercury\nbalance: {a: 1}\n", "x.yaml:2: balance"},
		{"all weights 0", "base: mercury\nbalance: [0, 0]\n", "x.yaml:2: balance: all weights are 0"},
		{"phase balance", "base: mercury\nprocesses: 2\nloads: []\nphases:\n  - {at: 0s, load: 1, balance: [1]}\n", "x.yaml:5: phases[0].balance: 1 weights for 2 processes"},
		{"not a mapping", "- 1\n- 2\n", "x.yaml:1"},
		{"empty", "", "x.yaml"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseScenario("x.yaml", []byte(tc.src))
			if err == nil {
				t.Fatalf("no error for\n%s", tc.src)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

// FuzzParseScenario: any input gives a scenario that validates or an
// error with a position, never a panic; a scenario that parses also runs.
func FuzzParseScenario(f *testing.F) {
	f.Add(goodScenario)
	f.Add("base: mercury\nclient: {attempts: 5}\nloads: [9000]\n")
	f.Add("base: load-step\nphases:\n  - {at: 0s, load: 10}\n  - {at: 1s, load: 1000, slowdown: 3}\nlength: 3s\ninterval: 500ms\n")
	f.Add("workers: 1\nclasses:\n  - {name: a, path: /a, share: 1, service: {dist: loguniform, min: 1us, max: 1s}}\nloads: [1e9]\nstep: 1ms\n")
	f.Add("base: lease-fleet\nprocesses: 3\nbalance: [2, 0, 1]\nphases:\n  - {at: 0s, load: 500}\n  - {at: 1s, load: 200, balance: [0, 1, 0]}\nlength: 3s\n")
	f.Add("{")
	f.Fuzz(func(t *testing.T, src string) {
		s, err := ParseScenario("fuzz.yaml", []byte(src))
		if err != nil {
			var es yamlfile.Errors
			if !errors.As(err, &es) || len(es) == 0 || es[0].File != "fuzz.yaml" {
				t.Fatalf("error without position: %v", err)
			}
			return
		}
		// Keep the run tiny: the parser's job is to hand the engine only
		// scenarios it can run.
		s.Step, s.Warmup, s.Length, s.Interval = 20*time.Millisecond, 0, 20*time.Millisecond, 10*time.Millisecond
		for i := range s.Phases {
			s.Phases[i].At = time.Duration(i) * time.Millisecond
		}
		for i := range s.Loads {
			s.Loads[i] = min(s.Loads[i], 1e5)
		}
		for i := range s.Phases {
			s.Phases[i].Load = min(s.Phases[i].Load, 1e5)
		}
		if len(s.Loads) > 3 {
			s.Loads = s.Loads[:3]
		}
		if _, err := Simulate(s, Options{}); err != nil {
			t.Fatalf("parsed but does not run: %v\n%s", err, src)
		}
	})
}

// Retries add attempts the scenario's bound on first attempts does not
// count: callers that retry every timeout at a naive service that keeps
// every abandoned attempt queued grew the simulator's memory without bound
// (17 GB and growing at 100 attempts). A run stops at maxAlive attempts
// alive at once and says so.
func TestRetriesAreBoundedByTheAttemptsAlive(t *testing.T) {
	defer func(n int) { maxAlive = n }(maxAlive)
	maxAlive = 20_000
	s, err := ParseScenario("storm.yaml", []byte(`name: storm
workers: 1
loads: [10000]
step: 5s
classes: [{name: q, share: 1, service: 1s}]
client: {attempts: 100, backoff: 1us, backoff_max: 1us, timeout: 1ms, budget: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = Simulate(s, Options{Seed: 1})
	if err == nil || !strings.Contains(err.Error(), "20000 attempts were alive at once") {
		t.Fatalf("%v, want the bound on attempts alive", err)
	}
	// A time series stops alike.
	s.Loads, s.Step = nil, 0
	s.Phases = []Phase{{At: 0, Load: 10000}}
	s.Length = 5 * time.Second
	if _, err = Simulate(s, Options{Seed: 1}); err == nil || !strings.Contains(err.Error(), "attempts were alive at once") {
		t.Fatalf("series: %v, want the bound on attempts alive", err)
	}
}

// A policy's retry hint of centuries (a Retry-After that saturates at
// 999,999,999,999,999 s) keeps its callers waiting: it wrapped negative
// in nanoseconds, and they retried at once, 1,772 a second here.
func TestHugeRetryHintIsAWaitNotARetry(t *testing.T) {
	if got := retryAfterNs(999_999_999_999_999); got != maxDelay/int64(time.Second)*int64(time.Second) {
		t.Fatalf("retryAfterNs: %d", got)
	}
	for _, retrying := range []string{"", "sluice"} {
		s, err := ParseScenario("s.yaml", []byte(`name: hint
workers: 4
loads: [1000]
step: 5s
classes: [{name: q, share: 1, service: 10ms}]
client: {attempts: 3, backoff: 1ms, retry: `+cond(retrying == "", "naive", retrying)+`}
`))
		if err != nil {
			t.Fatal(err)
		}
		rep, err := Simulate(s, Options{Seed: 1, PolicyOnly: true, Policy: &Policy{Name: "p.yaml",
			Data: []byte("version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 2, retry_hint: 2562047h}\n")}})
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Runs[0].Steps[0].Retried; r != 0 {
			t.Errorf("client %q: %v retried a second after a Retry-After of centuries, want 0", retrying, r)
		}
	}
}

func cond(c bool, a, b string) string {
	if c {
		return a
	}
	return b
}
