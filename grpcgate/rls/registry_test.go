package rls

import (
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/limit"
)

// An algorithm registered with one line (internal/algorithm) is a rule's
// algorithm by its name, checked, described and decided on memory and
// Redis, with no edit to this package. (The line below reuses the fixed
// window's step function and Lua twin under a new name; a new algorithm
// brings its own.)
func TestARegisteredAlgorithmIsARuleAlgorithm(t *testing.T) {
	remove := algorithm.Register(algorithm.New("window_test", algorithm.UsesLimit|algorithm.UsesWindow, algorithm.Counts,
		func(s algorithm.Settings) (*limit.FixedWindow, error) { return limit.NewFixedWindow(s.Limit, s.Window) }))
	defer remove()

	_, err := Parse("bad.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, rate_limit: {algorithm: nope, unit: minute, requests_per_unit: 2}}\n"))
	if err == nil || !strings.Contains(err.Error(), "window_test") || !strings.Contains(err.Error(), "sliding_log") {
		t.Errorf("an unknown algorithm's error should list the registered ones: %v", err)
	}
	_, err = Parse("burst.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, rate_limit: {algorithm: window_test, unit: minute, requests_per_unit: 2, burst: 3}}\n"))
	if err == nil || !strings.Contains(err.Error(), "burst.yaml:3") || !strings.Contains(err.Error(), "applies only to algorithm token_bucket or gcra, not window_test") {
		t.Errorf("a setting the algorithm does not read: %v", err)
	}

	cfg := mustParse(t, "domain: d\ndescriptors:\n  - {key: k, rate_limit: {algorithm: window_test, unit: minute, requests_per_unit: 2}}\n")
	if r := cfg.Lookup("d", ents("k", "x")); r == nil || r.String() != "d.k: window_test 2/MINUTE" {
		t.Errorf("rule %v", r)
	}
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			s, clk := b.server(t, cfg, Options{})
			run(t, s, clk, "d", []call{
				{at: 1200, repeat: 1, descs: []Descriptor{d("k", "x")}, overall: CodeOK},
				{descs: []Descriptor{d("k", "x")}, overall: CodeOverLimit},
				{descs: []Descriptor{d("k", "y")}, overall: CodeOK},
				{at: 1260, repeat: 1, descs: []Descriptor{d("k", "x")}, overall: CodeOK},
			})
		})
	}
}

// A paced queue makes a call wait, which the protocol cannot say: the
// registry's leaky bucket is no rule algorithm, and neither is its fixed
// window, which the peer's replaces.
func TestRuleAlgorithms(t *testing.T) {
	want := []string{"fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log", "concurrency"}
	if got := ruleAlgorithms(0, false); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("rule algorithms %v, want %v", got, want)
	}
	if _, err := Parse("lb.yaml", []byte("domain: d\ndescriptors:\n  - {key: k, rate_limit: {algorithm: leaky_bucket, unit: minute, requests_per_unit: 2}}\n")); err == nil {
		t.Error("leaky_bucket accepted")
	}
}
