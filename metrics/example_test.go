package metrics_test

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/store/memory"
)

// The chain's decisions as Prometheus metrics: two admitted and one
// rejected by the rate gate, read back from the handler's exposition
// (MaxTenants -1: no tenant label values, every tenant is "other"; by
// default a tenant admitted 10 times gets a label, a hash of its key).
func ExampleNew() {
	m := metrics.New(metrics.Options{MaxTenants: -1})
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 2)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Observer: m}, rate)
	for range 3 {
		if d, tk := chain.Decide(context.Background(), &sluice.Request{Tenant: "acme"}); d.Admitted {
			tk.Done(sluice.OutcomeUseful)
		}
	}
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "sluice_requests_admitted_total") || strings.HasPrefix(line, "sluice_requests_rejected_total") {
			fmt.Println(line)
		}
	}
	// Output:
	// sluice_requests_admitted_total{class="",tenant="other"} 2
	// sluice_requests_rejected_total{class="",gate="request-rate",mode="enforce",reason="policy_rate",tenant="other"} 1
}
