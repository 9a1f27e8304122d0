package policy

import (
	"strings"
	"testing"
)

// A file of the other kind, an envoyproxy/ratelimit configuration, is
// named for what it is, not listed as unknown fields.
func TestRateLimitConfigurationIsNamed(t *testing.T) {
	_, err := Parse("rl.yaml", []byte("domain: edge\ndescriptors:\n  - {key: tenant, rate_limit: {unit: day, requests_per_unit: 5}}\n"))
	var es Errors
	if !asErrors(err, &es) || len(es) != 1 || !strings.Contains(es[0].Error(), "rl.yaml:1: (file): an envoyproxy/ratelimit configuration") {
		t.Errorf("got %v", err)
	}
}
