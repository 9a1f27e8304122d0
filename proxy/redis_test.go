package proxy

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
)

// Every gate over the Redis store exports its store failures, fleet usage
// included, when Redis is gone.
func TestStoreFailuresExportedForEveryRedisGate(t *testing.T) {
	srv := redistest.Start(t)
	up := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer up.Close()
	u, _ := url.Parse(up.URL)
	policy := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
service: failures
store: {backend: redis, addrs: [ADDR], timeout: 50ms, on_failure: fail_open}
routes:
  - {match: {path: "/x"}, class: sheddable}
gates:
  - {name: fleet, kind: fleet_usage, limit: 10, reserve: {default: 20%}}
  - {name: rate, kind: token_bucket, scope: tenant, rate: 10/s, burst: 10}
`, "ADDR", srv.Addr)
	s, err := New(Options{Config: "p.yaml", ConfigData: []byte(policy), Upstream: u, AdminToken: "x",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer s.host.Close()
	srv.Kill()
	proxyURL := front(t, s)
	admin := httptest.NewServer(s.AdminHandler())
	defer admin.Close()
	if resp, err := http.Get(proxyURL + "/x"); err != nil || resp.StatusCode != 200 {
		t.Fatalf("fail_open: %v %v", resp, err)
	}
	resp, err := http.Get(admin.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_gate_store_failures_total{gate="fleet",policy="fail_open"} 1`, `sluice_gate_store_failures_total{gate="rate",policy="fail_open"} 1`} {
		if !strings.Contains(string(b), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The proxy starts while Redis is down (a restart during an outage must
// not take the API down): it serves by the failure policy (here
// fail_closed: 503) and decides on Redis once Redis is up.
func TestProxyStartsWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	policy := strings.ReplaceAll(`version: 1
identity: {tenant: {header: X-Api-Key}}
service: startup
store: {backend: redis, addrs: [ADDR], probe_every: 100ms, on_failure: fail_closed}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 100/s, burst: 100}
`, "ADDR", srv.Addr)
	_, base := serve(t, policy, nil) // fails the test if the proxy refuses to start
	get := func() int {
		resp, err := http.Get(base + "/x")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != 503 {
		t.Fatalf("Redis down, fail_closed: %d", code)
	}
	srv.Restart()
	poll.Until(t, 10*time.Second, func() bool { return get() == 200 })
}

// heldSlots sums the slots every fleet concurrency key holds on srv.
func heldSlots(t *testing.T, srv *redistest.Server) int {
	t.Helper()
	out := srv.Do("eval", "local n = 0 for _, k in ipairs(redis.call('keys', '*:held')) do n = n + tonumber(redis.call('get', k) or '0') end return n", "0")
	n, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		t.Fatalf("held slots: %q", out)
	}
	return n
}

// A Redis pause under load (what CLIENT PAUSE, DEBUG SLEEP or a stalled
// host cause) must not leave tenant permits held by nobody: before, a
// 300 ms pause left 17 of 20 permits held with nothing in flight
// (throughput 375/s → 57/s), and a 10 s one gave the tenant 100% 429/503
// for the permit TTL (60 s) after Redis came back. After the pause the
// tenant is admitted normally again within a probe interval, and Redis
// holds no permit once nothing is in flight.
func TestRedisPauseLeavesNoPermitsOverProxy(t *testing.T) {
	for _, pause := range []time.Duration{300 * time.Millisecond, 10 * time.Second} {
		t.Run(pause.String(), func(t *testing.T) {
			if pause > time.Second && testing.Short() {
				t.Skip("a 10 s pause")
			}
			redisPause(t, pause)
		})
	}
}

func redisPause(t *testing.T, pause time.Duration) {
	srv := redistest.Start(t)
	const probe = 200 * time.Millisecond
	policy := strings.ReplaceAll(`version: 1
service: pause
store: {backend: redis, addrs: [ADDR], probe_every: 200ms, on_failure: fail_open}
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: tenant-inflight, kind: concurrency, scope: tenant, limit: 20, ttl: 60s}
`, "ADDR", srv.Addr)
	_, base := serve(t, policy, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // a little work
	}))
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()

	// 12 callers of one tenant, below its limit of 20: every request is
	// admitted while the store works.
	var mu sync.Mutex
	codes := map[int]int{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	defer func() { // however the test ends: no caller left running
		stop.Store(true)
		wg.Wait()
	}()
	for range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				req, _ := http.NewRequest("GET", base+"/x", nil)
				req.Header.Set("X-Api-Key", "acme")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				mu.Lock()
				codes[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	count := func() map[int]int {
		mu.Lock()
		defer mu.Unlock()
		out := map[int]int{}
		for k, v := range codes {
			out[k] = v
		}
		clear(codes)
		return out
	}
	poll.Until(t, 10*time.Second, func() bool { return heldSlots(t, srv) > 0 })
	srv.Pause()
	time.Sleep(pause) // the outage
	srv.Resume()
	time.Sleep(probe + 300*time.Millisecond) // recovery: a probe interval, then a margin for the drain
	count()
	time.Sleep(time.Second) // the window measured
	after := count()
	stop.Store(true)
	wg.Wait()
	t.Logf("%v pause: in the second after recovery %v", pause, after)
	if after[http.StatusTooManyRequests] > 0 || after[http.StatusOK] == 0 {
		t.Errorf("after a %v pause and a probe interval, the tenant is not admitted normally: %v", pause, after)
	}
	back := time.Now()
	poll.Until(t, 10*time.Second, func() bool { return heldSlots(t, srv) == 0 })
	t.Logf("Redis held no permit %v after the load stopped (permit TTL 60s)", time.Since(back).Round(time.Millisecond))
}

// burnCPU keeps n cores busy from other processes until the test ends.
func burnCPU(t *testing.T, n int) {
	t.Helper()
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			t.Skip("no sh to load the cores:", err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	}
}

// Two proxies with the default store settings share a limit of 100 per
// 10 s on Redis while 200 clients hammer them and other processes keep
// both cores busy. Before, ~95% of the decisions were store timeouts of
// the busy host (5 ms default, fail_open) and 37k–73k were admitted. Now
// the limit holds: what is admitted beyond it is only what the failure
// policy admitted, which is exported and stays under 1% of the decisions
// (measured: none in 60,000).
func TestTwoProxiesOnABusyHostKeepTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("a load test")
	}
	srv := redistest.Start(t)
	policy := strings.ReplaceAll(`version: 1
service: busy
store: {backend: redis, addrs: [ADDR]}
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: rate, kind: token_bucket, scope: tenant, rate: 100/10s, burst: 100}
`, "ADDR", srv.Addr)
	var proxies []*Server
	var urls []string
	for range 2 {
		s, base := serve(t, policy, nil)
		proxies, urls = append(proxies, s), append(urls, base)
	}
	burnCPU(t, 2)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200}}
	defer client.CloseIdleConnections()
	var ok, total atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				req, _ := http.NewRequest("GET", urls[i%2]+"/x", nil)
				req.Header.Set("X-Api-Key", "acme")
				resp, err := client.Do(req)
				if err != nil {
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				total.Add(1)
				if resp.StatusCode == http.StatusOK {
					ok.Add(1)
				}
			}
		}()
	}
	time.Sleep(3 * time.Second) // the load's length
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	var failOpen int64
	for _, s := range proxies {
		for _, g := range s.Chain().Gates() {
			if f, ok := sluice.As[sluice.FailureCounter](g); ok {
				failOpen += f.Failures()
			}
		}
	}
	// A token bucket of 10/s with burst 100 admits at most 100 + 10·T.
	allowed := 100 + int64(10*elapsed.Seconds()) + 1
	t.Logf("%v: %d requests, %d admitted (limit allows %d), %d decided by fail_open", elapsed.Round(time.Millisecond), total.Load(), ok.Load(), allowed, failOpen)
	if ok.Load() > allowed+failOpen {
		t.Errorf("admitted %d, more than the limit's %d plus the %d fail-open decisions", ok.Load(), allowed, failOpen)
	}
	// The share of decisions made without the store is a property of the
	// code only without the race detector, which slows this process
	// several times over while the others keep their speed.
	if failOpen*100 > total.Load() && !raceEnabled {
		t.Errorf("%d of %d decisions went to the failure policy on a busy host with default settings", failOpen, total.Load())
	}
}
