package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(args ...string) (string, string, error) {
	cmd := root()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errb.String(), err
}

func TestCheck(t *testing.T) {
	out, _, err := run("check", "--config", "../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "ADMISSION POLICY  routes-api") {
		t.Fatalf("%v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\ngates:\n  - {name: a, kind: token_bucket, rate: 100/x, burst: -1}\n"), 0o644)
	_, errOut, err := run("check", "--config", bad)
	if err == nil || !strings.Contains(errOut, "bad.yaml:3: gates[0].rate") || !strings.Contains(errOut, "bad.yaml:3: gates[0].burst") {
		t.Fatalf("%v\n%s", err, errOut)
	}
}

// check validates a Redis policy with no Redis to reach: validation never
// dials.
func TestCheckRedisPolicyWithoutRedis(t *testing.T) {
	file := filepath.Join(t.TempDir(), "redis.yaml")
	os.WriteFile(file, []byte("version: 1\nservice: r\nstore: {backend: redis, addrs: [\"127.0.0.1:1\"]}\ngates:\n  - {name: a, kind: token_bucket, scope: service, rate: 1/s, burst: 5}\n"), 0o644)
	out, errOut, err := run("check", "--config", file)
	if err != nil || !strings.Contains(out, "Redis at 127.0.0.1:1") {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
}

func TestVersion(t *testing.T) {
	out, _, err := run("version")
	if err != nil || !strings.HasPrefix(out, "sluice ") {
		t.Fatal(out, err)
	}
}

// smallScenario writes a short routes-api sweep into a temporary folder.
func smallScenario(t *testing.T) (dir, scn string) {
	dir = t.TempDir()
	scn = filepath.Join(dir, "small.yaml")
	os.WriteFile(scn, []byte("base: routes-api\nloads: [100, 1000]\nstep: 3s\nwarmup: 1s\n"), 0o644)
	return dir, scn
}

func TestSimWritesRowsAndPlot(t *testing.T) {
	dir, scn := smallScenario(t)
	js := filepath.Join(dir, "rows.json")
	out, _, err := run("sim", "--scenario", scn, "--config", "../../examples/routes-api.yaml", "--json", js, "--plot", filepath.Join(dir, "p"))
	if err != nil || !strings.Contains(out, "no admission") || !strings.Contains(out, "sluice (../../examples/routes-api.yaml)") {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, f := range []string{"rows.json", "p.png", "p.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Fatalf("%s not written", f)
		}
	}
	data, _ := os.ReadFile(js)
	var rows struct {
		Runs []struct {
			Name  string
			Steps []struct{ Offered, Goodput float64 }
		}
	}
	if err := json.Unmarshal(data, &rows); err != nil || len(rows.Runs) != 2 || rows.Runs[0].Name != "no admission" ||
		len(rows.Runs[1].Steps) != 2 || rows.Runs[1].Steps[1].Offered < 900 || rows.Runs[1].Steps[1].Goodput < 150 {
		t.Fatalf("json: %v %+v", err, rows)
	}
	// --json - writes to stdout, instead of the table.
	out, _, err = run("sim", "--scenario", scn, "--no-policy", "--json", "-", "--plot", "")
	if err != nil || !strings.HasPrefix(out, "{") || strings.Contains(out, "offered  retried") {
		t.Fatalf("--json -: %v\n%.200s", err, out)
	}
}

// Several processes in front of the service: the table adds a row per
// step of each process's offered, admitted and useful work and its lease.
func TestSimProcesses(t *testing.T) {
	scn := filepath.Join(t.TempDir(), "fleet.yaml")
	os.WriteFile(scn, []byte("base: lease-fleet\nphases:\n  - {at: 0s, load: 3000}\nlength: 8s\n"), 0o644)
	out, _, err := run("sim", "--scenario", scn, "--plot", "")
	if err != nil || !strings.Contains(out, "behind 4 processes") || !strings.Contains(out, "by process:") ||
		!strings.Contains(out, "process-4 offered  admitted  useful  lease") {
		t.Fatalf("%v\n%s", err, out)
	}
}

// Same seed, same bytes.
func TestSimIsDeterministic(t *testing.T) {
	_, scn := smallScenario(t)
	out2, _, _ := run("sim", "--scenario", scn, "--config", "../../examples/routes-api.yaml", "--plot", "")
	out3, _, _ := run("sim", "--scenario", scn, "--config", "../../examples/routes-api.yaml", "--plot", "")
	if out2 != out3 {
		t.Fatalf("two runs differ:\n%s\n%s", out2, out3)
	}
}

func TestSimErrors(t *testing.T) {
	dir, scn := smallScenario(t)
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("base: routes-api\nclient:\n  attempts: -1\n"), 0o644)
	// A utilization gate on real CPU cannot run on a virtual clock.
	cpu := filepath.Join(dir, "cpu.yaml")
	os.WriteFile(cpu, []byte("version: 1\ngates:\n  - {name: u, kind: utilization, source: cpu, tiers: [default]}\n"), 0o644)
	for _, c := range []struct {
		name string
		args []string
		want string // in the error or its output
	}{
		{"scenario field", []string{"--scenario", bad, "--plot", ""}, "bad.yaml:3: client.attempts"},
		{"unknown scenario", []string{"--scenario", "venus", "--plot", ""}, "mercury"},
		// Output paths are checked before simulating.
		{"json dir", []string{"--scenario", scn, "--json", filepath.Join(dir, "no", "such", "dir.json")}, "no such file"},
		{"plot dir", []string{"--scenario", scn, "--plot", filepath.Join(dir, "no", "such", "p")}, `--plot ""`},
		{"no-policy and config", []string{"--no-policy", "--config", "x.yaml"}, "choose one"},
		{"cpu source", []string{"--scenario", scn, "--config", cpu, "--plot", ""}, "cpu.yaml:3: gates[0].source"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, errOut, err := run(append([]string{"sim"}, c.args...)...)
			if err == nil || !strings.Contains(errOut+err.Error(), c.want) {
				t.Fatalf("%v\n%s", err, errOut)
			}
		})
	}
}

