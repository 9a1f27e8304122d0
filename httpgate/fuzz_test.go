package httpgate_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

var (
	tenantOK = regexp.MustCompile(`^[\x21-\x7e]{1,256}$`)
	countOK  = regexp.MustCompile(`^[0-9]{1,18}$`)
)

// FuzzHeaders throws arbitrary tenant, cost and deadline header values at
// the middleware: it must never panic, and a malformed header must give 400
// with reason invalid — never reach the handler.
func FuzzHeaders(f *testing.F) {
	for _, seed := range [][3]string{
		{"acme", "250", "250ms"}, {"", "", ""}, {"has space", "-5", "banana"},
		{"k", "99999999999999999999", "-1s"}, {"\x00", "1e3", "999h"}, {"é", "0", "1ns"},
	} {
		f.Add(seed[0], seed[1], seed[2])
	}
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	g, _ := gate.NewRateLimit("r", memory.NewKeyed(tb, memory.Options{MaxKeys: 1 << 16}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, g)
	mw, _ := httpgate.New(chain, httpgate.Config{
		Rules: identify.Rules{
			TenantHeader:   "X-Api-Key",
			DeadlineHeader: "X-Request-Timeout",
			Routes:         []identify.Route{{Path: "/", Cost: identify.Cost{Header: "X-Stops", Per: 100, Max: 50}}},
		},
	})
	reached := false
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = true }))
	f.Fuzz(func(t *testing.T, tenant, stops, timeout string) {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header["X-Api-Key"] = []string{tenant}
		req.Header["X-Stops"] = []string{stops}
		req.Header["X-Request-Timeout"] = []string{timeout}
		w := httptest.NewRecorder()
		reached = false
		h.ServeHTTP(w, req)
		d, err := time.ParseDuration(timeout)
		valid := tenantOK.MatchString(tenant) && countOK.MatchString(stops) && err == nil && d > 0
		switch {
		case valid && d < time.Millisecond && w.Code == 503:
			// A budget of a few ns may run out before the decision: the
			// deadline rejection is the right answer.
		case valid && (w.Code != 200 || !reached):
			t.Fatalf("valid headers %q %q %q refused: %d %s", tenant, stops, timeout, w.Code, w.Body)
		case !valid && (w.Code != 400 || reached):
			t.Fatalf("malformed headers %q %q %q got %d (handler reached: %v)", tenant, stops, timeout, w.Code, reached)
		case !valid:
			var e struct {
				Error struct{ Reason string } `json:"error"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Error.Reason != "invalid" {
				t.Fatalf("400 body %q: %v", w.Body, err)
			}
			if _, err := strconv.Atoi(w.Header().Get("Retry-After")); err == nil {
				t.Fatal("invalid request told to retry")
			}
		}
	})
}
