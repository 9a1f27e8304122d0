package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// upstreamTimeout sets Options.UpstreamTimeout.
func upstreamTimeout(d time.Duration) func(*Options) {
	return func(o *Options) { o.UpstreamTimeout = d }
}

// guarded is a client whose timeout only turns a hang into a failure: far
// above anything a test here waits for, even on a busy machine.
var guarded = &http.Client{Timeout: 60 * time.Second}

// An upstream that takes a request and says nothing frees the request's
// slot after UpstreamTimeout: the request answers 504 and the next one is
// admitted. Requests have no deadline here (no identity.deadline), and
// before the bound such a request held its slot for as long as the
// upstream kept the connection open.
func TestSilentUpstreamIsCutAndItsSlotFreed(t *testing.T) {
	quit := make(chan struct{})
	defer close(quit)
	var calls atomic.Int32
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			select { // silent
			case <-quit:
			case <-r.Context().Done():
			}
			return
		}
		io.WriteString(w, "ok")
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1}\n"
	_, base := serve(t, policy, up, upstreamTimeout(300*time.Millisecond))
	resp, err := guarded.Get(base + "/silent")
	if err != nil {
		t.Fatalf("the request to a silent upstream never ended: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("the request to a silent upstream answered %d, want 504", resp.StatusCode)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the upstream got the timed-out request %d times, want once (a retry runs it twice)", n)
	}
	resp, err = guarded.Get(base + "/next")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "ok" {
		t.Fatalf("the next request answered %d %q: the silent one kept its slot", resp.StatusCode, body)
	}
}

// The bound is on the silence, not on the exchange: a response that keeps
// arriving, a chunk every 25 ms for twice the bound, is answered whole.
func TestUpstreamTimeoutBoundsTheSilenceNotTheExchange(t *testing.T) {
	const bound, gap, chunks = 500 * time.Millisecond, 25 * time.Millisecond, 40
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for i := range chunks {
			fmt.Fprintf(w, "%02d;", i)
			w.(http.Flusher).Flush()
			time.Sleep(gap)
		}
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1}\n"
	_, base := serve(t, policy, up, upstreamTimeout(bound))
	start := time.Now()
	resp, err := guarded.Get(base + "/trickle")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil || len(body) != 3*chunks {
		t.Fatalf("answered %d with %d bytes (%v) after %v, want 200 with all %d", resp.StatusCode, len(body), err,
			time.Since(start), 3*chunks)
	}
}

