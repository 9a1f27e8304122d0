package proxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/internal/logbuf"
)

// drainHarness runs a proxy whose drain grace ends when the test closes
// grace, in front of an upstream that holds /slow/ requests until release.
type drainHarness struct {
	s                *Server
	base, admin      string
	grace            chan time.Time
	release, entered chan struct{}
	upstreamCut      chan struct{} // a /slow/ request the upstream saw cancelled
	stop             context.CancelFunc
	done             chan error
	log              *logbuf.Buffer
	graceAsked       chan time.Duration
}

func newDrainHarness(t *testing.T) *drainHarness {
	h := &drainHarness{grace: make(chan time.Time), release: make(chan struct{}), entered: make(chan struct{}, 10),
		done: make(chan error, 1), log: &logbuf.Buffer{}, graceAsked: make(chan time.Duration, 1),
		upstreamCut: make(chan struct{}, 10)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			h.entered <- struct{}{}
			select {
			case <-h.release:
			case <-r.Context().Done():
				h.upstreamCut <- struct{}{}
				return
			}
		}
		io.WriteString(w, "done "+r.URL.Path)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policyV1), Upstream: u, Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		AdminToken: "x", DrainGrace: 3 * time.Second, NetHTTP: netHTTPFront(), Logger: slog.New(slog.NewTextHandler(h.log, nil)),
		DrainAfter: func(d time.Duration) <-chan time.Time { h.graceAsked <- d; return h.grace }})
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	ctx, cancel := context.WithCancel(context.Background())
	h.stop = cancel
	go func() { h.done <- s.Run(ctx) }()
	p, a := s.Addrs()
	h.base, h.admin = "http://"+p.String(), "http://"+a.String()
	t.Cleanup(func() {
		cancel()
		select {
		case <-h.release:
		default:
			close(h.release)
		}
		select {
		case <-h.grace:
		default:
			close(h.grace)
		}
		<-h.done
	})
	return h
}

func status(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// slowRequest starts GET /slow/name with a tenant key and returns where its
// answer (status, or -1 for a failed request) will arrive, once the
// upstream holds it.
func (h *drainHarness) slowRequest(t *testing.T, name string) <-chan int {
	got := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", h.base+"/slow/"+name, nil)
		req.Header.Set("X-Api-Key", "tenant-"+name)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			got <- -1
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-h.entered
	return got
}

// At SIGTERM (Run's context done) /readyz turns 503 before the drain,
// /healthz stays 200 throughout, and a request that finishes within the
// grace is answered normally.
func TestDrainTurnsUnreadyFirstAndFinishesInFlight(t *testing.T) {
	h := newDrainHarness(t)
	if c := status(t, h.admin+"/readyz"); c != 200 {
		t.Fatalf("/readyz while serving: %d", c)
	}
	got := h.slowRequest(t, "a")
	h.stop()
	if d := <-h.graceAsked; d != 3*time.Second {
		t.Fatalf("drain grace %v, want the 3s given", d)
	}
	// The grace is asked for only after readiness turned off.
	if c := status(t, h.admin+"/readyz"); c != 503 {
		t.Fatalf("/readyz while draining: %d, want 503", c)
	}
	if c := status(t, h.admin+"/healthz"); c != 200 {
		t.Fatalf("/healthz while draining: %d, want 200", c)
	}
	close(h.release)
	if c := <-got; c != 200 {
		t.Fatalf("request finished within the grace answered %d", c)
	}
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil // for the cleanup
	if n := testutil.ToFloat64(h.s.host.DrainCut().WithLabelValues("proxy")); n != 0 {
		t.Fatalf("%v requests counted as cut", n)
	}
	if strings.Contains(h.log.String(), "request cut") {
		t.Fatalf("a cut logged:\n%s", h.log.String())
	}
}

// A request longer than the grace is cut, not silently: its connection is
// closed, and it is logged (method, path) and counted.
func TestDrainGraceCutsAndCountsLongRequests(t *testing.T) {
	h := newDrainHarness(t)
	got := h.slowRequest(t, "long")
	h.stop()
	<-h.graceAsked
	if c := status(t, h.admin+"/readyz"); c != 503 {
		t.Fatalf("/readyz while draining: %d, want 503", c)
	}
	close(h.grace) // the grace runs out with the request still at the upstream
	if c := <-got; c == 200 {
		t.Fatal("a request still running after the grace was answered 200")
	}
	// Its upstream call ends with it, on both fronts (a client going away
	// would not end it: TestGoneClientsRequestHoldsItsSlotUntilTheUpstreamAnswers).
	<-h.upstreamCut
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil
	if n := testutil.ToFloat64(h.s.host.DrainCut().WithLabelValues("proxy")); n != 1 {
		t.Fatalf("%v requests counted as cut, want 1", n)
	}
	log := h.log.String()
	if !strings.Contains(log, "request cut") || !strings.Contains(log, "path=/slow/long") || !strings.Contains(log, "requests_cut=1") {
		t.Fatalf("the cut is not logged:\n%s", log)
	}
}
