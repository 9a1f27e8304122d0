package proxy

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// frontEnv selects the server the proxy's tests run through: the proxy's
// own (Run's, by default) or, with "nethttp", net/http's around Handler.
// TestSuiteOverNetHTTP runs the whole suite again with the latter.
const frontEnv = "SLUICE_PROXY_TEST_FRONT"

func netHTTPFront() bool { return os.Getenv(frontEnv) == "nethttp" }

// serve runs a proxy with policy in front of the upstream handler up (nil:
// one that answers 200 with nothing) on loopback. It returns the proxy and
// its URL; everything closes when t ends. opts, if given, adjusts the
// options first.
func serve(t *testing.T, policy string, up http.Handler, opts ...func(*Options)) (*Server, string) {
	t.Helper()
	if up == nil {
		up = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	}
	upstream := httptest.NewServer(up)
	t.Cleanup(upstream.Close)
	u, _ := url.Parse(upstream.URL)
	o := Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, f := range opts {
		f(&o)
	}
	s, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.host.Close)
	return s, front(t, s)
}

// front serves s on loopback through the selected server and returns its
// URL; it closes when t ends.
func front(t *testing.T, s *Server) string {
	t.Helper()
	if netHTTPFront() || s.opts.Transport != nil || s.opts.NetHTTP {
		srv := httptest.NewUnstartedServer(s.Handler())
		s.boundHead(srv.Config)
		srv.Start()
		t.Cleanup(srv.Close)
		return srv.URL
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fs := s.newFast()
	done := make(chan struct{})
	go func() { fs.serveOn(ln); close(done) }()
	t.Cleanup(func() {
		fs.srv.Shutdown()
		<-done
	})
	return "http://" + ln.Addr().String()
}

// TestSuiteOverNetHTTP runs every other test of the package again, with
// the proxy served by net/http's server around Handler.
func TestSuiteOverNetHTTP(t *testing.T) {
	if netHTTPFront() {
		t.Skip("this is the run over net/http")
	}
	if testing.Short() {
		t.Skip("runs the suite again")
	}
	args := []string{"-test.run", "^Test", "-test.skip", "^TestSuiteOverNetHTTP$", "-test.count", "1"}
	if testing.Verbose() {
		args = append(args, "-test.v")
	}
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), frontEnv+"=nethttp")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the suite over net/http failed: %v\n%s", err, tail(string(out), 200))
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// echoUpgrade answers an upgrade with 101 and echoes what comes on the
// connection until it closes (an upstream's WebSocket, reduced).
func echoUpgrade(w http.ResponseWriter) {
	c, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	brw.Flush()
	io.Copy(c, brw)
}

// drip writes a byte to c every period until done closes or a write
// fails (a body sent as slowly as a client may), in a goroutine wg waits
// for.
func drip(c net.Conn, period time.Duration, done <-chan struct{}, wg *sync.WaitGroup) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := c.Write([]byte("a")); err != nil {
					return
				}
			}
		}
	}()
}
