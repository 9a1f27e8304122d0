package proxy

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/internal/poll"
)

// echoUpstream answers every request with what it received (request
// line, Host, the header fields sorted, the body) and with fields of its
// own, hop-by-hop ones among them, chosen by the request's path.
func echoUpstream() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s %s\nhost: %s\n", r.Method, r.RequestURI, r.Proto, r.Host)
		var keys []string
		for k := range r.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if k == "Content-Length" && r.Method == "OPTIONS" && r.Header.Get(k) == "0" {
				// fasthttp's client writes "Content-Length: 0" on a request
				// without a body whose method may have one; net/http's
				// writes none. Both mean no body (RFC 9110 section 8.6).
				continue
			}
			fmt.Fprintf(&b, "%s: %q\n", k, r.Header[k])
		}
		fmt.Fprintf(&b, "body %d: %x\n", len(body), sha256.Sum256(body))
		h := w.Header()
		h.Set("X-Upstream", "yes")
		h["Set-Cookie"] = []string{"a=1", "b=2"}
		switch r.URL.Path {
		case "/hop":
			h.Set("Connection", "X-Private")
			h.Set("X-Private", "secret")
			h.Set("Keep-Alive", "timeout=5")
			h.Set("Proxy-Authenticate", "Basic")
		case "/status/201":
			w.WriteHeader(201)
		case "/status/204":
			w.WriteHeader(204)
			return
		case "/status/304":
			w.WriteHeader(304)
			return
		case "/status/503":
			w.WriteHeader(503)
		case "/untyped": // a body with no Content-Type: none is added
			h["Content-Type"] = nil
			io.WriteString(w, "<html>not declared</html>")
			return
		case "/hangup": // no answer at all: the proxy answers 502 itself
			if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
				c.Close()
			}
			return
		case "/nolength":
			h.Set("Content-Type", "text/plain")
			w.(http.Flusher).Flush() // chunked, no Content-Length
		case "/big":
			h.Set("Content-Type", "application/octet-stream")
			w.Write([]byte(strings.Repeat("0123456789abcdef", 20000))) // 320 kB: past the small body
			return
		}
		io.WriteString(w, b.String())
	})
}

// parityPolicy admits everything but reads a tenant, a deadline and a
// cost header, so that the fields the rules read travel both ways.
const parityPolicy = `version: 1
identity:
  tenant: {header: X-Api-Key}
  deadline: {header: X-Request-Timeout, default: 5s}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 1e9/s, burst: 1000000000}
  - {name: pool, kind: concurrency, scope: service, limit: 1000}
`

type parityCase struct {
	name   string
	method string
	target string
	header map[string]string
	body   string
}

