package rls

import (
	"strings"
	"testing"
)

// A sluice policy in a configuration folder is named for what it is, not
// listed as unknown fields.
func TestPolicyFileIsNamed(t *testing.T) {
	_, err := Parse("p.yaml", []byte("version: 1\ngates:\n  - {name: rate, kind: token_bucket, scope: service, rate: 1/s, burst: 1}\n"))
	if err == nil || strings.Count(err.Error(), "\n") > 0 || !strings.Contains(err.Error(), "p.yaml:1: (file): a sluice policy") {
		t.Errorf("got %v", err)
	}
}
