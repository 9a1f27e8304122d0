package redis

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// held reads what a fleet concurrency key holds on Redis: permits and the
// slots they hold in all.
func held(t *testing.T, st *Store, lim store.Limiter, key string) (permits, slots int64) {
	t.Helper()
	ks := lim.(*limiter).keys(key)
	c := st.rc()
	permits, _ = c.Do(context.Background(), c.B().Zcard().Key(ks[0]).Build()).AsInt64()
	s, err := c.Do(context.Background(), c.B().Get().Key(ks[1]).Build()).ToString()
	if err == nil {
		slots, _ = strconv.ParseInt(s, 10, 64)
	}
	return permits, slots
}

// pause stops the server for d (SIGSTOP: commands queue on its sockets, as
// under DEBUG SLEEP or CLIENT PAUSE) while fn runs.
func pause(srv *redistest.Server, d time.Duration, fn func()) {
	srv.Pause()
	done := make(chan struct{})
	go func() { fn(); close(done) }()
	time.Sleep(d) // the length of the stall, not a wait for a result
	srv.Resume()
	<-done
}

// A fleet concurrency take that times out must not leave a permit held by
// nobody: limit 4, timeout 30 ms, Redis stalled for 80 ms under 4 takes
// (which Redis runs when it wakes up). Before, 2 permits stayed held until
// their 60 s TTL; now the count is back to what is in flight (nothing)
// within a probe interval, both by the takes' expiry and, when a take did
// run, by the release journal.
func TestTimedOutTakeLeavesNoPermit(t *testing.T) {
	for _, topo := range []string{"standalone", "cluster"} {
		for _, c := range []struct {
			name     string
			noExpiry bool // only the journal cleans up
		}{{"expiry", false}, {"journal", true}} {
			t.Run(topo+"/"+c.name, func(t *testing.T) { timedOutTake(t, topo == "cluster", c.noExpiry) })
		}
	}
}

// topology starts a standalone server or a 3-master Cluster and returns a
// store on it (timeout 30 ms, probes every 200 ms) and the server that
// holds key of limiter name.
func topology(t *testing.T, cluster bool, name, key string, timeout time.Duration) (*Store, *redistest.Server) {
	t.Helper()
	var addrs []string
	var nodes []*redistest.Server
	if cluster {
		cl := redistest.StartCluster(t, 3)
		addrs, nodes = cl.Addrs, cl.Nodes
	} else {
		srv := redistest.Start(t)
		addrs, nodes = []string{srv.Addr}, []*redistest.Server{srv}
	}
	st, err := New(Options{Addrs: addrs, Timeout: timeout, ProbeEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	if !cluster {
		return st, nodes[0]
	}
	addr := st.breakerFor(st.key(name, key)).addr
	for _, n := range nodes {
		if n.Addr == addr {
			return st, n
		}
	}
	t.Fatalf("no node %s holds %s", addr, key)
	return nil, nil
}

func timedOutTake(t *testing.T, cluster, noExpiry bool) {
	st, srv := topology(t, cluster, "fleet", "svc", 30*time.Millisecond)
	st.noExpiry = noExpiry
	lim, _ := bind(st)(concurrencySpec("fleet", must(limit.NewConcurrency(4)), time.Minute))
	ctx := context.Background()
	// Learn Redis' clock. On a busy host this first call can reach Redis
	// past its 30 ms and do nothing (a host stall, not what is tested):
	// it is set-up, so it is tried again.
	var h store.Handle
	var err error
	for range 20 {
		if _, h, err = lim.Take(ctx, "svc", 0, 1, 0); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	} else if err := lim.Refund(ctx, "svc", h, 0, 1); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Int64
	pause(srv, 80*time.Millisecond, func() {
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, _, err := lim.Take(ctx, "svc", 0, 1, 0); errors.Is(err, store.ErrUnavailable) {
					failed.Add(1)
				}
			}()
		}
		wg.Wait()
	})
	if failed.Load() != 4 {
		t.Fatalf("%d of 4 takes failed during the stall", failed.Load())
	}
	back := time.Now()
	poll.Until(t, 10*time.Second, func() bool {
		p, n := held(t, st, lim, "svc")
		return p == 0 && n == 0 && st.journal.owed() == 0
	})
	t.Logf("no permit held %v after Redis answered again (permit TTL: 1m)", time.Since(back).Round(time.Millisecond))
	if r, _, err := lim.Take(ctx, "svc", 0, 4, 0); err != nil || !r.OK() {
		t.Fatalf("the whole limit is not free again: %+v %v", r, err)
	}
}

// 64 callers acquire and release fleet permits while Redis stalls for
// twice the timeout: once Redis answers again and the callers are done,
// Redis holds no permit (within a probe interval, not the TTL).
func TestStallUnderConcurrentAcquires(t *testing.T) {
	srv := redistest.Start(t)
	const timeout = 20 * time.Millisecond
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: timeout, ProbeEvery: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(concurrencySpec("fleet", must(limit.NewConcurrency(16)), time.Minute))
	ctx := context.Background()
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	// The callers stop however the test ends: a poll below that fails ends
	// it at once, and 64 callers left spinning ran on through the rest of
	// the package until its 10-minute timeout.
	defer func() {
		stop.Store(true)
		wg.Wait()
	}()
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				r, h, err := lim.Take(ctx, "svc", 0, 1, 0)
				if err != nil {
					failed.Add(1)
					continue
				}
				if r.OK() {
					ok.Add(1)
					lim.Refund(ctx, "svc", h, 0, 1)
				}
			}
		}()
	}
	poll.Until(t, 10*time.Second, func() bool { return ok.Load() > 500 })
	pause(srv, 2*timeout, func() {})
	poll.Until(t, 10*time.Second, func() bool { return ok.Load() > 1000 }) // deciding on Redis again
	stop.Store(true)
	wg.Wait()
	back := time.Now()
	poll.Until(t, 10*time.Second, func() bool {
		p, n := held(t, st, lim, "svc")
		return p == 0 && n == 0 && st.journal.owed() == 0
	})
	t.Logf("%d admitted, %d failed; no permit held %v after the callers stopped", ok.Load(), failed.Load(), time.Since(back).Round(time.Millisecond))
}

