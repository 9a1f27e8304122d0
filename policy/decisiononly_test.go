package policy

import (
	"errors"
	"strings"
	"testing"
)

// Every kind is classified: a new kind must say whether a decision
// endpoint can enforce it.
func TestDecisionOnlyClassifiesEveryKind(t *testing.T) {
	rate := map[string]bool{"token_bucket": true, "gcra": true, "fixed_window": true, "sliding_window": true,
		"sliding_log": true, "leaky_bucket": true, "reservation": true} // reservation: its capacity form
	for _, k := range kinds {
		got := afterWork(&Gate{Kind: k.name, params: k.new()}) == ""
		if want := rate[k.name]; got != want {
			t.Errorf("kind %s: enforceable behind a decision endpoint %v, want %v", k.name, got, rate[k.name])
		}
	}
}

func TestCheckDecisionOnly(t *testing.T) {
	f, err := Load("../examples/routes-api.yaml")
	if err != nil {
		t.Fatal(err)
	}
	err = CheckDecisionOnly(f)
	var es Errors
	if !errors.As(err, &es) || len(es) != 3 {
		t.Fatalf("%v", err)
	}
	for i, want := range []string{"gates[1].kind: concurrent-requests (concurrency) holds a slot", "gates[2].kind: in-time (deadline)", "gates[3].kind: worker-pool (adaptive_concurrency)"} {
		if !strings.Contains(es[i].Error(), want) || !strings.HasPrefix(es[i].Error(), "../examples/routes-api.yaml:") {
			t.Errorf("%s", es[i])
		}
	}
	f, err = Parse("rates.yaml", []byte(`version: 1
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: a, kind: token_bucket, rate: 10/s, burst: 20}
  - {name: b, kind: sliding_window, scope: service, limit: 1000, window: 1m}
  - {name: c, kind: reservation, capacity: 100, shares: {default: {reserve: 50}}}
  - {name: d, kind: reservation, inflight: 10, shares: {default: {reserve: 5}}, mode: off}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDecisionOnly(f); err == nil || !strings.Contains(err.Error(), "rates.yaml:7: gates[3].kind: d (reservation) holds its work units") {
		t.Fatalf("%v", err)
	}
	f.Gates = f.Gates[:3]
	if err := CheckDecisionOnly(f); err != nil {
		t.Fatal(err)
	}
}
