package lease_test

import (
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/lease"
)

func near(a, b int64) bool { return a == b }

// Doorman's FAIR_SHARE example through refreshes: capacity 120, clients
// wanting 1000, 50 and 10. The first round hands the first client what is
// free; after every client has refreshed once more the grants are
// 60 / 50 / 10, and they never sum above 120.
func TestAllocatorConvergesToFairShares(t *testing.T) {
	a := lease.Allocator{Capacity: 120, Lease: 10 * time.Second}
	var st lease.State
	now := clock.Instant(time.Hour)
	st.Started, st.LearnUntil = true, now // not learning
	wants := map[string]int64{"a": 1000, "b": 50, "c": 10}
	var got map[string]int64
	for round := 0; round < 2; round++ {
		got = map[string]int64{}
		for _, c := range []string{"a", "b", "c"} {
			g := a.Step(&st, lease.Request{Client: c, Wants: wants[c]}, now)
			got[c] = g.Has
			sum := int64(0)
			for _, h := range st.Holdings {
				sum += h.Has
			}
			if sum > a.Capacity {
				t.Fatalf("round %d after %s: holdings sum to %v > capacity", round, c, sum)
			}
			now = now.Add(time.Second)
		}
	}
	if !near(got["a"], 60) || !near(got["b"], 50) || !near(got["c"], 10) {
		t.Fatalf("after two rounds: %v, want a 60, b 50, c 10", got)
	}
}

// After the state is lost (a Redis restart), the allocator learns for one
// lease time: it confirms what clients say they hold and grants a new
// client nothing, so the old grants still running are never handed out a
// second time; after the lease time it allocates fairly again.
func TestAllocatorLearnsAfterLosingItsState(t *testing.T) {
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	var st lease.State // just lost
	now := clock.Instant(time.Hour)
	if g := a.Step(&st, lease.Request{Client: "a", Wants: 80, Has: 70}, now); !g.Learning || !near(g.Has, 70) {
		t.Fatalf("a during learning: %+v, want its 70 confirmed", g)
	}
	if g := a.Step(&st, lease.Request{Client: "b", Wants: 80, Has: 50}, now.Add(time.Second)); !near(g.Has, 30) {
		t.Fatalf("b during learning: %+v, want what is left (30)", g)
	}
	if g := a.Step(&st, lease.Request{Client: "new", Wants: 80}, now.Add(2*time.Second)); !near(g.Has, 0) {
		t.Fatalf("a new client during learning: %+v, want 0", g)
	}
	after := now.Add(10 * time.Second)
	g := a.Step(&st, lease.Request{Client: "a", Wants: 80}, after) // its lease lapsed now, by its clock too
	if g.Learning || g.Has > 100-30 {
		t.Fatalf("a after learning: %+v", g)
	}
}

// A budget that is new (or lost with no holder left) is spent from its
// first step: while learning, the clients that hold nothing are told safe
// shares of what no confirmed holding takes, max-min between them and
// never summing above it, so four processes starting together share the
// capacity within two rounds; a holder from before the loss is confirmed
// first, and the safe shares make room for it at their next step.
func TestAllocatorSafeSharesWhileLearning(t *testing.T) {
	a := lease.Allocator{Capacity: 10000, Lease: 8 * time.Second} // refresh 2 s; 500 ms while learning
	var st lease.State
	now := clock.Instant(time.Hour)
	want := map[string]int64{}
	for round := range 2 {
		for i, c := range []string{"a", "b", "c", "d"} {
			g := a.Step(&st, lease.Request{Client: c, Wants: 10000}, now.Add(time.Duration(round*500+i)*time.Millisecond))
			if !g.Learning || g.Has != 0 || g.Refresh != 500*time.Millisecond {
				t.Fatalf("round %d %s: %+v, want learning, nothing granted, back in 500ms", round, c, g)
			}
			want[c] = g.Safe
		}
	}
	for _, s := range want {
		if s != 2500 {
			t.Fatalf("safe shares after two rounds: %v, want 2500 each", want)
		}
	}
	// A holder from before the loss reports 4000: confirmed in full, and
	// the others' safe shares shrink to what is left as they come back.
	if g := a.Step(&st, lease.Request{Client: "old", Wants: 4000, Has: 4000}, now.Add(1100*time.Millisecond)); g.Has != 4000 {
		t.Fatalf("old holder while learning: %+v, want its 4000 confirmed", g)
	}
	for round := range 2 {
		for i, c := range []string{"a", "b", "c", "d"} {
			g := a.Step(&st, lease.Request{Client: c, Wants: 10000}, now.Add(time.Duration(1500+round*500+i)*time.Millisecond))
			want[c] = g.Safe
		}
	}
	if want["a"]+want["b"]+want["c"]+want["d"] != 6000 || want["a"] != 1500 {
		t.Fatalf("safe shares beside a confirmed 4000: %v, want 1500 each", want)
	}
	// After learning the safe shares count against the room until their
	// owners step again: the first grant takes only what is free.
	if g := a.Step(&st, lease.Request{Client: "old", Wants: 10000, Has: 4000}, now.Add(8*time.Second)); g.Learning || g.Has != 2000 || g.Safe != 2000 {
		t.Fatalf("old after learning: %+v, want its fair 2000 of five (4000 free beside the safe shares), safe 2000", g)
	}
}

