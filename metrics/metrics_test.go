package metrics

import (
	"context"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func scrape(t *testing.T, m *Metrics) string {
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	b, _ := io.ReadAll(w.Body)
	return string(b)
}

func TestTenantLabelsNeverShowKeysAndAreCapped(t *testing.T) {
	m := New(Options{MaxTenants: 2, TenantAfter: 1})
	secret := "sk_live_SECRET123"
	adm := &sluice.Decision{Admitted: true}
	rej := &sluice.Decision{Reason: sluice.ReasonInvalid}
	// Rejected junk keys do not take label slots.
	for i := range 50 {
		m.Decided(&sluice.Request{Tenant: fmt.Sprint("junk", i), Class: "default"}, rej, 0)
	}
	m.Decided(&sluice.Request{Tenant: secret, Class: "default", Cost: 1}, adm, 0)
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
	h := HashTenant(secret)
	for _, want := range []string{
		`sluice_demand_units_total{class="default",stage="offered",tenant="` + h + `"} 1`,
		`sluice_demand_units_total{class="default",stage="admitted",tenant="` + h + `"} 1`,
		`sluice_demand_units_total{class="default",stage="consumed",tenant="` + h + `"} 3`,
		`sluice_demand_units_total{class="default",stage="rejected",tenant="other"} 50`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
}

// Label slots go to tenants with traffic, not to the first keys seen: a
// flood of admitted one-shot keys earns none, a tenant admitted
// TenantAfter times takes a slot, and one idle for TenantIdle gives it
// back (its series go) to the next that earns one. Before, the 100 slots
// went to the first admitted keys forever, junk keys included.
func TestTenantLabelSlotsFollowTraffic(t *testing.T) {
	clk := fakeclock.New(1)
	m := New(Options{MaxTenants: 1, TenantAfter: 5, TenantIdle: time.Minute, Clock: clk})
	adm := &sluice.Decision{Admitted: true}
	decide := func(tenant string, n int) {
		for range n {
			m.Decided(&sluice.Request{Tenant: tenant, Class: "default"}, adm, 0)
		}
	}
	for i := range 10_000 {
		decide(fmt.Sprint("junk", i), 1)
	}
	decide("steady", 5)
	out := scrape(t, m)
	if !strings.Contains(out, `tenant="`+HashTenant("steady")+`"`) || strings.Contains(out, HashTenant("junk0")) {
		t.Fatalf("the slot did not go to the tenant with traffic:\n%s", grepLines(out, "admitted"))
	}
	decide("newcomer", 5) // no slot free yet
	if strings.Contains(scrape(t, m), HashTenant("newcomer")) {
		t.Fatal("a second tenant got a label beyond MaxTenants")
	}
	clk.Advance(2 * time.Minute) // steady goes idle
	decide("newcomer", 1)
	out = scrape(t, m)
	if !strings.Contains(out, HashTenant("newcomer")) || strings.Contains(out, HashTenant("steady")) {
		t.Fatalf("the idle tenant's slot did not pass on:\n%s", grepLines(out, "admitted"))
	}
}

// A tenant deciding more often than TenantIdle keeps its slot, also when
// TenantIdle is under the second the last decision is otherwise known to
// (its last decision is written at most once an eighth of TenantIdle).
func TestBusyTenantKeepsItsSlotUnderAShortIdle(t *testing.T) {
	clk := fakeclock.New(1)
	m := New(Options{MaxTenants: 1, TenantAfter: 1, TenantIdle: 400 * time.Millisecond, Clock: clk})
	adm := &sluice.Decision{Admitted: true}
	decide := func(tenant string) { m.Decided(&sluice.Request{Tenant: tenant, Class: "default"}, adm, 0) }
	decide("steady")
	for range 705 { // past the minute between reclaims, deciding every 100 ms
		clk.Advance(100 * time.Millisecond)
		decide("steady")
	}
	decide("newcomer") // slots full: the idle ones are reclaimed first
	out := scrape(t, m)
	if !strings.Contains(out, HashTenant("steady")) || strings.Contains(out, HashTenant("newcomer")) {
		t.Fatalf("a tenant deciding every 100 ms lost its slot under TenantIdle 400ms:\n%s", grepLines(out, "admitted"))
	}
}

// failing is a store whose backend is down.
type failing struct{ store.Limiter }

func (failing) Take(context.Context, string, clock.Instant, int64, clock.Instant) (limit.Result, store.Handle, error) {
	return limit.Result{}, 0, store.ErrUnavailable
}

// Every gate over a store exports its store failures, fleet usage included
// (it passes reserved classes through without a decision of its own).
func TestStoreFailuresOfEveryStoreGate(t *testing.T) {
	c, _ := limit.NewConcurrency(10)
	down := failing{memory.NewKeyed(c, memory.Options{})}
	fleet, _ := gate.NewFleetUsage("fleet", down, []string{"critical"}, gate.Options{})
	rate, _ := gate.NewRateLimit("rate", down, gate.Options{})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, fleet, gate.ForClasses(rate, []string{"default"}))
	m := New(Options{})
	m.Gates(func() *sluice.Chain { return chain })
	chain.Decide(context.Background(), &sluice.Request{Class: "default"})
	out := scrape(t, m)
	for _, want := range []string{`sluice_gate_store_failures_total{gate="fleet",policy="fail_open"} 1`, `sluice_gate_store_failures_total{gate="rate",policy="fail_open"} 1`} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, grepLines(out, "store_failures"))
		}
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A lease gate's budget, grant, liveness, spend and stated bounds are
// exported: 500 units/s with the default 100 ms burst may overshoot by 50
// units, and leave 500 × 15 s (the default refresh of a 1-minute lease)
// unused.
func TestLeaseMetrics(t *testing.T) {
	g, err := lease.NewGate("fleet-rate", lease.GateOptions{Budget: "b", Client: "c", Leaser: &lease.Local{},
		Allocator: lease.Allocator{Capacity: 500, Lease: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	m := New(Options{})
	m.Gates(func() *sluice.Chain { return chain })
	out := scrape(t, m)
	for _, want := range []string{`sluice_lease_capacity{gate="fleet-rate"} 500`, `sluice_lease_granted{gate="fleet-rate"} 0`, `sluice_lease_live{gate="fleet-rate"} 0`,
		`sluice_lease_spending{gate="fleet-rate"} 0`, `sluice_lease_overshoot_bound{gate="fleet-rate"} 50`, `sluice_lease_unused_bound{gate="fleet-rate"} 7500`} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s", want)
		}
	}
}
