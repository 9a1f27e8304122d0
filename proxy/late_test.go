package proxy

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
)

// A request whose upstream answers past its deadline holds its slot until
// the answer comes (the upstream was still working on it), is answered 504
// with reason deadline then, not forwarded, and counts as late, on both
// fronts: the slot used to be freed at the deadline, the request booked as
// errored, and the adaptive limit and the deadline test learned nothing.
func TestLateAnswerHoldsItsSlotAndCountsLate(t *testing.T) {
	release := make(chan struct{})
	arrived := make(chan struct{}, 1)
	s, base := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout, default: 5s}
gates:
  - {name: pool, kind: concurrency, scope: service, limit: 1}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "too late")
	}), func(o *Options) { o.UpstreamGrace = time.Minute })
	held := func() bool {
		d, tk := s.Chain().Decide(t.Context(), &sluice.Request{})
		if d.Admitted {
			tk.Done(sluice.OutcomeUseful)
		}
		return !d.Admitted
	}
	c := dial(t, base)
	// A budget a busy machine cannot spend before the request is admitted
	// (with 100 ms, a run beside two busy loops was refused at the door).
	sent := time.Now()
	fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: x\r\nX-Request-Timeout: 1s\r\n\r\n")
	answered := make(chan *http.Response, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Error(err)
			close(answered)
			return
		}
		io.ReadAll(resp.Body)
		answered <- resp
	}()
	// Wait for the upstream to have the request before probing the gate:
	// a probe taking the one slot while the request is admitted would
	// refuse the request (seen on a busy machine).
	select {
	case <-arrived:
	case resp := <-answered:
		if resp != nil {
			t.Fatalf("answered %s before the upstream got the request", resp.Status)
		}
		return
	case <-time.After(20 * time.Second):
		t.Fatal("the request did not reach the upstream in 20 s")
	}
	// Well past the 1 s deadline the upstream still works: the slot stays
	// held and nothing is answered yet.
	if !held() {
		t.Fatal("the slot is free while the upstream works")
	}
	time.Sleep(time.Until(sent.Add(1300 * time.Millisecond)))
	if !held() {
		t.Fatal("the slot was freed at the deadline while the upstream still worked")
	}
	select {
	case resp := <-answered:
		t.Fatalf("answered %v before the upstream did", resp.Status)
	default:
	}
	close(release)
	resp := <-answered
	if resp == nil {
		return
	}
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("late answer: %s, want 504", resp.Status)
	}
	poll.Until(t, 10*time.Second, func() bool { return !held() })
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `sluice_requests_completed_total{class="default",outcome="late"`) {
		t.Errorf("no late completion in /metrics:\n%s", grepLines(rec.Body.String(), "sluice_requests_completed_total"))
	}
}

// With the grace run out the upstream's connection is cut: the request
// answers 504 and counts as late, and its slot is free again.
func TestUpstreamGraceBoundsTheHold(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	s, base := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout, default: 5s}
gates:
  - {name: pool, kind: concurrency, scope: service, limit: 1}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), func(o *Options) { o.UpstreamGrace = 200 * time.Millisecond })
	start := time.Now()
	req, _ := http.NewRequest("GET", base+"/x", nil)
	req.Header.Set("X-Request-Timeout", "100ms")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("%s after %v, want 504 after the deadline and the grace (300 ms)", resp.Status, time.Since(start))
	}
	poll.Until(t, 10*time.Second, func() bool {
		d, tk := s.Chain().Decide(t.Context(), &sluice.Request{})
		tk.Done(sluice.OutcomeUseful)
		return d.Admitted
	})
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if !strings.Contains(rec.Body.String(), `outcome="late"`) {
		t.Errorf("no late completion in /metrics:\n%s", grepLines(rec.Body.String(), "sluice_requests_completed_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// In front of an upstream, a queue_delay controller would read the proxy's
// own goroutine scheduling, not the upstream's queue: refused at start,
// on the field, with what to use instead.
func TestQueueDelayRefusedInFrontOfAnUpstream(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	_, err := New(Options{Config: "p.yaml", Upstream: u, AdminToken: "x", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		ConfigData: []byte("version: 1\ngates:\n  - {name: a, kind: adaptive_concurrency, controller: queue_delay, target: 5ms}\n")})
	if err == nil || !strings.Contains(err.Error(), "p.yaml:3") || !strings.Contains(err.Error(), "controller") || !strings.Contains(err.Error(), "use bbr") {
		t.Fatalf("err = %v", err)
	}
}

// A late answer's response buffer goes back to the pool once: released
// twice, two later requests would share it and one client would read the
// other's answer (found by the race detector in a full test run).
func TestLateAnswersLeaveNoSharedBuffers(t *testing.T) {
	_, base := serve(t, `version: 1
identity:
  deadline: {header: X-Request-Timeout, default: 5s}
gates:
  - {name: pool, kind: concurrency, scope: service, limit: 100}
`, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			time.Sleep(60 * time.Millisecond)
		}
		io.WriteString(w, r.URL.Path)
	}), func(o *Options) { o.UpstreamGrace = time.Second })
	get := func(path, timeout string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if timeout != "" {
			req.Header.Set("X-Request-Timeout", timeout)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0, ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	done := make(chan struct{})
	for i := 0; i < 8; i++ {
		go func(i int) {
			defer func() { done <- struct{}{} }()
			for j := 0; j < 10; j++ {
				if j%2 == 0 {
					if code, _ := get("/slow", "10ms"); code != http.StatusGatewayTimeout && code != 0 {
						t.Errorf("late: %d, want 504", code)
					}
					continue
				}
				path := fmt.Sprintf("/p%d-%d", i, j)
				if code, body := get(path, ""); code != 200 || body != path {
					t.Errorf("%s: %d %q", path, code, body)
				}
			}
		}(i)
	}
	for i := 0; i < 8; i++ {
		<-done
	}
}