// A client that stops refreshing loses its holding at expiry; a client
// that releases gives it back at once; the others' next refresh takes it.
func TestAllocatorExpiryAndRelease(t *testing.T) {
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	st := lease.State{Started: true}
	now := clock.Instant(time.Hour)
	for _, c := range []string{"a", "b"} {
		a.Step(&st, lease.Request{Client: c, Wants: 100}, now)
	}
	a.Step(&st, lease.Request{Client: "a", Wants: 100}, now.Add(time.Second))
	if g := a.Step(&st, lease.Request{Client: "b", Wants: 100}, now.Add(2*time.Second)); !near(g.Has, 50) {
		t.Fatalf("b with a also busy: %+v, want 50", g)
	}
	// a stops; its lease runs until now+1s+10s.
	if g := a.Step(&st, lease.Request{Client: "b", Wants: 100}, now.Add(5*time.Second)); !near(g.Has, 50) {
		t.Fatalf("b while a's lease runs: %+v, want 50", g)
	}
	if g := a.Step(&st, lease.Request{Client: "b", Wants: 100}, now.Add(11*time.Second)); !near(g.Has, 100) {
		t.Fatalf("b after a's lease expired: %+v, want 100", g)
	}
	a.Step(&st, lease.Request{Client: "c", Wants: 100}, now.Add(12*time.Second))
	a.Step(&st, lease.Request{Client: "b", Release: true}, now.Add(13*time.Second))
	if g := a.Step(&st, lease.Request{Client: "c", Wants: 100}, now.Add(14*time.Second)); !near(g.Has, 100) {
		t.Fatalf("c after b released: %+v, want 100", g)
	}
}

// Whatever clients ask, report and release, and whenever: the live grants
// never sum above the capacity, and outside learning no client is granted
// more than it wants.
func TestAllocatorNeverOverCommits(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		a := lease.Allocator{Capacity: rapid.Int64Range(1, 1e6).Draw(t, "capacity"),
			Lease: time.Duration(rapid.Int64Range(1, 20).Draw(t, "leaseS")) * time.Second}
		var st lease.State
		now := clock.Instant(time.Hour)
		for i, n := 0, rapid.IntRange(1, 200).Draw(t, "n"); i < n; i++ {
			now = now.Add(time.Duration(rapid.Int64Range(0, int64(3*time.Second)).Draw(t, "gap")))
			r := lease.Request{Client: fmt.Sprint("c", rapid.IntRange(0, 5).Draw(t, "client")),
				Wants: rapid.Int64Range(0, 2*a.Capacity).Draw(t, "wants"), Has: rapid.Int64Range(0, 2*a.Capacity).Draw(t, "has"),
				Release: rapid.IntRange(0, 9).Draw(t, "release") == 0}
			g := a.Step(&st, r, now)
			if !g.Learning && !r.Release && g.Has > r.Wants {
				t.Fatalf("granted %v to a client wanting %v", g.Has, r.Wants)
			}
			sum, spent := int64(0), int64(0)
			for _, h := range st.Holdings {
				if h.Expiry > now {
					sum += h.Has
					spent += max(h.Has, h.Spare) // a holder's safe share takes in its grant
				}
			}
			if sum > a.Capacity {
				t.Fatalf("live grants sum to %v > capacity %v", sum, a.Capacity)
			}
			// a safe share never takes what a grant or another safe share holds
			if !r.Release && g.Learning && spent > a.Capacity && g.Safe > g.Has {
				t.Fatalf("safe share %v beside holdings spending %v > capacity %v", g.Safe, spent, a.Capacity)
			}
			if !r.Release && !g.Learning && spent > a.Capacity && g.Has > 0 {
				t.Fatalf("grant %v beside holdings spending %v > capacity %v", g.Has, spent, a.Capacity)
			}
		}
	})
}