var parityCases = []parityCase{
	{name: "get", method: "GET", target: "/v1/items/42?x=1&y=%20z"},
	{name: "escaped path", method: "GET", target: "/a%2Fb/c%20d/%7Euser"},
	{name: "dot segments", method: "GET", target: "/a/../b/./c"},
	{name: "double slash", method: "GET", target: "//a//b"},
	{name: "hash in path", method: "GET", target: "/a#b/c?d=1"},
	{name: "absolute form", method: "GET", target: "http://other.example/abs/x?q=1"},
	{name: "head", method: "HEAD", target: "/v1/items"},
	{name: "post body", method: "POST", target: "/v1/items", body: `{"a":1}`, header: map[string]string{"Content-Type": "application/json"}},
	{name: "put empty body", method: "PUT", target: "/v1/items/1", header: map[string]string{"Content-Length": "0"}},
	{name: "large body", method: "POST", target: "/upload", body: strings.Repeat("x", 200<<10)},
	{name: "hop by hop request", method: "GET", target: "/x", header: map[string]string{
		"Connection": "X-Secret", "X-Secret": "1", "Keep-Alive": "300", "Proxy-Authorization": "Basic eA==", "Te": "trailers", "Upgrade-Insecure-Requests": "1"}},
	{name: "forwarded fields", method: "GET", target: "/x", header: map[string]string{
		"X-Forwarded-For": "1.2.3.4", "X-Forwarded-Host": "evil", "X-Forwarded-Proto": "https", "Forwarded": "for=1.2.3.4"}},
	{name: "hop by hop response", method: "GET", target: "/hop"},
	{name: "201", method: "GET", target: "/status/201"},
	{name: "204", method: "GET", target: "/status/204"},
	{name: "304", method: "GET", target: "/status/304"},
	{name: "upstream 503", method: "GET", target: "/status/503"},
	// the proxy's own 502 to an admitted request, with its RateLimit fields
	{name: "upstream hangs up", method: "POST", target: "/hangup", body: "x"},
	{name: "no content type", method: "GET", target: "/untyped"},
	{name: "chunked response", method: "GET", target: "/nolength"},
	{name: "big response", method: "GET", target: "/big"},
	{name: "tenant and deadline", method: "GET", target: "/t", header: map[string]string{"X-Api-Key": "tenant-1", "X-Request-Timeout": "2s", "X-Request-Id": "abc-1"}},
	{name: "malformed deadline", method: "GET", target: "/t", header: map[string]string{"X-Request-Timeout": "soon", "X-Request-Id": "abc-2"}},
	{name: "user agent", method: "GET", target: "/ua", header: map[string]string{"User-Agent": "probe/1"}},
	{name: "no user agent", method: "GET", target: "/ua", header: map[string]string{"User-Agent": ""}},
	{name: "options", method: "OPTIONS", target: "/x"},
	{name: "connect", method: "CONNECT", target: "example.com:443"},
}

// exchange sends c to the proxy at addr on a connection of its own, as
// raw HTTP/1.1, and returns the answer in a comparable form: status, the
// fields both servers must agree on, and the body, with what differs by
// nature (dates, ports, generated ids) masked.
func exchange(t *testing.T, addr string, c parityCase) string {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: front.example\r\n", c.method, c.target)
	ua := "parity"
	for k, v := range c.header {
		if k == "User-Agent" {
			ua = v
			continue
		}
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	if ua != "" {
		fmt.Fprintf(&b, "User-Agent: %s\r\n", ua)
	}
	if c.body != "" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", len(c.body))
	}
	b.WriteString("\r\n")
	b.WriteString(c.body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(c.method, "http://x"+c.target, nil)
	if c.method == "CONNECT" {
		req = &http.Request{Method: "CONNECT"}
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		t.Fatalf("%s: %v", c.name, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var out strings.Builder
	fmt.Fprintf(&out, "status %d\n", resp.StatusCode)
	var keys []string
	for k := range resp.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch k {
		case "Date":
			continue
		case "X-Request-Id":
			if v := resp.Header.Get(k); strings.HasPrefix(v, "abc-") {
				fmt.Fprintf(&out, "%s: %s\n", k, v)
			} else {
				fmt.Fprintf(&out, "%s: (generated)\n", k)
			}
			continue
		}
		fmt.Fprintf(&out, "%s: %q\n", k, resp.Header[k])
	}
	s := string(body)
	if len(s) > 4096 {
		s = fmt.Sprintf("%d bytes %x", len(s), sha256.Sum256(body))
	}
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "X-Forwarded-Host") || strings.HasPrefix(l, "host: ") {
			continue // compared below, without the port
		}
		if strings.Contains(l, `"request_id"`) {
			l = maskID(l)
		}
		out.WriteString(l + "\n")
	}
	return out.String()
}

func maskID(l string) string {
	i := strings.Index(l, `"request_id":"`)
	if i < 0 {
		return l
	}
	j := strings.IndexByte(l[i+14:], '"')
	return l[:i+14] + "(id)" + l[i+14+j:]
}

