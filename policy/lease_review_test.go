package policy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/poll"
	"github.com/sluice-go/sluice/lease"
)

// A reload that changes a leased concurrency gate (here its retry hint, so
// the gate is built anew over the same state key) must not open a fresh
// budget: the old gate's requests still in flight hold their slots, as
// they do for a concurrency gate without a lease: on the memory backend,
// and on an allocator the fleet shares (Options.Leaser, as the Redis
// store's), where the old gate drains under the same client name as the
// new one.
func TestLeaseReloadKeepsSlotsInFlight(t *testing.T) {
	for _, c := range []struct {
		leased bool
		leaser lease.Leaser
	}{{false, nil}, {true, nil}, {true, &lease.Local{}}} {
		leased := c.leased
		src := func(hint string) []byte {
			l := ""
			if leased {
				l = ", lease: {time: 300ms, refresh: 50ms}"
			}
			return []byte(`version: 1
gates:
  - {name: pool, kind: concurrency, scope: service, limit: 2, retry_hint: ` + hint + l + `}
`)
		}
		f1, err := Parse("p.yaml", src("100ms"))
		if err != nil {
			t.Fatal(err)
		}
		opts := Options{Leaser: c.leaser}
		rt1, err := Build(f1, nil, opts)
		if err != nil {
			t.Fatal(err)
		}
		if leased {
			poll.Until(t, 5*time.Second, func() bool {
				g, _ := sluice.As[*lease.Concurrency](rt1.Chain.Gates()[0])
				lim, _ := g.ConcurrencyLimit()
				return lim == 2
			})
		}
		var held []sluice.Ticket
		for range 2 {
			if d, tk := rt1.Chain.Decide(context.Background(), &sluice.Request{}); d.Admitted {
				held = append(held, tk)
			}
		}
		if len(held) != 2 {
			t.Fatalf("leased %v, shared %v: the first build admitted %d of 2", leased, c.leaser != nil, len(held))
		}
		f2, err := Parse("p.yaml", src("200ms"))
		if err != nil {
			t.Fatal(err)
		}
		rt2, err := Build(f2, rt1, opts)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // a few refreshes of the new gate's lease
		for range 2 {
			if d, tk := rt2.Chain.Decide(context.Background(), &sluice.Request{}); d.Admitted {
				held = append(held, tk)
			}
		}
		if len(held) > 2 {
			t.Errorf("leased %v, shared %v: %d in flight on a limit of 2 after a reload that changed the retry hint", leased, c.leaser != nil, len(held))
		}
		for _, tk := range held {
			tk.Done(sluice.OutcomeUseful)
		}
		rt2.Close()
	}
}

// releaseLate is a shared allocator (Options.Leaser) on which a lease given
// back (a gate stopped by a reload) arrives after the first refresh of the
// gate that replaced it: the order the runtime's goroutines usually run in,
// since Build starts the new gate's loop before it stops the old one's.
type releaseLate struct {
	lease.Local
	mu    sync.Mutex
	taken chan struct{} // closed by the first refresh after a release began
	once  bool          // only the first release waits
}

func (r *releaseLate) Lease(ctx context.Context, budget string, a lease.Allocator, q lease.Request) (lease.Grant, error) {
	r.mu.Lock()
	first := !r.once && (q.Release || (q.Wants == 0 && q.InUse > 0))
	r.mu.Unlock()
	if first {
		r.mu.Lock()
		r.once = true
		r.taken = make(chan struct{})
		ch := r.taken
		r.mu.Unlock()
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
		}
	} else {
		r.mu.Lock()
		if r.taken != nil {
			close(r.taken)
			r.taken = nil
		}
		r.mu.Unlock()
	}
	return r.Local.Lease(ctx, budget, a, q)
}

// A reload that rebuilds a leased gate: the old gate gives its lease back
// after the new one, in the same process, took its first grant. The new
// gate's grant must stay counted by the allocator, or another process is
// granted it too and the grants sum above the budget.
func TestLeaseReloadKeepsTheNewGatesGrantCounted(t *testing.T) {
	l := &releaseLate{}
	src := func(mode string) []byte {
		return []byte(`version: 1
gates:
  - {name: api, kind: token_bucket, scope: service, rate: 1000/s, burst: 100, lease: {time: 1s, refresh: 250ms, on_failure: ` + mode + `}}
`)
	}
	opts := Options{Leaser: l, LeaseClient: "this"}
	f1, err := Parse("p.yaml", src("safe"))
	if err != nil {
		t.Fatal(err)
	}
	rt1, err := Build(f1, nil, opts)
	if err != nil {
		t.Fatal(err)
	}
	status := func(rt *Runtime) sluice.LeaseStatus {
		g, _ := sluice.As[*lease.Gate](rt.Chain.Gates()[0])
		return g.Lease(rt.Chain.Clock().Now())
	}
	poll.Until(t, 5*time.Second, func() bool { // past learning
		g, _ := sluice.As[*lease.Gate](rt1.Chain.Gates()[0])
		st := g.ReportState(rt1.Chain.Clock().Now()).(lease.GateState)
		return st.Live && !st.Learning
	})
	f2, err := Parse("p.yaml", src("closed"))
	if err != nil {
		t.Fatal(err)
	}
	rt2, err := Build(f2, rt1, opts) // the old gate's loop has ended when it returns
	if err != nil {
		t.Fatal(err)
	}
	defer rt2.Close()
	poll.Until(t, 5*time.Second, func() bool { return status(rt2).Live })
	// another process of the fleet asks for the whole budget
	alloc := lease.Allocator{Capacity: 1000, Lease: time.Second, Refresh: 250 * time.Millisecond}
	other, err := l.Local.Lease(context.Background(), "api", alloc, lease.Request{Client: "other", Wants: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if mine := status(rt2).Granted; mine+other.Has > 1000 {
		t.Fatalf("the new gate spends a live grant of %d and the allocator grants another process %d of a budget of 1000", mine, other.Has)
	}
}
