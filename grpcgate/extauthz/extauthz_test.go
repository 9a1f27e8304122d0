package extauthz_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/grpcgate/extauthz"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() clock.Instant      { return clock.Instant(c.now.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// probe admits (or rejects with a set decision) and records.
type probe struct {
	mu       sync.Mutex
	last     sluice.Request
	decides  int
	reject   *sluice.Decision
	level    sluice.Level
	released []sluice.Outcome
}

func (p *probe) Name() string { return "probe" }

func (p *probe) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var permit sluice.Permit
	*d, permit = p.decide(ctx, r, now)
	return permit
}

func (p *probe) decide(_ context.Context, r *sluice.Request, _ clock.Instant) (sluice.Decision, sluice.Permit) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last, p.decides = *r, p.decides+1
	if p.reject != nil {
		return *p.reject, 0
	}
	return sluice.Decision{Admitted: true, Level: p.level}, 1
}

func (p *probe) Release(_ *sluice.Request, _ sluice.Permit, c sluice.Completion) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.released = append(p.released, c.Outcome)
}

func (p *probe) seen() (sluice.Request, int, []sluice.Outcome) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last, p.decides, append([]sluice.Outcome(nil), p.released...)
}

func (p *probe) set(fn func(p *probe)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p)
}

var rules = identify.Rules{
	TenantHeader:   "X-Api-Key",
	DeadlineHeader: "X-Request-Timeout",
	Routes: []identify.Route{
		{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical, Cost: identify.Cost{Header: "X-Stops", Per: 100, Max: 50}},
		{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
	},
}

type fixture struct {
	clk    *fakeClock
	probe  *probe
	srv    *extauthz.Server
	client authv3.AuthorizationClient
}

// newFixture serves a server deciding with request-rate (token bucket
// 100/s, burst 2, per tenant) and the probe, on a fake clock.
func newFixture(t *testing.T, cfg extauthz.Config) *fixture {
	t.Helper()
	f := &fixture{clk: &fakeClock{}, probe: &probe{}}
	f.clk.Advance(time.Second)
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 2)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: f.clk}, rate, f.probe)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Jitter == nil {
		cfg.Jitter = &sluice.Jitter{}
	}
	if f.srv, err = extauthz.New(chain, cfg); err != nil {
		t.Fatal(err)
	}
	f.client = serve(t, f.srv)
	return f
}

func serve(t *testing.T, srv *extauthz.Server) authv3.AuthorizationClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	extauthz.Register(gs, srv)
	done := make(chan struct{})
	go func() { defer close(done); gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(); gs.Stop(); <-done })
	return authv3.NewAuthorizationClient(conn)
}

func checkReq(method, path string, headers map[string]string) *authv3.CheckRequest {
	return &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: "10.1.2.3", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}},
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Id: "envoy-id-1", Method: method, Path: path, Headers: headers,
		}},
	}}
}

func (f *fixture) check(t *testing.T, req *authv3.CheckRequest) *authv3.CheckResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := f.client.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func headers(hs []*corev3.HeaderValueOption) map[string]string {
	m := map[string]string{}
	for _, h := range hs {
		m[h.GetHeader().GetKey()] = h.GetHeader().GetValue()
	}
	return m
}

type envelope struct {
	Error struct {
		Reason     string `json:"reason"`
		Scope      string `json:"scope"`
		Gate       string `json:"gate"`
		Retryable  bool   `json:"retryable"`
		RetryAfter int64  `json:"retry_after"`
		RequestID  string `json:"request_id"`
		Message    string `json:"message"`
	} `json:"error"`
}

func denied(t *testing.T, resp *authv3.CheckResponse, code codes.Code, httpStatus int32) (map[string]string, envelope) {
	t.Helper()
	if resp.GetStatus().GetCode() != int32(code) {
		t.Fatalf("status %v, want %v", resp.GetStatus(), code)
	}
	d := resp.GetDeniedResponse()
	if d == nil || int32(d.GetStatus().GetCode()) != httpStatus {
		t.Fatalf("denied response %v, want %d", d, httpStatus)
	}
	for _, h := range d.GetHeaders() {
		//lint:ignore SA1019 the deprecated append field must stay unset beside append_action
		if h.GetAppendAction() != corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD || h.GetAppend() != nil {
			t.Errorf("header %v not set to overwrite", h)
		}
	}
	var e envelope
	if err := json.Unmarshal([]byte(d.GetBody()), &e); err != nil {
		t.Fatalf("body %q: %v", d.GetBody(), err)
	}
	return headers(d.GetHeaders()), e
}

