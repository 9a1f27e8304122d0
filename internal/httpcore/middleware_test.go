package httpcore_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var noJitter = &sluice.Jitter{}

type envelope struct {
	Error struct {
		Reason         string `json:"reason"`
		Scope          string `json:"scope"`
		Gate           string `json:"gate"`
		Retryable      bool   `json:"retryable"`
		EffectPossible bool   `json:"effect_possible"`
		RetryAfter     int64  `json:"retry_after"`
		RequestID      string `json:"request_id"`
		Message        string `json:"message"`
	} `json:"error"`
}

type fixture struct {
	clk      *fakeclock.Clock
	rate     sluice.Gate
	tenantIn sluice.Gate
	pool     sluice.Gate
	poolLim  store.Limiter
	chain    *sluice.Chain
	metrics  *metrics.Metrics
	reg      *prometheus.Registry
	srv      *httptest.Server
	mw       *httpcore.Middleware
}

// newFixture serves handler behind: request-rate (token bucket 100/s burst
// 500 per tenant), tenant-inflight (per tenant, 429) and pool (service-wide
// concurrency, 503).
func newFixture(t *testing.T, handler http.Handler, modes map[string]sluice.Mode, poolSize int64) *fixture {
	t.Helper()
	f := &fixture{clk: fakeclock.New(1)}
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
	f.rate, _ = gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	c20, _ := limit.NewConcurrency(20)
	f.tenantIn, _ = gate.NewInFlight("tenant-inflight", memory.NewKeyed(c20, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	cp, _ := limit.NewConcurrency(poolSize)
	f.poolLim = memory.NewKeyed(cp, memory.Options{})
	f.pool, _ = gate.NewInFlight("pool", f.poolLim, gate.Options{RetryHint: 2 * time.Second})
	f.reg = prometheus.NewRegistry()
	f.metrics = metrics.New(metrics.Options{Registry: f.reg})
	var err error
	f.chain, err = sluice.NewChain(sluice.ChainOptions{Clock: f.clk, Observer: f.metrics, Modes: modes}, f.rate, f.tenantIn, f.pool)
	if err != nil {
		t.Fatal(err)
	}
	f.mw, err = httpcore.New(f.chain, httpcore.Config{
		Rules: identify.Rules{
			TenantHeader:   "X-Api-Key",
			DeadlineHeader: "X-Request-Timeout",
			Routes: []identify.Route{
				{Method: "POST", Path: "/v1/routes", Class: sluice.ClassCritical, Cost: identify.Cost{Header: "X-Stops", Per: 100, Min: 1, Max: 50}},
				{Path: "/v1/analytics/*", Class: sluice.ClassSheddable},
			},
		},
		Jitter: noJitter,
	})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = httptest.NewUnstartedServer(f.mw.Wrap(handler))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0) // handler panics are expected
	f.srv.Start()
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fixture) get(t *testing.T, path string, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, body
}

func decode(t *testing.T, body []byte) envelope {
	t.Helper()
	var e envelope
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("envelope %q: %v", body, err)
	}
	return e
}

var ok200 = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })

// Token bucket 100/s burst 500: the 501st request gets 429 with
// Retry-After: 1 and RateLimit remaining 0, on a fake clock without jitter.
func TestRetryAfterExactOn501st(t *testing.T) {
	f := newFixture(t, ok200, nil, 1000)
	key := map[string]string{"X-Api-Key": "acme"}
	for i := range 500 {
		resp, _ := f.get(t, "/v1/routes/42", key)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i+1, resp.StatusCode)
		}
		if i == 0 {
			if got := resp.Header.Get("RateLimit-Policy"); got != `"request-rate";q=500;w=5, "tenant-inflight";q=20;qu="concurrent-requests"` {
				t.Fatalf("RateLimit-Policy %q", got)
			}
		}
		if i == 499 && resp.Header.Get("RateLimit") != `"request-rate";r=0;t=5` {
			t.Fatalf("500th RateLimit %q", resp.Header.Get("RateLimit"))
		}
	}
	resp, body := f.get(t, "/v1/routes/42", key)
	check501st(t, resp, body)
	// Another tenant is unaffected.
	if resp, _ := f.get(t, "/v1/routes/42", map[string]string{"X-Api-Key": "other"}); resp.StatusCode != 200 {
		t.Fatal("tenants share a bucket")
	}
	// 10 ms later one token is back.
	f.clk.Advance(10 * time.Millisecond)
	if resp, _ := f.get(t, "/v1/routes/42", key); resp.StatusCode != 200 {
		t.Fatal("token not back after 10ms")
	}
}

