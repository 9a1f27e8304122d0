package client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// seen records what the server received.
type seen struct {
	mu       sync.Mutex
	ids      []string
	keys     []string
	bodies   []string
	attempts atomic.Int64
}

func (s *seen) record(r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, r.Header.Get("X-Request-Id"))
	s.keys = append(s.keys, r.Header.Get("Idempotency-Key"))
	s.bodies = append(s.bodies, string(b))
	s.attempts.Add(1)
}

// sluiceServer serves a handler behind sluice's middleware over loopback: a
// token bucket of 1 request per second per tenant, burst 1, exact
// Retry-After, on the fake clock f (which the client's sleeps move).
func sluiceServer(t *testing.T, f *fake, s *seen) string {
	t.Helper()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 1)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: f.clk}, rate)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpgate.New(chain, httpgate.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key"}, Jitter: &sluice.Jitter{}})
	if err != nil {
		t.Fatal(err)
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	h := mw.Wrap(inner)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(r)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func do(t *testing.T, hc *http.Client, method, url, body string, hdr ...string) (*http.Response, string, error) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}

// A sluice 429 (retryable, no effect possible) is retried after its
// Retry-After, for a GET and for a POST whose body can be sent again,
// with the same request id and idempotency key on every attempt; the
// metrics count both attempts.
func TestTransportRetriesRefusal(t *testing.T) {
	f := newFake()
	var s seen
	url := sluiceServer(t, f, &s)
	m := NewMetrics(MetricsOptions{})
	r := f.retrier(t, 1, Options{Observer: m, ThrottleK: -1, PaceBelow: -1})
	hc := &http.Client{Transport: &Transport{Retrier: r}}
	defer hc.CloseIdleConnections()
	if resp, _, err := do(t, hc, "GET", url+"/a", "", "X-Api-Key", "acme"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v", resp, err)
	}
	resp, body, err := do(t, hc, "POST", url+"/b", "payload", "X-Api-Key", "acme", "Idempotency-Key", "k-1")
	if err != nil || resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("POST after a 429: %v %q %v", resp, body, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) != 3 || s.ids[1] == "" || s.ids[1] != s.ids[2] || s.ids[0] == s.ids[1] {
		t.Fatalf("request ids %q: want one per request, the same on every attempt", s.ids)
	}
	if s.keys[1] != "k-1" || s.keys[2] != "k-1" || s.bodies[1] != "payload" || s.bodies[2] != "payload" {
		t.Fatalf("keys %q, bodies %q", s.keys, s.bodies)
	}
	if len(f.waits) != 1 || f.waits[0] < time.Second || f.waits[0] > 2*time.Second {
		t.Fatalf("waits %v: want one in [1s, 2s] (Retry-After 1 jittered upward)", f.waits)
	}
	reqs, retries := counter(t, m, "sluice_client_requests_total"), counter(t, m, "sluice_client_retries_total")
	if reqs != 2 || retries != 1 {
		t.Fatalf("metrics: %v requests, %v retries", reqs, retries)
	}
}

// With pacing (the default) the client reads r=0;t=1 on the first answer
// and sends the second request after the reset: no refusal at all.
func TestTransportPacesToAvoidRefusal(t *testing.T) {
	f := newFake()
	var s seen
	url := sluiceServer(t, f, &s)
	r := f.retrier(t, 1, Options{ThrottleK: -1})
	hc := &http.Client{Transport: &Transport{Retrier: r}}
	defer hc.CloseIdleConnections()
	for i := range 3 {
		if resp, _, err := do(t, hc, "GET", url+"/a", "", "X-Api-Key", "acme"); err != nil || resp.StatusCode != 200 {
			t.Fatalf("request %d: %v %v", i, resp, err)
		}
	}
	if s.attempts.Load() != 3 || len(f.waits) != 2 || f.waits[0] != time.Second {
		t.Fatalf("%d attempts, waits %v: want 3 attempts, each later one paced 1 s", s.attempts.Load(), f.waits)
	}
}

// counter reads the sum of a metric family from the metrics' registry.
func counter(t *testing.T, m *Metrics, name string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	m.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	total := 0.0
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			var v float64
			if _, err := fmtSscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
				total += v
			}
		}
	}
	return total
}

