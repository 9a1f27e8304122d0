package metrics

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-go/sluice"
)

func TestTopRejectedFindsATenantThatNeverEarnedALabel(t *testing.T) {
	m := New(Options{MaxTenants: 1, TenantAfter: 1, TopTenants: 4})
	adm := &sluice.Decision{Admitted: true}
	m.Decided(&sluice.Request{Tenant: "steady", Class: "default"}, adm, 0) // takes the one label
	for range 30 {
		m.Decided(&sluice.Request{Tenant: "sk_live_flood", Class: "default"}, &sluice.Decision{Reason: sluice.ReasonPolicyRate, Gate: "rate"}, 0)
	}
	for range 5 {
		m.Decided(&sluice.Request{Tenant: "sk_live_flood", Class: "default"}, &sluice.Decision{Reason: sluice.ReasonConcurrency, Gate: "pool"}, 0)
	}
	for i := range 20 { // one-shot keys: at most Total/Capacity each
		m.Decided(&sluice.Request{Tenant: fmt.Sprint("junk", i), Class: "default"}, &sluice.Decision{Reason: sluice.ReasonInvalid}, 0)
	}
	if out := scrape(t, m); !strings.Contains(out, `tenant="other"} 30`) {
		t.Fatalf("the flood should be under other in /metrics:\n%s", out)
	}
	top := m.TopRejected(1)
	if top.Total != 55 || top.Capacity != 4 || len(top.Tenants) != 1 {
		t.Fatalf("top %+v", top)
	}
	got := top.Tenants[0]
	if got.Tenant != HashTenant("sk_live_flood") || got.Count != 35 || got.Error != 0 ||
		got.By["policy_rate"] != 30 || got.By["concurrency"] != 5 || len(got.By) != 2 {
		t.Fatalf("the heaviest: %+v", got)
	}
	for _, tc := range m.TopRejected(10).Tenants {
		if strings.Contains(tc.Tenant, "sk_live") || strings.Contains(tc.Tenant, "junk") {
			t.Fatalf("a tenant key is visible: %+v", tc)
		}
		if tc.Error*int64(top.Capacity) > top.Total {
			t.Fatalf("error over Total/Capacity: %+v", tc)
		}
	}
}

func TestTopConsumedCountsUnitsByOutcome(t *testing.T) {
	m := New(Options{TopTenants: 8, TenantLabel: func(t string) string { return t }})
	for i := range 10 {
		r := &sluice.Request{Tenant: "big", Class: "critical", Cost: 7}
		m.Decided(r, &sluice.Decision{Admitted: true}, 0)
		m.Done(r, sluice.Completion{Outcome: sluice.Outcome(i % 2 * 2)}) // useful, errored, ...
	}
	r := &sluice.Request{Tenant: "small", Class: "default"} // cost 0 counts 1, as the metrics do
	m.Decided(r, &sluice.Decision{Admitted: true}, 0)
	m.Done(r, sluice.Completion{Outcome: sluice.OutcomeLate})
	top := m.TopConsumed(10)
	want := `{8 71 [{big 70 0 map[errored:35 useful:35]} {small 1 0 map[late:1]}]}`
	if fmt.Sprint(top) != want {
		t.Fatalf("got %v, want %s", top, want)
	}
	if m.TopRejected(5).Total != 0 {
		t.Fatal("rejections counted with none")
	}
}

func TestTopKeepsLongAndNULKeysAsLabels(t *testing.T) {
	m := New(Options{TopTenants: 4})
	long := strings.Repeat("k", 5000)
	for _, k := range []string{long, "\x00x"} {
		m.Decided(&sluice.Request{Tenant: k}, &sluice.Decision{Reason: sluice.ReasonPolicyRate}, 0)
	}
	got := map[string]bool{}
	for _, tc := range m.TopRejected(4).Tenants {
		got[tc.Tenant] = true
	}
	if !got[HashTenant(long)] || !got[HashTenant("\x00x")] || len(got) != 2 {
		t.Fatalf("labels %v", got)
	}
}

func TestTopTenantsOff(t *testing.T) {
	m := New(Options{TopTenants: -1})
	m.Decided(&sluice.Request{Tenant: "a"}, &sluice.Decision{Reason: sluice.ReasonPolicyRate}, 0)
	if top := m.TopRejected(3); top.Capacity != 0 || len(top.Tenants) != 0 || topTenantsBytes(-1) != 0 {
		t.Fatalf("%+v", top)
	}
	if topTenantsBytes(DefaultTopTenants) > 64<<10 {
		t.Fatalf("the default sketches may hold %d bytes, over the 64 KiB the docs imply", topTenantsBytes(DefaultTopTenants))
	}
}

func TestClassesSumTheCountersOverTenants(t *testing.T) {
	m := New(Options{TenantAfter: 1})
	adm := &sluice.Decision{Admitted: true}
	for i := range 6 {
		r := &sluice.Request{Tenant: fmt.Sprint("t", i%3), Class: "default", Cost: 2}
		m.Decided(r, adm, 0)
		if i < 4 {
			m.Done(r, sluice.Completion{Outcome: sluice.OutcomeUseful})
		}
	}
	m.Decided(&sluice.Request{Tenant: "t0", Class: "default"}, &sluice.Decision{Reason: sluice.ReasonPolicyRate, Gate: "rate"}, 0)
	m.ShadowRejected(&sluice.Request{Tenant: "t1", Class: "sheddable"}, &sluice.Decision{Reason: sluice.ReasonOverload, Gate: "ladder"})
	got := fmt.Sprint(m.Classes())
	want := `[{default 7 6 map[useful:4] map[policy_rate:1] map[] map[admitted:12 consumed:8 offered:13 rejected:1] 8 2} ` +
		`{sheddable 0 0 map[] map[] map[overload:1] map[] 0 0}]`
	if got != want {
		t.Fatalf("got  %s\nwant %s", got, want)
	}
	out := scrape(t, m)
	for _, s := range []string{`sluice_requests_inflight{class="default"} 2`, `sluice_goodput_units_total{class="default",tenant=`} {
		if !strings.Contains(out, s) {
			t.Fatalf("/metrics lacks %s", s)
		}
	}
}

// TenantKey finds the key behind a label among the tenants with a label
// slot and those the sketches keep, and nothing else.
func TestTenantKey(t *testing.T) {
	m := New(Options{MaxTenants: 1, TenantAfter: 1, TopTenants: 4})
	if _, ok := m.TenantKey(HashTenant("sk_a")); ok {
		t.Fatal("found a tenant never seen")
	}
	m.Decided(&sluice.Request{Tenant: "steady", Class: "default"}, &sluice.Decision{Admitted: true}, 0) // a label slot
	m.Decided(&sluice.Request{Tenant: "sk_a", Class: "default"}, &sluice.Decision{Reason: sluice.ReasonPolicyRate, Gate: "rate"}, 0)
	long := strings.Repeat("k", 4096) // kept by its digest only
	m.Decided(&sluice.Request{Tenant: long, Class: "default"}, &sluice.Decision{Reason: sluice.ReasonPolicyRate, Gate: "rate"}, 0)
	for key, want := range map[string]bool{"steady": true, "sk_a": true, long: false} {
		if k, ok := m.TenantKey(HashTenant(key)); ok != want || (ok && k != key) {
			t.Errorf("%.10s: %.10q %v", key, k, ok)
		}
	}
	if _, ok := New(Options{TopTenants: -1}).TenantKey(HashTenant("sk_a")); ok {
		t.Fatal("found a tenant without sketches")
	}
}