// An upgrade whose upstream takes the request and never answers it is
// cut the same way (504), and so is an upgraded connection silent both
// ways; traffic in either direction keeps it open.
func TestSilentUpgradeIsCut(t *testing.T) {
	quit := make(chan struct{})
	defer close(quit)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		if r.URL.Path == "/silent" {
			<-quit
			return
		}
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		io.Copy(c, brw) // echo until the proxy closes
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	_, base := serve(t, policy, up, upstreamTimeout(300*time.Millisecond))

	c := dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second)) // a hang fails
	fmt.Fprintf(c, "GET /silent HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Fatalf("an upgrade to a silent upstream answered %d, want 504", resp.StatusCode)
	}

	c = dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second))
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	if resp, err = http.ReadResponse(br, nil); err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	// Traffic keeps it open past the bound...
	for i := range 8 {
		msg := fmt.Sprintf("m%d", i)
		io.WriteString(c, msg)
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
			t.Fatalf("echo %d after %d×100 ms: %q, %v", i, i, got, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// ... and silence closes it.
	if n, err := br.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a silent upgraded connection stayed open: read %d, %v", n, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// upConn's bound: a read waits at most idle for data, and no longer than
// the deadline its user set; CloseWrite reaches the TCP connection
// inside; Close forgets the connection once.
func TestUpConnBoundsEachWait(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	c := newUpConn(a, 50*time.Millisecond, nil)
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read with nothing to read: %v, want the idle bound's timeout", err)
	}
	go b.Write([]byte("x"))
	if n, err := c.Read(make([]byte, 1)); n != 1 || err != nil {
		t.Fatalf("a read after the bound ran out once: %d, %v", n, err)
	}
	c.SetReadDeadline(time.Now().Add(-time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a read past the user's deadline: %v", err)
	}
	c.Close()

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		s, err := ln.Accept()
		if err == nil {
			io.Copy(s, s) // echo, then close when the other side is done
			s.Close()
		}
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	forgot := 0
	u := newUpConn(raw, time.Minute, func(*upConn) { forgot++ })
	io.WriteString(u, "bye")
	closeWrite(u)
	if got, err := io.ReadAll(u); string(got) != "bye" || err != nil {
		t.Fatalf("after CloseWrite the peer echoed %q, %v; want bye and EOF", got, err)
	}
	u.Close()
	if forgot != 1 {
		t.Fatalf("forget called %d times, want 1", forgot)
	}
}

// The idle bound is renewed only when it moves by its slack: reads in a
// quick loop set no deadline each.
func TestIdleSlack(t *testing.T) {
	for _, c := range []struct{ idle, want time.Duration }{
		{time.Minute, time.Second}, {4 * time.Second, 500 * time.Millisecond}, {80 * time.Millisecond, 10 * time.Millisecond},
	} {
		if got := time.Duration(idleSlack(c.idle)); got != c.want {
			t.Errorf("idleSlack(%v) = %v, want %v", c.idle, got, c.want)
		}
	}
	if !strings.Contains(fmt.Sprint(sooner(0, 0)), "0001") || sooner(5, 0).UnixNano() != 5 || sooner(0, 7).UnixNano() != 7 ||
		sooner(9, 3).UnixNano() != 3 {
		t.Error("sooner")
	}
}

// rawUpstream serves each accepted connection with handle, on its own
// goroutine; it closes, with every connection, when t ends.
func rawUpstream(t *testing.T, handle func(c net.Conn)) *url.URL {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return rawUpstreamOn(t, ln, "http", handle)
}

// rawUpstreamTLS is rawUpstream over TLS, with httptest's certificate,
// and the client configuration that trusts it.
func rawUpstreamTLS(t *testing.T, handle func(c net.Conn)) (*url.URL, *tls.Config) {
	t.Helper()
	cfg, trust := testCert()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return rawUpstreamOn(t, tls.NewListener(ln, cfg), "https", handle), trust
}

// testCert returns httptest's server TLS configuration and the client one
// that trusts it.
func testCert() (server, client *tls.Config) {
	ts := httptest.NewTLSServer(nil)
	defer ts.Close()
	return ts.TLS.Clone(), ts.Client().Transport.(*http.Transport).TLSClientConfig
}

// holding is a listener whose connections can hold their writes and send
// them as one (two answers in one TCP segment, TLS records included).
type holding struct{ net.Listener }

func (l holding) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &holdConn{Conn: c}, nil
}

type holdConn struct {
	net.Conn
	mu   sync.Mutex
	held []byte
	hold bool
}

func (c *holdConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hold {
		c.held = append(c.held, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// together runs write with the writes held, then sends them in one.
func together(c net.Conn, write func()) {
	h, ok := c.(*holdConn)
	if tc, isTLS := c.(*tls.Conn); isTLS {
		h, ok = tc.NetConn().(*holdConn)
	}
	if !ok {
		panic("not a holding connection")
	}
	h.mu.Lock()
	h.hold = true
	h.mu.Unlock()
	write()
	h.mu.Lock()
	h.hold = false
	h.Conn.Write(h.held)
	h.held = nil
	h.mu.Unlock()
}

// Bytes an upstream sends that no request asked for (an answer right
// behind another, in the same segment or a moment later; a body behind a
// HEAD's answer) never answer the next request: the connection is given
// up. Over TLS the proxy's own server answered the next request with them
// (TLS had read them from the socket with the answer before, so the look
// at the socket saw nothing), and every later answer was one behind.
func TestUnrequestedBytesNeverAnswerTheNextRequest(t *testing.T) {
	for _, secure := range []bool{false, true} {
		for _, mode := range []string{"behind", "late", "after head"} {
			t.Run(map[bool]string{false: "http", true: "https"}[secure]+"/"+mode, func(t *testing.T) {
				unrequestedBytes(t, secure, mode)
			})
		}
	}
}

func unrequestedBytes(t *testing.T, secure bool, mode string) {
	const evil = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL"
	var n atomic.Int32
	handle := func(c net.Conn) {
		br := bufio.NewReader(c)
		for {
			r, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, r.Body)
			i := n.Add(1)
			answer := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nr%d", i%10)
			switch {
			case i > 1:
				io.WriteString(c, answer)
			case mode == "behind":
				together(c, func() { io.WriteString(c, answer); io.WriteString(c, evil) })
			case mode == "late":
				io.WriteString(c, answer)
				time.Sleep(5 * time.Millisecond)
				io.WriteString(c, evil)
			default: // a HEAD's answer, then a body no one asked for
				together(c, func() { io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 41\r\n\r\n"); io.WriteString(c, evil) })
			}
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	var base string
	if secure {
		cfg, trust := testCert()
		_, base = serveTrusting(t, policy, rawUpstreamOn(t, tls.NewListener(holding{ln}, cfg), "https", handle), trust)
	} else {
		_, base = serve(t, policy, nil, func(o *Options) { o.Upstream = rawUpstreamOn(t, holding{ln}, "http", handle) })
	}
	for i := 1; i <= 3; i++ {
		method := "GET"
		if mode == "after head" && i == 1 {
			method = "HEAD"
		}
		req, _ := http.NewRequest(method, base+"/x", nil)
		resp, err := guarded.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(got), "EVIL") {
			t.Fatalf("%s %d answered with bytes no request asked for: %d %q", method, i, resp.StatusCode, got)
		}
		time.Sleep(20 * time.Millisecond) // what came late has arrived
	}
}

func rawUpstreamOn(t *testing.T, ln net.Listener, scheme string, handle func(c net.Conn)) *url.URL {
	var mu sync.Mutex
	var open []net.Conn
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	}()
	u, _ := url.Parse(scheme + "://" + ln.Addr().String())
	return u
}

// A request on a pooled connection the upstream closed while it sat idle
// goes out once, on a new connection, whatever its method and body: a POST
// on it answered 502 on the proxy's own server, whose client retries only
// requests without a body, and only after they failed. To an https
// upstream too (the proxy's own server had neither the look nor the retry
// over TLS: every request after the first answered 502 here).
func TestRequestOnAClosedIdleConnectionGoesOutOnANewOne(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[secure], func(t *testing.T) { requestOnAClosedIdleConnection(t, secure) })
	}
}

func requestOnAClosedIdleConnection(t *testing.T, secure bool) {
	var seen atomic.Int32
	handle := func(c net.Conn) { // one answer a connection, then close it
		r, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, r.Body)
		seen.Add(1)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	var base string
	if secure {
		u, trust := rawUpstreamTLS(t, handle)
		_, base = serveTrusting(t, policy, u, trust)
	} else {
		_, base = serve(t, policy, nil, func(o *Options) { o.Upstream = rawUpstream(t, handle) })
	}
	sent := 0
	for i := range 3 {
		for _, method := range []string{"GET", "POST", "PUT", "DELETE"} {
			req, _ := http.NewRequest(method, base+"/again", strings.NewReader(strings.Repeat("b", 100<<10)))
			if method == "GET" || method == "DELETE" {
				req.Body, req.ContentLength = nil, 0
			}
			resp, err := guarded.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			sent++
			if resp.StatusCode != 200 || string(body) != "ok" {
				t.Fatalf("round %d: %s on a closed idle connection answered %d %q", i, method, resp.StatusCode, body)
			}
			time.Sleep(20 * time.Millisecond) // the upstream's close reaches the proxy
		}
	}
	if n := seen.Load(); int(n) != sent {
		t.Fatalf("the upstream answered %d requests, want %d", n, sent)
	}
}

// A GET the upstream may have worked on is not sent again: neither one
// whose answer broke off inside its head, on a connection that had
// answered before, nor one whose new connection was reset with no answer.
// One whose used connection ended with no byte of an answer is.
// The proxy's own server sent both twice (its client took the wrapped
// io.EOF of a partial head, and a reset, for a pooled connection's stale
// close); net/http's transport sends them once.
func TestFailedGetIsNotSentTwice(t *testing.T) {
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	cases := []struct {
		name   string
		answer func(c net.Conn, nth int) bool // false: the connection ends
		codes  []int
		seen   int
	}{
		{"partial head on a used connection", func(c net.Conn, nth int) bool {
			if nth == 1 {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Le")
			return false
		}, []int{200, 502}, 2},
		{"reset of a new connection", func(c net.Conn, _ int) bool {
			c.(*net.TCPConn).SetLinger(0) // the close sends a reset
			return false
		}, []int{502}, 1},
		// The race of an idle close with the request going out, which the
		// look before a request cannot see: sent again (as net/http does).
		{"close with no answer on a used connection", func(c net.Conn, nth int) bool {
			if nth == 1 {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				return true
			}
			return false
		}, []int{200, 200}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var seen atomic.Int32
			u := rawUpstream(t, func(c net.Conn) {
				br := bufio.NewReader(c)
				for nth := 1; ; nth++ {
					if _, err := http.ReadRequest(br); err != nil {
						return
					}
					seen.Add(1)
					if !tc.answer(c, nth) {
						return
					}
				}
			})
			_, base := serve(t, policy, nil, func(o *Options) { o.Upstream = u })
			for i, want := range tc.codes {
				resp, err := guarded.Get(base + "/once")
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != want {
					t.Fatalf("request %d answered %d, want %d", i, resp.StatusCode, want)
				}
			}
			if n := seen.Load(); int(n) != tc.seen {
				t.Fatalf("the upstream saw %d requests, want %d", n, tc.seen)
			}
		})
	}
}

// When the upstream ends an upgraded connection, the proxy ends the
// client's too, and the slot is free, however silent the client is (both
// fronts used to wait for the client to send or close: ReverseProxy
// forwards the end as a half-close).
func TestUpgradeEndsWhenTheUpstreamCloses(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			io.WriteString(w, "ok")
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nbye")
		brw.Flush()
		c.Close()
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1}\n"
	_, base := serve(t, policy, up)
	c := dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second)) // a hang fails
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	got, err := io.ReadAll(br)
	if string(got) != "bye" || err != nil {
		t.Fatalf("the client read %q, %v; want bye, then the connection closed", got, err)
	}
	// The slot is given back as the upgrade's handler returns, which may
	// come just after the client saw the close (net/http's ReverseProxy
	// closes first).
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		resp, err = guarded.Get(base + "/after")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the request after the upgrade ended answered %d: its slot is still held", resp.StatusCode)
		}
	}
}

