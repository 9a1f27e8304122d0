package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
)

// Every gate over the Redis store exports its store failures, fleet usage
// included, when Redis is gone.
func TestStoreFailuresExportedForEveryRedisGate(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	policy := strings.ReplaceAll(`version: 1
service: failures
store: {backend: redis, addrs: [ADDR], timeout: 50ms, on_failure: fail_open}
routes:
  - {match: {path: "/x"}, class: sheddable}
gates:
  - {name: fleet, kind: fleet_usage, limit: 10, reserve: {default: 20%}}
  - {name: rate, kind: token_bucket, scope: tenant, rate: 10/s, burst: 10}
`, "ADDR", srv.Addr)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.rt.Close()
	srv.Kill()
	proxy := httptest.NewServer(s.Handler())
	defer proxy.Close()
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	if resp, err := http.Get(proxy.URL + "/x"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("fail_open: %v %v", resp, err)
	}
	resp, err := http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_gate_store_failures_total{gate="fleet",policy="fail_open"} 1`, `sluice_gate_store_failures_total{gate="rate",policy="fail_open"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The proxy starts while Redis is down (a restart during an outage must
// not take the API down): it serves by the failure policy (here
// fail_closed: 503) and decides on Redis once Redis is up.
func TestProxyStartsWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	policy := strings.ReplaceAll(`version: 1
service: startup
store: {backend: redis, addrs: [ADDR], probe_every: 100ms, on_failure: fail_closed}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 100/s, burst: 100}
`, "ADDR", srv.Addr)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatalf("the proxy refused to start with Redis down: %v", err)
	}
	defer s.rt.Close()
	proxy := httptest.NewServer(s.Handler())
	defer proxy.Close()
	get := func() int {
		resp, err := http.Get(proxy.URL + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 503 {
		t.Fatalf("Redis down, fail_closed: %d", code)
	}
	srv.Restart()
	poll.Until(t, 10*time.Second, func() bool { return get() == 200 })
}
