package serve

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/leakcheck"
	"github.com/sluice-go/sluice/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, leakcheck.Ignore()...) }

const ratePolicy = `version: 1
service: test
identity:
  tenant: {header: X-Api-Key, required: true}
routes:
  - {match: {method: POST, path: /v1/routes}, class: critical, cost: {header: X-Stops, per: 100, min: 1, max: 50}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1/s, burst: 2}
`

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// get asks h about one original request in the nginx form (uri) or, when
// envoy is set, in the Envoy form.
func ask(t *testing.T, base, method, uri string, envoy bool, hdr map[string]string) *http.Response {
	t.Helper()
	var req *http.Request
	if envoy {
		req, _ = http.NewRequest(method, base+ExtAuthzPrefix+uri, nil)
	} else {
		req, _ = http.NewRequest("GET", base+DecidePath, nil)
		req.Header.Set("X-Original-Method", method)
		req.Header.Set("X-Original-URI", uri)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultTransport.RoundTrip(req) // no redirects followed
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

func TestServeDecides(t *testing.T) {
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(ratePolicy), AdminToken: "x", Logger: quiet(),
		Clock: fakeclock.New(1), Jitter: &sluice.Jitter{}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	acme := map[string]string{"X-Api-Key": "acme"}
	var got []string
	for _, c := range []struct {
		method, uri string
		envoy       bool
	}{{"GET", "/v1/routes/1", false}, {"GET", "//v1/./routes/../routes/2", true}, {"GET", "/v1/routes/3", false}, {"POST", "/v1/routes", true}} {
		resp := ask(t, srv.URL, c.method, c.uri, c.envoy, acme)
		got = append(got, resp.Status[:3]+" "+resp.Header.Get("Retry-After")+" "+resp.Header.Get("RateLimit"))
	}
	want := []string{`200  "request-rate";r=1;t=1`, `200  "request-rate";r=0;t=2`, `429 1 "request-rate";r=0;t=1`, `429 1 "request-rate";r=0;t=1`}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if resp := ask(t, srv.URL, "GET", "/v1/routes/1", false, nil); resp.StatusCode != 400 {
		t.Fatalf("no tenant: %d", resp.StatusCode)
	}
	resp, err := http.Get(srv.URL + "/elsewhere")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatal(resp.Status)
	}
}

// A policy with gates that hold slots or learn from completions is
// refused: where sluice only decides, they would protect nothing.
func TestServeRefusesInflightGates(t *testing.T) {
	_, err := New(Options{Config: "../examples/routes-api.yaml", AdminToken: "x", Logger: quiet()})
	var es policy.Errors
	if !errors.As(err, &es) || len(es) != 3 || !strings.Contains(err.Error(), "concurrent-requests (concurrency) holds a slot") || !strings.Contains(err.Error(), "in-time (deadline) predicts") {
		t.Fatalf("%v", err)
	}
	if _, err := New(Options{ConfigData: []byte(ratePolicy), Admin: "0.0.0.0:0", Logger: quiet()}); err == nil || !strings.Contains(err.Error(), "no admin token") {
		t.Fatalf("%v", err)
	}
}

// Run serves the decision endpoints and the admin API, reloads a replaced
// policy file, refuses one with a concurrency gate (the old policy keeps
// deciding), and stops when its context ends.
func TestServeRunReloadAndAdmin(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "p.yaml")
	os.WriteFile(file, []byte(ratePolicy), 0o644)
	ticks := make(chan time.Time)
	s, err := New(Options{Config: file, HTTP: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "secret", Ticks: ticks,
		Logger: quiet(), Clock: fakeclock.New(1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	httpAddr, adminAddr := s.Addrs()
	base, admin := "http://"+httpAddr.String(), "http://"+adminAddr.String()

	acme := map[string]string{"X-Api-Key": "acme"}
	if resp := ask(t, base, "GET", "/", false, acme); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	ticks <- time.Now() // the watcher has read the file it starts from
	// A concurrency gate is refused on reload.
	n := 0
	replace := func(policy string) {
		n++
		// The replaced file stays linked, so that no new file can reuse
		// its inode and look to the watcher like the same file.
		os.Link(file, filepath.Join(dir, "old-"+strconv.Itoa(n)))
		tmp := filepath.Join(dir, "new.yaml")
		os.WriteFile(tmp, []byte(policy), 0o644)
		if err := os.Rename(tmp, file); err != nil {
			t.Fatal(err)
		}
	}
	replace(ratePolicy + "  - {name: pool, kind: concurrency, limit: 5}\n")
	if changed, err := s.Reload(); changed || err == nil || !strings.Contains(err.Error(), "pool (concurrency)") {
		t.Fatalf("%v %v", changed, err)
	}
	// The watcher applies a replaced file once two checks read it.
	replace(strings.Replace(ratePolicy, "burst: 2", "burst: 7", 1))
	ticks <- time.Now()
	ticks <- time.Now()
	ticks <- time.Now() // the third tick is taken only after the second's reload
	resp := ask(t, base, "GET", "/", true, map[string]string{"X-Api-Key": "umbrella"})
	if rl := resp.Header.Get("RateLimit"); rl != `"request-rate";r=6;t=1` {
		t.Fatalf("after reload: %s %q", resp.Status, rl)
	}

	req, _ := http.NewRequest("GET", admin+"/v1/gates", nil)
	req.Header.Set("Authorization", "Bearer secret")
	ar, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var gates []struct{ Name, Mode string }
	json.NewDecoder(ar.Body).Decode(&gates)
	ar.Body.Close()
	if len(gates) != 1 || gates[0].Name != "request-rate" || gates[0].Mode != "enforce" {
		t.Fatalf("%+v", gates)
	}
	mr, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(mr.Body)
	mr.Body.Close()
	if !strings.Contains(string(body), `sluice_requests_admitted_total`) {
		t.Fatalf("metrics:\n%.2000s", body)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// The Envoy example sends its check requests where sluice serve answers
// them, with the headers the example policy reads.
func TestEnvoyExampleFitsServe(t *testing.T) {
	b, err := os.ReadFile("../examples/envoy/ext_authz.yaml")
	if err != nil {
		t.Fatal(err)
	}
	env := string(b)
	f, err := policy.Load("../examples/nginx/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rt, err := policy.Build(f, nil, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	rules := rt.Rules
	headers := []string{rules.TenantHeader, rules.DeadlineHeader, "X-Request-Id"}
	for _, r := range rules.Routes {
		if r.Cost.Header != "" {
			headers = append(headers, r.Cost.Header)
		}
	}
	for _, h := range headers {
		if !strings.Contains(env, "{exact: "+strings.ToLower(h)+", ignore_case: true}") {
			t.Errorf("the Envoy example does not send %s", h)
		}
	}
	for _, want := range []string{"path_prefix: " + ExtAuthzPrefix + "\n", "port_value: 8080", "uri: http://127.0.0.1:8080"} {
		if !strings.Contains(env, want) {
			t.Errorf("the Envoy example has no %q", want)
		}
	}
	s, err := New(Options{Config: "../examples/nginx/policy.yaml", AdminToken: "x", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

// OnPolicy sees every policy before it serves, the first and each reload,
// and its error refuses a reload like an invalid file.
func TestOnPolicy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(file, []byte(ratePolicy), 0o644)
	var chains []*sluice.Chain
	var refuse error
	s, err := New(Options{Config: file, AdminToken: "x", Logger: quiet(), OnPolicy: func(c *sluice.Chain, r identify.Rules) error {
		if refuse != nil {
			return refuse
		}
		if r.TenantHeader != "X-Api-Key" {
			t.Errorf("rules %+v", r)
		}
		chains = append(chains, c)
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(chains) != 1 || chains[0] != s.Chain() {
		t.Fatalf("after New: %d chains", len(chains))
	}
	os.WriteFile(file, []byte(strings.Replace(ratePolicy, "burst: 2", "burst: 3", 1)), 0o644)
	if changed, err := s.Reload(); !changed || err != nil || len(chains) != 2 || chains[1] != s.Chain() {
		t.Fatalf("reload: %v %v, %d chains", changed, err, len(chains))
	}
	refuse = errors.New("no")
	os.WriteFile(file, []byte(strings.Replace(ratePolicy, "burst: 2", "burst: 4", 1)), 0o644)
	if changed, err := s.Reload(); changed || !errors.Is(err, refuse) || chains[1] != s.Chain() {
		t.Fatalf("refused reload: %v %v", changed, err)
	}
}

// A client that pipelines checks and never reads the answers holds its
// connection only until an answer has waited answerWrite to be written:
// it held it, with its goroutine and buffers, for as long as it kept the
// socket open (past ReadTimeout and IdleTimeout).
func TestUnreadAnswersEndTheConnection(t *testing.T) {
	defer func(d time.Duration) { answerWrite = d }(answerWrite)
	answerWrite = 200 * time.Millisecond
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(ratePolicy), HTTP: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "x",
		Logger: quiet(), Clock: fakeclock.New(1)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	httpAddr, _ := s.Addrs()
	c, err := net.Dial("tcp", httpAddr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4096)
	const n = 20_000 // answers of ~300 bytes: far more than the sockets' buffers hold
	req := []byte("GET /v1/decide HTTP/1.1\r\nHost: x\r\nX-Api-Key: acme\r\nX-Original-Method: GET\r\nX-Original-URI: /a\r\n\r\n")
	var sent atomic.Int64
	go func() {
		for range n {
			if _, err := c.Write(req); err != nil {
				return
			}
			sent.Add(1)
		}
	}()
	// Nothing read: the server's answers fill the sockets' buffers, its
	// write waits, and it stops reading requests. Once the requests sent
	// stand still, the wait is under way (however busy the host); it
	// passes answerWrite.
	for last, still := int64(-1), 0; still < 5; time.Sleep(100 * time.Millisecond) {
		if n := sent.Load(); n == last {
			still++
		} else {
			last, still = n, 0
		}
	}
	time.Sleep(time.Second)
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	got, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the connection stayed open after %d bytes of answers", got)
	}
	if answers := got / 250; answers >= n {
		t.Fatalf("%d bytes read: every answer was written", got)
	}
}
