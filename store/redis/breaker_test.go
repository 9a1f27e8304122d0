package redis

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/internal/stall"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// On a Cluster each master has its own breaker: with one master killed,
// decisions on its slots fail fast (they go to the gates' failure
// policies) while the other masters' slots keep deciding on Redis.
func TestClusterMasterDownFailsOnlyItsSlots(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	for _, n := range cl.Nodes {
		// Let the live masters serve their slots while one is down (the
		// default stops the whole cluster after the node timeout).
		n.Do("config", "set", "cluster-require-full-coverage", "no")
	}
	const timeout, probe = 20 * time.Millisecond, 200 * time.Millisecond
	st, err := New(Options{Addrs: cl.Addrs, Timeout: timeout, ProbeEvery: probe})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1_000_000), 1_000_000)
	lim, _ := bind(st)(tokenBucketSpec("slots", tb))
	dead, victim := slotZeroMaster(t, st, cl)
	load := &slotLoad{lim: lim}
	load.keys(st, dead)
	load.start(16)
	load.await(t, 1000, func() bool { return true })
	if load.liveErr.Load()+load.deadErr.Load() != 0 {
		t.Fatalf("errors before any fault: %d live, %d dead-to-be", load.liveErr.Load(), load.deadErr.Load())
	}
	victim.Kill()
	load.await(t, 0, dead.open.Load) // the breaker of the dead master opens
	f0, from := st.Failures(), time.Now()
	load.reset()
	load.await(t, 5000, func() bool { return load.deadErr.Load() > 100 && time.Since(from) > 3*probe }) // a few probes
	load.stop()
	failed, took := st.Failures()-f0, time.Since(from)
	t.Logf("%v with a master down: live slots %d ok / %d failed, dead slots %d ok / %d failed, %d calls failed on Redis",
		took.Round(time.Millisecond), load.liveOK.Load(), load.liveErr.Load(), load.deadOK.Load(), load.deadErr.Load(), failed)
	if load.liveOK.Load() == 0 || load.liveErr.Load() > load.liveOK.Load()/100 {
		t.Errorf("live slots: %d ok, %d failed: a dead master took down the others' slots", load.liveOK.Load(), load.liveErr.Load())
	}
	if load.deadOK.Load() != 0 || load.deadErr.Load() == 0 {
		t.Errorf("dead slots: %d ok, %d failed", load.deadOK.Load(), load.deadErr.Load())
	}
	// Only the probes of the dead master (one per interval) and calls in
	// flight reach it. The store counts every failed call: the live slots'
	// own (timeouts on a busy machine) are not the dead master's.
	onDead := failed - load.liveErr.Load()
	if limit := int64(took/probe) + 1 + 16; onDead > limit {
		t.Errorf("%d calls failed on the dead master in %v: the breaker let decisions through to it", onDead, took)
	}
	if !dead.open.Load() || st.breaker.open.Load() {
		t.Errorf("dead master's breaker open %v, store's own open %v", dead.open.Load(), st.breaker.open.Load())
	}
	// The master comes back: its slots decide on Redis again once a probe
	// finds it (within a probe interval of it rejoining).
	victim.Restart()
	back := time.Now()
	poll.Until(t, 5*time.Second, func() bool {
		_, _, err := lim.Take(context.Background(), load.deadKeys[0], 0, 1, 0)
		return err == nil
	})
	t.Logf("restarted master's slots decide on Redis again after %v", time.Since(back).Round(time.Millisecond))
}

// slotZeroMaster returns the breaker and the server of slot 0's master.
func slotZeroMaster(t *testing.T, st *Store, cl *redistest.Cluster) (*breaker, *redistest.Server) {
	t.Helper()
	m := st.slots.Load()
	if m == nil {
		t.Fatal("no slot map on a Cluster")
	}
	for _, n := range cl.Nodes {
		if n.Addr == m[0].addr {
			return m[0], n
		}
	}
	t.Fatalf("slot 0's master %s is not one of %v", m[0].addr, cl.Addrs)
	return nil, nil
}