// check501st checks the rejection of the 501st request: status, headers
// and envelope.
func check501st(t *testing.T, resp *http.Response, body []byte) {
	t.Helper()
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "1" || resp.Header.Get("RateLimit") != `"request-rate";r=0;t=1` {
		t.Fatalf("501st: %d Retry-After %q RateLimit %q", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("RateLimit"))
	}
	if resp.Header.Get("Cache-Control") != "no-store" || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatal("rejection headers")
	}
	e := decode(t, body).Error
	if e.Reason != "policy_rate" || e.Scope != "tenant" || e.Gate != "request-rate" || !e.Retryable || e.EffectPossible || e.RetryAfter != 1 {
		t.Fatalf("envelope %+v", e)
	}
	if e.RequestID == "" || resp.Header.Get("X-Request-Id") != e.RequestID {
		t.Fatalf("request id %q, header %q", e.RequestID, resp.Header.Get("X-Request-Id"))
	}
	if !strings.Contains(e.Message, "retry after 1s") || !strings.Contains(e.Message, "100 requests per second per tenant, in bursts of up to 500") {
		t.Fatalf("message %q", e.Message)
	}
	if len(body) > 400 {
		t.Fatalf("envelope of %d bytes", len(body))
	}
}

func TestRequestIDEchoedWhenValid(t *testing.T) {
	f := newFixture(t, ok200, nil, 1000)
	hdr := map[string]string{"X-Api-Key": "a", "X-Stops": "99999", "X-Request-Id": "req-123"}
	// Cost above burst (stops 99999 → cost 50 ≤ max; use a GET with cost 1 and drain instead).
	for range 500 {
		f.get(t, "/", map[string]string{"X-Api-Key": "a"})
	}
	resp, body := f.get(t, "/", hdr)
	if resp.Header.Get("X-Request-Id") != "req-123" || decode(t, body).Error.RequestID != "req-123" {
		t.Fatal("request id not echoed")
	}
	hdr["X-Request-Id"] = `"><script>`
	_, body = f.get(t, "/", hdr)
	if id := decode(t, body).Error.RequestID; id == hdr["X-Request-Id"] || id == "" {
		t.Fatalf("malformed request id echoed: %q", id)
	}
}

func Test429VersusProtection503(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
	}), nil, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f.get(t, "/", map[string]string{"X-Api-Key": fmt.Sprint("t", i)})
		}()
	}
	<-started
	<-started
	resp, body := f.get(t, "/", map[string]string{"X-Api-Key": "t9"})
	e := decode(t, body)
	if resp.StatusCode != 503 || e.Error.Reason != "concurrency" || e.Error.Scope != "service" || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("pool full: %d %+v", resp.StatusCode, e.Error)
	}
	// The pool is shared by every caller: its quota and everyone's
	// remaining count are not the caller's to see.
	if h := resp.Header; h.Get("RateLimit") != "" || h.Get("RateLimit-Policy") != "" {
		t.Errorf("a refusal by the service-wide pool advertised RateLimit %q, RateLimit-Policy %q", h.Get("RateLimit"), h.Get("RateLimit-Policy"))
	}
	close(release)
	wg.Wait()
}

