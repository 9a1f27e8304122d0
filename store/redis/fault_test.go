package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/internal/stall"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// faultLoad runs callers against the three failure policies until stop is
// closed and records the slowest decision and how many decisions there were.
type faultLoad struct {
	maxLatency atomic.Int64
	total      atomic.Int64
}

func TestFailurePoliciesUnderRedisFaults(t *testing.T) {
	srv := redistest.Start(t)
	const timeout, probe = 10 * time.Millisecond, 200 * time.Millisecond
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: timeout, ProbeEvery: probe})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1_000_000), 1_000_000)
	lim, _ := bind(st)(tokenBucketSpec("faults", tb))
	fb, _ := limit.NewTokenBucket(limit.PerSecond(1000), 1000) // the conservative local budget
	gOpen, _ := gate.NewRateLimit("open", lim, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.FailOpen})
	gClosed, _ := gate.NewRateLimit("closed", lim, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.FailClosed})
	gLocal, _ := gate.NewRateLimit("local", lim, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.LocalFallback,
		Fallback: memory.NewKeyed(fb, memory.Options{})})

	var load faultLoad
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := []sluice.Gate{gOpen, gClosed, gLocal}[i%3]
			req := &sluice.Request{Tenant: "t", Cost: 1}
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				d, p := gatetest.Decide(context.Background(), g, req, clock.Now())
				lat := time.Since(start)
				for {
					old := load.maxLatency.Load()
					if int64(lat) <= old || load.maxLatency.CompareAndSwap(old, int64(lat)) {
						break
					}
				}
				load.total.Add(1)
				if d.Admitted {
					g.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}

	// failures counts calls that went to Redis and failed (each paid up to
	// the timeout and its grace for a late reply, as long again); decisions
	// answered by the open breaker cost nothing. A decision may take twice
	// the timeout plus 2 ms, plus the scheduling stalls
	// this process suffered within a span of its length (a busy machine's,
	// not ours: a call waits at several hand-offs between goroutines, and on
	// a loaded machine each can be late).
	meter := stall.Start()
	defer meter.Stop()
	phase := func(name string, d time.Duration) (failures int64) {
		before, gb := st.Failures(), failuresOf(gOpen)+failuresOf(gClosed)+failuresOf(gLocal)
		load.maxLatency.Store(0)
		meter.Reset()
		time.Sleep(d) // the phase's length
		failures = st.Failures() - before
		stalled := meter.Max()
		t.Logf("%-9s %6d decisions so far, slowest %v, %d calls to Redis failed, %d decisions by failure policy, longest stall %v",
			name, load.total.Load(), time.Duration(load.maxLatency.Load()), failures, failuresOf(gOpen)+failuresOf(gClosed)+failuresOf(gLocal)-gb, stalled)
		if max := time.Duration(load.maxLatency.Load()); max > 2*timeout+2*time.Millisecond+stalled {
			if in := meter.MaxIn(max); max > 2*timeout+2*time.Millisecond+in {
				t.Errorf("%s: a decision took %v, more than twice the timeout + 2ms + the stalls within a span that long, %v", name, max, in)
			}
		}
		return failures
	}

	phase("normal", 300*time.Millisecond)

	srv.Kill()
	f := phase("killed", time.Second)
	// Only the calls in flight at the failure and one probe per interval
	// touch Redis: a handful of failures for thousands of decisions.
	if f == 0 || f > int64(time.Second/probe)+2+12 {
		t.Errorf("killed: %d store failures in 1 s with probes every %v", f, probe)
	}
	checkPolicies(t, gOpen, gClosed, gLocal)

	srv.Restart()
	waitResumed(t, st, probe, meter)
	afterReturn(t, st, probe, meter, "restarted", phase("restarted", 300*time.Millisecond))

	srv.Pause()
	phase("paused", time.Second)
	checkPolicies(t, gOpen, gClosed, gLocal)
	srv.Resume()
	waitResumed(t, st, probe, meter)
	afterReturn(t, st, probe, meter, "resumed", phase("resumed", 300*time.Millisecond))

	close(stop)
	wg.Wait()
}

// checkPolicies asks each gate once while Redis is down.
func checkPolicies(t *testing.T, open, closed, local sluice.Gate) {
	t.Helper()
	req := &sluice.Request{Tenant: "probe", Cost: 1}
	ctx := context.Background()
	if d, p := gatetest.Decide(ctx, open, req, clock.Now()); !d.Admitted || p != 0 {
		t.Errorf("fail_open: %+v", d)
	}
	if d, _ := gatetest.Decide(ctx, closed, req, clock.Now()); d.Admitted || d.Reason != sluice.ReasonDependency || !d.Retryable {
		t.Errorf("fail_closed: %+v", d)
	}
	d, p := gatetest.Decide(ctx, local, req, clock.Now())
	if !d.Admitted || d.Limit != 1000 {
		t.Errorf("local_fallback did not decide on the local budget: %+v", d)
	}
	local.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeRejected})
}

// afterReturn checks a phase after Redis came back: normally no call
// fails. A scheduling stall longer than the timeout on a loaded machine
// can still time out the calls in flight at that moment (at most one per
// load goroutine) and open the breaker; then decisions must resume within
// one probe interval again.
func afterReturn(t *testing.T, st *Store, probe time.Duration, meter *stall.Meter, name string, failures int64) {
	t.Helper()
	if failures > 12 {
		t.Errorf("%s: %d failures after Redis came back", name, failures)
	}
	if failures > 0 {
		t.Logf("%s: %d calls timed out after Redis came back (a stall of the machine?)", name, failures)
		waitResumed(t, st, probe, meter)
	}
}

// waitResumed requires normal decisions (the breaker closed) within one
// probe interval (plus scheduling slack) of Redis being back.
func waitResumed(t *testing.T, st *Store, probe time.Duration, meter *stall.Meter) {
	t.Helper()
	back := time.Now()
	meter.Reset()
	poll.Until(t, 10*time.Second, func() bool { return !st.open.Load() })
	if took, stalled := time.Since(back), meter.Max(); took > probe+50*time.Millisecond+stalled {
		t.Errorf("decisions resumed %v after Redis returned, more than one probe interval (%v) and the longest stall (%v)", took, probe, stalled)
	}
	t.Logf("normal decisions resumed %v after Redis returned", time.Since(back).Round(time.Millisecond))
}

// failuresOf is g's count of store failures (sluice.FailureCounter).
func failuresOf(g sluice.Gate) int64 {
	f, _ := sluice.As[sluice.FailureCounter](g)
	return f.Failures()
}