const wantPolicy = `"request-rate";q=100;w=1;sluice-burst=2`

func TestAllowed(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	resp := f.check(t, checkReq("GET", "/v1/analytics/daily?from=2026-01-01", map[string]string{"x-api-key": "acme"}))
	if resp.GetStatus().GetCode() != int32(codes.OK) {
		t.Fatalf("status %v", resp.GetStatus())
	}
	ok := resp.GetOkResponse()
	hs := headers(ok.GetResponseHeadersToAdd())
	if hs["RateLimit-Policy"] != wantPolicy || hs["RateLimit"] != `"request-rate";r=1;t=1` {
		t.Fatalf("response headers %v", hs)
	}
	if len(ok.GetHeadersToRemove()) != 1 || ok.GetHeadersToRemove()[0] != "sluice-level" {
		t.Errorf("headers to remove %v", ok.GetHeadersToRemove())
	}
	if c := headers(ok.GetHeaders())[sluice.ClassHeader]; c != sluice.ClassSheddable {
		t.Errorf("class on the forwarded request %q, want the route's", c)
	}
	req, n, released := f.probe.seen()
	if n != 1 || req.Tenant != "acme" || req.Class != sluice.ClassSheddable || req.Operation != "/v1/analytics/*" || req.Cost != 1 {
		t.Fatalf("probe saw %+v", req)
	}
	// Released at once: the end of the request cannot be observed.
	if len(released) != 1 || released[0] != sluice.OutcomeCancelled {
		t.Fatalf("released %v", released)
	}
}

// Over the tenant's rate: 429 with Retry-After, RateLimit and the
// envelope, RESOURCE_EXHAUSTED as the check's status.
func TestRateLimited(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	key := map[string]string{"x-api-key": "acme", "x-request-id": "req-7"}
	for range 2 {
		if resp := f.check(t, checkReq("GET", "/v1/orders", key)); resp.GetStatus().GetCode() != 0 {
			t.Fatal(resp)
		}
	}
	hs, e := denied(t, f.check(t, checkReq("GET", "/v1/orders", key)), codes.ResourceExhausted, 429)
	if hs["Retry-After"] != "1" || hs["RateLimit"] != `"request-rate";r=0;t=1` || hs["RateLimit-Policy"] != wantPolicy ||
		hs["Content-Type"] != "application/json" || hs["Cache-Control"] != "no-store" || hs["X-Request-Id"] != "req-7" {
		t.Fatalf("headers %v", hs)
	}
	if e.Error.Reason != "policy_rate" || e.Error.Scope != "tenant" || e.Error.Gate != "request-rate" || !e.Error.Retryable || e.Error.RetryAfter != 1 || e.Error.RequestID != "req-7" {
		t.Fatalf("envelope %+v", e)
	}
	// Without the header, Envoy's request id is echoed.
	delete(key, "x-request-id")
	if hs, _ := denied(t, f.check(t, checkReq("GET", "/v1/orders", key)), codes.ResourceExhausted, 429); hs["X-Request-Id"] != "envoy-id-1" {
		t.Fatalf("request id %q", hs["X-Request-Id"])
	}
	f.clk.Advance(10 * time.Millisecond)
	if resp := f.check(t, checkReq("GET", "/v1/orders", key)); resp.GetStatus().GetCode() != 0 {
		t.Fatal("token not back")
	}
}