// scripted is a base transport answering from a function, on the fake
// clock, recording when each attempt arrived.
type scripted struct {
	f     *fake
	mu    sync.Mutex
	at    []time.Duration // since the start, on the fake clock
	start time.Duration
	reply func(n int, r *http.Request) (*http.Response, error)
}

func (s *scripted) RoundTrip(r *http.Request) (*http.Response, error) {
	s.mu.Lock()
	n := len(s.at)
	s.at = append(s.at, time.Duration(s.f.clk.Now())-s.start)
	s.mu.Unlock()
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return s.reply(n, r)
}

func reply(code int, hdr map[string]string, body string) *http.Response {
	h := http.Header{}
	for k, v := range hdr {
		h.Set(k, v)
	}
	return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader(body))}
}

const retryableEnvelope = `{"error":{"reason":"overload","retryable":true,"effect_possible":false}}`

func overloaded(int, *http.Request) (*http.Response, error) {
	return reply(503, map[string]string{"Content-Type": "application/json"}, retryableEnvelope), nil
}

func newScripted(f *fake, fn func(int, *http.Request) (*http.Response, error)) *scripted {
	return &scripted{f: f, start: time.Duration(f.clk.Now()), reply: fn}
}

// The attempt limit stops retries, and every wait is the full-jitter
// backoff's: retry n within [0, min(cap, base·2^(n−1))).
func TestAttemptBudgetStops(t *testing.T) {
	f := newFake()
	base := newScripted(f, overloaded)
	r := f.retrier(t, 3, Options{MaxAttempts: 5, Backoff: Backoff{Base: 100 * time.Millisecond, Cap: 250 * time.Millisecond}, ThrottleK: -1})
	hc := &http.Client{Transport: &Transport{Retrier: r, Base: base}}
	resp, _, err := do(t, hc, "GET", "http://svc/x", "")
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("%v %v", resp, err)
	}
	if len(base.at) != 5 || len(f.waits) != 4 {
		t.Fatalf("%d attempts, %d waits; want 5 and 4", len(base.at), len(f.waits))
	}
	for i, w := range f.waits {
		ceil := min(100*time.Millisecond<<i, 250*time.Millisecond)
		if w < 0 || w >= ceil {
			t.Errorf("wait %d = %v, outside [0, %v)", i+1, w, ceil)
		}
	}
}

// The deadline stops retries: no retry starts unless it can start before
// the request's deadline, and the last answer is returned.
func TestDeadlineStops(t *testing.T) {
	f := newFake()
	base := newScripted(f, func(int, *http.Request) (*http.Response, error) {
		return reply(503, map[string]string{"Content-Type": "application/json", "Retry-After": "1"}, retryableEnvelope), nil
	})
	r := f.retrier(t, 5, Options{MaxAttempts: 10, BudgetRatio: -1, ThrottleK: -1})
	hc := &http.Client{Transport: &Transport{Retrier: r, Base: base}}
	ctx, cancel := context.WithTimeout(context.Background(), 3500*time.Millisecond) // wall time: the fake clock never gets there
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", "http://svc/x", nil)
	resp, err := hc.Do(req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatalf("%v %v", resp, err)
	}
	resp.Body.Close()
	// Retry-After 1 jittered upward: each wait in [1 s, 2 s], so two or
	// three attempts fit in 3.5 s, never one starting past it.
	last := base.at[len(base.at)-1]
	if len(base.at) < 2 || len(base.at) > 3 || last >= 3500*time.Millisecond {
		t.Fatalf("attempts at %v: want 2 or 3, all before the 3.5 s deadline", base.at)
	}
	for _, w := range f.waits {
		if w < time.Second || w > 2*time.Second {
			t.Fatalf("wait %v outside the Retry-After floor [1s, 2s]", w)
		}
	}
}