// A take that Redis reaches after its caller gave up takes nothing: the
// tokens of a bucket stalled under 8 takes are all still there. The store
// has learned Redis' clock from a look that takes nothing (retried: on a
// busy machine the first call to a new Cluster can miss its 20 ms), or,
// fresh, has never had a reply from Redis (which holds the script, as when
// other processes use it): its first calls must not run whenever Redis
// reaches them either. Before, with no expiry to send, the stalled takes
// that were sent all ran once Redis resumed.
func TestLateTakeTakesNothing(t *testing.T) {
	for _, topo := range []string{"standalone", "cluster"} {
		for _, fresh := range []bool{false, true} {
			name := topo
			if fresh {
				name += "/fresh"
			}
			t.Run(name, func(t *testing.T) { lateTake(t, topo == "cluster", fresh) })
		}
	}
}

func lateTake(t *testing.T, cluster, fresh bool) {
	st, srv := topology(t, cluster, "late", "k", 20*time.Millisecond)
	tb := must(limit.NewTokenBucket(must(limit.ParseRate("1/h")), 10))
	lim, _ := bind(st)(tokenBucketSpec("late", tb))
	ctx := context.Background()
	look := func() bool {
		r, _, err := lim.Take(ctx, "k", 0, 0, 0) // cost 0: a look, takes nothing
		return err == nil && r.Status == limit.Invalid
	}
	if fresh {
		st.rc() // connected, with no call yet
		srv.Do("SCRIPT", "LOAD", scriptTexts[tokenBucketScript].src)
		if st.breakerFor(st.key("late", "k")).known.Load() {
			t.Fatal("a fresh store knows Redis' clock")
		}
	} else {
		poll.Until(t, 10*time.Second, look) // learn Redis' clock
	}
	pause(srv, 100*time.Millisecond, func() {
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); lim.Take(ctx, "k", 0, 1, 0) }()
		}
		wg.Wait()
	})
	poll.Until(t, 10*time.Second, look)
	if r, _, err := lim.Take(ctx, "k", 0, 10, 0); err != nil || !r.OK() {
		t.Fatalf("takes that reached Redis after their timeout took tokens: %+v %v", r, err)
	}
}

// A store made while Redis is down starts (answering ErrUnavailable, so
// the gates decide by their failure policies) and decides on Redis once it
// is up, within a probe interval.
func TestStartWithRedisDown(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill()
	st, err := New(Options{Addrs: []string{srv.Addr}, ProbeEvery: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with Redis down: %v", err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("down", must(limit.NewTokenBucket(limit.PerSecond(10), 10))))
	ctx := context.Background()
	if _, _, err := lim.Take(ctx, "k", 0, 1, 0); !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Redis down: %v", err)
	}
	srv.Restart()
	back := time.Now()
	poll.Until(t, 10*time.Second, func() bool {
		_, _, err := lim.Take(ctx, "k", 0, 1, 0)
		return err == nil
	})
	t.Logf("deciding on Redis %v after it started", time.Since(back).Round(time.Millisecond))
}

// A call that only times out while the node still answers a PING (a slow
// moment, a busy host) fails that decision alone: the breaker stays
// closed. A node that answers nothing opens it.
func TestTimeoutAloneDoesNotOpenBreaker(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 10 * time.Millisecond, ProbeEvery: 100 * time.Millisecond, Batch: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	lim, _ := bind(st)(tokenBucketSpec("slow", must(limit.NewTokenBucket(limit.PerSecond(1000), 1000))))
	ctx := context.Background()
	lim.Take(ctx, "k", 0, 1, 0)
	// A 20 ms stall: the call times out, the PING (up to 100 ms) answers.
	// On a busy machine the PING can miss its 100 ms too (this process or
	// the resumed Redis not run in time): then the breaker rightly opens,
	// so the stall is tried again once it has closed, up to 5 times.
	for try := 1; ; try++ {
		pause(srv, 20*time.Millisecond, func() {
			if _, _, err := lim.Take(ctx, "k", 0, 1, 0); !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("a call during the stall: %v", err)
			}
		})
		poll.Until(t, 10*time.Second, func() bool { return !st.breaker.probing.Load() })
		if !st.breaker.open.Load() {
			break
		}
		if try == 5 {
			t.Fatal("one timeout opened the breaker although Redis answered the check (5 tries)")
		}
		t.Logf("try %d: the check's PING went unanswered for 100 ms; trying again", try)
		poll.Until(t, 10*time.Second, func() bool {
			lim.Take(ctx, "k", 0, 1, 0) // a call once the interval passed starts the probe that closes it
			return !st.breaker.open.Load()
		})
	}
	// A 1 s stall: the check fails too, and the breaker opens.
	pause(srv, time.Second, func() {
		lim.Take(ctx, "k", 0, 1, 0)
		poll.Until(t, 10*time.Second, func() bool { return !st.breaker.probing.Load() })
		if !st.breaker.open.Load() {
			t.Error("Redis answered nothing, yet the breaker stayed closed")
		}
	})
}
