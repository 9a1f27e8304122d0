package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/internal/logbuf"
	"github.com/sluice-go/sluice/internal/poll"
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

func newDrainHarness(t *testing.T, opts ...func(*Options)) *drainHarness {
	h := &drainHarness{grace: make(chan time.Time), release: make(chan struct{}), entered: make(chan struct{}, 10),
		done: make(chan error, 1), log: &logbuf.Buffer{}, graceAsked: make(chan time.Duration, 1),
		upstreamCut: make(chan struct{}, 10)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "" { // an echo until the client closes
			echoUpgrade(w)
			return
		}
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
	o := (Options{Config: "p.yaml", ConfigData: []byte(policyV1), Upstream: u, Listen: "127.0.0.1:0", Admin: "127.0.0.1:0",
		AdminToken: "x", DrainGrace: 3 * time.Second, NetHTTP: netHTTPFront(), Logger: slog.New(slog.NewTextHandler(h.log, nil)),
		DrainAfter: func(d time.Duration) <-chan time.Time { h.graceAsked <- d; return h.grace }})
	for _, f := range opts {
		f(&o)
	}
	s, err := New(o)
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

// With a drain delay the listener goes on accepting and serving new
// connections after SIGTERM, /readyz answering 503 already, until the delay
// ends; then it stops, and the grace begins. (Without one, a connection a
// load balancer still sent in the moment after SIGTERM was refused.)
func TestDrainDelayKeepsAccepting(t *testing.T) {
	delay := make(chan time.Time)
	var h *drainHarness
	h = newDrainHarness(t, func(o *Options) {
		o.DrainDelay = 7 * time.Second
		o.DrainAfter = func(d time.Duration) <-chan time.Time {
			if d == 7*time.Second {
				return delay
			}
			h.graceAsked <- d
			return h.grace
		}
	})
	h.stop()
	poll.Until(t, 10*time.Second, func() bool { return status(t, h.admin+"/readyz") == 503 })
	for i := range 3 { // new connections, each served, and closed after its answer
		c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatalf("a connection during the drain delay: %v", err)
		}
		fmt.Fprintf(c, "GET /fresh/%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a request during the drain delay: %v %v", resp, err)
		}
		if !resp.Close {
			t.Errorf("an answer during the drain delay keeps its connection alive: %v", resp.Header)
		}
		c.Close()
	}
	select {
	case d := <-h.graceAsked:
		t.Fatalf("the grace (%v) began during the delay", d)
	default:
	}
	close(delay)
	if d := <-h.graceAsked; d != 3*time.Second {
		t.Fatalf("drain grace %v after the delay, want 3s", d)
	}
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil // for the cleanup
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(h.base, "http://"), time.Second); err == nil {
		t.Fatal("the listener still accepts after the drain")
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
	// Run returned after the cut request's handler ended: the runtime it
	// closes took whatever the handler gave back.
	if n := h.s.inflight.Len(); n != 0 {
		t.Errorf("%d requests still in their handlers when Run returned", n)
	}
	if n := testutil.ToFloat64(h.s.host.DrainCut().WithLabelValues("proxy")); n != 1 {
		t.Fatalf("%v requests counted as cut, want 1", n)
	}
	log := h.log.String()
	if !strings.Contains(log, "request cut") || !strings.Contains(log, "path=/slow/long") || !strings.Contains(log, "requests_cut=1") {
		t.Fatalf("the cut is not logged:\n%s", log)
	}
	if strings.Contains(log, "upstream request failed") {
		t.Errorf("the cut is logged as the upstream's failure:\n%s", log)
	}
}

// upgraded opens an upgrade to the harness's echo and checks it echoes.
func (h *drainHarness) upgraded(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: x\r\nX-Api-Key: tenant-ws\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	echo(t, c, br, "hello")
	return c, br
}

func echo(t *testing.T, c net.Conn, br *bufio.Reader, msg string) {
	t.Helper()
	io.WriteString(c, msg)
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// An upgraded connection (a WebSocket) gets the drain's grace as any
// request does: it runs on while the drain waits, and the drain ends when
// it does. The servers do not count hijacked connections, so the drain
// used to end at once and cut it unlogged.
func TestDrainWaitsForAnUpgrade(t *testing.T) {
	h := newDrainHarness(t)
	c, br := h.upgraded(t)
	h.stop()
	<-h.graceAsked
	echo(t, c, br, "still here")
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		t.Fatalf("the drain ended with an upgrade open: %v", err)
	case <-time.After(50 * time.Millisecond): // a proof of absence: passes on a slow machine too
	}
	c.Close()
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil
	if n := testutil.ToFloat64(h.s.host.DrainCut().WithLabelValues("proxy")); n != 0 {
		t.Fatalf("%v requests counted as cut", n)
	}
}

// An upgrade open when the grace runs out is cut, logged and counted.
func TestDrainGraceCutsAnUpgrade(t *testing.T) {
	h := newDrainHarness(t)
	c, br := h.upgraded(t)
	h.stop()
	<-h.graceAsked
	close(h.grace)
	c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a hang turned into a failure
	if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the upgrade was not cut: %v", err)
	}
	if err := <-h.done; err != nil {
		t.Fatal(err)
	}
	h.done <- nil
	if n := testutil.ToFloat64(h.s.host.DrainCut().WithLabelValues("proxy")); n != 1 {
		t.Fatalf("%v requests counted as cut, want 1", n)
	}
	if log := h.log.String(); !strings.Contains(log, "path=/ws") {
		t.Fatalf("the cut is not logged:\n%s", log)
	}
	c.Close()
}
