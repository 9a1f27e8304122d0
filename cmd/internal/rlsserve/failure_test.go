package rlsserve

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/grpcgate/rls"
	"github.com/sluice-go/sluice/internal/logbuf"
)

// TestFailureMatrixOverGRPC points three servers, one per --on-failure
// policy, at a real redis-server, pauses it (SIGSTOP: connections stay
// open and nothing answers, the worst case) and then kills it, while
// clients call ShouldRateLimit over gRPC on loopback with two descriptors
// (so the store work runs concurrently). Every call must answer as its
// policy says, error with UNAVAILABLE, open with OK (counted in
// sluice_rls_fail_open_total), closed with OVER_LIMIT, and within twice
// the store timeout (the timeout, then as long again for a reply Redis
// sent in time and this process read late).
//
// The timeout is 50 ms and the bound asserted is timeout + 200 ms, not
// the grace and the + 2 ms a call's own work takes beyond them: the test runs on
// a shared 2-core machine under -race, with other tests and other
// people's builds, where the scheduler can deschedule the client, the
// server or the gRPC transport's goroutines for tens of milliseconds. A
// hang is still far outside the bound (a paused Redis never answers:
// without the timeout a call would wait the whole pause). The test logs
// each phase's slowest call and how many calls took over twice the
// timeout + 2 ms.
func TestFailureMatrixOverGRPC(t *testing.T) {
	if testing.Short() {
		t.Skip("real Redis, real time")
	}
	redis := startRedis(t)
	const timeout = 50 * time.Millisecond
	const bound = timeout + 200*time.Millisecond
	dir := t.TempDir()
	writeFile(t, dir, "edge.yaml", `domain: edge
descriptors:
  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1000000}}
  - key: tenant
    value: t1
    descriptors:
      - {key: path, rate_limit: {unit: minute, requests_per_unit: 100000000}}
`)
	policies := []rls.FailurePolicy{rls.FailError, rls.FailOpen, rls.FailClosed}
	names := []string{"error", "open", "closed"}
	servers := make([]*running, len(policies))
	for i, p := range policies {
		servers[i] = start(t, Options{Config: dir, Redis: []string{redis.addr}, RedisTimeout: timeout, OnFailure: p, RedisPrefix: "fm-" + names[i]})
	}
	call := req("edge", 1, desc("tenant", "t2"), desc("tenant", "t1", "path", "/p"))
	outcome := func(i int) (string, time.Duration) {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := servers[i].client.ShouldRateLimit(ctx, call)
		lat := time.Since(start)
		switch {
		case status.Code(err) == codes.Unavailable:
			return "unavailable", lat
		case err != nil:
			return "error " + err.Error(), lat
		case resp.GetOverallCode() == overCode:
			return "over", lat
		}
		return "ok", lat
	}
	normal := func() bool {
		o, _ := outcome(0)
		return o == "ok"
	}
	waitNormal := func() {
		deadline := time.Now().Add(15 * time.Second)
		for !normal() {
			if time.Now().After(deadline) {
				t.Fatal("Redis did not answer again within 15 s")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	phase := func(name string, d time.Duration, want []string) {
		type stats struct {
			calls, slow atomic.Int64
			stalled     atomic.Int64 // up: calls past the store's timeout, answered by the failure mode
			max         atomic.Int64
			mu          sync.Mutex
			bad         map[string]int
		}
		ps := make([]*stats, len(servers))
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range servers {
			ps[i] = &stats{bad: map[string]int{}}
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						o, lat := outcome(i)
						ps[i].calls.Add(1)
						for old := ps[i].max.Load(); int64(lat) > old && !ps[i].max.CompareAndSwap(old, int64(lat)); old = ps[i].max.Load() {
						}
						if lat > 2*timeout+2*time.Millisecond {
							ps[i].slow.Add(1)
						}
						if want != nil && o != want[i] && name == "up" && lat >= timeout {
							// Redis is up but the call outlived the store's
							// timeout: a scheduling stall of a busy machine
							// (measured: its latency), answered by the
							// failure mode as it must be.
							ps[i].stalled.Add(1)
						} else if want != nil && o != want[i] {
							ps[i].mu.Lock()
							ps[i].bad[o]++
							ps[i].mu.Unlock()
						}
						time.Sleep(time.Millisecond)
					}
				}()
			}
		}
		time.Sleep(d)
		close(stop)
		wg.Wait()
		for i := range servers {
			max := time.Duration(ps[i].max.Load())
			t.Logf("%-6s --on-failure %-6s %5d calls, slowest %8v, %d over twice the timeout + 2 ms", name, names[i], ps[i].calls.Load(),
				max.Round(10*time.Microsecond), ps[i].slow.Load())
			if max > bound {
				t.Errorf("%s, --on-failure %s: a call took %v, more than timeout + 200 ms", name, names[i], max)
			}
			if n := ps[i].stalled.Load(); n > 0 {
				t.Logf("%-6s --on-failure %-6s %d calls stalled past the timeout with Redis up, answered by the failure mode", name, names[i], n)
				if n*20 > ps[i].calls.Load() {
					t.Errorf("%s, --on-failure %s: %d of %d calls past the timeout with Redis up", name, names[i], n, ps[i].calls.Load())
				}
			}
			for o, n := range ps[i].bad {
				t.Errorf("%s, --on-failure %s: %d calls answered %s, want %s", name, names[i], n, o, want[i])
			}
		}
	}

	waitNormal()
	phase("up", 300*time.Millisecond, []string{"ok", "ok", "ok"})
	redis.pause()
	phase("paused", 1500*time.Millisecond, []string{"unavailable", "ok", "over"})
	redis.resume()
	waitNormal()
	redis.kill()
	phase("killed", time.Second, []string{"unavailable", "ok", "over"})

	if n := metric(t, servers[0], "sluice_rls_calls_total", `result="unavailable"`); n == 0 {
		t.Error("--on-failure error: no unavailable calls counted")
	}
	if n := metric(t, servers[1], "sluice_rls_fail_open_total", `domain="edge"`); n == 0 {
		t.Error("--on-failure open: no fail-open hits counted")
	}
	if n := metric(t, servers[2], "sluice_rls_fail_closed_total", `domain="edge"`); n == 0 {
		t.Error("--on-failure closed: no fail-closed hits counted")
	}
}