// Doorman's worked example (capacity 120, wants 1000 / 50 / 10 → 60 / 50 /
// 10) and integer remainders.
func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		capacity int64
		wants    []int64
		want     []int64
	}{
		{120, []int64{1000, 50, 10}, []int64{60, 50, 10}},
		{10, []int64{100, 100, 100}, []int64{4, 3, 3}},
		{2, []int64{5, 5, 5}, []int64{1, 1, 0}},
		{100, []int64{10, 20}, []int64{10, 20}},
		{100, []int64{0, 200}, []int64{0, 100}},
	} {
		var hs []lease.Holding
		for i, w := range tc.wants {
			hs = append(hs, lease.Holding{Client: fmt.Sprint("c", i), Wants: w})
		}
		got := leasealloc.FairShares(tc.capacity, hs, 0)
		for i, w := range tc.want {
			if got[fmt.Sprint("c", i)] != w {
				t.Errorf("FairShares(%d, %v) = %v, want %v", tc.capacity, tc.wants, got, tc.want)
				break
			}
		}
	}
}

// The allocator's clock steps forward past every holding (a Redis host's
// wall clock set ahead) while the holders, on their own clocks, still
// spend their leases: a holder that says so, whose holding the state no
// longer has, starts learning, so its grant and the others' are confirmed
// rather than handed out again (before, a was granted all 100 on top of
// the 40 b still spent).
func TestAllocatorLearnsAfterItsClockStepsForward(t *testing.T) {
	a := lease.Allocator{Capacity: 100, Lease: 10 * time.Second}
	st := lease.State{Started: true}
	now := clock.Instant(time.Hour)
	ga := a.Step(&st, lease.Request{Client: "a", Wants: 60}, now)
	gb := a.Step(&st, lease.Request{Client: "b", Wants: 60}, now)
	if ga.Has != 60 || gb.Has != 40 {
		t.Fatalf("before the step: a %d, b %d, want 60 and 40", ga.Has, gb.Has)
	}
	stepped := now.Add(time.Minute) // the holders' clocks: 1 s later, both leases live
	if g := a.Step(&st, lease.Request{Client: "a", Wants: 100, Has: 60}, stepped); !g.Learning || g.Has != 60 {
		t.Fatalf("a after the clock step: %+v, want its 60 confirmed while learning", g)
	}
	if g := a.Step(&st, lease.Request{Client: "b", Wants: 100, Has: 40}, stepped); !g.Learning || g.Has != 40 {
		t.Fatalf("b after the clock step: %+v, want its 40 confirmed", g)
	}
	if g := a.Step(&st, lease.Request{Client: "c", Wants: 100}, stepped); g.Has != 0 {
		t.Fatalf("a new client after the clock step: %+v, want nothing granted", g)
	}
}

