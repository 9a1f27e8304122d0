package metrics

import (
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
)

func scrape(t *testing.T, m *Metrics) string {
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(w.Body)
	return string(b)
}

func TestTenantLabelsNeverShowKeysAndAreCapped(t *testing.T) {
	m := New(Options{MaxTenants: 2})
	secret := "sk_live_SECRET123"
	adm := &sluice.Decision{Admitted: true}
	rej := &sluice.Decision{Reason: sluice.ReasonInvalid}
	// Rejected junk keys do not take label slots.
	for i := range 50 {
		m.Decided(&sluice.Request{Tenant: fmt.Sprint("junk", i), Class: "default"}, rej, 0)
	}
	m.Decided(&sluice.Request{Tenant: secret, Class: "default"}, adm, 0)
	m.Decided(&sluice.Request{Tenant: "second", Class: "default"}, adm, 0)
	m.Decided(&sluice.Request{Tenant: "third", Class: "default"}, adm, 0)
	m.Done(&sluice.Request{Tenant: secret, Class: "default", Cost: 3}, sluice.Completion{Outcome: sluice.OutcomeUseful})
	out := scrape(t, m)
	if strings.Contains(out, "SECRET") || strings.Contains(out, "junk") {
		t.Fatal("a tenant key is visible in /metrics")
	}
	if !strings.Contains(out, fmt.Sprintf(`sluice_requests_admitted_total{class="default",tenant=%q} 1`, HashTenant(secret))) ||
		!strings.Contains(out, fmt.Sprintf(`tenant=%q`, HashTenant("second"))) ||
		strings.Contains(out, fmt.Sprintf(`tenant=%q`, HashTenant("third"))) {
		t.Fatalf("labels not as expected:\n%s", out)
	}
	if !strings.Contains(out, `sluice_goodput_units_total{class="default",tenant="`+HashTenant(secret)+`"} 3`) {
		t.Fatal("goodput units not counted")
	}
}