func TestCostAboveBurstIsNotRetryable(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(10), 10)
	g, _ := gate.NewRateLimit("stops-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)}, g)
	mw, _ := httpcore.New(chain, httpcore.Config{
		Rules: identify.Rules{
			Routes: []identify.Route{
				{Path: "/solve", Cost: identify.Cost{Header: "X-Stops", Per: 100, Max: 50}},
			},
		},
		Jitter: noJitter,
	})
	srv := httptest.NewServer(mw.Wrap(ok200))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/solve", nil)
	req.Header.Set("X-Stops", "2000") // cost 20 > burst 10
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	e := decode(t, body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "" || e.Error.Retryable || e.Error.RetryAfter != 0 ||
		!strings.Contains(e.Error.Message, "retrying cannot help") {
		t.Fatalf("%d %q %+v", resp.StatusCode, resp.Header.Get("Retry-After"), e.Error)
	}
}

func TestMalformedHeadersGive400(t *testing.T) {
	f := newFixture(t, ok200, nil, 1000)
	for _, c := range []map[string]string{
		{"X-Api-Key": "has space"},
		{"X-Api-Key": strings.Repeat("k", sluice.MaxKeyLen+1)},
		{"X-Request-Timeout": "banana"},
		{"X-Request-Timeout": "-1s"},
		{"X-Request-Timeout": "0s"},
		{"X-Request-Timeout": "1000"},
	} {
		resp, body := f.get(t, "/", c)
		if e := decode(t, body); resp.StatusCode != 400 || e.Error.Reason != "invalid" || e.Error.Retryable {
			t.Errorf("%v: %d %+v", c, resp.StatusCode, e.Error)
		}
	}
	for _, stops := range []string{"abc", "-5", "1e3", "1.5", "99999999999999999999", "7, 8"} {
		req, _ := http.NewRequest("POST", f.srv.URL+"/v1/routes", nil)
		req.Header.Set("X-Stops", stops)
		resp, err := f.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if e := decode(t, body); resp.StatusCode != 400 || e.Error.Reason != "invalid" || !strings.Contains(e.Error.Message, "X-Stops") {
			t.Errorf("X-Stops %q: %d %+v", stops, resp.StatusCode, e.Error)
		}
	}
}

func TestShadowModePassesAndCounts(t *testing.T) {
	f := newFixture(t, ok200, map[string]sluice.Mode{"request-rate": sluice.ModeShadow}, 1000)
	key := map[string]string{"X-Api-Key": "acme"}
	for range 600 {
		resp, _ := f.get(t, "/", key)
		if resp.StatusCode != 200 || resp.Header.Get("Retry-After") != "" {
			t.Fatalf("shadow mode rejected: %d", resp.StatusCode)
		}
	}
	rejected := f.metric("sluice_requests_rejected_total", map[string]string{"reason": "policy_rate", "gate": "request-rate", "mode": "shadow", "tenant": metrics.HashTenant("acme")})
	if rejected != 100 {
		t.Fatalf("would-be rejections counted %v, want 100", rejected)
	}
	// Flip to enforce at run time.
	f.chain.SetMode("request-rate", sluice.ModeEnforce)
	if resp, _ := f.get(t, "/", key); resp.StatusCode != 429 {
		t.Fatalf("enforce: %d", resp.StatusCode)
	}
}

// metric sums the samples of the named metric whose labels include want.
func (f *fixture) metric(name string, want map[string]string) float64 {
	mfs, err := f.reg.Gather()
	if err != nil {
		panic(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if have[k] != v {
					continue next
				}
			}
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func completed(f *fixture, outcome string) float64 {
	return f.metric("sluice_requests_completed_total", map[string]string{"outcome": outcome})
}

func (f *fixture) inflight() int64 {
	// Every slot of the pool can be taken again when nothing is held.
	lim := f.poolLim
	res, h, _ := lim.Take(context.Background(), "", 0, 1, 0)
	if !res.OK() {
		return res.Limit
	}
	lim.Refund(context.Background(), "", h, 0, 1)
	return res.Limit - res.Remaining - 1
}

func TestPanicReleasesPermits(t *testing.T) {
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic("handler bug")
	}), nil, 5)
	for range 20 {
		req, _ := http.NewRequest("GET", f.srv.URL+"/", nil)
		if resp, err := f.srv.Client().Do(req); err == nil {
			resp.Body.Close()
		}
	}
	if n := f.inflight(); n != 0 {
		t.Fatalf("%d permits held after panics", n)
	}
	if got := (completed(f, "errored")); got != 20 {
		t.Fatalf("errored completions %v, want 20", got)
	}
}

// A client that goes away releases its permits and books the request as
// cancelled, whether its handler then returns or panics with
// http.ErrAbortHandler, as a reverse proxy does when the client hangs up
// mid-body (that was booked as the service's error).
func TestClientDisconnectReleasesPermits(t *testing.T) {
	for _, abort := range []bool{false, true} {
		entered := make(chan struct{})
		f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered <- struct{}{}
			<-r.Context().Done() // the client goes away
			if abort {
				panic(http.ErrAbortHandler)
			}
		}), nil, 5)
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "GET", f.srv.URL+"/", nil)
		errc := make(chan error, 1)
		go func() {
			resp, err := f.srv.Client().Do(req)
			if err == nil {
				resp.Body.Close()
			}
			errc <- err
		}()
		<-entered
		if n := f.inflight(); n != 1 {
			t.Fatalf("in flight %d during the request", n)
		}
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("client error %v", err)
		}
		waitFor(t, func() bool { return f.inflight() == 0 })
		waitFor(t, func() bool { return (completed(f, "cancelled")) == 1 })
		if n := completed(f, "errored"); n != 0 {
			t.Errorf("abort %v: %v errored completions, want 0", abort, n)
		}
	}
}