// slotLoad keeps callers deciding on keys of a dead-to-be master and of the
// others, and counts what each got.
type slotLoad struct {
	lim                store.Limiter
	deadKeys, liveKeys []string
	liveOK, liveErr    atomic.Int64
	deadOK, deadErr    atomic.Int64
	done               chan struct{}
	wg                 sync.WaitGroup
}

// keys sorts keys by whether dead's master owns them.
func (l *slotLoad) keys(st *Store, dead *breaker) {
	m := st.slots.Load()
	for i := 0; len(l.deadKeys) < 20 || len(l.liveKeys) < 40; i++ {
		k := "t" + strconv.Itoa(i)
		if m[keySlot(st.key("slots", k))] == dead {
			l.deadKeys = append(l.deadKeys, k)
		} else {
			l.liveKeys = append(l.liveKeys, k)
		}
	}
}

func (l *slotLoad) start(callers int) {
	l.done = make(chan struct{})
	for g := range callers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.done:
					return
				default:
				}
				l.decide(g, i)
				runtime.Gosched()
			}
		}()
	}
}

// decide makes caller g's i-th decision: every third on a dead-to-be key.
func (l *slotLoad) decide(g, i int) {
	isDead := i%3 == 0
	key := l.liveKeys[(g+i)%len(l.liveKeys)]
	if isDead {
		key = l.deadKeys[(g+i)%len(l.deadKeys)]
	}
	_, _, err := l.lim.Take(context.Background(), key, 0, 1, 0)
	switch {
	case isDead && err == nil:
		l.deadOK.Add(1)
	case isDead:
		l.deadErr.Add(1)
	case err == nil:
		l.liveOK.Add(1)
	default:
		l.liveErr.Add(1)
	}
}

// await waits until at least n live decisions succeeded since the last
// reset and cond holds.
func (l *slotLoad) await(t *testing.T, n int64, cond func() bool) {
	t.Helper()
	poll.Until(t, 10*time.Second, func() bool { return l.liveOK.Load() >= n && cond() })
}

func (l *slotLoad) reset() {
	for _, c := range []*atomic.Int64{&l.liveOK, &l.liveErr, &l.deadOK, &l.deadErr} {
		c.Store(0)
	}
}

func (l *slotLoad) stop() {
	close(l.done)
	l.wg.Wait()
}

// The breaker on a manual clock: once a call fails, no call reaches Redis
// until a probe interval has passed on the store's clock, whatever the
// wall clock does; then one probe goes, and when it finds Redis back the
// decisions resume.
func TestBreakerProbesOncePerInterval(t *testing.T) {
	srv := redistest.Start(t)
	clk := fakeclock.New(1)
	const probe = time.Second // of the manual clock: the wall clock never gets there
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond, ProbeEvery: probe, Clock: clk, Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1000), 1000)
	lim, _ := bind(st)(tokenBucketSpec("probe", tb))
	ctx := context.Background()
	if _, _, err := lim.Take(ctx, "k", 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, _, err := lim.Take(ctx, "k", 0, 1, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Redis down: %v", err)
	}
	// The broken connection's check (a PING on a new one) finds Redis
	// gone and opens the breaker.
	poll.Until(t, 10*time.Second, func() bool { return st.breaker.open.Load() && !st.breaker.probing.Load() })
	failed := st.Failures()
	srv.Restart()
	// Redis is back, but the breaker holds until the interval has passed.
	for range 1000 {
		if _, _, err := lim.Take(ctx, "k", 0, 1, 0); !errors.Is(err, store.ErrUnavailable) {
			t.Fatalf("a call went through the open breaker: %v", err)
		}
	}
	if st.Failures() != failed {
		t.Fatalf("%d calls reached Redis while the breaker was open", st.Failures()-failed)
	}
	// Once the interval has passed, a call starts a probe. A probe may find
	// the restarted server not yet accepting connections; then the breaker
	// waits another interval, so the manual clock moves on each round.
	poll.Until(t, 10*time.Second, func() bool {
		clk.Advance(probe)
		_, _, err := lim.Take(ctx, "k", 0, 1, 0)
		return err == nil
	})
}