// LegacyHeaders' X-RateLimit-* fields come on a denial too, with the
// reset RateLimit gives, as on an allowed answer.
func TestLegacyHeadersOnDenials(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules, LegacyHeaders: true})
	key := map[string]string{"x-api-key": "acme"}
	for range 2 {
		if resp := f.check(t, checkReq("GET", "/v1/orders", key)); resp.GetStatus().GetCode() != 0 {
			t.Fatal(resp)
		}
	}
	hs, _ := denied(t, f.check(t, checkReq("GET", "/v1/orders", key)), codes.ResourceExhausted, 429)
	if hs["X-RateLimit-Limit"] != "2" || hs["X-RateLimit-Remaining"] != "0" || hs["X-RateLimit-Reset"] != "1" {
		t.Fatalf("headers %v", hs)
	}
}

// With ProblemDetails a denial's body is an RFC 9457 problem details
// object, as httpgate's with the same setting (sluice serve
// --problem-details answered it over HTTP only).
func TestProblemDetailsDenial(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules, ProblemDetails: true})
	key := map[string]string{"x-api-key": "acme", "x-request-id": "req-9"}
	for range 2 {
		f.check(t, checkReq("GET", "/v1/orders", key))
	}
	resp := f.check(t, checkReq("GET", "/v1/orders", key))
	d := resp.GetDeniedResponse()
	var p struct {
		Type, Reason, RequestID string
		Status                  int
		Retryable               bool
		EffectPossible          *bool `json:"effect_possible"`
	}
	if err := json.Unmarshal([]byte(d.GetBody()), &p); err != nil {
		t.Fatalf("body %q: %v", d.GetBody(), err)
	}
	hs := headers(d.GetHeaders())
	if hs["Content-Type"] != "application/problem+json" || !strings.HasSuffix(p.Type, "#policy_rate") || p.Status != 429 ||
		!p.Retryable || p.EffectPossible == nil || *p.EffectPossible {
		t.Fatalf("%v %q", hs, d.GetBody())
	}
}

// A gRPC request's denial carries grpcgate's pushback; an HTTP one's not.
func TestGRPCRequestGetsPushback(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	key := map[string]string{"x-api-key": "acme", "content-type": "application/grpc+proto"}
	for range 2 {
		f.check(t, checkReq("POST", "/acme.v1.Orders/Create", key))
	}
	hs, _ := denied(t, f.check(t, checkReq("POST", "/acme.v1.Orders/Create", key)), codes.ResourceExhausted, 429)
	if hs["grpc-retry-pushback-ms"] != "10" {
		t.Fatalf("headers %v", hs)
	}
	key["content-type"] = "application/json"
	hs, _ = denied(t, f.check(t, checkReq("POST", "/acme.v1.Orders/Create", key)), codes.ResourceExhausted, 429)
	if _, ok := hs["grpc-retry-pushback-ms"]; ok {
		t.Fatalf("pushback on an HTTP request: %v", hs)
	}
}

func TestOverloadIsServiceUnavailable(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	f.probe.set(func(p *probe) {
		p.reject = &sluice.Decision{Reason: sluice.ReasonOverload, Gate: "probe", Retryable: true, RetryAfter: 2 * time.Second}
	})
	hs, e := denied(t, f.check(t, checkReq("GET", "/", nil)), codes.Unavailable, 503)
	if hs["Retry-After"] != "2" || e.Error.Reason != "overload" {
		t.Fatalf("headers %v envelope %+v", hs, e)
	}
	if _, ok := hs["RateLimit"]; ok {
		t.Fatal("RateLimit without a quota")
	}
}

func TestInvalid(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	for _, tc := range []struct {
		name, method, path string
		headers            map[string]string
	}{
		{"bad tenant", "GET", "/", map[string]string{"x-api-key": "a b"}},
		{"bad cost", "POST", "/v1/routes", map[string]string{"x-stops": "many"}},
		{"bad deadline", "GET", "/", map[string]string{"x-request-timeout": "soon"}},
		{"bad path", "GET", "/v1/%zz", nil},
	} {
		_, e := denied(t, f.check(t, checkReq(tc.method, tc.path, tc.headers)), codes.InvalidArgument, 400)
		if e.Error.Reason != "invalid" || e.Error.Retryable {
			t.Errorf("%s: envelope %+v", tc.name, e)
		}
	}
	// Two tenant headers, as raw headers carry them, are refused as
	// httpgate refuses them.
	raw := checkReq("GET", "/", nil)
	raw.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-api-key", Value: "a"}, {Key: "X-Api-Key", Value: "b"}}}
	if _, e := denied(t, f.check(t, raw), codes.InvalidArgument, 400); e.Error.Message != "invalid request: more than one X-Api-Key header; fix the request before retrying" {
		t.Errorf("message %q", e.Error.Message)
	}
	if _, n, _ := f.probe.seen(); n != 0 {
		t.Fatalf("the gates decided %d invalid checks", n)
	}
}

