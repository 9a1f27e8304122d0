package sim

import (
	"testing"

	"github.com/sluice-go/sluice/policy"
)

func mustPolicy(tb testing.TB, p *Policy) *policy.File {
	tb.Helper()
	if p == nil {
		return nil
	}
	f, err := policy.Parse(p.Name, p.Data)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}
