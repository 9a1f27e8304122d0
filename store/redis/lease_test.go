package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/store"
)

// leaseStore is a store on a fresh local Redis, closed with the test.
func leaseStore(t *testing.T) *Store {
	t.Helper()
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

// The Redis twin of the lease allocator computes what its Go step does, on
// the same requests at the same instants: grants, expiries and learning,
// through random refreshes, releases, lapses and a lost state.
func TestLeaseTwinMatchesTheStep(t *testing.T) {
	st := leaseStore(t)
	ctx := context.Background()
	n := 0
	rapid.Check(t, func(t *rapid.T) {
		n++
		budget := fmt.Sprint("twin-", n)
		a := lease.Allocator{Capacity: rapid.Int64Range(1, 1<<40).Draw(t, "capacity"),
			Lease: time.Duration(rapid.Int64Range(1, 10_000_000).Draw(t, "leaseUs")) * time.Microsecond}
		var state lease.State
		nowUS := rapid.Int64Range(1, 1<<50).Draw(t, "t0")
		for i, steps := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < steps; i++ {
			// any gaps: the twin's hash lives 10 minutes of real time past its last call
			nowUS += rapid.Int64Range(0, 2*a.Lease.Microseconds()-1).Draw(t, "gapUs")
			r := lease.Request{Client: fmt.Sprint("c", rapid.IntRange(0, 4).Draw(t, "client")),
				Wants: rapid.Int64Range(0, 2*a.Capacity).Draw(t, "wants"), Has: rapid.Int64Range(0, 2*a.Capacity).Draw(t, "has"),
				InUse:   rapid.Int64Range(0, 2*a.Capacity).Draw(t, "inuse") * int64(rapid.IntRange(0, 1).Draw(t, "concurrency")),
				Release: rapid.IntRange(0, 7).Draw(t, "release") == 0}
			want := a.Step(&state, r, clock.Instant(nowUS*1000))
			got, expiry, err := st.leaseAt(ctx, budget, a, r, nowUS)
			if err != nil {
				t.Fatal(err)
			}
			if got.Has != want.Has || got.Learning != want.Learning || (!r.Release && got.Safe != want.Safe) || (!r.Release && got.Clients != want.Clients) || (!r.Release && expiry*1000 != int64(want.Expiry)) ||
				(!r.Release && got.Refresh.Truncate(time.Microsecond) != want.Refresh.Truncate(time.Microsecond)) {
				t.Fatalf("step %d %+v: Redis %+v (expiry %d us), Go %+v", i, r, got, expiry, want)
			}
		}
	})
}

// A Redis restarted empty does not hand the budget out twice: holders
// report what they hold, a newcomer gets nothing until the learning period
// ends, and the grants never sum above the capacity.
func TestLeaseAfterRedisRestart(t *testing.T) {
	st := leaseStore(t)
	ctx := context.Background()
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	t0 := int64(1_000_000_000)
	for _, c := range []string{"a", "b"} { // learning: the first call's
		st.leaseAt(ctx, "b1", a, lease.Request{Client: c, Wants: 100}, t0)
	}
	after := t0 + 11_000_000
	ga, _, _ := st.leaseAt(ctx, "b1", a, lease.Request{Client: "a", Wants: 100}, after)
	gb, _, _ := st.leaseAt(ctx, "b1", a, lease.Request{Client: "b", Wants: 100}, after+1)
	ga, _, _ = st.leaseAt(ctx, "b1", a, lease.Request{Client: "a", Wants: 100, Has: ga.Has}, after+2) // shrinks to its share
	gb, _, _ = st.leaseAt(ctx, "b1", a, lease.Request{Client: "b", Wants: 100, Has: gb.Has}, after+3) // and b takes it
	if ga.Has != 50 || gb.Has != 50 {
		t.Fatalf("after learning: a %d, b %d; want 50 and 50", ga.Has, gb.Has)
	}
	if err := st.rc().Do(ctx, st.rc().B().Flushall().Build()).Error(); err != nil { // the state is lost
		t.Fatal(err)
	}
	now := after + 1_000_000
	g, _, _ := st.leaseAt(ctx, "b1", a, lease.Request{Client: "new", Wants: 100}, now)
	if g.Has != 0 || !g.Learning {
		t.Fatalf("a newcomer right after the restart: %+v, want 0 while learning", g)
	}
	ga, _, _ = st.leaseAt(ctx, "b1", a, lease.Request{Client: "a", Wants: 100, Has: 50}, now+1)
	gb, _, _ = st.leaseAt(ctx, "b1", a, lease.Request{Client: "b", Wants: 100, Has: 50}, now+2)
	if ga.Has != 50 || gb.Has != 50 {
		t.Fatalf("holders after the restart: a %d, b %d; want their 50 confirmed", ga.Has, gb.Has)
	}
}

// A lease step that failed before the store's timeout (here the caller's
// own context ended; a broken connection does the same) may still run on
// Redis until that timeout: the client's next step is not sent before,
// so it cannot be overwritten by the old one. Redis is stopped while the
// first step is sent, and runs it once it resumes, within the timeout.
func TestLeaseStepWaitsForTheFailedOne(t *testing.T) {
	srv := redistest.Start(t)
	st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	a := lease.Allocator{Capacity: 1000, Lease: 10 * time.Second}
	bg := context.Background()
	if _, err := st.Lease(bg, "b", a, lease.Request{Client: "other", Wants: 1}); err != nil { // learn Redis' clock
		t.Fatal(err)
	}
	srv.Pause()
	ctx, cancel := context.WithTimeout(bg, 20*time.Millisecond)
	_, err = st.Lease(ctx, "b", a, lease.Request{Client: "c", Wants: 700})
	cancel()
	if err == nil {
		srv.Resume()
		t.Fatal("a step answered while Redis was stopped")
	}
	_, err = st.Lease(bg, "b", a, lease.Request{Client: "c", Wants: 300})
	srv.Resume()
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "may still run") {
		t.Fatalf("the next step while the failed one may still run: %v", err)
	}
	if _, err := st.Lease(bg, "b", a, lease.Request{Client: "other", Wants: 1}); err != nil {
		t.Fatalf("another client's step: %v", err) // not held back
	}
	poll.Until(t, 10*time.Second, func() bool {
		_, err := st.Lease(bg, "b", a, lease.Request{Client: "c", Wants: 300})
		return err == nil
	})
	if f := strings.Fields(srv.Do("HGET", st.key("lease", "b"), "c:c")); len(f) < 2 || f[1] != "300" {
		t.Errorf("c's holding after its newer step: %q, want 300 wanted", f)
	}
}