// The path is decoded as net/http decodes URL.Path, the query dropped,
// and the method, cost and deadline read as httpgate reads them.
func TestIdentification(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	f.check(t, checkReq("GET", "/v1/%61nalytics/x?y=1", map[string]string{"x-api-key": "a"}))
	if req, _, _ := f.probe.seen(); req.Class != sluice.ClassSheddable {
		t.Fatalf("encoded path: %+v", req)
	}
	f.check(t, checkReq("POST", "http://api.example/v1/routes", map[string]string{"x-api-key": "b", "x-stops": "150", "x-request-timeout": "250ms"}))
	req, _, _ := f.probe.seen()
	if req.Class != sluice.ClassCritical || req.Cost != 2 || req.Deadline != f.clk.Now().Add(250*time.Millisecond) {
		t.Fatalf("absolute form: %+v (want cost ⌈150/100⌉)", req)
	}
	// Raw headers (encode_raw_headers) are read the same.
	raw := checkReq("GET", "/", nil)
	raw.Attributes.Request.Http.HeaderMap = &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: "x-api-key", RawValue: []byte("raw-tenant")}}}
	f.check(t, raw)
	if req, _, _ := f.probe.seen(); req.Tenant != "raw-tenant" {
		t.Fatalf("raw headers: %+v", req)
	}
}

func TestSourceTenant(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules, SourceTenant: true})
	f.check(t, checkReq("GET", "/", nil))
	if req, _, _ := f.probe.seen(); req.Tenant != "10.1.2.3" {
		t.Fatalf("tenant %q", req.Tenant)
	}
	f.check(t, checkReq("GET", "/", map[string]string{"x-api-key": "k"}))
	if req, _, _ := f.probe.seen(); req.Tenant != "k" {
		t.Fatalf("tenant %q", req.Tenant)
	}
}

func TestLevel(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	f.probe.set(func(p *probe) { p.level = sluice.LevelShed })
	ok := f.check(t, checkReq("GET", "/", nil)).GetOkResponse()
	if headers(ok.GetHeaders())["Sluice-Level"] != "shed" || headers(ok.GetResponseHeadersToAdd())["Sluice-Level"] != "shed" || len(ok.GetHeadersToRemove()) != 0 {
		t.Fatalf("ok response %v", ok)
	}
}

// Nil and empty messages are decided as an anonymous request to "".
func TestNilAndEmpty(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	if resp := f.check(t, &authv3.CheckRequest{}); resp.GetStatus().GetCode() != 0 {
		t.Fatal(resp)
	}
	resp, err := f.srv.Check(context.Background(), nil)
	if err != nil || resp.GetStatus().GetCode() != 0 {
		t.Fatal(resp, err)
	}
	if req, n, _ := f.probe.seen(); n != 2 || req.Operation != "other" || req.Tenant != "" {
		t.Fatalf("probe saw %+v", req)
	}
}

