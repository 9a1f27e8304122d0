package httpcore_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/httpcore"
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
	mw, _ := httpcore.New(chain, httpcore.Config{
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

// FuzzDecisionHeaders throws arbitrary original methods, URIs and identity
// headers at the decision endpoint, next to the middleware on the same
// chain and clock: it must never panic; a method or URI that net/http
// would not take as a request line gives 400 with reason invalid, and
// every other request gets the middleware's own status and fields.
func FuzzDecisionHeaders(f *testing.F) {
	for _, seed := range [][4]string{
		{"GET", "/v1/routes/1", "acme", ""}, {"POST", "/v1/routes?x=1", "acme", "250"},
		{"", "", "", ""}, {"G ET", "/", "k", ""}, {"GET", "v1", "k", ""}, {"GET", "/%zz", "k", ""},
		{"DELETE", "http://h/v1/analytics/x", "k", "-1"}, {"OPTIONS", "*", "\x00", "9"},
		{"GET", "//v1/../v1/./routes/", "é", "99999999999999999999"},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	clk := fakeclock.New(1)
	p := newPair(f, clk)
	f.Fuzz(func(t *testing.T, method, uri, tenant, stops string) {
		clk.Advance(200 * time.Millisecond)
		dr := httptest.NewRequest("GET", "/v1/decide", nil)
		dr.Header["X-Original-Method"] = []string{method}
		dr.Header["X-Original-Uri"] = []string{uri}
		dr.Header["X-Api-Key"] = []string{tenant}
		dr.Header["X-Stops"] = []string{stops}
		dr.Header["X-Request-Id"] = []string{"f"}
		got := httptest.NewRecorder()
		p.decide.ServeHTTP(got, dr)

		u, err := url.ParseRequestURI(uri)
		if err != nil || !methodOK.MatchString(method) {
			if e := decode(t, got.Body.Bytes()); got.Code != 400 || e.Error.Reason != "invalid" {
				t.Fatalf("original %q %q: %d %s", method, uri, got.Code, got.Body)
			}
			return
		}
		in := &http.Request{Method: method, URL: u, Header: http.Header{}, RequestURI: uri}
		in = in.WithContext(context.Background())
		for _, k := range []string{"X-Api-Key", "X-Stops", "X-Request-Id"} {
			in.Header[k] = dr.Header[k]
		}
		want := httptest.NewRecorder()
		p.inproc.ServeHTTP(want, in)
		if g, w := answerOf(got), answerOf(want); g != w {
			t.Fatalf("original %q %q tenant %q stops %q: decision endpoint %d\n%s%s\nmiddleware %d\n%s%s", method, uri, tenant, stops, g.status, g.fields, g.body, w.status, w.fields, w.body)
		}
	})
}

var methodOK = regexp.MustCompile("^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
