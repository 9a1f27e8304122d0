package redis

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/limit"
)

// heldLanes returns how many lanes st's connection holds, and how many of
// them are idle.
func heldLanes(st *Store) (held, idle int) {
	cn := st.conn.Load()
	cn.lanes.mu.Lock()
	defer cn.lanes.mu.Unlock()
	return cn.lanes.held, len(cn.lanes.idle)
}

// Calls on a standalone server open lanes in the background, then go out on
// them with the same answers; a PING goes the same way; a lane whose call
// broke is closed with every idle one, and new ones open; Close gives every
// lane back (goleak in TestMain checks nothing is left running).
func TestLanesCarryCalls(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	tb := must(limit.NewTokenBucket(must(limit.NewRate(1, time.Hour)), 1000)) // no refill during the test
	lim := st.Limiter(must(TokenBucket("lanes", tb)))
	ctx := context.Background()
	taken := int64(0)
	take := func() {
		t.Helper()
		r, _, err := lim.Take(ctx, "k", 0, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		taken++
		if r.Remaining != 1000-taken {
			t.Fatalf("take %d: remaining %d, want %d", taken, r.Remaining, 1000-taken)
		}
	}
	// Concurrent callers open up to maxLanes lanes, never more.
	var wg sync.WaitGroup
	var mu sync.Mutex
	for range 2 * maxLanes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				mu.Lock()
				take()
				mu.Unlock()
				if err := st.Ping(ctx); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	poll.Until(t, 10*time.Second, func() bool { held, _ := heldLanes(st); return held > 0 })
	take()
	if held, _ := heldLanes(st); held > maxLanes {
		t.Fatalf("%d lanes held, at most %d", held, maxLanes)
	}

	// Every connection killed: the lane that carries the next call fails,
	// and it and the idle ones are closed; then calls resume and lanes
	// open again.
	cn := st.conn.Load()
	l := cn.lanes.get(cn.client, st.opts.Timeout)
	if l == nil {
		t.Fatal("no idle lane")
	}
	if err := cn.client.Do(ctx, cn.client.B().ClientKill().TypeNormal().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	r := l.eval(ctx, tokenBucketScript, []string{st.key("lanes", "other")}, lim.(*limiter).args("take", 1, "0"))
	if r.NonRedisError() == nil {
		t.Fatal("a call on a killed connection did not fail")
	}
	cn.lanes.put(l, r.NonRedisError())
	if held, idle := heldLanes(st); idle != 0 {
		t.Fatalf("after a failed lane: %d held, %d idle, want none idle", held, idle)
	}
	poll.Until(t, 10*time.Second, func() bool {
		_, _, err := lim.Take(ctx, "k", 0, 0, 0) // cost 0: answers without taking
		held, _ := heldLanes(st)
		return err == nil && held > 0
	})
	take()

	st.Close()
	if held, idle := heldLanes(st); held != 0 || idle != 0 {
		t.Fatalf("after Close: %d lanes held, %d idle", held, idle)
	}
	if l := cn.lanes.get(cn.client, st.opts.Timeout); l != nil {
		t.Fatal("a closed store handed out a lane")
	}
}

// A store on the caller's client gives its lanes back to that client on
// Close and leaves the client open.
func TestLanesOfCallersClient(t *testing.T) {
	srv := redistest.Start(t)
	own, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	st, err := New(Options{Client: own.rc(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	poll.Until(t, 10*time.Second, func() bool {
		if err := st.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		held, _ := heldLanes(st)
		return held > 0
	})
	st.Close()
	if held, _ := heldLanes(st); held != 0 {
		t.Fatalf("after Close: %d lanes held", held)
	}
	if err := own.Ping(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("the caller's client after Close: %v", err)
	}
}