// TestFastServerAnswersAsNetHTTP sends the same requests through the
// proxy's own server and through net/http's around Handler, in front of
// one upstream that echoes what it gets: both must forward the same
// request (method, target, Host, fields, body) and answer the same
// status, fields and body; to an http upstream and to an https one.
func TestFastServerAnswersAsNetHTTP(t *testing.T) {
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[secure], func(t *testing.T) { answersAsNetHTTP(t, secure) })
	}
}

func answersAsNetHTTP(t *testing.T, secure bool) {
	up := httptest.NewUnstartedServer(echoUpstream())
	var trust *tls.Config
	if secure {
		up.StartTLS()
		trust = up.Client().Transport.(*http.Transport).TLSClientConfig
	} else {
		up.Start()
	}
	defer up.Close()
	u, _ := url.Parse(up.URL)
	newServer := func(tr http.RoundTripper) *Server {
		s, err := New(Options{Config: "p.yaml", ConfigData: []byte(parityPolicy), Upstream: u, AdminToken: "x",
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Transport: tr})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		return s
	}
	var tr http.RoundTripper
	if secure {
		tr = &http.Transport{TLSClientConfig: trust, DisableCompression: true}
	}
	std := httptest.NewServer(newServer(tr).Handler())
	defer std.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := newServer(nil).newFast()
	fs.up.TLSConfig = trust
	done := make(chan struct{})
	go func() { fs.srv.Serve(ln); close(done) }()
	defer func() { fs.srv.Shutdown(); <-done }()
	for _, c := range parityCases {
		want := timeLeft(t, exchange(t, std.Listener.Addr().String(), c))
		got := timeLeft(t, exchange(t, ln.Addr().String(), c))
		if got != want {
			t.Errorf("%s: the proxy's own server answers\n%s\nnet/http answers\n%s", c.name, got, want)
		}
	}
}

// leftField is the deadline header the proxy sets on the upstream request:
// the time left, which differs by the time each server took.
var leftField = regexp.MustCompile(`X-Request-Timeout: \["([0-9]+)ms"\]`)

// timeLeft replaces the time left in an exchange's forwarded request by
// "(left)", after checking that it is within the policy's default budget.
func timeLeft(t *testing.T, ex string) string {
	t.Helper()
	return leftField.ReplaceAllStringFunc(ex, func(m string) string {
		ms, _ := strconv.Atoi(leftField.FindStringSubmatch(m)[1])
		if ms < 1 || ms > 30_000 {
			t.Errorf("time left %d ms forwarded", ms)
		}
		return `X-Request-Timeout: ["(left)"]`
	})
}

// An upgrade (WebSocket's handshake) is forwarded, and on the upstream's
// 101 the two connections are joined both ways; the slot is held while
// they are, and given back when the client closes. An https upstream gets
// the upgrade over TLS (it used to be dialled in plain TCP).
func TestUpgradeJoinsConnections(t *testing.T) {
	up := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "want Upgrade: echo", 400)
			return
		}
		echoUpgrade(w) // until the client closes
	})
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "http", true: "https"}[secure], func(t *testing.T) {
			var s *Server
			var base string
			if secure {
				s, base = serveTLS(t, policy, up)
			} else {
				s, base = serve(t, policy, up)
			}
			c := dial(t, base)
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode != 101 || resp.Header.Get("Upgrade") != "echo" {
				t.Fatalf("answer %d %v, want 101 with Upgrade: echo", resp.StatusCode, resp.Header)
			}
			for _, msg := range []string{"hello", "world"} {
				io.WriteString(c, msg)
				got := make([]byte, len(msg))
				if _, err := io.ReadFull(br, got); err != nil || string(got) != msg {
					t.Fatalf("echo of %q: %q, %v", msg, got, err)
				}
			}
			inflight := func() int64 {
				d, tk := s.Chain().Decide(context.Background(), &sluice.Request{})
				tk.Done(sluice.OutcomeUseful)
				return 9 - d.Remaining
			}
			if n := inflight(); n != 1 {
				t.Fatalf("%d requests in flight during the upgrade, want 1", n)
			}
			c.Close()
			poll.Until(t, 10*time.Second, func() bool { return inflight() == 0 })
		})
	}
}

