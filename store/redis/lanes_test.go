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
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: connWriteTimeout / 2}) // and as much grace
	if err != nil {
		t.Fatal(err)
	}
	tb := must(limit.NewTokenBucket(must(limit.NewRate(1, time.Hour)), 1000)) // no refill during the test
	lim := st.Limiter(must(tokenBucketSpec("lanes", tb)))
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

// No lanes where a dedicated connection could cut a call short or go to
// the wrong node: a store on the caller's client (whose write timeout it
// does not know), a store whose timeout and grace for late replies are
// beyond the client's write timeout together (rueidis gives up on a
// dedicated reply after it: such a call failed as a broken connection in a
// 3-process test with a 2 s timeout), and a Cluster. Their calls and PINGs go through the pipelined client.
func TestNoLanes(t *testing.T) {
	srv := redistest.Start(t)
	own, err := New(Options{Addrs: []string{srv.Addr}, Timeout: connWriteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	callers, err := New(Options{Client: own.rc(), Timeout: connWriteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	long, err := New(Options{Addrs: []string{srv.Addr}, Timeout: connWriteTimeout/2 + time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Close()
	cl, err := New(Options{Addrs: redistest.StartCluster(t, 3).Addrs, Timeout: connWriteTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	tb := must(limit.NewTokenBucket(limit.PerSecond(1000), 1000))
	ctx := context.Background()
	for name, st := range map[string]*Store{"caller's client": callers, "long timeout": long, "cluster": cl} {
		lim := st.Limiter(must(tokenBucketSpec("nolanes", tb)))
		for range 50 {
			if _, _, err := lim.Take(ctx, "k", 0, 1, 0); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := st.Ping(ctx); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
		}
		st.conn.Load().lanes.wg.Wait() // an open under way, if any, has ended
		if held, _ := heldLanes(st); held != 0 {
			t.Fatalf("%s: %d lanes held", name, held)
		}
	}
	callers.Close()
	if err := own.Ping(ctx); err != nil {
		t.Fatalf("the caller's client after Close: %v", err)
	}
}

func TestLaneContext(t *testing.T) {
	now := time.Now()
	// The earlier of the two deadlines wins.
	if dl, ok := laneContext(context.Background(), now.Add(time.Second)).Deadline(); !ok || !dl.Equal(now.Add(time.Second)) {
		t.Fatalf("deadline %v, %v", dl, ok)
	}
	parent, cancel := context.WithDeadline(context.Background(), now.Add(time.Millisecond))
	defer cancel()
	if dl, _ := laneContext(parent, now.Add(time.Hour)).Deadline(); !dl.Equal(now.Add(time.Millisecond)) {
		t.Fatalf("the caller's earlier deadline was lost: %v", dl)
	}
	// No timer: Done is the caller's (nil for Background), and Err reads the
	// deadline itself.
	if c := laneContext(context.Background(), now.Add(time.Hour)); c.Done() != nil || c.Err() != nil {
		t.Fatalf("Done %v, Err %v", c.Done(), c.Err())
	}
	if err := laneContext(context.Background(), now.Add(-time.Nanosecond)).Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past deadline: Err %v", err)
	}
	gone, stop := context.WithCancel(context.Background())
	stop()
	if c := laneContext(gone, now.Add(time.Hour)); c.Done() != gone.Done() || !errors.Is(c.Err(), context.Canceled) {
		t.Fatalf("the caller's cancellation was lost: %v", c.Err())
	}
}