// LegacyHeaders' X-RateLimit-* fields come on a refusal too, where a
// client of that convention looks for them (Remaining 0, Reset the wait):
// they came on admitted answers only.
func TestLegacyHeadersOnEveryAnswer(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 2)
	rate, _ := gate.NewRateLimit("rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)}, rate)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpcore.New(chain, httpcore.Config{LegacyHeaders: true, Jitter: noJitter, Rules: identify.Rules{TenantHeader: "X-Api-Key"}})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct {
		status                  int
		limit, remaining, reset string
	}{{200, "2", "1", "1"}, {200, "2", "0", "2"}, {429, "2", "0", "1"}} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Api-Key", "a")
		mw.Wrap(ok200).ServeHTTP(rec, req)
		h := rec.Result().Header
		got := [...]string{h.Get("X-RateLimit-Limit"), h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset")}
		if rec.Code != want.status || got != [...]string{want.limit, want.remaining, want.reset} {
			t.Errorf("answer %d: %d %q (RateLimit %q), want %d %q", i, rec.Code, got, h.Get("RateLimit"), want.status,
				[...]string{want.limit, want.remaining, want.reset})
		}
	}
}

// The answer's cost field trues up the charge: in the head, or in a
// trailer for a cost known only after the body; said twice it is
// malformed and the estimate (1) stays. Each answer's charge shows in the
// next answer's RateLimit remaining (burst 100, nothing refills).
func TestAnswerCostTruesUpTheCharge(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 100)
	rate, _ := gate.NewRateLimit("rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)}, rate)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpcore.New(chain, httpcore.Config{Jitter: noJitter, Rules: identify.Rules{TenantHeader: "X-Api-Key",
		Routes: []identify.Route{{Path: "/*", Cost: identify.Cost{ResponseHeader: "X-Work-Units"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/head":
			w.Header().Set("X-Work-Units", "10")
		case "/trailer":
			w.Header().Set("Trailer", "X-Work-Units")
			w.Write([]byte("body"))
			w.Header().Set("X-Work-Units", "10")
		case "/twice":
			w.Header()["X-Work-Units"] = []string{"10", "10"}
		}
	}))
	remaining := func(path string) string {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", path, nil)
		req.Header.Set("X-Api-Key", "a")
		h.ServeHTTP(rec, req)
		return rec.Result().Header.Get("RateLimit")
	}
	for i, c := range []struct{ path, want string }{
		{"/head", `"rate";r=99;t=1`},     // before the charge: 100 − 1
		{"/trailer", `"rate";r=89;t=11`}, // after /head's 10
		{"/twice", `"rate";r=79;t=21`},   // after the trailer's 10
		{"/", `"rate";r=78;t=22`},        // after /twice's estimate of 1
	} {
		if got := remaining(c.path); got != c.want {
			t.Errorf("answer %d (%s): RateLimit %q, want %q", i, c.path, got, c.want)
		}
	}
}

func TestLateResponseCountsAsLate(t *testing.T) {
	var f *fixture
	f = newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dl, ok := r.Context().Deadline()
		if !ok || time.Until(dl) > 250*time.Millisecond {
			t.Errorf("deadline not propagated: %v %v", dl, ok)
		}
		f.clk.Advance(300 * time.Millisecond) // the work overruns the caller's budget
		w.Write([]byte("too late"))
	}), nil, 5)
	resp, _ := f.get(t, "/", map[string]string{"X-Request-Timeout": "250ms"})
	if resp.StatusCode != 200 {
		t.Fatal(resp.StatusCode)
	}
	if got := (completed(f, "late")); got != 1 {
		t.Fatalf("late completions %v", got)
	}
	if got := (completed(f, "useful")); got != 0 {
		t.Fatalf("a late response counted as useful")
	}
}

