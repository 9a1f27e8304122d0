package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/fakeclock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/redistest"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/store"
)

// clockedLeaser runs a store's lease steps at a fake clock's now (Redis'
// own TIME overridden), so a fleet can be driven millisecond by
// millisecond against a real Redis.
type clockedLeaser struct {
	st   *Store
	clk  *fakeclock.Clock
	down *bool // while set, the allocator is unreachable
}

func (l clockedLeaser) Lease(ctx context.Context, budget string, a lease.Allocator, r lease.Request) (lease.Grant, error) {
	if *l.down {
		return lease.Grant{}, store.ErrUnavailable
	}
	g, expiry, err := l.st.leaseAt(ctx, budget, a, r, int64(l.clk.Now())/1000)
	if err == nil && !r.Release {
		g.Expiry = clock.Instant(expiry * 1000)
	}
	return g, err
}

// process is one simulated process of the fleet: its own store
// connection, its lease gate and its offered load.
type process struct {
	gate    *lease.Gate
	rate    int   // requests/s offered
	next    int64 // its next refresh, ns
	stopped bool
}

// The acceptance run on one real Redis: four processes, each with its own
// connection, offering 12k, 9k, 6k and 3k requests/s (3x a global limit of
// 10,000/s) for 10 s, leases of 1 s refreshed every 250 ms: every second
// after the first admits within [0.97, 1.01] x the limit. Then one process
// stops (without giving its lease back): within one lease time the others
// take its share. Then a new process arrives: it has its fair share within
// one refresh interval of its first request.
func TestLeaseFleetOnRedis(t *testing.T) {
	srv := redistest.Start(t)
	clk := fakeclock.New(int64(1000 * time.Second))
	a := lease.Allocator{Capacity: 10000, Lease: time.Second, Refresh: 250 * time.Millisecond}
	ctx := context.Background()
	down := false
	var stores []*Store
	newProcess := func(i, rate int) *process {
		st, err := New(Options{Addrs: []string{srv.Addr}, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		stores = append(stores, st)
		t.Cleanup(st.Close)
		g, err := lease.NewGate("fleet-rate", lease.GateOptions{Budget: "api", Client: fmt.Sprint("process-", i), Allocator: a,
			Leaser: clockedLeaser{st, clk, &down}, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return &process{gate: g, rate: rate, next: int64(clk.Now()) + int64(i)*int64(a.Refresh)/4}
	}
	ps := []*process{newProcess(0, 12000), newProcess(1, 9000), newProcess(2, 6000), newProcess(3, 3000)}
	// run drives the fleet for d and returns the requests admitted in each
	// second, in all and by process.
	run := func(d time.Duration) (total []int, each [][]int) {
		start := int64(clk.Now())
		secs := int((d + time.Second - 1) / time.Second)
		total, each = make([]int, secs), make([][]int, len(ps))
		for i := range each {
			each[i] = make([]int, secs)
		}
		for ms := 0; ms < int(d/time.Millisecond); ms++ {
			now := clock.Instant(start + int64(ms)*int64(time.Millisecond))
			clk.Set(int64(now))
			for i, p := range ps {
				if p.stopped {
					continue
				}
				if int64(now) >= p.next {
					wait, err := p.gate.Refresh(ctx)
					if err != nil && !down {
						t.Fatalf("refresh: %v", err)
					}
					p.next = int64(now) + int64(wait)
				}
				for k := 0; k < p.rate/1000; k++ {
					r := &sluice.Request{Cost: 1}
					if d, _ := gatetest.Decide(ctx, p.gate, r, now); d.Admitted {
						total[ms/1000]++
						each[i][ms/1000]++
					}
				}
			}
		}
		return total, each
	}
	within := func(what string, got, want int) {
		t.Helper()
		if float64(got) < 0.97*float64(want) || float64(got) > 1.01*float64(want) {
			t.Errorf("%s: %d admitted, want within [0.97, 1.01] x %d", what, got, want)
		}
	}
	total, each := run(10 * time.Second)
	t.Logf("admitted per second: %v; by process in the last: %d %d %d %d", total, each[0][9], each[1][9], each[2][9], each[3][9])
	for s := 1; s < len(total); s++ {
		within(fmt.Sprintf("second %d", s+1), total[s], 10000)
	}
	// Process 3 stops without giving its lease back: the others take its
	// share once its lease lapses (1 s) and they refresh.
	ps[3].stopped = true
	total, _ = run(3 * time.Second)
	t.Logf("after process 3 stopped: %v", total)
	within("the second after the stopped lease lapsed", total[2], 10000)
	// A new process arrives offering 5k/s: within one refresh interval of
	// its first request it holds its fair share (10,000 / 4 = 2,500).
	ps = append(ps, newProcess(4, 5000))
	ps[len(ps)-1].next = int64(clk.Now())
	run(a.Refresh + 10*time.Millisecond)
	st := ps[4].gate.ReportState(clk.Now()).(lease.GateState)
	t.Logf("new process after one refresh interval: %+v", st)
	if st.Rate < 2500*97/100 {
		t.Errorf("new process holds %d units/s after one refresh interval, want its fair share 2,500", st.Rate)
	}
	run(2 * time.Second)
	// The allocator is unreachable for 5 s: no decision waits on it (they
	// are all in process), the leases run to their expiry, then each
	// process spends its safe share (the capacity over the 4 clients it last
	// saw); afterwards the leases resume.
	down = true
	total, _ = run(5 * time.Second)
	down = false
	t.Logf("allocator down for 5 s: %v", total)
	for s, n := range total {
		within(fmt.Sprintf("second %d without the allocator", s+1), n, 10000)
	}
	total, _ = run(2 * time.Second)
	t.Logf("after it is back: %v", total)
	within("the second after it is back", total[1], 10000)
	// Redis restarted empty: the allocator learns for one lease time, the
	// holders' grants are confirmed and nothing is handed out twice.
	if err := stores[0].rc().Do(ctx, stores[0].rc().B().Flushall().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	total, _ = run(3 * time.Second)
	t.Logf("after Redis restarted empty: %v", total)
	for s, n := range total {
		if n > 10100 {
			t.Errorf("second %d after the restart: %d admitted, above the limit", s+1, n)
		}
	}
	within("the second after learning", total[2], 10000)
}