// The units a max-min round cannot split rotate with the turn: 2 units
// over 5 equal claimants go to c0, c1 at turn 0, c2, c3 at turn 1, c4, c0
// at turn 2 (start = turn·2 mod 5).
func TestFairSharesRotate(t *testing.T) {
	var hs []lease.Holding
	for i := 0; i < 5; i++ {
		hs = append(hs, lease.Holding{Client: fmt.Sprint("c", i), Wants: 9})
	}
	for turn, want := range [][]int64{{1, 1, 0, 0, 0}, {0, 0, 1, 1, 0}, {1, 0, 0, 0, 1}, {0, 1, 1, 0, 0}} {
		got := leasealloc.FairShares(2, hs, int64(turn))
		for i, w := range want {
			if got[fmt.Sprint("c", i)] != w {
				t.Fatalf("turn %d: %v, want %v", turn, got, want)
			}
		}
	}
	// 7 units over 3 claimants: 2 each, the seventh rotating.
	for turn, first := range []string{"c0", "c1", "c2", "c0"} {
		got := leasealloc.FairShares(7, hs[:3], int64(turn))
		if got[first] != 3 {
			t.Fatalf("turn %d: %v, want the extra unit at %s", turn, got, first)
		}
	}
}

// A budget smaller than its holders: every holder refreshing every
// Refresh is granted a whole unit within ⌈n/C⌉ + 2 lease times (a fixed
// order left the last ones nothing for good: one lease holder admitted
// nothing for 100 s), and the grants never sum above the capacity.
func TestEveryHolderGetsATurn(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := rapid.Int64Range(1, 5).Draw(t, "capacity")
		n := rapid.IntRange(int(c)+1, 3*int(c)+6).Draw(t, "holders")
		inUse := rapid.Bool().Draw(t, "inUse") // a concurrency budget: what a holder has, it has in flight
		a := lease.Allocator{Capacity: c, Lease: 8 * time.Second}
		var st lease.State
		now := clock.Instant(time.Hour)
		st.Started, st.LearnUntil = true, now
		has := make([]int64, n)
		got := make([]bool, n)
		rounds := (n/int(c) + 3) * 4 // refreshes of Lease/4
		for r := 0; r < rounds; r++ {
			for i := 0; i < n; i++ {
				req := lease.Request{Client: fmt.Sprint("h", i), Wants: 3, Has: has[i]}
				if inUse {
					req.InUse = has[i]
				}
				has[i] = a.Step(&st, req, now).Has
				got[i] = got[i] || has[i] > 0
				sum := int64(0)
				for _, h := range st.Holdings {
					sum += h.Has
				}
				if sum > c {
					t.Fatalf("round %d: grants sum to %d > %d", r, sum, c)
				}
				now = now.Add(2 * time.Second / time.Duration(n))
			}
		}
		for i, ok := range got {
			if !ok {
				t.Fatalf("holder h%d of %d never granted a unit of %d in %d refreshes", i, n, c, rounds)
			}
		}
	})
}

// While learning, a client asks again at the latest when holders start to
// get safe shares beyond their confirmed holdings (a refresh interval into
// learning), not up to a learning refresh after it: an idle fleet whose
// load came back spends its budget from then on.
func TestAllocatorLearningRefreshMeetsTheSpareShares(t *testing.T) {
	a := lease.Allocator{Capacity: 200, Lease: 10 * time.Second} // refresh 2.5 s; 625 ms while learning
	var st lease.State
	start := clock.Instant(time.Hour)
	if g := a.Step(&st, lease.Request{Client: "a", Wants: 4, Has: 4}, start); !g.Learning || g.Refresh != 625*time.Millisecond {
		t.Fatalf("first step after a loss: %+v, want learning, back in 625ms", g)
	}
	g := a.Step(&st, lease.Request{Client: "a", Wants: 200, Has: 4}, start.Add(2200*time.Millisecond))
	if g.Refresh != 300*time.Millisecond || g.Safe != 4 {
		t.Fatalf("2.2 s into learning: %+v, want back in 300ms (when spare shares start), safe share 4 until then", g)
	}
	if g := a.Step(&st, lease.Request{Client: "a", Wants: 200, Has: 4}, start.Add(2500*time.Millisecond)); g.Safe != 200 || g.Has != 4 {
		t.Fatalf("2.5 s into learning: %+v, want 4 confirmed and a safe share of 200", g)
	}
}