// Requests reach an https upstream: path, query, body and the upstream's
// Host, on connections kept alive (one TLS handshake for a run of requests
// one at a time). The proxy's own server answered every one 502: its
// upstream client took the request for plain HTTP (the scheme of the
// connection it came on) and refused it as a redirect to another scheme.
func TestRequestsReachAnHTTPSUpstream(t *testing.T) {
	var conns atomic.Int32
	upstream := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s %d %s", r.Method, r.URL.RequestURI(), r.Host, len(body), r.Header.Get("X-Forwarded-Proto"))
	}))
	upstream.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	upstream.StartTLS()
	t.Cleanup(upstream.Close)
	u, _ := url.Parse(upstream.URL + "/base?k=v")
	const policy = "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"
	_, base := serveTrusting(t, policy, u, upstream.Client().Transport.(*http.Transport).TLSClientConfig)
	for i := range 5 {
		resp, err := guarded.Post(base+"/p?q=1", "text/plain", strings.NewReader(strings.Repeat("b", 1000*i)))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf("POST /base/p?k=v&q=1 %s %d http", u.Host, 1000*i)
		if resp.StatusCode != 200 || string(got) != want {
			t.Fatalf("request %d answered %d %q, want 200 %q", i, resp.StatusCode, got, want)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("%d connections to the upstream for 5 requests one at a time, want 1", n)
	}
}

// serveTLS is serve with an https upstream whose certificate the proxy
// trusts: through the transport on net/http's front, through the
// upstream client's TLS configuration on the proxy's own.
func serveTLS(t *testing.T, policy string, up http.Handler) (*Server, string) {
	t.Helper()
	upstream := httptest.NewTLSServer(up)
	t.Cleanup(upstream.Close)
	u, _ := url.Parse(upstream.URL)
	return serveTrusting(t, policy, u, upstream.Client().Transport.(*http.Transport).TLSClientConfig)
}