// Redis' clock set a minute ahead while two holders still spend their
// leases: the first of them to refresh starts the allocator learning, and
// both are confirmed, not granted anew (the twin of the Go step's test).
func TestLeaseLearnsAfterRedisClockStepsForward(t *testing.T) {
	st := leaseStore(t)
	ctx := context.Background()
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	t0 := int64(1_000_000_000)
	st.leaseAt(ctx, "jump", a, lease.Request{Client: "a", Wants: 60}, t0) // learning begins
	t1 := t0 + a.Lease.Microseconds()
	ga, _, _ := st.leaseAt(ctx, "jump", a, lease.Request{Client: "a", Wants: 60}, t1)
	gb, _, _ := st.leaseAt(ctx, "jump", a, lease.Request{Client: "b", Wants: 60}, t1)
	if ga.Has != 60 || gb.Has != 40 {
		t.Fatalf("before the step: a %+v, b %+v, want 60 and 40", ga, gb)
	}
	t2 := t1 + time.Minute.Microseconds()
	ga, _, _ = st.leaseAt(ctx, "jump", a, lease.Request{Client: "a", Wants: 100, Has: 60}, t2)
	gb, _, _ = st.leaseAt(ctx, "jump", a, lease.Request{Client: "b", Wants: 100, Has: 40}, t2)
	if !ga.Learning || ga.Has != 60 || gb.Has != 40 {
		t.Fatalf("after Redis' clock stepped: a %+v, b %+v, want 60 and 40 confirmed while learning", ga, gb)
	}
}
