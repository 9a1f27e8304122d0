package main

import (
	"go.uber.org/goleak"

	"bufio"
	"context"
	"errors"
	"github.com/sluice-go/sluice/internal/leakcheck"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	descpb "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlspb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/sluice-go/sluice/internal/redistest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestMain runs the command itself when asked to (the end-to-end tests
// start the test binary as `sluice serve` to signal it).
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_RUN_MAIN") == "1" {
		if n := os.Getenv("SLUICE_TEST_NOFILE"); n != "" {
			setNoFile(n)
		}
		main()
		os.Exit(0)
	}
	// `sluice proxy` and `sluice serve` start again in their own process to
	// keep the runtime's monitor awake (sysmon.Reexec), unless GODEBUG
	// names schedtrace. A test that runs them in this process (run) would
	// start the whole test binary again: every test before it ran twice,
	// and the first run's temporary directories were never removed.
	if !strings.Contains(os.Getenv("GODEBUG"), "schedtrace") {
		os.Setenv("GODEBUG", strings.TrimPrefix(os.Getenv("GODEBUG")+",schedtrace=0", ","))
	}
	goleak.VerifyTestMain(m, leakcheck.Ignore()...)
}

// child is `sluice serve` running in a process of its own.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	mu     sync.Mutex
	log    strings.Builder
	lines  chan string
	exited chan error
}

// startChild runs `sluice args...` and waits for the log line that
// contains marker.
func startChild(t *testing.T, args ...string) *child {
	t.Helper()
	c := &child{t: t, lines: make(chan string, 1024), exited: make(chan error, 1)}
	c.cmd = exec.Command(os.Args[0], args...)
	c.cmd.Env = append(os.Environ(), "SLUICE_TEST_RUN_MAIN=1")
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			c.mu.Lock()
			c.log.WriteString(sc.Text() + "\n")
			c.mu.Unlock()
			select {
			case c.lines <- sc.Text():
			default:
			}
		}
		c.exited <- c.cmd.Wait()
	}()
	t.Cleanup(func() {
		// Kill, not a read of ProcessState: Wait writes it in the
		// goroutine above. Killing a process that has exited is a
		// harmless error.
		_ = c.cmd.Process.Kill()
	})
	return c
}

// waitLine returns the first log line containing s (within 20 s).
func (c *child) waitLine(s string) string {
	c.t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case l := <-c.lines:
			if strings.Contains(l, s) {
				return l
			}
		case err := <-c.exited:
			c.t.Fatalf("sluice exited (%v) before logging %q:\n%s", err, s, c.logText())
		case <-deadline:
			c.t.Fatalf("no log line with %q in 20 s:\n%s", s, c.logText())
		}
	}
}

func (c *child) logText() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.log.String()
}

// stop sends SIGTERM and wants a clean exit.
func (c *child) stop() {
	c.t.Helper()
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exited:
		if err != nil {
			c.t.Errorf("sluice serve exited with %v on SIGTERM:\n%s", err, c.logText())
		}
	case <-time.After(20 * time.Second):
		c.t.Fatalf("sluice serve did not exit 20 s after SIGTERM:\n%s", c.logText())
	}
}

var logField = regexp.MustCompile(`(\w+)=(\S+)`)

