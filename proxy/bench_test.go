package proxy

import (
	"net"

	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"
)

func benchGet(b *testing.B, target string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	req, _ := http.NewRequest("GET", target+"/v1/routes/42", nil)
	req.Header.Set("X-Api-Key", "tenant-42")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatal(resp.StatusCode)
		}
	}
}

func noopUpstream() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
}

// BenchmarkDirect: a request straight to a no-op upstream over loopback.
func BenchmarkDirect(b *testing.B) {
	up := noopUpstream()
	defer up.Close()
	benchGet(b, up.URL)
}

// BenchmarkThroughProxy: the same request through sluice proxy's Handler
// on net/http's server (admitted by a per-tenant token bucket and a
// service concurrency limit). The difference with BenchmarkDirect is the
// proxy's overhead.
func BenchmarkThroughProxy(b *testing.B) {
	s, done := benchProxy(b)
	defer done()
	px := httptest.NewServer(s.Handler())
	defer px.Close()
	benchGet(b, px.URL)
}

// BenchmarkThroughFastProxy: the same through the proxy's own server, as
// Run serves it.
func BenchmarkThroughFastProxy(b *testing.B) {
	s, done := benchProxy(b)
	defer done()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	fs := s.newFast()
	go fs.srv.Serve(ln)
	defer fs.srv.Shutdown()
	benchGet(b, "http://"+ln.Addr().String())
}

func benchProxy(b *testing.B) (*Server, func()) {
	up := noopUpstream()
	file := filepath.Join(b.TempDir(), "p.yaml")
	os.WriteFile(file, []byte(`version: 1
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1e9/s, burst: 1000000000}
  - {name: pool, kind: concurrency, scope: service, limit: 1000}
`), 0o644)
	u, _ := url.Parse(up.URL)
	s, err := New(Options{Config: file, Upstream: u, AdminToken: "x", ReloadEvery: -1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return s, func() { s.Close(); up.Close() }
}

// benchFast returns the proxy's own server's handler under policy,
// with an upstream that answers 200 "ok".
func benchFast(b *testing.B, policy string) (*fastServer, func()) {
	up := noopUpstream()
	u, _ := url.Parse(up.URL)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	return s.newFast(), func() { s.Close(); up.Close() }
}

// BenchmarkFastRejected: the proxy's own server's handler answering a
// request whose tenant is over its rate (no network: the request is
// parsed once, the handler runs on it).
func BenchmarkFastRejected(b *testing.B) {
	f, done := benchFast(b, `version: 1
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/s, burst: 1}
`)
	defer done()
	req, addr := benchRequest()
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Init(req, addr, nil)
		f.serve(&ctx)
	}
	if ctx.Response.StatusCode() != 429 {
		b.Fatal(ctx.Response.StatusCode())
	}
}

// BenchmarkFastAdmitted: the proxy's own server's handler forwarding an
// admitted request (a per-tenant token bucket and a service concurrency
// limit) to an upstream in memory (fasthttp answering "ok" over
// in-memory pipes), so that ns/op is the handler's work and the pipes',
// with no system call: the instrument for the admitted path's own cost,
// which loopback benchmarks bury under the kernel's.
func BenchmarkFastAdmitted(b *testing.B) {
	f, done := benchFast(b, `version: 1
identity: {tenant: {header: X-Api-Key}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1e9/s, burst: 1000000000}
  - {name: pool, kind: concurrency, scope: service, limit: 1000}
`)
	defer done()
	ln := fasthttputil.NewInmemoryListener()
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }}
	go up.Serve(ln)
	defer up.Shutdown()
	f.dial = func(string, time.Duration) (net.Conn, error) { return ln.Dial() }
	req, addr := benchRequest()
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Init(req, addr, nil)
		f.serve(&ctx)
		if ctx.Response.StatusCode() != 200 {
			b.Fatal(ctx.Response.StatusCode(), string(ctx.Response.Body()))
		}
	}
}

// BenchmarkFastBare is BenchmarkFastAdmitted's floor: the proxy's library
// alone as a bare proxy (a fasthttp.HostClient forwarding the request to
// the same upstream in memory, X-Forwarded-For set, nothing decided). The
// difference of the two is what sluice's admitted path adds.
func BenchmarkFastBare(b *testing.B) {
	ln := fasthttputil.NewInmemoryListener()
	up := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { ctx.SetBodyString("ok") }}
	go up.Serve(ln)
	defer up.Shutdown()
	hc := &fasthttp.HostClient{Addr: "upstream", Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	req, addr := benchRequest()
	var ctx fasthttp.RequestCtx
	b.ReportAllocs()
	for b.Loop() {
		ctx.Init(req, addr, nil)
		ctx.Request.Header.Set("X-Forwarded-For", ctx.RemoteIP().String())
		if err := hc.Do(&ctx.Request, &ctx.Response); err != nil || ctx.Response.StatusCode() != 200 {
			b.Fatal(err, ctx.Response.StatusCode())
		}
	}
}

// benchRequest is the handler benchmarks' request (a tenant's GET) and
// the address it comes from.
func benchRequest() (*fasthttp.Request, net.Addr) {
	req := new(fasthttp.Request)
	req.SetRequestURI("http://x/v1/routes/42")
	req.Header.Set("X-Api-Key", "tenant-42")
	return req, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000}
}