// After a quick Redis restart a store whose calls are sparse (a lease
// gate's refreshes) decides on Redis again within one probe interval: the
// client's pooled connections broke while Redis was away and each fails
// its first command at once (EOF), the probe's as well as a decision's
// after the probe closed the breaker; neither may cost another interval.
func TestBreakerResumesWithinOneProbeAfterRestart(t *testing.T) {
	srv := redistest.Start(t)
	const probe = 200 * time.Millisecond
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	ctx := context.Background()
	meter := stall.Start()
	defer meter.Stop()
	for round := range 6 {
		st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second, ProbeEvery: probe})
		if err != nil {
			t.Fatal(err)
		}
		for range 20 { // use the client's connections
			if _, err := st.Lease(ctx, "restart", a, lease.Request{Client: "c", Wants: 1}); err != nil {
				t.Fatal(err)
			}
		}
		srv.Restart()
		back := time.Now()
		meter.Reset()
		tick := time.NewTicker(10 * time.Millisecond) // a sparse caller
		for {
			if _, err := st.Lease(ctx, "restart", a, lease.Request{Client: "c", Wants: 1}); err == nil {
				break
			}
			if time.Since(back) > 10*time.Second {
				t.Fatalf("round %d: no decision on Redis 10 s after the restart", round)
			}
			<-tick.C
		}
		tick.Stop()
		took, stalled := time.Since(back), meter.Max()
		st.Close()
		t.Logf("round %d: deciding on Redis again %v after the restart", round, took.Round(time.Millisecond))
		if took > probe+100*time.Millisecond+stalled {
			t.Errorf("round %d: deciding on Redis again %v after the restart, more than one probe interval (%v) and the longest stall (%v)",
				round, took, probe, stalled)
		}
	}
}

// An open breaker is probed on its own, without calls: a store that opened
// on a failure and then saw no traffic decides its next call on Redis
// again, not by the failure policy.
func TestIdleStoreClosesItsBreakerWithoutCalls(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: time.Second, ProbeEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("idle", must(limit.NewTokenBucket(limit.PerSecond(10), 10))))
	if _, _, err := lim.Take(context.Background(), "k", 0, 1, 0); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	poll.Until(t, 10*time.Second, func() bool { // Redis gone: the breaker opens
		lim.Take(context.Background(), "k", 0, 1, 0)
		return st.breaker.open.Load()
	})
	srv.Restart()
	poll.Until(t, 10*time.Second, func() bool { return !st.breaker.open.Load() }) // no call meanwhile
	if _, _, err := lim.Take(context.Background(), "k", 0, 1, 0); err != nil {
		t.Errorf("the first call after the idle time: %v", err)
	}
}

// A quick restart of Redis between a sparse gate's decisions costs at most
// the decisions that meet a connection Redis ended (each fails once, at
// once), never a probe interval on the failure policy: a broken connection
// is checked with a PING on a new one, and Redis answers it.
func TestSparseCallsAfterAnUnseenRestart(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 100 * time.Millisecond, ProbeEvery: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("sparse", must(limit.NewTokenBucket(limit.PerSecond(1000), 1000))))
	ctx := context.Background()
	for range 20 { // lanes and connections in use
		if _, _, err := lim.Take(ctx, "k", 0, 1, 0); err != nil {
			t.Fatal(err)
		}
	}
	srv.Restart() // between two decisions: no call sees Redis away
	failed := 0
	for range 40 {
		if _, _, err := lim.Take(ctx, "k", 0, 1, 0); err != nil {
			failed++
		}
		time.Sleep(20 * time.Millisecond)
	}
	if failed > 4 {
		t.Errorf("%d of 40 sparse decisions failed after a restart Redis was back from (want only those that met an ended connection)", failed)
	}
	t.Logf("%d of 40 failed", failed)
}
