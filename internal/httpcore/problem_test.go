package httpcore_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/internal/wire"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

type problem struct {
	Type           string `json:"type"`
	Title          string `json:"title"`
	Status         int    `json:"status"`
	Detail         string `json:"detail"`
	Reason         string `json:"reason"`
	Scope          string `json:"scope"`
	Gate           string `json:"gate"`
	Retryable      bool   `json:"retryable"`
	EffectPossible bool   `json:"effect_possible"`
	RetryAfter     int64  `json:"retry_after"`
	RequestID      string `json:"request_id"`
}

// rejectTwice answers the same over-limit request with the envelope and
// with problem details, from two middlewares on one clock.
func rejectTwice(t *testing.T, req func() *http.Request) (env, prob *httptest.ResponseRecorder) {
	t.Helper()
	for _, pd := range []bool{false, true} {
		clk := fakeclock.New(1)
		r, _ := limit.ParseRate("1/m")
		tb, _ := limit.NewTokenBucket(r, 1)
		g, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
		chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: clk}, g)
		mw, err := httpcore.New(chain, httpcore.Config{Rules: identify.Rules{TenantHeader: "X-Api-Key", RequestIDHeader: "X-Request-Id"},
			Jitter: noJitter, ProblemDetails: pd})
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		h.ServeHTTP(httptest.NewRecorder(), req())
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req())
		if pd {
			prob = rec
		} else {
			env = rec
		}
	}
	return env, prob
}

// Problem details carry the rejection's facts in RFC 9457's members and
// the envelope's as extensions; status, Retry-After and the RateLimit
// fields are those of the envelope's answer.
func TestProblemDetailsBody(t *testing.T) {
	env, prob := rejectTwice(t, func() *http.Request {
		r := httptest.NewRequest("GET", "/v1/routes/1", nil)
		r.Header.Set("X-Api-Key", "acme")
		r.Header.Set("X-Request-Id", "req-1")
		return r
	})
	if prob.Code != 429 || prob.Code != env.Code {
		t.Fatalf("status %d, envelope's %d", prob.Code, env.Code)
	}
	for _, k := range []string{"Retry-After", "Ratelimit", "Ratelimit-Policy", "Cache-Control", "X-Request-Id"} {
		if prob.Header().Get(k) != env.Header().Get(k) || env.Header().Get(k) == "" {
			t.Errorf("%s: %q, envelope's %q", k, prob.Header().Get(k), env.Header().Get(k))
		}
	}
	if ct := prob.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var p problem
	dec := json.NewDecoder(prob.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil || dec.More() {
		t.Fatalf("%v: %s", err, prob.Body.String())
	}
	var e envelope
	if err := json.Unmarshal(env.Body.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	want := problem{Type: wire.ProblemType + "policy_rate", Title: "Rate limit exceeded", Status: 429, Detail: e.Error.Message,
		Reason: "policy_rate", Scope: "tenant", Gate: "request-rate", Retryable: true, RetryAfter: 60, RequestID: "req-1"}
	if p != want {
		t.Fatalf("problem\n%+v\nwant\n%+v", p, want)
	}
}

// An invalid request's problem names the field at fault in its detail.
func TestProblemDetailsInvalid(t *testing.T) {
	_, prob := rejectTwice(t, func() *http.Request {
		r := httptest.NewRequest("GET", "/v1/routes/1", nil)
		r.Header.Set("X-Api-Key", string([]byte{'a', 0x7f, '"'}))
		return r
	})
	var p problem
	if err := json.Unmarshal(prob.Body.Bytes(), &p); err != nil {
		t.Fatalf("%v: %s", err, prob.Body.String())
	}
	if prob.Code != 400 || p.Status != 400 || p.Type != wire.ProblemType+"invalid" || p.Title != "Invalid request" || p.Detail == "" || p.Retryable {
		t.Fatalf("%d %+v", prob.Code, p)
	}
}

// InvalidStatus answers the status it is given, in the status line and the
// problem's status alike; a status that is not a client's error is 400.
func TestInvalidStatus(t *testing.T) {
	chain, _ := sluice.NewChain(sluice.ChainOptions{Clock: fakeclock.New(1)})
	mw, err := httpcore.New(chain, httpcore.Config{ProblemDetails: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ give, want int }{{413, 413}, {431, 431}, {400, 400}, {500, 400}, {200, 400}, {0, 400}} {
		rec := httptest.NewRecorder()
		mw.InvalidStatus(rec, httptest.NewRequest("POST", "/", nil), c.give, "too large")
		var p problem
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatalf("%v: %s", err, rec.Body.String())
		}
		if rec.Code != c.want || p.Status != c.want || p.Reason != "invalid" || p.Retryable {
			t.Errorf("InvalidStatus(%d): %d %+v, want %d", c.give, rec.Code, p, c.want)
		}
	}
}
