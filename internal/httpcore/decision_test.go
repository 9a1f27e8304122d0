package httpcore_test

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
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

var decisionRules = identify.Rules{
	TenantHeader:   "X-Api-Key",
	DeadlineHeader: "X-Request-Timeout",
	Routes: []identify.Route{
		{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical, Cost: identify.Cost{Header: "X-Stops", Per: 100, Min: 1, Max: 50}},
		{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
	},
}

// decisionChain is a fresh chain on clk: a token bucket per tenant (1/s,
// burst 3; its tokens are refunded when the later gate rejects) and a
// fixed window per tenant and operation (5 per 10 s).
func decisionChain(t testing.TB, clk *fakeclock.Clock) *sluice.Chain {
	t.Helper()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 3)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	fw, _ := limit.NewFixedWindow(5, 10*time.Second)
	win, _ := gate.NewRateLimit("route-window", memory.NewKeyed(fw, memory.Options{}), gate.Options{Scope: sluice.ScopeTenantOperation})
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: clk}, rate, win)
	if err != nil {
		t.Fatal(err)
	}
	return chain
}

type pair struct {
	mw, dmw *httpcore.Middleware
	inproc  http.Handler // the middleware in front of a handler answering 200
	decide  http.Handler // the nginx form
	envoy   http.Handler // the Envoy form, under /ext_authz
}

// newPair builds the same chain twice on one clock: once in front of a
// handler (the middleware), once behind decision handlers.
func newPair(t testing.TB, clk *fakeclock.Clock) *pair {
	t.Helper()
	p := &pair{}
	var err error
	cfg := httpcore.Config{Rules: decisionRules, Jitter: noJitter}
	if p.mw, err = httpcore.New(decisionChain(t, clk), cfg); err != nil {
		t.Fatal(err)
	}
	if p.dmw, err = httpcore.New(decisionChain(t, clk), cfg); err != nil {
		t.Fatal(err)
	}
	p.inproc = p.mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	if p.decide, err = p.dmw.DecisionHandler(httpcore.DecisionConfig{}); err != nil {
		t.Fatal(err)
	}
	if p.envoy, err = p.dmw.DecisionHandler(httpcore.DecisionConfig{StripPrefix: "/ext_authz"}); err != nil {
		t.Fatal(err)
	}
	return p
}

// answer is what a client sees of a decision: the status and the fields
// sluice sets, and the body of a rejection.
type answer struct {
	status int
	fields string
	body   string
}

var answerFields = []string{"Retry-After", "Ratelimit-Policy", "Ratelimit", "X-Request-Id", "Sluice-Level", "Content-Type"}

func answerOf(rec *httptest.ResponseRecorder) answer {
	var b strings.Builder
	for _, k := range answerFields {
		if k == "Content-Type" && rec.Code == http.StatusOK {
			continue // the upstream's, not sluice's
		}
		if v, ok := rec.Header()[k]; ok {
			b.WriteString(k + ": " + strings.Join(v, ", ") + "\n")
		}
	}
	a := answer{status: rec.Code, fields: b.String()}
	if rec.Code != http.StatusOK {
		a.body = rec.Body.String()
	}
	return a
}

type step struct {
	advance time.Duration // the clock moves this much first
	method  string
	uri     string
	header  map[string]string
}