// sluice serve refuses a policy with gates a decision endpoint cannot
// enforce, and check --serve lists them; the nginx example's policy passes.
func TestServeRefusesInflightGates(t *testing.T) {
	_, errOut, err := run("serve", "--config", "../../examples/routes-api.yaml", "--admin-token", "x")
	if err == nil || !strings.Contains(errOut, "routes-api.yaml:22: gates[1].kind: concurrent-requests (concurrency) holds a slot") {
		t.Fatalf("%v\n%s", err, errOut)
	}
	_, errOut, err = run("check", "--serve", "--config", "../../examples/routes-api.yaml")
	if err == nil || !strings.Contains(errOut, "worker-pool (adaptive_concurrency)") || !strings.Contains(errOut, "3 gate(s) sluice serve cannot enforce") {
		t.Fatalf("%v\n%s", err, errOut)
	}
	out, errOut, err := run("check", "--serve", "--config", "../../examples/nginx/policy.yaml")
	if err != nil || !strings.Contains(out, "ADMISSION POLICY  routes-api") {
		t.Fatalf("%v\n%s%s", err, out, errOut)
	}
}

// check takes the file as its argument as well as --config; --quiet
// prints nothing either way and the exit code tells; what check used to
// accept silently is refused with file:line:field.
func TestCheckArgumentQuietAndRefusals(t *testing.T) {
	out, _, err := run("check", "../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "ADMISSION POLICY  routes-api") {
		t.Fatalf("check FILE: %v\n%s", err, out)
	}
	if out, errOut, err := run("check", "--quiet", "../../examples/routes-api.yaml"); err != nil || out != "" || errOut != "" {
		t.Fatalf("--quiet on a valid file: %v %q %q", err, out, errOut)
	}
	dir := t.TempDir()
	for name, c := range map[string]struct{ src, want string }{
		"rate.yaml":   {"version: 1\ngates:\n  - {name: a, kind: token_bucket, scope: service, rate: 10/sec, burst: 5}\n", `rate.yaml:3: gates[0].rate: invalid rate "10/sec": period "sec": write "s"`},
		"empty.yaml":  {"version: 1\ngates: []\n", "empty.yaml:2: gates: empty"},
		"tenant.yaml": {"version: 1\ngates:\n  - {name: a, kind: token_bucket, rate: 10/s, burst: 5}\n", "tenant.yaml:3: gates[0].scope: scope tenant (the default of kind token_bucket), but the policy identifies no tenant"},
		"indent.yaml": {"version: 1\ngates:\n  - name: a\n    kind: concurrency\n    limit: 1\n    mode: enforce\n    retry_hint: 1s\n    scope: service\n   ttl: 5s\n", "indent.yaml:9: (yaml)"},
		"cidr.yaml":   {"version: 1\nidentity:\n  tenant: {ip: true}\n  client_ip: {trusted_proxies: [10.0.0.1/8]}\ngates:\n  - {name: a, kind: concurrency, limit: 1}\n", "cidr.yaml:4: identity.client_ip.trusted_proxies[0]"},
	} {
		file := filepath.Join(dir, name)
		os.WriteFile(file, []byte(c.src), 0o644)
		_, errOut, err := run("check", file)
		if err == nil || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: %v\n%s", name, err, errOut)
		}
		if out, errOut, err := run("check", "-q", file); err == nil || out != "" || errOut != "" {
			t.Errorf("%s --quiet: %v %q %q", name, err, out, errOut)
		}
	}
	if _, _, err := run("check", "a.yaml", "--config", "b.yaml"); err == nil {
		t.Error("two different files accepted")
	}
	if _, _, err := run("check"); err == nil {
		t.Error("no file accepted")
	}
}

