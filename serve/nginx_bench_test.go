package serve

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/proxy"
)

// benchPolicy admits everything: a token bucket per tenant far above what
// loopback can offer, so every request goes the whole way.
const benchPolicy = `version: 1
service: bench
identity: {tenant: {header: X-Api-Key, required: true}}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 1e9/s, burst: 1000000000}
`

// nginxAlone is nginx in front of the application with nothing else: the
// baseline.
const nginxAlone = `upstream app {
    server 127.0.0.1:9000;
    keepalive 64;
}
server {
    listen 127.0.0.1:8000;
    location / {
        proxy_pass http://app;
        proxy_http_version 1.1;
        proxy_set_header Connection "";
    }
}
`

// TestNginxThroughput measures, on loopback, the throughput of one no-op
// application behind nginx alone, behind nginx with auth_request to sluice
// serve (examples/nginx/sluice.conf), and behind sluice proxy, every
// request admitted, with wrk as a closed-loop generator. Rounds interleave
// the three so that drifts of a shared machine hit them alike; it prints
// the median of each. It runs only with SLUICE_BENCH_NGINX=1 (make
// bench-nginx; BENCHMARKS.md has the figures); SLUICE_BENCH_ROUNDS (5),
// SLUICE_BENCH_SECONDS (5) and SLUICE_BENCH_CONNECTIONS (32) change the
// run.
func TestNginxThroughput(t *testing.T) {
	if os.Getenv("SLUICE_BENCH_NGINX") != "1" {
		t.Skip("a benchmark: SLUICE_BENCH_NGINX=1 runs it (make bench-nginx)")
	}
	wrk, err := exec.LookPath("wrk")
	if err != nil {
		t.Fatal("wrk not installed (apt-get install wrk)")
	}
	rounds, secs, conns := envInt("SLUICE_BENCH_ROUNDS", 5), envInt("SLUICE_BENCH_SECONDS", 5), envInt("SLUICE_BENCH_CONNECTIONS", 32)
	site, err := os.ReadFile("../examples/nginx/sluice.conf")
	if err != nil {
		t.Fatal(err)
	}
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer app.Close()
	appURL, _ := url.Parse(app.URL)
	appAddr := app.Listener.Addr().String()

	px, err := proxy.New(proxy.Options{Config: "bench.yaml", ConfigData: []byte(benchPolicy), Upstream: appURL, AdminToken: "x", Logger: quiet(),
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	pctx, stopProxy := context.WithCancel(context.Background())
	proxyDone := make(chan error, 1)
	go func() { proxyDone <- px.Run(pctx) }() // as sluice proxy serves: its own server
	defer func() { stopProxy(); <-proxyDone }()
	pxAddr, _ := px.Addrs()
	sv, err := New(Options{Config: "bench.yaml", ConfigData: []byte(benchPolicy), AdminToken: "x", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	defer sv.Close()
	svSrv := httptest.NewServer(sv.Handler())
	defer svSrv.Close()
	alone := startNginx(t, nginxAlone, "", appAddr, "")
	withSluice := startNginx(t, string(site), svSrv.Listener.Addr().String(), appAddr, "")

	setups := []struct{ name, url string }{
		{"nginx alone", "http://" + alone.addr + "/v1/routes/42"},
		{"nginx + sluice serve (auth_request)", "http://" + withSluice.addr + "/v1/routes/42"},
		{"sluice proxy", "http://" + pxAddr.String() + "/v1/routes/42"},
	}
	type result struct{ rps, p50, p99 float64 }
	res := make([][]result, len(setups))
	var throughSluice int64 // requests wrk completed through nginx + sluice serve
	for r := range rounds {
		for i, s := range setups {
			out, err := exec.Command(wrk, "-t1", "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(secs)+"s", "--latency",
				"-H", "X-Api-Key: bench", s.url).CombinedOutput()
			if err != nil {
				t.Fatalf("wrk: %v\n%s", err, out)
			}
			rps, p50, p99, non2xx := parseWrk(string(out))
			if rps == 0 || non2xx {
				t.Fatalf("%s: wrk output:\n%s", s.name, out)
			}
			if i == 1 {
				throughSluice += wrkRequests(string(out))
			}
			res[i] = append(res[i], result{rps, p50, p99})
			t.Logf("round %d %-36s %8.0f req/s  p50 %.3f ms  p99 %.3f ms", r+1, s.name, rps, p50, p99)
		}
	}
	med := func(rs []result, f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n| setup (%d connections, %d rounds of %d s, medians) | req/s | vs nginx alone | p50 ms | p99 ms |\n|---|---:|---:|---:|---:|\n", conns, rounds, secs)
	base := med(res[0], func(r result) float64 { return r.rps })
	for i, s := range setups {
		rps := med(res[i], func(r result) float64 { return r.rps })
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %.3f | %.3f |\n", s.name, rps, rps/base,
			med(res[i], func(r result) float64 { return r.p50 }), med(res[i], func(r result) float64 { return r.p99 }))
	}
	t.Log(b.String())
	// Every request through nginx + sluice serve was decided by sluice.
	rec := httptest.NewRecorder()
	sv.AdminHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	admitted := 0.0 // summed over the series (class, tenant)
	for _, m := range regexp.MustCompile(`(?m)^sluice_requests_admitted_total\{[^}]*\} ([0-9.e+]+)$`).FindAllStringSubmatch(rec.Body.String(), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		admitted += v
	}
	if int64(admitted) < throughSluice {
		t.Fatalf("sluice serve admitted %.0f requests, wrk completed %d through it", admitted, throughSluice)
	}
	t.Logf("sluice serve decided %.0f requests (wrk completed %d through nginx + sluice serve)", admitted, throughSluice)
}

var wrkTotal = regexp.MustCompile(`(?m)^\s+([0-9]+) requests in`)

// wrkRequests reads how many requests wrk completed.
func wrkRequests(out string) int64 {
	if m := wrkTotal.FindStringSubmatch(out); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	return 0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

var (
	wrkRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkLatency = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
)

// parseWrk reads requests/s, the 50th and 99th latency percentiles in ms,
// and whether any answer was not 2xx or 3xx from wrk's output.
func parseWrk(out string) (rps, p50, p99 float64, non2xx bool) {
	if m := wrkRPS.FindStringSubmatch(out); m != nil {
		rps, _ = strconv.ParseFloat(m[1], 64)
	}
	for _, m := range wrkLatency.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if m[1] == "50" {
			p50 = v
		} else {
			p99 = v
		}
	}
	return rps, p50, p99, strings.Contains(out, "Non-2xx or 3xx responses")
}
