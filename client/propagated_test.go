package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// In process: a handler behind sluice's middleware calls a downstream
// service through a Transport with its request's context, and the call
// carries the class the request was admitted as (its route's, not the
// client's) and what is left of its budget.
func TestMiddlewareClassTravelsThroughTheTransport(t *testing.T) {
	got := make(chan http.Header, 1)
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.Header.Clone() }))
	defer down.Close()
	retrier, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &Transport{Retrier: retrier, DeadlineHeader: "X-Request-Timeout"}}
	defer hc.CloseIdleConnections()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 100)
	g, _ := gate.NewRateLimit("rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{})
	chain, err := sluice.NewChain(sluice.ChainOptions{}, g)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httpgate.New(chain, httpgate.Config{Rules: identify.Rules{
		DeadlineHeader: "X-Request-Timeout",
		Routes:         []identify.Route{{Path: "/report", Class: sluice.ClassSheddable}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := sluice.ClassFrom(r.Context()); c != sluice.ClassSheddable {
			t.Errorf("handler's context: class %q", c)
		}
		req, _ := http.NewRequestWithContext(r.Context(), "GET", down.URL, nil)
		if resp, err := hc.Do(req); err == nil {
			resp.Body.Close()
		}
	})))
	defer front.Close()
	req, _ := http.NewRequest("GET", front.URL+"/report", nil)
	req.Header.Set(sluice.ClassHeader, sluice.ClassCritical)
	req.Header.Set("X-Request-Timeout", "5s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	h := <-got
	if c := h.Get(sluice.ClassHeader); c != sluice.ClassSheddable {
		t.Errorf("downstream got class %q, want the route's sheddable", c)
	}
	if d, err := time.ParseDuration(h.Get("X-Request-Timeout")); err != nil || d > 5*time.Second || d <= 0 {
		t.Errorf("downstream got deadline %q (%v), want what is left of 5s", h.Get("X-Request-Timeout"), err)
	}
}

// Behind sluice proxy a service reads what it was admitted as from the
// request (Propagated) and a Transport passes it on; a malformed field is
// ignored, and no field means nothing is sent.
func TestPropagatedReadsTheProxysFields(t *testing.T) {
	for _, c := range []struct {
		class, level, timeout string
		wantClass, wantLevel  string
		wantDeadline          bool
	}{
		{"sheddable", "degrade", "250ms", "sheddable", "degrade", true},
		{"critical", "normal", "", "critical", "", false},
		{"", "sideways", "soon", "", "", false},
		{"", "", "-5ms", "", "", false},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for k, v := range map[string]string{sluice.ClassHeader: c.class, sluice.LevelHeader: c.level, "X-Request-Timeout": c.timeout} {
			if v != "" {
				r.Header.Set(k, v)
			}
		}
		ctx, cancel := Propagated(r, "X-Request-Timeout")
		_, hasDeadline := ctx.Deadline()
		if sluice.ClassFrom(ctx) != c.wantClass || levelName(ctx) != c.wantLevel || hasDeadline != c.wantDeadline {
			t.Errorf("%+v: class %q level %q deadline %v", c, sluice.ClassFrom(ctx), levelName(ctx), hasDeadline)
		}
		cancel()
	}
}

func levelName(ctx context.Context) string {
	if l := sluice.LevelFrom(ctx); l != sluice.LevelNormal {
		return l.String()
	}
	return ""
}