func TestJitterSpreadsRetryAfter(t *testing.T) {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	g, _ := gate.NewRateLimit("r", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	clk := fakeclock.New(1)
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, g)
	jitter := sluice.Jitter{Fraction: 0.5, Min: 2}
	mw, _ := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: &jitter})
	h := mw.Wrap(ok200)
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Api-Key", "a")
	h.ServeHTTP(httptest.NewRecorder(), req) // empties the bucket: true wait 1 s
	seen := map[int]int{}
	for range 1000 {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		v, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if err != nil || v < 1 {
			t.Fatalf("Retry-After %q below the true wait of 1s", w.Header().Get("Retry-After"))
		}
		seen[v]++
	}
	// Documented range: [1, 1 + max(Min=2, ⌈0.5⌉)] = {1, 2, 3}, each value used.
	for v := 1; v <= 3; v++ {
		if seen[v] < 200 {
			t.Fatalf("Retry-After spread %v does not cover [1, 3]", seen)
		}
	}
	if len(seen) != 3 {
		t.Fatalf("values outside the documented range: %v", seen)
	}
}

func TestUpdateSwapsChainWithoutDroppingInFlight(t *testing.T) {
	release := make(chan struct{})
	f := newFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		w.Write([]byte("ok"))
	}), nil, 1)
	done := make(chan int)
	go func() {
		resp, _ := f.get(t, "/", nil)
		done <- resp.StatusCode
	}()
	waitFor(t, func() bool { return f.inflight() == 1 })
	c, _ := limit.NewConcurrency(1)
	pool2, _ := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	chain2, _ := sluice.NewChain(sluice.ChainOptions{Clock: f.clk}, pool2)
	if err := f.mw.Update(chain2, httpcore.Config{Jitter: noJitter}); err != nil {
		t.Fatal(err)
	}
	if f.mw.Chain() != chain2 {
		t.Fatal("not swapped")
	}
	close(release)
	if code := <-done; code != 200 {
		t.Fatalf("in-flight request got %d across the swap", code)
	}
	waitFor(t, func() bool { return f.inflight() == 0 })
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	poll.Until(t, 5*time.Second, cond)
}

// levelGate admits at a fixed degradation level.
type levelGate struct{ level sluice.Level }

func (levelGate) Name() string { return "level" }
func (g levelGate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

func (g levelGate) decide(context.Context, *sluice.Request, clock.Instant) (sluice.Decision, sluice.Permit) {
	return sluice.Decision{Admitted: true, Level: g.level}, 0
}
func (levelGate) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

func TestDegradationLevelReachesTheHandler(t *testing.T) {
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, levelGate{level: sluice.LevelDegrade})
	mw, _ := httpcore.New(chain, httpcore.Config{})
	var seen sluice.Level
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { seen = sluice.LevelFrom(r.Context()) }))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if seen != sluice.LevelDegrade || w.Header().Get("Sluice-Level") != "degrade" {
		t.Fatalf("handler saw %v, header %q", seen, w.Header().Get("Sluice-Level"))
	}
}

// A TenantKey's error answers 400 invalid with its text; its long keys are
// hashed within sluice.MaxKeyLen, not refused; it cannot be combined with
// the rules' own tenant.
func TestTenantKeyFunc(t *testing.T) {
	obs := &tenants{}
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1e6)
	g, _ := gate.NewRateLimit("r", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{Observer: obs}, g)
	key := func(r *http.Request) (string, error) {
		if k := r.Header.Get("K"); k != "" {
			return k, nil
		}
		return "", errors.New("no K")
	}
	mw, err := httpcore.New(chain, httpcore.Config{TenantKey: key})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(ok200)
	for _, k := range []string{"", strings.Repeat("x", 1000)} {
		req := httptest.NewRequest("GET", "/", nil)
		if k != "" {
			req.Header.Set("K", k)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if want := map[bool]int{true: 400, false: 200}[k == ""]; rec.Code != want {
			t.Errorf("key %.10q: %d, want %d (%s)", k, rec.Code, want, rec.Body)
		}
	}
	if len(obs.seen) != 2 || len(obs.seen[1]) > sluice.MaxKeyLen {
		t.Errorf("tenants seen: %q", obs.seen)
	}
	if _, err := httpcore.New(chain, httpcore.Config{TenantKey: key, Rules: identify.Rules{TenantHeader: "X"}}); err == nil {
		t.Error("TenantKey and TenantHeader both accepted")
	}
}

// tenants records the tenant of every decision.
type tenants struct{ seen []string }

func (o *tenants) Decided(r *sluice.Request, _ *sluice.Decision, _ time.Duration) {
	o.seen = append(o.seen, r.Tenant)
}
func (o *tenants) ShadowRejected(*sluice.Request, *sluice.Decision) {}
func (o *tenants) Done(*sluice.Request, sluice.Completion)          {}
