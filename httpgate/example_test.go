package httpgate_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// stopped is a clock at which time stands still, so the example's output
// does not depend on how fast it runs.
type stopped struct{}

func (stopped) Now() clock.Instant { return 1 }

// The middleware in front of a handler: tenants are told apart by their
// X-Api-Key, route solves are critical and cost one unit per 100 stops,
// and a tenant past its token bucket gets 429 with Retry-After and the
// RateLimit fields.
func ExampleMiddleware_Wrap() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 2) // 1/s, bursts of 2
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}),
		gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: stopped{}}, rate)

	mw, _ := httpgate.New(chain, httpgate.Config{
		Rules: identify.Rules{
			TenantHeader:   "X-Api-Key",
			DeadlineHeader: "X-Request-Timeout",
			Routes: []identify.Route{
				{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical,
					Cost: identify.Cost{Header: "X-Stops", Per: 100, Min: 1, Max: 50}},
				{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
			},
		},
		Jitter: &sluice.Jitter{}, // exact Retry-After, for the example's output
	})
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	h := mw.Wrap(app) // in a service: http.ListenAndServe(":8080", h)

	for range 3 {
		req := httptest.NewRequest("GET", "/v1/routes/42", nil)
		req.Header.Set("X-Api-Key", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200  "request-rate";r=1;t=1
	// 200  "request-rate";r=0;t=2
	// 429 1 "request-rate";r=0;t=1
}

// A tenant key from a key function: per client address, here with no
// trusted proxy (so X-Forwarded-For is never read). Two requests from one
// address share its bucket; another address has its own.
func ExampleConfig_tenantKey() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	rate, _ := gate.NewRateLimit("per-ip", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: stopped{}}, rate)
	key, _ := identify.Key(identify.KeyRules{Parts: []identify.Part{identify.FromClientIP()}})
	mw, _ := httpgate.New(chain, httpgate.Config{TenantKey: key, Jitter: &sluice.Jitter{}})
	h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, peer := range []string{"192.0.2.1:1000", "192.0.2.1:1001", "192.0.2.2:1000"} {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = peer
		req.Header.Set("X-Forwarded-For", "198.51.100.1") // not from a trusted proxy: ignored
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(peer, rec.Code)
	}
	// Output:
	// 192.0.2.1:1000 200
	// 192.0.2.1:1001 429
	// 192.0.2.2:1000 200
}