// A bound below 1 ms is refused (every request would answer 504), and one
// past the year 2262 saturates instead of wrapping into a deadline passed.
func TestUpstreamTimeoutExtremes(t *testing.T) {
	u, _ := url.Parse("http://127.0.0.1:1")
	_, err := New(Options{Upstream: u, UpstreamTimeout: time.Microsecond, ConfigData: []byte("version: 1\n"), AdminToken: "x"})
	if err == nil || !strings.Contains(err.Error(), "below 1ms") {
		t.Fatalf("New with a 1us upstream timeout: %v", err)
	}
	a, b := net.Pipe()
	defer b.Close()
	c := newUpConn(a, time.Duration(math.MaxInt64), nil).(*upConn)
	defer c.Close()
	if got := c.armed.Load(); got < time.Now().Add(100*365*24*time.Hour).UnixNano() {
		t.Fatalf("the bound of a huge timeout is at %v", time.Unix(0, got))
	}
	go b.Write([]byte("x"))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		t.Fatalf("a read under a huge timeout: %v", err)
	}
}

// An upstream that is not an http or https URL with a host is refused by
// New: an ftp:// one was served, the proxy's own server forwarding it as
// plain HTTP (200) and net/http's answering 502.
func TestUpstreamMustBeHTTP(t *testing.T) {
	for _, raw := range []string{"ftp://127.0.0.1:9000", "unix:///run/x.sock", "http://", "https://user:secret@127.0.0.1:1", "localhost:9000"} {
		u, _ := url.Parse(raw)
		_, err := New(Options{Upstream: u, ConfigData: []byte("version: 1\n"), AdminToken: "x"})
		if err == nil || !strings.Contains(err.Error(), "want an http or https URL") || strings.Contains(err.Error(), "secret") {
			t.Errorf("upstream %q: %v", raw, err)
		}
	}
}