// What is not retried: a POST refused by a 503 that may have had an
// effect (no envelope), a body that cannot be sent again, an envelope
// saying "do not retry", a 4xx; a GET's transport error is retried.
func TestWhatIsRetried(t *testing.T) {
	plain503 := func(int, *http.Request) (*http.Response, error) { return reply(503, nil, "busy"), nil }
	noRetry := func(int, *http.Request) (*http.Response, error) {
		return reply(429, map[string]string{"Content-Type": "application/json"}, `{"error":{"retryable":false,"effect_possible":false}}`), nil
	}
	noRetryProblem := func(int, *http.Request) (*http.Response, error) {
		return reply(429, map[string]string{"Content-Type": "application/problem+json"},
			`{"type":"about:blank","status":429,"retryable":false,"effect_possible":false}`), nil
	}
	mayHaveActedProblem := func(int, *http.Request) (*http.Response, error) {
		return reply(503, map[string]string{"Content-Type": "application/problem+json; charset=utf-8"},
			`{"type":"about:blank","status":503,"retryable":true,"effect_possible":false}`), nil
	}
	badRequest := func(int, *http.Request) (*http.Response, error) { return reply(400, nil, ""), nil }
	flaky := func(n int, _ *http.Request) (*http.Response, error) {
		if n == 0 {
			return nil, errors.New("connection reset")
		}
		return reply(200, nil, "ok"), nil
	}
	for _, c := range []struct {
		name     string
		method   string
		body     io.Reader
		hdr      []string
		fn       func(int, *http.Request) (*http.Response, error)
		attempts int
	}{
		{"GET 503 without envelope", "GET", nil, nil, plain503, 3},
		{"POST 503 without envelope", "POST", strings.NewReader("x"), nil, plain503, 1},
		{"POST 503 with idempotency key", "POST", strings.NewReader("x"), []string{"Idempotency-Key", "k"}, plain503, 3},
		{"POST sluice refusal", "POST", strings.NewReader("x"), nil, overloaded, 3},
		{"POST body without GetBody", "POST", io.MultiReader(strings.NewReader("x")), []string{"Idempotency-Key", "k"}, overloaded, 1},
		{"retryable false", "GET", nil, nil, noRetry, 1},
		{"retryable false in problem details", "GET", nil, nil, noRetryProblem, 1},
		{"POST refusal before any effect, in problem details", "POST", strings.NewReader("x"), nil, mayHaveActedProblem, 3},
		{"400", "GET", nil, nil, badRequest, 1},
		{"GET transport error", "GET", nil, nil, flaky, 2},
		{"POST transport error", "POST", strings.NewReader("x"), nil, flaky, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake()
			base := newScripted(f, c.fn)
			r := f.retrier(t, 1, Options{ThrottleK: -1})
			req, _ := http.NewRequest(c.method, "http://svc/x", c.body)
			for i := 0; i+1 < len(c.hdr); i += 2 {
				req.Header.Set(c.hdr[i], c.hdr[i+1])
			}
			resp, err := (&Transport{Retrier: r, Base: base}).RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			if len(base.at) != c.attempts {
				t.Fatalf("%d attempts, want %d (err %v)", len(base.at), c.attempts, err)
			}
		})
	}
}