// --explain prints one gate kind's or section's reference.
func TestCheckExplain(t *testing.T) {
	out, _, err := run("check", "--explain", "token_bucket")
	if err != nil || !strings.Contains(out, "## `token_bucket`") || !strings.Contains(out, "| `burst` | integer") {
		t.Fatalf("%v\n%s", err, out)
	}
	out, _, err = run("check", "--explain", "identity")
	if err != nil || !strings.Contains(out, "identity.client_ip.trusted_proxies") {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, _, err := run("check", "--explain", "bucket"); err == nil {
		t.Fatal("an unknown kind explained")
	}
}

// sluice demo refuses a scenario's flag on another scenario, and incident
// settings that cannot run (a negative duration panicked; a duration of 0
// ran the 30-minute default), with the flag and what it wants.
func TestDemoFlagErrors(t *testing.T) {
	for _, c := range []struct{ args, want string }{
		{"--scenario incident --duration -5s", "--duration -5s: want at least 1s"},
		{"--scenario incident --duration 0", "--duration 0s: want at least 1s"},
		{"--scenario incident --load 0", "--load 0: want"},
		{"--scenario incident --load -3", "--load -3: want"},
		{"--scenario incident --skew NaN", "--skew NaN: want"},
		{"--scenario incident --skew -1", "--skew -1: want"},
		{"--scenario incident --slowdown -2", "--slowdown -2: want"},
		{"--scenario sweep --skew 1", "--skew: only the incident scenario takes it"},
		{"--record x.log", "--record: only the incident scenario takes it"},
		{"--scenario sweep --seed 42", "--seed: only the incident scenario takes it"},
		{"--scenario incident --seed -1", "--seed"},
		{"--duration 1m", "--duration: only the incident scenario takes it"},
		{"--scenario incident --workers 2", "--workers: only the capacity-matrix scenario takes it"},
	} {
		_, _, err := run(append([]string{"demo"}, strings.Fields(c.args)...)...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("demo %s: %v, want %q", c.args, err, c.want)
		}
	}
}
