package rls

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/internal/stall"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// TestFailureMatrix runs the three failure policies against a real
// redis-server that is paused (SIGSTOP: connections stay open and nothing
// answers, the worst case) and then killed (connections refused), with
// calls of three descriptors (two fixed windows and a token bucket), on
// the real clock. Every call must answer within its timeout and as its
// policy says: FailError with ErrUnavailable, FailOpen with OK (counted in
// sluice_rls_fail_open_total), FailClosed with OVER_LIMIT.
//
// The bound asserted is timeout + 200 ms. A call's own overhead is well
// under 2 ms beyond the timeout (the test logs how many calls exceeded
// timeout + 2 ms + the longest scheduling stall the process suffered); the
// rest of the margin is for a busy 2-core machine that deschedules this
// process, and it is still far below what a hang takes (a paused Redis
// never answers: without the timeout a call would wait until the pause
// ends, a second here, or forever).
func TestFailureMatrix(t *testing.T) {
	if testing.Short() {
		t.Skip("real Redis, real time")
	}
	srv := redistest.Start(t)
	const timeout, probe = 50 * time.Millisecond, 200 * time.Millisecond
	const bound = timeout + 200*time.Millisecond
	st, err := sredis.New(sredis.Options{Addrs: []string{srv.Addr}, Timeout: timeout, ProbeEvery: probe})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cfg := mustParse(t, conformanceConfig+"  - {key: bucket, rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 1000000}}\n")
	policies := []FailurePolicy{FailError, FailOpen, FailClosed}
	names := []string{"error", "open", "closed"}
	servers := make([]*Server, len(policies))
	for i, p := range policies {
		s, err := New(cfg, Options{Redis: st, Timeout: timeout, OnFailure: p, Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		servers[i] = s
	}
	req := func() *Request {
		return &Request{Domain: "edge", Descriptors: []Descriptor{d("tenant", "load"), d("path", "/load"), d("bucket", "b")}, Hits: 1}
	}
	// outcome of one call: "ok", "over", "unavailable", or "other".
	outcome := func(resp *Response, err error) string {
		switch {
		case errors.Is(err, ErrUnavailable):
			return "unavailable"
		case err != nil:
			return "other: " + err.Error()
		case resp.Overall == CodeOverLimit:
			return "over"
		}
		return "ok"
	}

	type phaseStats struct {
		calls, slow atomic.Int64 // slow: over timeout + 2 ms + the longest stall
		maxLat      atomic.Int64
		bad         sync.Map // outcome → count, for outcomes the policy forbids
	}
	meter := stall.Start()
	defer meter.Stop()
	runPhase := func(name string, d time.Duration, want []string) {
		var ps [3]phaseStats
		meter.Reset()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i := range servers {
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
						start := time.Now()
						resp, err := servers[i].ShouldRateLimit(context.Background(), req())
						lat := time.Since(start)
						ps[i].calls.Add(1)
						for {
							old := ps[i].maxLat.Load()
							if int64(lat) <= old || ps[i].maxLat.CompareAndSwap(old, int64(lat)) {
								break
							}
						}
						if lat > timeout+2*time.Millisecond+meter.Max() && lat > timeout+2*time.Millisecond+meter.MaxIn(lat) {
							ps[i].slow.Add(1)
						}
						if got := outcome(resp, err); want != nil && got != want[i] {
							n, _ := ps[i].bad.LoadOrStore(got, new(atomic.Int64))
							n.(*atomic.Int64).Add(1)
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
			maxLat := time.Duration(ps[i].maxLat.Load())
			t.Logf("%-7s fail_%-6s %5d calls, slowest %7v, %d over timeout+2ms+stall; longest stall %v",
				name, names[i], ps[i].calls.Load(), maxLat.Round(10*time.Microsecond), ps[i].slow.Load(), meter.Max().Round(10*time.Microsecond))
			if maxLat > bound {
				t.Errorf("%s, fail_%s: a call took %v, more than timeout + 200ms", name, names[i], maxLat)
			}
			ps[i].bad.Range(func(k, v any) bool {
				t.Errorf("%s, fail_%s: %d calls answered %v, want %s", name, names[i], v.(*atomic.Int64).Load(), k, want[i])
				return true
			})
		}
	}
	normal := func() bool {
		_, err := servers[0].ShouldRateLimit(context.Background(), req())
		return err == nil
	}

	// Up: the limits decide (the tenant's 10/minute is soon over).
	poll.Until(t, 10*time.Second, normal)
	runPhase("normal", 200*time.Millisecond, nil)

	srv.Pause()
	runPhase("paused", time.Second, []string{"unavailable", "ok", "over"})
	srv.Resume()
	poll.Until(t, 10*time.Second, normal)

	srv.Kill()
	runPhase("killed", time.Second, []string{"unavailable", "ok", "over"})

	if n := counter(t, servers[1], "sluice_rls_fail_open_total", "edge", "tenant"); n == 0 {
		t.Error("fail_open: no fail-open hits counted")
	}
	if n := counter(t, servers[2], "sluice_rls_fail_closed_total", "edge", "bucket"); n == 0 {
		t.Error("fail_closed: no fail-closed hits counted")
	}
	if n := counter(t, servers[0], "sluice_rls_calls_total", "unavailable"); n == 0 {
		t.Error("fail_error: no unavailable calls counted")
	}
}
