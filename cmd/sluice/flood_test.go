//go:build unix

package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// sluice proxy with 256 file descriptors, flooded with 600 connections
// that send nothing: it stays up (before, EMFILE on accept made it exit
// within seconds), connections past its client budget (half the
// descriptors) are answered 503 and closed, the admin listener still
// answers, a prober is answered throughout (a refusal is fine while at the
// bound), and once the flood ends every probe is served.
func TestProxySurvivesADescriptorFlood(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer up.Close()
	pol := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(pol, []byte("version: 1\ngates:\n  - {name: pool, kind: concurrency, limit: 100}\n"), 0o644)
	t.Setenv("SLUICE_TEST_NOFILE", "256")
	c := startChild(t, "proxy", "--config", pol, "--upstream", up.URL, "--listen", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "x")
	if d := fields(c.waitLine("sluice proxy descriptors")); d["file_limit"] != "256" || d["max_client_conns"] != "128" {
		t.Fatalf("descriptors line %v: want file_limit=256 max_client_conns=128", d)
	}
	serving := fields(c.waitLine("sluice proxy serving"))
	addr, admin := serving["listen"], "http://"+serving["admin"]

	var flood []net.Conn
	refused := 0
	for range 600 {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			continue // the backlog is full: also a refusal
		}
		flood = append(flood, conn)
	}
	// The connections past the budget were answered 503 and closed.
	for _, conn := range flood {
		conn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if line, err := bufio.NewReader(conn).ReadString('\n'); err == nil && strings.Contains(line, " 503 ") {
			refused++
		}
	}
	if refused == 0 {
		t.Errorf("no connection of 600 was refused past a budget of 128")
	}
	probe := func(base string) int {
		client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		resp, err := client.Get(base)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := probe(admin + "/healthz"); code != 200 {
		t.Errorf("the admin listener answered %d during the flood", code)
	}
	if code := probe("http://" + addr + "/x"); code != 200 && code != 503 && code != 0 {
		t.Errorf("a probe during the flood: %d", code)
	}
	select {
	case err := <-c.exited:
		t.Fatalf("sluice proxy exited under the flood (%v):\n%s", err, c.logText())
	default:
	}
	for _, conn := range flood {
		conn.Close()
	}
	deadline := time.Now().Add(20 * time.Second)
	served := 0
	for served < 20 {
		if probe("http://"+addr+"/x") == 200 {
			served++
			continue
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the flood, %d of 20 probes served in 20 s:\n%s", served, c.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.stop()
}

// sluice serve with 256 file descriptors, its HTTP decision listener
// flooded with 600 connections that send nothing: it stays up (net/http's
// and gRPC's accept loops wait out EMFILE), and once the flood ends both
// its HTTP and gRPC listeners answer again.
func TestServeSurvivesADescriptorFlood(t *testing.T) {
	t.Setenv("SLUICE_TEST_NOFILE", "256")
	c := startChild(t, "serve", "--config", "../../examples/nginx/policy.yaml", "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--admin", "127.0.0.1:0", "--admin-token", "x")
	g := fields(c.waitLine("ext_authz gRPC"))["grpc"]
	h := fields(c.waitLine("sluice serve deciding"))["http"]
	var flood []net.Conn
	for range 600 {
		conn, err := net.DialTimeout("tcp", h, 2*time.Second)
		if err != nil {
			continue
		}
		flood = append(flood, conn)
	}
	time.Sleep(time.Second)
	select {
	case err := <-c.exited:
		t.Fatalf("sluice serve exited under the flood (%v):\n%s", err, c.logText())
	default:
	}
	for _, conn := range flood {
		conn.Close()
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := client.Get("http://" + h + "/") // any answer: the listener serves
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the HTTP listener does not answer 30 s after the flood: %v\n%s", err, c.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	hc := healthpb.NewHealthClient(dial(t, g))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("the gRPC listener after the flood: %v", err)
	}
	c.stop()
}
