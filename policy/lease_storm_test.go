package policy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/lease"
)

// A reload storm on one process of a fleet: a changed policy (its retry
// hint, so the leased gates are built anew over the same budgets) applied
// every 50 ms, 20 a second, with no coalescing (the servers coalesce
// SIGHUPs to one a second; this is the allocator's own bound), while both
// processes of the fleet take all they can. Before reloads handed leases
// over, such a storm took a fleet to 1.46 times its rate budget and 1.6
// times its concurrency budget. The bounds of the lease package hold
// throughout: at most C·(T + B) admitted in any window T (C the rate, B
// the bucket's time), and never more than C in flight; and the storm
// starves nobody (a new holder per reload admitted nothing at all).
func TestReloadStormKeepsTheLeaseBounds(t *testing.T) {
	if testing.Short() {
		t.Skip("a 3 s storm")
	}
	const (
		rate   = 200 // per second: well below what the takers ask, even on a busy host
		burst  = 20  // B = 100 ms
		limit  = 4   // in flight
		window = time.Second
		slot   = 50 * time.Millisecond // the counting slots
		storm  = 3 * time.Second
	)
	src := func(hint int) *File {
		f, err := Parse("p.yaml", fmt.Appendf(nil, `version: 1
gates:
  - {name: api, kind: token_bucket, scope: service, rate: %d/s, burst: %d, retry_hint: %dms, lease: {time: 1s, refresh: 100ms}}
  - {name: pool, kind: concurrency, scope: service, limit: %d, retry_hint: %dms, lease: {time: 1s, refresh: 100ms}}
`, rate, burst, 100+hint%2, limit, 100+hint%2))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	shared := &lease.Local{}
	var chains [2]atomic.Pointer[sluice.Chain]
	var rts [2]*Runtime
	for i, client := range []string{"a", "b"} {
		rt, err := Build(src(0), nil, Options{Leaser: shared, LeaseClient: client})
		if err != nil {
			t.Fatal(err)
		}
		rts[i] = rt
		chains[i].Store(rt.Chain)
	}
	defer func() {
		for _, rt := range rts {
			rt.Close()
		}
	}()

	start := time.Now()
	slots := make([]atomic.Int64, int(storm/slot)+40) // admitted per slot, with room for the end
	var inFlight, most atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for p := range 2 {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					d, tk := chains[p].Load().Decide(context.Background(), &sluice.Request{})
					if !d.Admitted {
						time.Sleep(time.Millisecond)
						continue
					}
					if i := int(time.Since(start) / slot); i < len(slots) {
						slots[i].Add(1)
					}
					n := inFlight.Add(1)
					for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
					}
					time.Sleep(2 * time.Millisecond)
					inFlight.Add(-1) // before the slot is given back
					tk.Done(sluice.OutcomeUseful)
				}
			}()
		}
	}
	reloads := 0
	for tick := time.NewTicker(50 * time.Millisecond); time.Since(start) < storm; <-tick.C {
		reloads++
		rt, err := Build(src(reloads), rts[0], Options{Leaser: shared, LeaseClient: "a"})
		if err != nil {
			t.Fatal(err)
		}
		rts[0] = rt
		chains[0].Store(rt.Chain)
	}
	close(stop)
	wg.Wait()

	per := int(window / slot)
	worst, total := int64(0), int64(0)
	for i := range slots {
		total += slots[i].Load()
		var sum int64
		for j := i; j < i+per && j < len(slots); j++ {
			sum += slots[j].Load()
		}
		worst = max(worst, sum)
	}
	bound := int64(rate * (window + burst*time.Second/rate).Seconds())
	t.Logf("%d reloads in %v: %d admitted, at most %d in any %v (bound %d), at most %d in flight (limit %d)",
		reloads, storm, total, worst, window, bound, most.Load(), limit)
	if worst > bound {
		t.Errorf("%d admitted in a window of %v, above C·(T+B) = %d", worst, window, bound)
	}
	if floor := int64(rate * storm.Seconds() / 4); total < floor {
		// the bound kept by admitting nothing: a storm that starves the fleet
		t.Errorf("%d admitted in %v of a %d/s budget, below a quarter of it (%d)", total, storm, rate, floor)
	}
	if m := most.Load(); m > limit {
		t.Errorf("%d in flight, above the leased limit of %d", m, limit)
	}
}