// When the client half-closes an upgraded connection, what the upstream
// still sends reaches it: the proxy's own server used to close both sides
// at once and drop it.
func TestUpgradeAnswerAfterTheClientHalfCloses(t *testing.T) {
	tail := strings.Repeat("t", 200_000)
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		brw.Flush()
		got, _ := io.ReadAll(brw) // up to the client's half-close
		brw.WriteString(string(got) + tail)
		brw.Flush()
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 1}\n"
	_, base := serve(t, policy, up)
	c := dial(t, base)
	c.SetDeadline(time.Now().Add(60 * time.Second)) // a hang fails
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	io.WriteString(c, "last words")
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(br)
	if err != nil || string(got) != "last words"+tail {
		t.Fatalf("after its half-close the client read %d bytes (%v), want %d", len(got), err, len("last words"+tail))
	}
}

const stallPolicy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"

// stalledAfterFirst is a TLS upstream that answers one request on its
// first connection, closes it a moment later (an idle close), and never
// completes a handshake on any later connection.
func stalledAfterFirst(t *testing.T) (*url.URL, *tls.Config) {
	cfg, trust := testCert()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for first := true; ; first = false {
			raw, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, raw)
			mu.Unlock()
			if !first {
				continue // the handshake stalls
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c := tls.Server(raw, cfg)
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				time.Sleep(20 * time.Millisecond)
				raw.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	u, _ := url.Parse("https://" + ln.Addr().String())
	return u, trust
}

// A pooled connection the upstream spoiled is replaced within the
// deadline of the request that finds it so, not within the bound of the
// request that dialled it: with a stalled handshake, a request of 300 ms
// after one of 30 s waited the 30 s.
func TestReplacedConnectionKeepsTheRequestsDeadline(t *testing.T) {
	if netHTTPFront() {
		t.Skip("the proxy's own server's upstream client")
	}
	u, trust := stalledAfterFirst(t)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(stallPolicy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.host.Close)
	fs := s.newFast()
	fs.up.TLSConfig = trust
	t.Cleanup(func() { fs.Close() })
	do := func(d time.Duration) (time.Duration, error) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI(u.String() + "/x")
		start := time.Now()
		err := fs.up.DoDeadline(req, resp, start.Add(d))
		if err == nil {
			io.Copy(io.Discard, resp.BodyStream())
			resp.CloseBodyStream()
		}
		return time.Since(start), err
	}
	if _, err := do(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // the idle close arrives
	took, err := do(300 * time.Millisecond)
	if err == nil || took > 10*time.Second {
		t.Fatalf("a 300ms request on a spoiled connection, new handshakes stalled: %v after %v", err, took)
	}
}

// An upgrade to an https upstream whose handshake stalls answers (504, as
// a pooled request's stalled handshake) once the dial's bound (3 s) is out, with no upstream timeout and no request
// deadline to end it: it waited for ever, holding its slot, and held up
// the server's shutdown.
func TestUpgradeToAStalledHandshakeAnswers(t *testing.T) {
	if netHTTPFront() {
		t.Skip("the proxy's own server's upgrade (net/http's transport bounds the handshake itself)")
	}
	u, trust := stalledAfterFirst(t)
	c, err := net.Dial("tcp", u.Host) // take the one connection that would answer
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	time.Sleep(20 * time.Millisecond)
	_, base := serveTrusting(t, stallPolicy, u, trust, func(o *Options) { o.UpstreamTimeout = -1 })
	cl := dial(t, base)
	fmt.Fprintf(cl, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	cl.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(cl), nil)
	if err != nil || (resp.StatusCode != 502 && resp.StatusCode != 504) {
		t.Fatalf("an upgrade whose TLS handshake stalls: %v %v", resp, err)
	}
}

// A request whose upstream goes silent past UpstreamTimeout is answered
// 504 and sent once, on either front, also on a connection that answered
// before: net/http's transport took the idle bound's timeout on a reused
// connection for an upstream that had closed it, and sent a GET again on
// a new one (the upstream ran it twice, the client waited twice as long).
func TestSilentUpstreamGetsTheRequestOnce(t *testing.T) {
	var stalled atomic.Int32
	release := make(chan struct{})
	defer close(release)
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/stall" {
				stalled.Add(1)
				select {
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			io.WriteString(w, "ok")
		}), func(o *Options) { o.UpstreamTimeout = 300 * time.Millisecond })
	c := &http.Client{Transport: &http.Transport{}}
	defer c.CloseIdleConnections()
	for range 3 { // the upstream's connections answer first: the stall comes on a reused one
		resp, err := c.Get(base + "/ok")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	resp, err := c.Get(base + "/stall")
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("answered %d, want 504", resp.StatusCode)
	}
	if n := stalled.Load(); n != 1 {
		t.Errorf("the upstream got the request %d times, want once", n)
	}
}

// refusedStatus tells the answers the proxy refuses from their first
// bytes, before fasthttp pools the connection they came on.
func TestRefusedStatus(t *testing.T) {
	for s, want := range map[string]bool{
		"HTTP/1.1 200 OK\r\n": false, "HTTP/1.1 101 Switching Protocols\r\n": true, "HTTP/1.0 101 x": true,
		"HTTP/1.1 099 X\r\n": true, "HTTP/1.1 600 X\r\n": true, "HTTP/1.1 599 X": false, "HTTP/1.1 100 Continue": false,
		"HTTP/1.1 1": false, "HTTP/1.1 20x": false, "HTTP/2.0 101 x": false, "": false,
	} {
		if got := refusedStatus([]byte(s)); got != want {
			t.Errorf("%q: %v, want %v", s, got, want)
		}
	}
}