// serveTrusting serves the proxy in front of the https upstream u, whose
// certificate trust verifies.
func serveTrusting(t *testing.T, policy string, u *url.URL, trust *tls.Config, opts ...func(*Options)) (*Server, string) {
	t.Helper()
	o := Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	if netHTTPFront() {
		o.Transport = &http.Transport{TLSClientConfig: trust, DisableCompression: true}
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.host.Close)
	if netHTTPFront() {
		return s, front(t, s)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := s.newFast()
	fs.up.TLSConfig = trust
	done := make(chan struct{})
	go func() { fs.serveOn(ln); close(done) }()
	t.Cleanup(func() {
		fs.srv.Shutdown()
		<-done
	})
	return s, "http://" + ln.Addr().String()
}

// A body past MaxBodyBytes, with a length or chunked, is answered 413 in
// the envelope and never forwarded (a chunked one used to stream through:
// its last chunk hit the spool's cap, which was taken for a spent
// budget); the proxy's own server answers a request head past its read
// buffer 431. A problem details body gives the same status as the status
// line (it said 400 under a 431, and bodies too large were 400).
func TestOversizedRequestsAreRefused(t *testing.T) {
	for _, problem := range []bool{false, true} {
		forwarded := make(chan struct{}, 10)
		_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n",
			http.HandlerFunc(func(http.ResponseWriter, *http.Request) { forwarded <- struct{}{} }),
			func(o *Options) { o.MaxBodyBytes, o.ProblemDetails = 1<<10, problem })
		for _, c := range []struct {
			req    string
			status int
		}{
			{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n" + strings.Repeat("b", 2048), 413},
			{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + strings.Repeat("c", 2048) + "\r\n0\r\n\r\n", 413},
			{"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("a", 20<<10) + "\r\n\r\n", 431},
		} {
			if c.status == 431 && netHTTPFront() {
				continue // net/http takes heads up to 1 MiB
			}
			conn := dial(t, base)
			io.WriteString(conn, c.req)
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			want := `"reason":"invalid"`
			if problem {
				want = `"status":` + strconv.Itoa(c.status)
			}
			if resp.StatusCode != c.status || !strings.Contains(string(body), want) {
				t.Errorf("problem details %v, %.40q: %d %s, want %d with %s", problem, c.req, resp.StatusCode, body, c.status, want)
			}
		}
		select {
		case <-forwarded:
			t.Error("an oversized request reached the upstream")
		default:
		}
	}
}

// The access log shows the path the client asked for, also when the
// upstream's URL has a path of its own (the proxy's own server rewrites
// the request target in the buffer the path was read from).
func TestAccessLogShowsTheClientsPath(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/base/v1/items/42" {
			http.Error(w, "path "+r.URL.Path, 404)
		}
	}))
	defer up.Close()
	u, _ := url.Parse(up.URL + "/base")
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte("version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n"),
		Upstream: u, AdminToken: "x", Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		AccessLog: &httpgate.AccessLog{Logger: log}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	base := front(t, s)
	for range 3 { // on one keep-alive connection: its buffers are reused
		resp, err := http.Get(base + "/v1/items/42")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
	}
	poll.Until(t, 5*time.Second, func() bool { return strings.Count(buf.String(), `"decision":"admitted"`) == 3 })
	if n := strings.Count(buf.String(), `"path":"/v1/items/42"`); n != 3 {
		t.Fatalf("access log lines %s: %d with the client's path /v1/items/42, want 3", buf.String(), n)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCoarseConnIsReadAndWrittenConcurrently: a hijacked connection (an
// upgrade) is read by one goroutine and written by another; the yield
// between a write and the next read keeps every byte, in order, and is
// free of races (run with -race).
func TestCoarseConnIsReadAndWrittenConcurrently(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := ln.Accept()
		ch <- accepted{c, err}
	}()
	peer, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer peer.Close()
	a := <-ch
	if a.err != nil {
		t.Fatal(a.err)
	}
	cc := &coarseConn{Conn: a.c}
	defer cc.Close()

	const n = 1 << 20
	out := make([]byte, n)
	for i := range out {
		out[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { // the proxy's side writes...
		defer wg.Done()
		if _, err := cc.Write(out); err != nil {
			t.Error(err)
		}
	}()
	var got []byte
	go func() { // ...and reads what the peer echoes
		defer wg.Done()
		b, err := io.ReadAll(io.LimitReader(cc, n))
		if err != nil {
			t.Error(err)
		}
		got = b
	}()
	go func() { // the peer echoes every byte back
		defer wg.Done()
		if _, err := io.CopyN(peer, peer, n); err != nil {
			t.Error(err)
		}
	}()
	wg.Wait()
	if !slices.Equal(got, out) {
		t.Fatalf("read %d bytes back, not the %d written", len(got), n)
	}
}

// The yield backs off while it returns at once and the reads after it
// wait, 1, 3, 7 … 63 answers without one; a read that finds its request
// at once, or a yield that ran other goroutines, ends the skipping.
func TestCoarseConnYieldBacksOffWhileItDoesNotPay(t *testing.T) {
	c := &yielder{}
	for _, want := range []int{1, 3, 7, 15, 31, 63, 63} {
		c.yielded(time.Microsecond, time.Millisecond)
		if c.skip != want || c.backoff != want {
			t.Fatalf("after a read that waited: skip %d, backoff %d, want %d", c.skip, c.backoff, want)
		}
	}
	c.yielded(time.Microsecond, yieldPaid)
	if c.backoff != 0 {
		t.Fatalf("a read that paid left backoff %d", c.backoff)
	}
	c.yielded(time.Microsecond, time.Millisecond)
	c.yielded(yieldPaid, time.Millisecond)
	if c.backoff != 0 {
		t.Fatalf("a yield that ran others left backoff %d", c.backoff)
	}
}

// Read yields, or skips its yield, as the backoff says, on both legs: the
// client's connection before its next request, the upstream's before its
// answer. On a clock where every yield returns at once and every read
// after one waits, the reads go yield (skip 1), skip, yield (skip 3),
// skip, skip, skip, yield. A read that follows a read does not yield.
func TestConnsSkipYieldsAsTheBackoffSays(t *testing.T) {
	for _, leg := range []string{"client", "upstream"} {
		t.Run(leg, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			var calls int
			var at clock.Instant
			tick := func() clock.Instant {
				// A yielded read asks the time three times: before the
				// yield, after it (1 µs later) and after the read (1 ms
				// later).
				calls++
				switch calls % 3 {
				case 2:
					at += clock.Instant(time.Microsecond)
				case 0:
					at += clock.Instant(time.Millisecond)
				}
				return at
			}
			var c net.Conn
			var y *yielder
			if leg == "client" {
				cc := &coarseConn{Conn: a, y: yielder{clock: tick}}
				c, y = cc, &cc.y
			} else {
				pc := newPooledConn(nil, "upstream", &upConn{Conn: a}, a)
				pc.y.clock = tick
				c, y = pc, &pc.y
			}
			done := make(chan struct{})
			go func() { // the peer: reads each message and sends two bytes back
				defer close(done)
				buf := make([]byte, 1)
				for {
					if _, err := b.Read(buf); err != nil {
						return
					}
					if _, err := b.Write([]byte("rr")); err != nil {
						return
					}
				}
			}()
			buf := make([]byte, 1)
			var skips []int
			var yields int
			for range 7 {
				if _, err := c.Write([]byte("a")); err != nil {
					t.Fatal(err)
				}
				before := calls
				if _, err := c.Read(buf); err != nil {
					t.Fatal(err)
				}
				if calls > before {
					yields++
				}
				skips = append(skips, y.skip)
				before = calls
				if _, err := c.Read(buf); err != nil { // the second byte: no yield
					t.Fatal(err)
				}
				if calls > before {
					t.Fatal("a read after a read yielded")
				}
			}
			a.Close()
			<-done
			if want := []int{1, 0, 3, 2, 1, 0, 7}; !slices.Equal(skips, want) || yields != 3 {
				t.Fatalf("skips after each read %v and %d yields, want %v and 3", skips, yields, want)
			}
		})
	}
}

// appendClientIP gives what net.SplitHostPort of the address's String
// gives, for every kind of address a listener hands out, and nothing for
// one without an IP.
func TestAppendClientIP(t *testing.T) {
	for _, a := range []net.Addr{
		&net.TCPAddr{IP: net.IPv4(192, 0, 2, 7), Port: 80}, // 16-byte form, as the kernel's
		&net.TCPAddr{IP: net.IP{192, 0, 2, 7}.To4(), Port: 80},
		&net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 443},
		&net.TCPAddr{IP: net.ParseIP("fe80::1"), Port: 443, Zone: "eth0"},
		&net.UDPAddr{IP: net.ParseIP("2001:db8::2"), Port: 53},
	} {
		want, _, err := net.SplitHostPort(a.String())
		if err != nil {
			t.Fatal(err)
		}
		if got := string(appendClientIP(nil, a)); got != want {
			t.Errorf("%v: %q, want %q", a, got, want)
		}
	}
	for _, a := range []net.Addr{nil, &net.TCPAddr{}, &net.UnixAddr{Name: "/s", Net: "unix"}} {
		if got := appendClientIP(nil, a); len(got) != 0 {
			t.Errorf("%v: %q, want nothing", a, got)
		}
	}
}

// An HTTP/1.0 upstream's answers go out in the proxy's own version, on a
// connection kept alive: its "HTTP/1.0" reached the client, which then
// closed every connection after one answer (python's http.server is such
// an upstream).
func TestHTTP10UpstreamAnsweredAsHTTP11(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					l, err := br.ReadString('\n')
					if err != nil || l == "\r\n" {
						break
					}
				}
				io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
			}()
		}
	}()
	u, _ := url.Parse("http://" + ln.Addr().String())
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 10}\n", nil,
		func(o *Options) { o.Upstream = u })
	conn := dial(t, base)
	br := bufio.NewReader(conn)
	for i := range 2 {
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("answer %d on one connection: %v", i+1, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.Proto != "HTTP/1.1" || resp.Close || string(body) != "ok" {
			t.Fatalf("answer %d: %s close %v %q", i+1, resp.Proto, resp.Close, body)
		}
	}
}

