package redis

import (
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/lease"
)

// A holding written by the previous version of the script ("has wants
// expiry spare", before concurrency leases added "inuse") is a live grant
// of a process not yet upgraded (a rolling upgrade shares the hash). The
// script must count it, not delete it as foreign: else a new process is
// granted what the old one still spends, and the grants sum above the
// capacity.
func TestLeaseCountsAnOldFormatHolding(t *testing.T) {
	st := leaseStore(t)
	ctx := context.Background()
	a := lease.Allocator{Capacity: 1000, Lease: 10 * time.Second}
	t0 := int64(1_000_000_000_000)
	st.leaseAt(ctx, "old", a, lease.Request{Client: "x", Release: true}, t0) // the budget exists (learning from t0)
	now := t0 + 11_000_000                                                   // past learning
	key := st.key("lease", "old")
	// the old process holds 600 until now + 5 s, in the old format
	if err := st.rc().Do(ctx, st.rc().B().Hset().Key(key).FieldValue().FieldValue("c:old", "600 600 "+strconv.FormatInt(now+5_000_000, 10)+" 0").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	g, _, err := st.leaseAt(ctx, "old", a, lease.Request{Client: "new", Wants: 1000}, now)
	if err != nil {
		t.Fatal(err)
	}
	if g.Has > 400 {
		t.Fatalf("granted %d beside an old-format holding of 600 (capacity 1000)", g.Has)
	}
}

// slowReplies is a TCP proxy to addr that holds every reply for delay
// while slow is set: Redis runs each script at once, the caller learns of
// it delay later.
func slowReplies(t *testing.T, addr string, delay time.Duration, slow *atomic.Bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go io.Copy(s, c)
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 {
						if slow.Load() {
							time.Sleep(delay)
						}
						if _, err := c.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// The grant's expiry on the caller's clock is at most one lease time after
// the call was sent (Redis ran the step after that): the allocator drops
// the holding one lease time after it ran the step, so a lease the caller
// dates from the reply outlives the holding by the reply's latency, and
// another process can be granted it meanwhile.
func TestLeaseExpiryDatesFromTheCall(t *testing.T) {
	srv := redistest.Start(t)
	// Replies late by three times the bound checked below (20 ms; the
	// expiry dates from the call, so it is exact), and by well under the
	// client's 200 ms connection deadline even when two chunks of one reply
	// are each delayed (at 100 and 150 ms, that passed it).
	const delay = 60 * time.Millisecond
	var slow atomic.Bool
	st, err := New(Options{Addrs: []string{slowReplies(t, srv.Addr, delay, &slow)}, Timeout: 5 * time.Second, ProbeEvery: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx := context.Background()
	a := lease.Allocator{Capacity: 1000, Lease: 10 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; { // connected, the script loaded
		if _, err := st.Lease(ctx, "expiry", a, lease.Request{Client: "warm", Wants: 1}); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	slow.Store(true)
	sent := clock.Now()
	g, err := st.Lease(ctx, "expiry", a, lease.Request{Client: "c", Wants: 10})
	if err != nil {
		t.Fatal(err)
	}
	if over := g.Expiry.Sub(sent) - a.Lease; over > 20*time.Millisecond {
		t.Fatalf("the grant expires %v past one lease time from the call (replies %v late): it outlives the allocator's holding", over, delay)
	}
}

// The twin agrees with the Go step near MaxCapacity too (sums of up to
// eight holdings of 2^50 units), and on client names that sort differently
// by case, digits and punctuation.
func TestLeaseTwinMatchesTheStepNearMaxCapacity(t *testing.T) {
	st := leaseStore(t)
	ctx := context.Background()
	names := []string{"a", "B", "a-1", "a1", "Z_", "z", "é", "A"}
	n := 0
	rapid.Check(t, func(t *rapid.T) {
		n++
		budget := fmt.Sprint("twin-max-", n)
		a := lease.Allocator{Capacity: rapid.Int64Range(leasealloc.MaxCapacity-1000, leasealloc.MaxCapacity).Draw(t, "capacity"),
			Lease: time.Duration(rapid.Int64Range(1, 10_000_000).Draw(t, "leaseUs")) * time.Microsecond}
		var state lease.State
		nowUS := rapid.Int64Range(1, 1<<50).Draw(t, "t0")
		for i, steps := 0, rapid.IntRange(1, 40).Draw(t, "steps"); i < steps; i++ {
			nowUS += rapid.Int64Range(0, a.Lease.Microseconds()).Draw(t, "gapUs")
			units := func(label string) int64 {
				return rapid.OneOf(rapid.Int64Range(0, 3), rapid.Int64Range(a.Capacity/8-3, a.Capacity/8+3),
					rapid.Int64Range(a.Capacity-3, a.Capacity+3)).Draw(t, label)
			}
			r := lease.Request{Client: names[rapid.IntRange(0, len(names)-1).Draw(t, "client")],
				Wants: units("wants"), Has: units("has"), InUse: units("inuse") * int64(rapid.IntRange(0, 1).Draw(t, "concurrency")),
				Release: rapid.IntRange(0, 9).Draw(t, "release") == 0}
			want := a.Step(&state, r, clock.Instant(nowUS*1000))
			got, expiry, err := st.leaseAt(ctx, budget, a, r, nowUS)
			if err != nil {
				t.Fatal(err)
			}
			if got.Has != want.Has || got.Learning != want.Learning || (!r.Release && (got.Safe != want.Safe || got.Clients != want.Clients || expiry*1000 != int64(want.Expiry))) {
				t.Fatalf("step %d %+v: Redis %+v (expiry %d us), Go %+v", i, r, got, expiry, want)
			}
		}
	})
}

// Redis sets LC_COLLATE from its environment, and its Lua compares strings
// with strcoll: on a server started in a UTF-8 locale such as en_US, "a"
// sorts before "B". The Go step orders clients by bytes, so the units a
// max-min round leaves over went to different clients on such a server.
func TestLeaseTwinOrdersClientsByBytesInAnyLocale(t *testing.T) {
	if _, err := exec.LookPath("localedef"); err != nil {
		t.Skip("localedef not installed")
	}
	dir := t.TempDir()
	if out, err := exec.Command("localedef", "-i", "en_US", "-f", "UTF-8", filepath.Join(dir, "en_US.UTF-8")).CombinedOutput(); err != nil {
		t.Skipf("cannot build the en_US.UTF-8 locale: %v %s", err, out)
	}
	t.Setenv("LOCPATH", dir)
	t.Setenv("LC_ALL", "en_US.UTF-8")
	st := leaseStore(t)
	ctx := context.Background()
	a := lease.Allocator{Capacity: 3, Lease: 10 * time.Second}
	t0 := int64(1_000_000_000_000)
	var state lease.State
	for i, r := range []lease.Request{
		{Client: "x", Release: true},    // the budget starts learning
		{Client: "a", Wants: 2},         // past learning (below)
		{Client: "B", Wants: 2},         // max-min of 3 over two wants of 2: one unit left over, to the first client
		{Client: "a", Wants: 2, Has: 1}, // a's share now
	} {
		now := t0
		if i > 0 {
			now = t0 + 11_000_000 + int64(i)
		}
		want := a.Step(&state, r, clock.Instant(now*1000))
		got, _, err := st.leaseAt(ctx, "order", a, r, now)
		if err != nil {
			t.Fatal(err)
		}
		if got.Has != want.Has {
			t.Fatalf("step %d %+v: Redis granted %d, the Go step %d", i, r, got.Has, want.Has)
		}
	}
}
