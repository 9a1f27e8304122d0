package redis

import (
	"context"
	"io"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
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
	const delay = 150 * time.Millisecond // below the client's 200 ms connection deadline
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
	if over := g.Expiry.Sub(sent) - a.Lease; over > 50*time.Millisecond {
		t.Fatalf("the grant expires %v past one lease time from the call (replies %v late): it outlives the allocator's holding", over, delay)
	}
}