// decisionVector exercises the token bucket (burst, refill, cost above
// the burst), the window per operation, cost headers, deadlines, request
// ids and malformed identity headers, for two tenants.
var decisionVector = []step{
	{method: "GET", uri: "/v1/routes/1", header: map[string]string{"X-Api-Key": "acme"}},
	{method: "GET", uri: "/v1/routes/2?full=1", header: map[string]string{"X-Api-Key": "acme", "X-Request-Id": "r-2"}},
	{method: "POST", uri: "/v1/routes", header: map[string]string{"X-Api-Key": "acme", "X-Stops": "100"}},
	{method: "GET", uri: "/v1/routes/3", header: map[string]string{"X-Api-Key": "acme", "X-Request-Id": "r-4"}}, // 429: bucket empty
	{method: "GET", uri: "/v1/routes/3", header: map[string]string{"X-Api-Key": "umbrella"}},
	{advance: 1500 * time.Millisecond, method: "GET", uri: "/V1/Routes/3/", header: map[string]string{"X-Api-Key": "acme"}},
	{method: "POST", uri: "/v1/routes", header: map[string]string{"X-Api-Key": "umbrella", "X-Stops": "250", "X-Request-Id": "r-7"}},                     // cost 3 takes the refilled bucket
	{method: "POST", uri: "/v1/routes", header: map[string]string{"X-Api-Key": "umbrella", "X-Stops": "9999", "X-Request-Id": "r-8"}},                    // cost 50 > burst: not retryable
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella", "X-Request-Timeout": "250ms"}},                        // 429: empty
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella", "X-Request-Timeout": "soon", "X-Request-Id": "r-10"}}, // 400
	{method: "GET", uri: "/v1/routes/9", header: map[string]string{"X-Api-Key": "has space", "X-Request-Id": "r-11"}},                                    // 400
	{method: "GET", uri: "/v1/routes/9", header: map[string]string{"X-Request-Id": "r-12"}},                                                              // anonymous
	{advance: 10 * time.Second, method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella"}},
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella"}},
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella"}},
	{advance: 4 * time.Second, method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella"}},
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella"}},
	{method: "GET", uri: "/v1/analytics/daily", header: map[string]string{"X-Api-Key": "umbrella", "X-Request-Id": "r-18"}}, // window of 5 spent: 429
	{method: "DELETE", uri: "http://routes.example/v1/routes/1", header: map[string]string{"X-Api-Key": "acme"}},
}

// The decision endpoint, in both its forms, gives the decision and the
// fields the middleware gives, request for request.
func TestDecisionMatchesMiddleware(t *testing.T) {
	for _, form := range []string{"nginx", "envoy"} {
		t.Run(form, func(t *testing.T) {
			clk := fakeclock.New(1)
			p := newPair(t, clk)
			statuses := map[int]int{}
			for i, s := range decisionVector {
				clk.Advance(s.advance)
				in := httptest.NewRequest(s.method, s.uri, nil)
				var dr *http.Request
				if form == "nginx" {
					dr = httptest.NewRequest("GET", "/v1/decide", nil)
					dr.Header.Set("X-Original-Method", s.method)
					dr.Header.Set("X-Original-URI", s.uri)
				} else {
					dr = httptest.NewRequest(s.method, "/ext_authz"+in.URL.RequestURI(), nil)
				}
				for k, v := range s.header {
					in.Header.Set(k, v)
					dr.Header.Set(k, v)
				}
				if s.header["X-Request-Id"] == "" { // generated ids differ: name each request
					in.Header.Set("X-Request-Id", "s-"+strconv.Itoa(i))
					dr.Header.Set("X-Request-Id", "s-"+strconv.Itoa(i))
				}
				want, got := httptest.NewRecorder(), httptest.NewRecorder()
				p.inproc.ServeHTTP(want, in)
				h := p.decide
				if form == "envoy" {
					h = p.envoy
				}
				h.ServeHTTP(got, dr)
				w, g := answerOf(want), answerOf(got)
				if g != w {
					t.Fatalf("step %d %s %s: decision endpoint\n%d\n%s%s\nmiddleware\n%d\n%s%s", i, s.method, s.uri, g.status, g.fields, g.body, w.status, w.fields, w.body)
				}
				if got.Code == http.StatusOK && (got.Body.Len() != 0 || got.Header().Get("Content-Length") != "0") {
					t.Fatalf("step %d: admitted with a body %q", i, got.Body)
				}
				statuses[got.Code]++
				t.Logf("step %d: %d %s", i, got.Code, got.Header().Get("RateLimit"))
			}
			if statuses[200] < 8 || statuses[429] < 3 || statuses[400] < 2 {
				t.Fatalf("the vector does not exercise every answer: %v", statuses)
			}
		})
	}
}

// Missing or malformed original-request headers give 400 with reason
// invalid and a message naming the header; nothing is decided.
func TestDecisionBadOriginalGives400(t *testing.T) {
	clk := fakeclock.New(1)
	p := newPair(t, clk)
	for _, c := range []struct {
		name   string
		header map[string][]string
		path   string
		want   string
	}{
		{"no method", map[string][]string{"X-Original-Uri": {"/"}}, "/v1/decide", "missing X-Original-Method"},
		{"no uri", map[string][]string{"X-Original-Method": {"GET"}}, "/v1/decide", "missing X-Original-Uri"},
		{"two methods", map[string][]string{"X-Original-Method": {"GET", "POST"}, "X-Original-Uri": {"/"}}, "/v1/decide", "malformed X-Original-Method"},
		{"bad method", map[string][]string{"X-Original-Method": {"GE T"}, "X-Original-Uri": {"/"}}, "/v1/decide", "malformed X-Original-Method"},
		{"two uris", map[string][]string{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/", "/a"}}, "/v1/decide", "more than one X-Original-Uri"},
		{"relative uri", map[string][]string{"X-Original-Method": {"GET"}, "X-Original-Uri": {"v1/routes"}}, "/v1/decide", "malformed X-Original-Uri"},
		{"bad escape", map[string][]string{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/v1/%zz"}}, "/v1/decide", "malformed X-Original-Uri"},
		{"empty uri", map[string][]string{"X-Original-Method": {"GET"}, "X-Original-Uri": {""}}, "/v1/decide", "malformed X-Original-Uri"},
		{"bad tenant", map[string][]string{"X-Original-Method": {"GET"}, "X-Original-Uri": {"/"}, "X-Api-Key": {"a b"}}, "/v1/decide", "malformed X-Api-Key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", c.path, nil)
			for k, v := range c.header {
				r.Header[k] = v
			}
			rec := httptest.NewRecorder()
			p.decide.ServeHTTP(rec, r)
			e := decode(t, rec.Body.Bytes())
			if rec.Code != 400 || e.Error.Reason != "invalid" || !strings.Contains(e.Error.Message, c.want) || rec.Header().Get("Retry-After") != "" {
				t.Fatalf("%d %s", rec.Code, rec.Body)
			}
		})
	}
	rec := httptest.NewRecorder()
	p.envoy.ServeHTTP(rec, httptest.NewRequest("GET", "/ext_authzv1/routes", nil))
	if e := decode(t, rec.Body.Bytes()); rec.Code != 400 || !strings.Contains(e.Error.Message, "/ext_authz/") {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	p.envoy.ServeHTTP(rec, httptest.NewRequest("GET", "/ext_authz", nil))
	if rec.Code != 200 {
		t.Fatalf("the bare prefix is the path /: %d %s", rec.Code, rec.Body)
	}
}

func TestDecisionHandlerConfig(t *testing.T) {
	mw, _ := httpcore.New(decisionChain(t, fakeclock.New(1)), httpcore.Config{})
	for _, cfg := range []httpcore.DecisionConfig{
		{StripPrefix: "ext_authz"}, {StripPrefix: "/ext_authz/"}, {StripPrefix: "/a?b"},
		{MethodHeader: "X Method"}, {URIHeader: "X-Uri:"},
	} {
		if _, err := mw.DecisionHandler(cfg); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	h, err := mw.DecisionHandler(httpcore.DecisionConfig{MethodHeader: "x-method", URIHeader: "x-uri"})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/decide", nil)
	r.Header.Set("X-Method", "GET")
	r.Header.Set("X-Uri", "/v1/routes/1")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
}

// A concurrency gate behind a decision endpoint sees every request end at
// once: the Ticket is done before the answer, so the slot is free again
// and nothing stays in flight (the documented reason such gates do not
// belong there).
func TestDecisionReleasesBeforeAnswering(t *testing.T) {
	c1, _ := limit.NewConcurrency(1)
	in, _ := gate.NewInFlight("pool", memory.NewKeyed(c1, memory.Options{}), gate.Options{})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, in)
	mw, _ := httpcore.New(chain, httpcore.Config{})
	h, _ := mw.DecisionHandler(httpcore.DecisionConfig{})
	for i := range 3 {
		r := httptest.NewRequest("GET", "/v1/decide", nil)
		r.Header.Set("X-Original-Method", "GET")
		r.Header.Set("X-Original-Uri", "/")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if rec.Code != 200 {
			t.Fatalf("decision %d: %d", i, rec.Code)
		}
	}
}

// Update on the middleware reaches its decision handlers.
func TestDecisionFollowsUpdate(t *testing.T) {
	clk := fakeclock.New(1)
	p := newPair(t, clk)
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	rate, _ := gate.NewRateLimit("strict", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	strict, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, rate)
	if err := p.dmw.Update(strict, httpcore.Config{Rules: decisionRules, Jitter: noJitter}); err != nil {
		t.Fatal(err)
	}
	var codes []int
	for range 2 {
		r := httptest.NewRequest("GET", "/v1/decide", nil)
		r.Header.Set("X-Original-Method", "GET")
		r.Header.Set("X-Original-Uri", "/v1/routes/1")
		rec := httptest.NewRecorder()
		p.decide.ServeHTTP(rec, r)
		codes = append(codes, rec.Code)
		if !bytes.Contains([]byte(rec.Header().Get("RateLimit")), []byte(`"strict"`)) {
			t.Fatalf("RateLimit %q", rec.Header().Get("RateLimit"))
		}
	}
	if codes[0] != 200 || codes[1] != 429 {
		t.Fatal(codes)
	}
}

// The nginx form keys a query-parameter tenant from the original URI (not
// the check request's own), and a client-IP tenant from X-Forwarded-For
// only when the asking proxy is trusted.
func TestDecisionTenantFromQueryAndClientIP(t *testing.T) {
	decideWith := func(tenant identify.KeyRules) http.Handler {
		tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
		rate, _ := gate.NewRateLimit("r", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
		chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)}, rate)
		mw, err := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{Tenant: tenant}, Jitter: noJitter})
		if err != nil {
			t.Fatal(err)
		}
		h, _ := mw.DecisionHandler(httpcore.DecisionConfig{})
		return h
	}
	ask := func(h http.Handler, uri, peer, xff string) int {
		r := httptest.NewRequest("GET", "/decide?api_key=ignored", nil)
		r.Header.Set("X-Original-Method", "GET")
		r.Header.Set("X-Original-URI", uri)
		r.RemoteAddr = peer
		if xff != "" {
			r.Header.Set("X-Forwarded-For", xff)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	q := decideWith(identify.KeyRules{Parts: []identify.Part{identify.FromQuery("api_key")}})
	if a, b, c := ask(q, "/x?api_key=a", "127.0.0.1:1", ""), ask(q, "/x?api_key=a", "127.0.0.1:1", ""), ask(q, "/x?api_key=b", "127.0.0.1:1", ""); a != 200 || b != 429 || c != 200 {
		t.Errorf("query tenant: %d %d %d, want 200 429 200", a, b, c)
	}
	lo, _ := identify.ParseTrustedProxy("127.0.0.0/8")
	ip := decideWith(identify.KeyRules{Parts: []identify.Part{identify.FromClientIP()}, ClientIP: identify.ClientIP{TrustedProxies: []netip.Prefix{lo}}})
	if a, b, c := ask(ip, "/x", "127.0.0.1:1", "198.51.100.1"), ask(ip, "/x", "127.0.0.1:1", "198.51.100.1"), ask(ip, "/x", "127.0.0.1:1", "198.51.100.2"); a != 200 || b != 429 || c != 200 {
		t.Errorf("trusted nginx: %d %d %d, want 200 429 200", a, b, c)
	}
	if a, b := ask(ip, "/x", "192.0.2.9:1", "198.51.100.3"), ask(ip, "/x", "192.0.2.9:1", "198.51.100.4"); a != 200 || b != 429 {
		t.Errorf("untrusted asker, spoofed X-Forwarded-For: %d %d, want 200 429", a, b)
	}
}