// A connection that sends no whole request head within ReadTimeout (idle,
// or a head that stalls) is answered 408 and closed, as net/http answers
// it, and is not counted as an invalid request: it used to get an
// unsolicited 400 "malformed request" in the envelope.
func TestIdleConnectionGets408(t *testing.T) {
	if netHTTPFront() {
		t.Skip("the fast front's")
	}
	s, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 4}\n", nil,
		func(o *Options) { o.ReadTimeout = 300 * time.Millisecond })
	for _, sent := range []string{"", "GET /x HT"} {
		c := dial(t, base)
		io.WriteString(c, sent)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		if !strings.HasPrefix(string(b), "HTTP/1.1 408") {
			t.Errorf("after %q: %q, want a 408", sent, b)
		}
	}
	rec := httptest.NewRecorder()
	s.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if strings.Contains(rec.Body.String(), `reason="invalid"`) {
		t.Errorf("an idle connection counted as invalid:\n%s", grepLines(rec.Body.String(), "invalid"))
	}
}

// The fast front is as strict about the request line and header names as
// net/http's server: a version other than HTTP/1.x is answered 505, a
// header name with a space or another byte outside a token 400, and
// neither is forwarded.
func TestStrictRequestLineAndHeaderNames(t *testing.T) {
	forwarded := make(chan string, 10)
	_, base := serve(t, "version: 1\ngates:\n  - {name: pool, kind: concurrency, scope: service, limit: 4}\n",
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { forwarded <- r.URL.Path }))
	for _, c := range []struct{ req, want string }{
		{"GET /a HTTP/2.0\r\nHost: x\r\n\r\n", "HTTP/1.1 505"},
		{"GET /b HTTP/3.1\r\nHost: x\r\n\r\n", "HTTP/1.1 505"},
		{"GET /c HTTP/1.1\r\nHost: x\r\nFoo Bar: 1\r\n\r\n", "HTTP/1.1 400"},
		{"GET /d HTTP/1.1\r\nHost: x\r\nFoo\x01: 1\r\n\r\n", "HTTP/1.1 400"},
		{"GET /ok HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", "HTTP/1.1 200"},
	} {
		conn := dial(t, base)
		io.WriteString(conn, c.req)
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(conn)
		if !strings.HasPrefix(string(b), c.want) {
			t.Errorf("%q: %q, want %s", c.req, b, c.want)
		}
		// net/http's server answers these itself before the proxy's
		// handler; the fast front's must be the proxy's own answer.
		own := netHTTPFront() || strings.Contains(string(b), `"reason":"invalid"`) || strings.Contains(string(b), "sluice proxy:")
		if c.want != "HTTP/1.1 200" && (!strings.Contains(string(b), "Connection: close") || !own) {
			t.Errorf("%q: %q, want the proxy's own answer, the connection closed (the upstream's answer: forwarded)", c.req, b)
		}
	}
	close(forwarded)
	var got []string
	for p := range forwarded {
		got = append(got, p)
	}
	if len(got) != 1 || got[0] != "/ok" {
		t.Errorf("forwarded %v, want only /ok", got)
	}
}