// An outage of Redis is logged, though no call's answer is: a warning
// once its calls fail, with the failure policy and what Redis answered,
// again while it goes on, and a line once it answers again. (Nothing was logged: a Redis that
// refused every call for minutes left only the metrics to say so.)
func TestRedisOutageIsLogged(t *testing.T) {
	if testing.Short() {
		t.Skip("real Redis, real time")
	}
	defer func(e, r time.Duration) { storeWatchEvery, storeRetell = e, r }(storeWatchEvery, storeRetell)
	storeWatchEvery, storeRetell = 50*time.Millisecond, 300*time.Millisecond
	redis := startRedis(t)
	dir := t.TempDir()
	writeFile(t, dir, "edge.yaml", "domain: edge\ndescriptors:\n  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1000000}}\n")
	r := start(t, Options{Config: dir, Redis: []string{redis.addr}, RedisTimeout: 50 * time.Millisecond, OnFailure: rls.FailOpen, RedisPrefix: "outage"})
	call := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r.client.ShouldRateLimit(ctx, req("edge", 1, desc("tenant", "a")))
	}
	waitLog := func(what string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(r.log.String(), what) {
			if time.Now().After(deadline) {
				t.Fatalf("no %q in the log within 20 s:\n%s", what, r.log.String())
			}
			call()
			time.Sleep(20 * time.Millisecond)
		}
	}
	call()
	if strings.Contains(r.log.String(), "Redis is failing") {
		t.Fatalf("an outage logged while Redis answers:\n%s", r.log.String())
	}
	redis.pause()
	waitLog("Redis is failing")
	if log := r.log.String(); !strings.Contains(log, "on_failure=open") || !strings.Contains(log, "err=") {
		t.Errorf("the outage's line names neither the policy nor Redis' answer:\n%s", log)
	}
	waitLog("Redis is still failing")
	redis.resume()
	waitLog("Redis answers again")
}

// outageLog on a Redis that comes and goes every other second for a
// minute: a warning and an all-clear at most once per retell (30 s), not
// a pair a second; the brief outages between are counted in the next
// warning.
func TestOutageLogOfAFlappingRedis(t *testing.T) {
	var logs logbuf.Buffer
	o := outageLog{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "open", retell: 30 * time.Second}
	start := time.Unix(1000, 0)
	n := int64(0)
	up := func() error { return nil }
	for s := range 60 {
		if s%4 == 0 {
			n++ // a failed call this second, then three quiet ones
		}
		o.look(start.Add(time.Duration(s)*time.Second), n, up)
	}
	l := logs.String()
	if w, i := strings.Count(l, "Redis is failing"), strings.Count(l, "answers again"); w != 2 || i != 2 {
		t.Errorf("%d warnings and %d all-clears in a minute of a flapping Redis, want 2 of each:\n%s", w, i, l)
	}
	if !strings.Contains(l, "brief_outages_untold=7") {
		t.Errorf("the second warning does not count the outages between:\n%s", l)
	}
}
