package main

import (
	"bufio"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// --version and the version command print the same line, from the
// binary's build information.
func TestVersionFlag(t *testing.T) {
	flag, _, err := run("--version")
	if err != nil || !strings.HasPrefix(flag, "sluice ") || !strings.Contains(flag, "go1.") {
		t.Fatalf("%v %q", err, flag)
	}
	cmd, _, _ := run("version")
	if cmd != flag {
		t.Fatalf("sluice version %q, sluice --version %q", cmd, flag)
	}
}

func TestLogFlagsRefused(t *testing.T) {
	rls := filepath.Join(t.TempDir(), "edge.yaml")
	os.WriteFile(rls, []byte(rlsConfig), 0o644)
	for _, c := range []struct{ args []string }{
		{[]string{"--log-level", "loud", "check", "--config", "../../examples/routes-api.yaml"}},
		{[]string{"--log-level", "info+2", "check", "--config", "../../examples/routes-api.yaml"}},
		{[]string{"--log-format", "xml", "check", "--config", "../../examples/routes-api.yaml"}},
		{[]string{"proxy", "--config", "../../examples/routes-api.yaml", "--upstream", "http://127.0.0.1:1", "--access-log", "--access-log-rejects", "0"}},
		{[]string{"proxy", "--config", "../../examples/routes-api.yaml", "--upstream", "http://127.0.0.1:1", "--drain-grace", "0s"}},
		{[]string{"serve", "--config", rls, "--access-log"}},
		{[]string{"serve", "--config", rls, "--problem-details"}},
	} {
		if _, _, err := run(c.args...); err == nil {
			t.Errorf("%v accepted", c.args)
		}
	}
}

// jsonLines parses every line of a JSON log, failing on any that is not
// one object.
func jsonLines(t *testing.T, log string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("a log line is not JSON: %q", l)
		}
		out = append(out, m)
	}
	return out
}

// `sluice proxy --log-format json --access-log` in a process of its own:
// every line it writes is one JSON object; a generated admin token goes to
// a file only this user reads (removed when it exits) and never into the
// log; requests get access
// lines; /metrics has the build information; SIGTERM drains and exits.
func TestProxyLogsJSONAndNoSecrets(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	os.Unsetenv("SLUICE_ADMIN_TOKEN") // the child inherits the environment
	c := startChild(t, "proxy", "--config", "../../examples/routes-api.yaml", "--upstream", up.URL, "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--log-format", "json", "--access-log")
	tokenLine := c.waitLine("admin token generated")
	serving := c.waitLine("sluice proxy serving")
	var tok, srv map[string]any
	json.Unmarshal([]byte(tokenLine), &tok)
	json.Unmarshal([]byte(serving), &srv)
	file, _ := tok["file"].(string)
	st, err := os.Stat(file)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("token file %q: %v %v", file, st, err)
	}
	defer os.Remove(file)
	token, _ := os.ReadFile(file)
	fp, _ := tok["fingerprint"].(string)
	if len(strings.TrimSpace(string(token))) != 32 || fp == "" || strings.Contains(string(token), fp) {
		t.Fatalf("token %q, fingerprint %q", token, fp)
	}
	req, _ := http.NewRequest("GET", "http://"+srv["listen"].(string)+"/v1/routes/1?key=SECRET", nil)
	req.Header.Set("X-Api-Key", "tenant-secret-key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	access := c.waitLine(`"msg":"request"`)
	if !strings.Contains(access, `"decision":"admitted"`) || !strings.Contains(access, `"path":"/v1/routes/1"`) {
		t.Fatalf("access line %s", access)
	}
	if code, body := httpGet(t, "http://"+srv["admin"].(string)+"/metrics"); code != 200 || !strings.Contains(body, "sluice_build_info{") {
		t.Fatalf("/metrics %d", code)
	}
	if code, _ := httpGet(t, "http://"+srv["admin"].(string)+"/readyz"); code != 200 {
		t.Fatalf("/readyz %d", code)
	}
	c.stop()
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the generated token file outlived the process: %v", err) // restarts piled them up
	}
	log := c.logText()
	jsonLines(t, log)
	for _, secret := range []string{strings.TrimSpace(string(token)), "SECRET", "tenant-secret-key"} {
		if strings.Contains(log, secret) {
			t.Fatalf("%q logged:\n%s", secret, log)
		}
	}
	if !strings.Contains(log, "draining") {
		t.Fatalf("no drain logged:\n%s", log)
	}
}

