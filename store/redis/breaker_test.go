package redis

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// On a Cluster each master has its own breaker: with one master killed,
// decisions on its slots fail fast (they go to the gates' failure
// policies) while the other masters' slots keep deciding on Redis, and
// every decision returns within the timeout plus scheduling slack.
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
	lim, _ := bind(st)(TokenBucket("slots", tb))

	// Keys by the master that owns them.
	m := st.slots.Load()
	if m == nil {
		t.Fatal("no slot map on a Cluster")
	}
	dead := m[0] // the master of slot 0
	var deadKeys, liveKeys []string
	for i := 0; len(deadKeys) < 20 || len(liveKeys) < 40; i++ {
		k := "t" + strconv.Itoa(i)
		if m[keySlot(st.key("slots", k))] == dead {
			deadKeys = append(deadKeys, k)
		} else {
			liveKeys = append(liveKeys, k)
		}
	}
	var victim *redistest.Server
	for _, n := range cl.Nodes {
		if n.Addr == dead.addr {
			victim = n
		}
	}
	if victim == nil {
		t.Fatalf("slot 0's master %s is not one of %v", dead.addr, cl.Addrs)
	}

	var liveOK, liveErr, deadOK, deadErr atomic.Int64
	var slowest atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				isDead := i%3 == 0
				key := liveKeys[(g+i)%len(liveKeys)]
				if isDead {
					key = deadKeys[(g+i)%len(deadKeys)]
				}
				start := time.Now()
				_, _, err := lim.Take(context.Background(), key, 0, 1, 0)
				if d := int64(time.Since(start)); d > slowest.Load() {
					slowest.Store(d)
				}
				switch {
				case isDead && err == nil:
					deadOK.Add(1)
				case isDead:
					deadErr.Add(1)
				case err == nil:
					liveOK.Add(1)
				default:
					liveErr.Add(1)
				}
				time.Sleep(200 * time.Microsecond)
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if liveErr.Load()+deadErr.Load() != 0 {
		t.Fatalf("errors before any fault: %d live, %d dead-to-be", liveErr.Load(), deadErr.Load())
	}
	victim.Kill()
	time.Sleep(200 * time.Millisecond) // the breaker of the dead master opens
	f0 := st.Failures()
	liveOK.Store(0)
	liveErr.Store(0)
	deadOK.Store(0)
	deadErr.Store(0)
	slowest.Store(0)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	t.Logf("1 s with a master down: live slots %d ok / %d failed, dead slots %d ok / %d failed, %d calls failed on Redis, slowest decision %v",
		liveOK.Load(), liveErr.Load(), deadOK.Load(), deadErr.Load(), st.Failures()-f0, time.Duration(slowest.Load()))
	if liveOK.Load() == 0 || liveErr.Load() > liveOK.Load()/100 {
		t.Errorf("live slots: %d ok, %d failed: a dead master took down the others' slots", liveOK.Load(), liveErr.Load())
	}
	if deadOK.Load() != 0 || deadErr.Load() == 0 {
		t.Errorf("dead slots: %d ok, %d failed", deadOK.Load(), deadErr.Load())
	}
	// Only the probes of the dead master (one per interval) and calls in
	// flight reach it.
	if f := st.Failures() - f0; f > int64(time.Second/probe)+16 {
		t.Errorf("%d calls failed on Redis in 1 s: the breaker let decisions through to the dead master", f)
	}
	if !dead.open.Load() || st.breaker.open.Load() {
		t.Errorf("dead master's breaker open %v, store's own open %v", dead.open.Load(), st.breaker.open.Load())
	}

	// The master comes back: its slots decide on Redis again within a
	// probe interval (plus the time it takes to rejoin).
	victim.Restart()
	back := time.Now()
	for {
		if _, _, err := lim.Take(context.Background(), deadKeys[0], 0, 1, 0); err == nil {
			break
		}
		if time.Since(back) > 5*time.Second {
			t.Fatalf("the restarted master's slots still fail after %v", time.Since(back))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("restarted master's slots decide on Redis again after %v", time.Since(back).Round(time.Millisecond))
}