// The retry budget caps retries at its ratio under a 100% failure rate:
// 1,000 requests, every attempt refused, at most 10% + the burst retried.
func TestBudgetCapsRetries(t *testing.T) {
	f := newFake()
	base := newScripted(f, overloaded)
	m := NewMetrics(MetricsOptions{})
	r := f.retrier(t, 9, Options{MaxAttempts: 5, ThrottleK: -1, Observer: m})
	tr := &Transport{Retrier: r, Base: base}
	for range 1000 {
		req, _ := http.NewRequest("GET", "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	retries := len(base.at) - 1000
	if retries > 100+10 || retries < 100 {
		t.Fatalf("%d retries for 1,000 requests at a 10%% budget with a burst of 10", retries)
	}
	if got := counter(t, m, "sluice_client_attempts_total"); got != float64(len(base.at)) {
		t.Fatalf("attempts metric %v, sent %d", got, len(base.at))
	}
	if got := counter(t, m, "sluice_client_budget_exhausted_total"); got < 800 {
		t.Fatalf("budget exhausted %v times, want most of the 1,000 requests", got)
	}
}

// The adaptive throttle: with every attempt refused, the client soon sends
// only a fraction of its requests, which it refuses locally with
// ErrThrottled, counted in the metrics.
func TestThrottleShedsLocally(t *testing.T) {
	f := newFake()
	base := newScripted(f, overloaded)
	m := NewMetrics(MetricsOptions{})
	r := f.retrier(t, 11, Options{MaxAttempts: 1, Observer: m})
	tr := &Transport{Retrier: r, Base: base}
	local := 0
	for range 1000 {
		req, _ := http.NewRequest("GET", "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		switch {
		case errors.Is(err, ErrThrottled) && errors.Is(err, ErrLocal):
			local++
		case err != nil:
			t.Fatal(err)
		default:
			resp.Body.Close()
		}
	}
	// p = (n − 0)/(n + 1) → 1: all but a handful are shed.
	if local < 950 || len(base.at)+local != 1000 {
		t.Fatalf("%d shed locally, %d sent", local, len(base.at))
	}
	if got := counter(t, m, "sluice_client_local_rejections_total"); got != float64(local) {
		t.Fatalf("local rejections metric %v, want %d", got, local)
	}
}

// Pacing from the RateLimit fields: once remaining falls to 10% of the
// quota, requests are spaced over the time to the reset.
func TestTransportPaces(t *testing.T) {
	f := newFake()
	left := 100
	base := newScripted(f, func(int, *http.Request) (*http.Response, error) {
		left--
		return reply(200, map[string]string{"RateLimit-Policy": `"rate";q=100;w=10`, "RateLimit": `"rate";r=` + itoa(left) + `;t=5`}, "ok"), nil
	})
	r := f.retrier(t, 1, Options{ThrottleK: -1})
	tr := &Transport{Retrier: r, Base: base}
	for range 95 {
		req, _ := http.NewRequest("GET", "http://svc/x", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// 90 go at once (r ≥ 10); from r = 9 on each waits about t/(r+1).
	if len(f.waits) == 0 || base.at[89] != 0 || base.at[94] < time.Second {
		t.Fatalf("attempt times %v, waits %v", base.at[85:], f.waits)
	}
}

// closeCount is a request body that counts its Close calls.
type closeCount struct {
	io.Reader
	closed atomic.Int64
}

func (c *closeCount) Close() error { c.closed.Add(1); return nil }

// A request refused locally (the throttle, pacing past the deadline) or by
// a Transport without a Retrier has its body closed, as a RoundTripper
// must: it was never sent, so no base transport closed it.
func TestLocalRejectionClosesTheBody(t *testing.T) {
	f := newFake()
	base := newScripted(f, overloaded)
	tr := &Transport{Retrier: f.retrier(t, 11, Options{MaxAttempts: 1}), Base: base}
	shed := 0
	for range 200 {
		body := &closeCount{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest("POST", "http://svc/x", body)
		resp, err := tr.RoundTrip(req)
		if errors.Is(err, ErrThrottled) {
			shed++
			if body.closed.Load() != 1 {
				t.Fatalf("a body refused locally was closed %d times", body.closed.Load())
			}
		} else if resp != nil {
			resp.Body.Close()
		}
	}
	if shed == 0 {
		t.Fatal("nothing was shed locally")
	}
	body := &closeCount{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest("POST", "http://svc/x", body)
	if _, err := (&Transport{}).RoundTrip(req); err == nil || body.closed.Load() != 1 {
		t.Fatalf("without a Retrier: %v, body closed %d times", err, body.closed.Load())
	}
}

// countReads is a body that counts its reads.
type countReads struct {
	io.Reader
	reads atomic.Int64
}

func (c *countReads) Read(p []byte) (int, error) { c.reads.Add(1); return c.Reader.Read(p) }
func (c *countReads) Close() error               { return nil }

// A refusal on the last attempt is handed back with its body unread: the
// envelope only decides a retry, and a slow body held the answer back for
// as long as it took to arrive.
func TestLastAttemptLeavesTheBodyUnread(t *testing.T) {
	f := newFake()
	body := &countReads{Reader: strings.NewReader(retryableEnvelope)}
	base := newScripted(f, func(int, *http.Request) (*http.Response, error) {
		r := reply(503, map[string]string{"Content-Type": "application/json"}, "")
		r.Body = body
		return r, nil
	})
	tr := &Transport{Retrier: f.retrier(t, 1, Options{MaxAttempts: 1}), Base: base}
	req, _ := http.NewRequest("GET", "http://svc/x", nil)
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 503 {
		t.Fatal(resp, err)
	}
	if n := body.reads.Load(); n != 0 {
		t.Fatalf("the body was read %d times before RoundTrip returned", n)
	}
	if b, _ := io.ReadAll(resp.Body); string(b) != retryableEnvelope {
		t.Fatalf("body %q", b)
	}
}

// A server's wait above WaitCap (default 20 s) is not slept inside the
// call: a Retry-After of an hour, with no deadline on the request, returns
// the refusal at once (it held the call for the whole hour); a wait within
// the cap is slept as before.
func TestWaitCapReturnsTheRefusal(t *testing.T) {
	for _, c := range []struct {
		retryAfter string
		cap        time.Duration
		attempts   int
	}{{"3600", 0, 1}, {"21", 0, 1}, {"3600", -1, 2}, {"5", 0, 2}, {"5", 4 * time.Second, 1}} {
		f := newFake()
		base := newScripted(f, func(n int, _ *http.Request) (*http.Response, error) {
			if n >= 1 {
				return reply(200, nil, "ok"), nil
			}
			return reply(503, map[string]string{"Content-Type": "application/json", "Retry-After": c.retryAfter}, retryableEnvelope), nil
		})
		r := f.retrier(t, 1, Options{MaxAttempts: 3, BudgetRatio: -1, ThrottleK: -1, FloorSpread: -1, WaitCap: c.cap, Backoff: Backoff{Base: time.Second}})
		hc := &http.Client{Transport: &Transport{Retrier: r, Base: base}}
		req, _ := http.NewRequest("GET", "http://svc/x", nil)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		want := 503
		if c.attempts == 2 {
			want = 200
		}
		if len(base.at) != c.attempts || resp.StatusCode != want {
			t.Errorf("Retry-After %s, cap %v: %d attempts, %d; want %d, %d (waits %v)", c.retryAfter, c.cap, len(base.at), resp.StatusCode, c.attempts, want, f.waits)
		}
	}
}

// A backoff longer than the wait cap is a configuration error, named.
func TestWaitCapBelowBackoffRefused(t *testing.T) {
	_, err := New(Options{WaitCap: time.Second, Backoff: Backoff{Base: 100 * time.Millisecond, Cap: 5 * time.Second}})
	if err == nil || !strings.Contains(err.Error(), "WaitCap") {
		t.Fatalf("err = %v", err)
	}
	if _, err := New(Options{WaitCap: time.Second}); err != nil {
		t.Fatalf("a cap under the default backoff cap: %v", err)
	}
}