// A SIGHUP while the proxy is still starting (building a policy whose
// Redis does not answer yet: systemctl reload right after start) is
// ignored; it ended the process (SIGHUP's default action) before the
// reload handler was installed.
func TestHangupDuringStartIsIgnored(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	// A Redis that takes connections and never answers: the start waits
	// for it (up to its timeouts) before serving.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var mu sync.Mutex
	var conns []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte("version: 1\nstore: {backend: redis, addrs: ["+ln.Addr().String()+"], timeout: 500ms}\n"+
		"gates:\n  - {name: r, kind: token_bucket, scope: service, rate: 10/s, burst: 10, on_failure: fail_open}\n"), 0o644)
	c := startChild(t, "proxy", "--config", pol, "--upstream", up.URL, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--admin-token", "x")
	for range 5 { // well after the process started, while it waits for Redis
		time.Sleep(100 * time.Millisecond)
		c.cmd.Process.Signal(syscall.SIGHUP)
	}
	c.waitLine("sluice proxy serving")
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-c.exited:
		if err != nil {
			t.Fatalf("exit %v:\n%s", err, c.logText())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("did not stop:\n%s", c.logText())
	}
}

// A log pipe whose reader goes away (the log shipper restarted, `| head`
// done) does not kill the process: sluice ignores SIGPIPE, so its log
// writes fail and it serves on (it died of SIGPIPE at its next log line,
// and left its admin token file behind).
func TestClosedLogPipeDoesNotKill(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	pol := filepath.Join(dir, "p.yaml")
	os.WriteFile(pol, []byte("version: 1\ngates:\n  - {name: r, kind: token_bucket, scope: service, rate: 100/s, burst: 100}\n"), 0o644)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "proxy", "--config", pol, "--upstream", up.URL, "--listen", "127.0.0.1:0")
	cmd.Env = append(os.Environ(), "SLUICE_TEST_RUN_MAIN=1")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(r)
	for sc.Scan() && !strings.Contains(sc.Text(), "sluice proxy serving") {
	}
	r.Close() // the reader goes away
	for range 3 {
		cmd.Process.Signal(syscall.SIGHUP) // each reload logs a line
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case err := <-exited:
		t.Fatalf("sluice proxy exited (%v) after its log pipe closed", err)
	default:
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("did not stop")
	}
}

// gRPC's warnings and errors are written at most grpcLinesPerSecond a
// second: a flood of bad calls cannot flood the log; the next line written
// counts what was left out.
func TestGRPCLogLinesAreLimited(t *testing.T) {
	var buf strings.Builder
	g := grpcLogger{log: slog.New(slog.NewTextHandler(&buf, nil)), lim: &lineLimiter{}}
	for i := range 1000 {
		g.Warningf("bad call %d", i)
	}
	if n := strings.Count(buf.String(), "\n"); n > grpcLinesPerSecond {
		t.Fatalf("%d lines of 1,000 warnings in a second, want at most %d", n, grpcLinesPerSecond)
	}
	g.lim.mu.Lock()
	g.lim.second-- // the next second
	g.lim.mu.Unlock()
	g.Errorf("later")
	if !strings.Contains(buf.String(), "suppressed=") {
		t.Fatalf("the next line does not count the suppressed ones:\n%s", buf.String())
	}
}