// Gates that hold a slot per request are refused unless allowed; allowed,
// their slots are freed at once (they bound concurrent checks only).
func TestConcurrencyGates(t *testing.T) {
	c1, _ := limit.NewConcurrency(1)
	inflight, _ := gate.NewInFlight("inflight", memory.NewKeyed(c1, memory.Options{}), gate.Options{})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, inflight)
	if _, err := extauthz.New(chain, extauthz.Config{}); !errors.Is(err, extauthz.ErrConcurrencyGate) {
		t.Fatalf("New: %v", err)
	}
	srv, err := extauthz.New(chain, extauthz.Config{AllowConcurrencyGates: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if resp, _ := srv.Check(context.Background(), checkReq("GET", "/", nil)); resp.GetStatus().GetCode() != 0 {
			t.Fatalf("slot held: %v", resp)
		}
	}
	if _, err := extauthz.New(nil, extauthz.Config{}); err == nil {
		t.Fatal("nil chain accepted")
	}
	if err := srv.Update(chain, extauthz.Config{Rules: identify.Rules{Routes: []identify.Route{{Path: "x"}}}, AllowConcurrencyGates: true}); err == nil {
		t.Fatal("bad rules accepted")
	}
	if srv.Chain() != chain {
		t.Fatal("Chain")
	}
}

// identity's client IP is Envoy's downstream (the check's source address),
// or behind a trusted one the right-most untrusted X-Forwarded-For entry;
// a query part reads the original request's query.
func TestClientIPAndQueryTenant(t *testing.T) {
	lb, _ := identify.ParseTrustedProxy("10.0.0.0/8")
	ip := identify.Rules{Tenant: identify.KeyRules{Parts: []identify.Part{identify.FromClientIP()}, ClientIP: identify.ClientIP{TrustedProxies: []netip.Prefix{lb}}}}
	f := newFixture(t, extauthz.Config{Rules: ip})
	f.check(t, checkReq("GET", "/", map[string]string{"x-forwarded-for": "6.6.6.6, 198.51.100.7"}))
	if req, _, _ := f.probe.seen(); req.Tenant != "198.51.100.7" {
		t.Fatalf("behind the trusted source: tenant %q", req.Tenant)
	}
	q := identify.Rules{Tenant: identify.KeyRules{Parts: []identify.Part{identify.FromQuery("key")}}}
	f = newFixture(t, extauthz.Config{Rules: q})
	f.check(t, checkReq("GET", "/x?key=k1&y=2", nil))
	if req, _, _ := f.probe.seen(); req.Tenant != "k1" {
		t.Fatalf("query tenant %q", req.Tenant)
	}
}

// Envoy's headers map joins a repeated field's values with ",": a tenant
// header sent twice arrives as "victim,1", which was read as one key, a
// fresh bucket per request. It is refused as a repeat, as over HTTP.
func TestRepeatedTenantHeaderJoinedByEnvoyIsRefused(t *testing.T) {
	f := newFixture(t, extauthz.Config{Rules: rules})
	for i := range 5 {
		resp := f.check(t, checkReq("GET", "/v1/orders", map[string]string{"x-api-key": fmt.Sprintf("victim,%d", i)}))
		if _, e := denied(t, resp, codes.InvalidArgument, 400); !strings.Contains(e.Error.Message, "more than one X-Api-Key header") {
			t.Fatalf("check %d: %q", i, e.Error.Message)
		}
	}
}

// The headers identification reads beyond the tenant's reach the check:
// the client key's X-Forwarded-For behind a trusted proxy (every client
// behind it shared the proxy's bucket) and a trusted peer's Sluice-Class
// (ignored).
func TestClientKeyAndPeerClassHeaders(t *testing.T) {
	lb, _ := identify.ParseTrustedProxy("10.0.0.0/8")
	r := identify.Rules{ClientKey: true, Client: identify.ClientIP{TrustedProxies: []netip.Prefix{lb}},
		Peers:  identify.Peers{Trusted: []netip.Prefix{lb}},
		Routes: []identify.Route{{Path: "/v1/*", Class: sluice.ClassCritical}, {Path: "/*", Class: sluice.ClassSheddable}}}
	f := newFixture(t, extauthz.Config{Rules: r})
	f.check(t, checkReq("GET", "/v1/x", map[string]string{"x-forwarded-for": "198.51.100.7", "sluice-class": "sheddable"}))
	req, _, _ := f.probe.seen()
	if req.Client != "198.51.100.7" {
		t.Errorf("client key %q, want the forwarded client's", req.Client)
	}
	if req.Class != sluice.ClassSheddable {
		t.Errorf("class %q, want the trusted peer's lower class", req.Class)
	}
}