// fields parses a log line's key=value pairs.
func fields(line string) map[string]string {
	m := map[string]string{}
	for _, kv := range logField.FindAllStringSubmatch(line, -1) {
		m[kv[1]] = kv[2]
	}
	return m
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// rename writes data to path through a new file renamed over it.
func rename(t *testing.T, path, data string) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

const rlsConfig = "domain: edge\ndescriptors:\n  - {key: tenant, rate_limit: {unit: day, requests_per_unit: 5}}\n"

// `sluice serve --config FOLDER` end to end, in a process of its own:
// ShouldRateLimit over gRPC and /json, the peer's headers, SIGHUP reloads
// (and refuses an invalid file, logging its line, the old configuration
// serving), SIGTERM stops it cleanly.
func TestServeRateLimitConfig(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yaml")
	rename(t, file, rlsConfig)
	c := startChild(t, "serve", "--config", dir, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--headers", "peer")
	f := fields(c.waitLine("sluice serve: rate limit service"))
	if f["store"] != "memory" || f["domains"] != "edge" {
		t.Errorf("log fields %v", f)
	}
	client := rlspb.NewRateLimitServiceClient(dial(t, f["grpc"]))
	call := func() *rlspb.RateLimitResponse {
		t.Helper()
		resp, err := client.ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*descpb.RateLimitDescriptor{{Entries: []*descpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := call()
	if st := resp.GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 5 || st.GetLimitRemaining() != 4 {
		t.Errorf("first call: %v", resp)
	}
	if hs := resp.GetResponseHeadersToAdd(); len(hs) != 3 || hs[0].GetKey() != "RateLimit-Limit" || hs[0].GetValue() != "5" {
		t.Errorf("headers: %v", hs)
	}
	hr, err := http.Post("http://"+f["http"]+"/json", "application/json",
		strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"tenant","value":"a"}]}],"hitsAddend":5}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(hr.Body)
	hr.Body.Close()
	if hr.StatusCode != http.StatusTooManyRequests || !strings.Contains(string(body), `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("/json: %d %s", hr.StatusCode, body)
	}
	if code, body := httpGet(t, "http://"+f["http"]+"/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("/healthcheck: %d %q", code, body)
	}
	if code, body := httpGet(t, "http://"+f["admin"]+"/metrics"); code != 200 || !strings.Contains(body, `sluice_rls_calls_total{result="over_limit"} 1`) {
		t.Errorf("/metrics: %d\n%s", code, body)
	}

	rename(t, file, strings.Replace(rlsConfig, "requests_per_unit: 5}", "requests_per_unit: 50}", 1))
	c.cmd.Process.Signal(syscall.SIGHUP)
	c.waitLine("configuration reloaded")
	st := call().GetStatuses()[0]
	rolled := st.GetDurationUntilReset().AsDuration() > resp.GetStatuses()[0].GetDurationUntilReset().AsDuration() // a new day began meanwhile
	if st.GetCurrentLimit().GetRequestsPerUnit() != 50 || (st.GetLimitRemaining() != 50-7 && !rolled) {
		t.Errorf("after SIGHUP: %v, want 50 with 43 left (the 7 hits counted so far kept)", st)
	}
	rename(t, file, "domain: edge\ndescriptors:\n  - {key: tenant, rate_limit: {unit: day}}\n")
	c.cmd.Process.Signal(syscall.SIGHUP)
	c.waitLine("reload refused")
	c.waitLine(file + ":3: descriptors[0].rate_limit.requests_per_unit")
	c.cmd.Process.Signal(syscall.SIGHUP) // the same file again: an answer all the same
	c.waitLine("SIGHUP: configuration reload refused, as before")
	if st := call().GetStatuses()[0]; st.GetCurrentLimit().GetRequestsPerUnit() != 50 {
		t.Errorf("after the invalid file: %v, want the old configuration", st)
	}
	c.stop()
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// `sluice serve --config POLICY` keeps the HTTP decision endpoints and
// answers Envoy ext_authz over gRPC with the same chain.
func TestServePolicyExtAuthzGRPC(t *testing.T) {
	c := startChild(t, "serve", "--config", "../../examples/nginx/policy.yaml", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "x")
	g := fields(c.waitLine("ext_authz gRPC"))["grpc"]
	h := fields(c.waitLine("sluice serve deciding"))["http"]
	client := authv3.NewAuthorizationClient(dial(t, g))
	check := func(headers map[string]string) *authv3.CheckResponse {
		t.Helper()
		resp, err := client.Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "/v1/routes/42", Headers: headers}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := check(map[string]string{"x-api-key": "t1"}); codes.Code(resp.GetStatus().GetCode()) != codes.OK || !hasHeader(resp.GetOkResponse().GetResponseHeadersToAdd(), "RateLimit") {
		t.Errorf("admitted check: %v", resp)
	}
	if resp := check(nil); codes.Code(resp.GetStatus().GetCode()) != codes.InvalidArgument || resp.GetDeniedResponse().GetStatus().GetCode() != 400 {
		t.Errorf("check without the required tenant: %v", resp)
	}
	req, _ := http.NewRequest("GET", "http://"+h+"/v1/decide", nil)
	req.Header.Set("X-Original-Method", "GET")
	req.Header.Set("X-Original-URI", "/v1/routes/42")
	req.Header.Set("X-Api-Key", "t1")
	hr, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	hr.Body.Close()
	if hr.StatusCode != 200 {
		t.Errorf("/v1/decide: %d", hr.StatusCode)
	}
	c.stop()
}

func hasHeader(hs []*corev3.HeaderValueOption, name string) bool {
	for _, h := range hs {
		if strings.EqualFold(h.GetHeader().GetKey(), name) {
			return true
		}
	}
	return false
}

// check validates rate limit configurations too (a file or a folder),
// and serve refuses flags of the other form.
func TestCheckAndFlagsForRateLimitConfigs(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yaml")
	rename(t, file, rlsConfig)
	for _, p := range []string{file, dir} {
		out, errOut, err := run("check", "--config", p)
		if err != nil || !strings.Contains(out, "domain edge: 1 rule(s)") || !strings.Contains(out, "edge.tenant: 5/DAY  ["+file+":3]") {
			t.Errorf("check %s: %v\n%s%s", p, err, out, errOut)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: edge\ndescriptors:\n  - {key: tenant, rate_limit: {unit: weekly, requests_per_unit: 5}}\n"), 0o644)
	_, errOut, err := run("check", "--config", bad)
	if err == nil || !strings.Contains(errOut, bad+":3: descriptors[0].rate_limit.unit") {
		t.Errorf("check of an invalid file: %v\n%s", err, errOut)
	}
	_, errOut, err = run("serve", "--config", bad, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0")
	if err == nil || !strings.Contains(errOut, bad+":3: descriptors[0].rate_limit.unit") {
		t.Errorf("serve of an invalid file: %v\n%s", err, errOut)
	}
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--config", file, "--admin-token", "x"}, "--admin-token does not apply to an envoyproxy/ratelimit configuration"},
		{[]string{"--config", file, "--on-failure", "maybe"}, `--on-failure "maybe": want error, open or closed`},
		{[]string{"--config", file, "--headers", "all"}, `--headers "all": want off, draft or peer`},
		{[]string{"--config", file, "--redis", ""}, "--redis is empty"},
		{[]string{"--config", file, "--redis", "127.0.0.1:99999", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, "want 1 to 65535"},
		{[]string{"--config", "../../examples/nginx/policy.yaml", "--redis", "127.0.0.1:1", "--shadow"}, "--redis, --shadow does not apply to a sluice policy"},
	} {
		_, errOut, err := run(append([]string{"serve"}, c.args...)...)
		if err == nil || !strings.Contains(errOut, c.msg) {
			t.Errorf("serve %v: %v\n%s", c.args, err, errOut)
		}
	}
}

// A second SIGTERM ends the process at once, cutting a drain short: the
// first starts the drain (a minute's --drain-delay here), and from then on
// the signal has its default action.
func TestSecondSignalCutsTheDrainShort(t *testing.T) {
	dir := t.TempDir()
	rename(t, filepath.Join(dir, "edge.yaml"), rlsConfig)
	for _, tc := range []struct {
		name, serving, draining string
		args                    []string
	}{
		{"envoyproxy/ratelimit configuration", "sluice serve: rate limit service", "draining: serving on",
			[]string{"--config", dir, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}},
		{"policy", "sluice serve", "sluice serve draining",
			[]string{"--config", "../../examples/nginx/policy.yaml", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startChild(t, append([]string{"serve", "--admin", "127.0.0.1:0", "--drain-delay", "1m"}, tc.args...)...)
			c.waitLine(tc.serving)
			c.cmd.Process.Signal(syscall.SIGTERM)
			c.waitLine(tc.draining)
			c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-c.exited:
				var ee *exec.ExitError
				if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
					t.Errorf("exit after the second SIGTERM: %v, want killed by it", err)
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("still running 20 s after the second SIGTERM:\n%s", c.logText())
			}
			// The generated admin token's file goes with the process (it
			// was left behind: one more file in /tmp per run).
			m := regexp.MustCompile(`admin token generated.* file=(\S+)`).FindStringSubmatch(c.logText())
			if m == nil {
				if tc.name == "policy" {
					t.Fatalf("no generated token logged:\n%s", c.logText())
				}
				return // the rate limit configuration's admin takes no token
			}
			if _, err := os.Stat(m[1]); !errors.Is(err, os.ErrNotExist) {
				os.Remove(m[1])
				t.Errorf("the token file %s outlived the second SIGTERM: %v", m[1], err)
			}
		})
	}
}

// `sluice serve --redis` for an envoyproxy/ratelimit configuration takes
// the peer's Redis credentials and TLS settings from its environment
// (REDIS_AUTH, REDIS_TLS, REDIS_TLS_CACERT): a managed Redis that wants a
// password, a user or TLS is reached, and one that wants a password the
// environment does not give fails the start, saying to set REDIS_AUTH.
func TestServeRateLimitConfigRedisAuthAndTLS(t *testing.T) {
	dir := t.TempDir()
	rename(t, filepath.Join(dir, "edge.yaml"), rlsConfig)
	decides := func(t *testing.T, addr string) {
		t.Helper()
		c := startChild(t, "serve", "--config", dir, "--redis", addr, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0")
		f := fields(c.waitLine("sluice serve: rate limit service"))
		resp, err := rlspb.NewRateLimitServiceClient(dial(t, f["grpc"])).ShouldRateLimit(context.Background(), &rlspb.RateLimitRequest{Domain: "edge",
			Descriptors: []*descpb.RateLimitDescriptor{{Entries: []*descpb.RateLimitDescriptor_Entry{{Key: "tenant", Value: "a"}}}}})
		if err != nil || resp.GetOverallCode() != rlspb.RateLimitResponse_OK || resp.GetStatuses()[0].GetLimitRemaining() != 4 {
			t.Fatalf("a call: %v %v", resp, err)
		}
		c.stop()
	}
	t.Run("password", func(t *testing.T) {
		srv := redistest.Start(t, "--requirepass", "s3cret")
		t.Setenv("REDIS_AUTH", "s3cret")
		decides(t, srv.Addr)
		t.Setenv("REDIS_AUTH", "")
		c := startChild(t, "serve", "--config", dir, "--redis", srv.Addr, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0")
		c.waitLine("set REDIS_AUTH")
	})
	t.Run("user", func(t *testing.T) {
		srv := redistest.Start(t, "--user", "rl", "on", ">pw", "~*", "&*", "+@all")
		t.Setenv("REDIS_AUTH", "rl:pw")
		decides(t, srv.Addr)
	})
	t.Run("tls", func(t *testing.T) {
		srv, _ := redistest.StartTLS(t)
		t.Setenv("REDIS_TLS", "true")
		t.Setenv("REDIS_TLS_CACERT", srv.CAFile)
		decides(t, srv.TLSAddr)
	})
}

// The environment's Redis settings, read as the peer reads them; the
// mistakes are errors naming the variable.
func TestRedisEnv(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}
	if u, p, c, err := redisEnv(env("REDIS_AUTH", "pw:with:colons")); u != "pw" || p != "with:colons" || c != nil || err != nil {
		t.Errorf("user:password: %q %q %v %v", u, p, c, err)
	}
	if u, p, _, err := redisEnv(env("REDIS_AUTH", "secret")); u != "" || p != "secret" || err != nil {
		t.Errorf("password: %q %q %v", u, p, err)
	}
	if _, _, c, err := redisEnv(env("REDIS_TLS", "1", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "False")); c == nil || err != nil {
		t.Errorf("TLS, hostname verified (False): %v %v", c, err)
	}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"REDIS_TLS", "yes please"}, "REDIS_TLS"},
		{[]string{"REDIS_TLS_CACERT", "ca.pem"}, "REDIS_TLS is not true"},
		{[]string{"REDIS_TLS", "true", "REDIS_TLS_CACERT", "/nonexistent/ca.pem"}, "REDIS_TLS_CACERT"},
		{[]string{"REDIS_TLS", "true", "REDIS_TLS_CLIENT_CERT", "c.pem"}, "give both"},
		{[]string{"REDIS_TLS", "true", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"}, "not supported"},
	} {
		if _, _, _, err := redisEnv(env(tc.env...)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.env, err, tc.want)
		}
	}
}

// `sluice serve --config POLICY` answers grpc.health.v1 on its gRPC
// listener: SERVING, and NOT_SERVING from the start of a drain.
func TestServePolicyGRPCHealth(t *testing.T) {
	c := startChild(t, "serve", "--config", "../../examples/nginx/policy.yaml", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "x", "--drain-delay", "1m")
	g := fields(c.waitLine("ext_authz gRPC"))["grpc"]
	h := fields(c.waitLine("sluice serve deciding"))["http"]
	hc := healthpb.NewHealthClient(dial(t, g))
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health while serving: %v %v", r, err)
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.waitLine("sluice serve draining")
	if r, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health while draining: %v %v", r, err)
	}
	// The HTTP listener's answers close their connections during the delay.
	resp, err := http.Get("http://" + h + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !resp.Close {
		t.Errorf("an answer during the drain delay keeps its connection: %v", resp.Header)
	}
	c.cmd.Process.Kill()
}

// A SIGHUP during a drain is ignored: it reloads nothing and does not end
// the process (its default action) while requests finish.
func TestHangupDuringTheDrainIsIgnored(t *testing.T) {
	dir := t.TempDir()
	rename(t, filepath.Join(dir, "edge.yaml"), rlsConfig)
	c := startChild(t, "serve", "--config", dir, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--drain-delay", "1s")
	c.waitLine("sluice serve: rate limit service")
	c.cmd.Process.Signal(syscall.SIGTERM)
	c.waitLine("draining: serving on")
	time.Sleep(100 * time.Millisecond) // the reload watcher has seen the end of its context
	c.cmd.Process.Signal(syscall.SIGHUP)
	select {
	case err := <-c.exited:
		if err != nil {
			t.Errorf("exit after a SIGHUP during the drain: %v, want a clean stop", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("did not stop:\n%s", c.logText())
	}
}
