// Package lease divides a global budget between processes as leases: each
// process holds a slice of the budget for a lease time and spends it
// in-process, and the allocator hands slices out fairly and never more
// than the budget in all.
//
//	a := lease.Allocator{Capacity: 10000, Lease: 10 * time.Second}
//	var st lease.State
//	g := a.Step(&st, lease.Request{Client: "web-1", Wants: 4000}, now)
//	// g.Has units/s until g.Expiry; ask again every g.Refresh
//
// A Gate spends a process's lease of a rate budget in-process (no call to
// the allocator on the decision path) and refreshes it in the background;
// a Concurrency gate does the same with a budget of slots in flight.
//
// Bounds, for n processes sharing a capacity of C units/s (or C slots)
// with lease time L, refresh interval R and a local bucket of B (time at
// the grant):
//   - Overshoot: the grants never sum above C, so the fleet admits at most
//     C·(T + B) in any window T while the allocator keeps its state. That
//     holds for what the processes spend, not only for what the allocator
//     has on record: a gate spends its old grant until the answer to its
//     refresh applies, and until that grant's expiry when the answer is
//     lost after the step ran (a timeout after Redis ran the script), so
//     each refresh reports what the gate spends as in use, and the
//     allocator keeps it from the others until the gate's next step (a
//     gate whose grant shrank by more than an eighth asks again at once).
//     Likewise a concurrency budget's holders report what they have in
//     flight, so the fleet never has more than C in flight while its
//     processes reach the allocator. After
//     it lost its state (a Redis restart or failover, indistinguishable
//     from a budget that is new) it learns for L: it confirms what holders
//     say they hold and grants nothing new; a process holding nothing is
//     told a safe share of what neither confirmed holdings nor other safe
//     shares take, which it spends under FailSafe. So a new budget stays
//     within C from its first step, and after a loss the fleet can spend
//     the holdings not yet reported on top of C: at most 2C, and only
//     until those holders refresh (within R when they reach the
//     allocator) and the others ask again after them (R/4); under
//     FailClosed it stays within C throughout. It also learns again when
//     a client says it holds a lease its state no longer has (a holding
//     outlives its holder's lease, so only a forward step of the
//     allocator's clock, a Redis host's wall clock, or a partial loss
//     does that): the holders are confirmed, not granted their room a
//     second time. A client holding nothing that reaches it first is
//     granted from the state as it finds it, so until the holders refresh
//     (within R) the fleet can spend up to 2C, as after a loss. With the
//     allocator unreachable a lease runs to its expiry and then the
//     failure mode decides: FailSafe spends C ÷ (the clients last seen),
//     so the fleet stays within C while no process has a lease, when
//     every process saw the same clients (and within C·n/m when a process
//     last saw m of them). The safe shares come on top of the grants,
//     though, while some processes spend them and the others hold leases:
//     a process cut off alone, or around an outage the leases lapsing and
//     coming back at different moments (the first back is granted its
//     fair share of what the live holdings leave, up to its demand, while
//     the others still spend their safe shares). Then the fleet can spend
//     up to those safe shares more (at most 2C) for as long as that lasts:
//     after an outage, until the last process has reached the allocator.
//     A gate that never had an answer spends nothing (or SafeShare);
//     FailOpen has no bound; FailClosed admits nothing.
//   - Unused allocation: a process whose demand fell keeps its grant until
//     its next refresh, so at most C stays unused for R (and a grant cut
//     by less than an eighth keeps its old size from the others for one
//     more R); a stopped process
//     holds its share for at most L (none after it gives the lease back).
//     While learning, the first process to ask is told all of C until the
//     others have asked (every R/4 while learning): at most C − its demand
//     unused for R/4.
//   - Whole units: a budget of C units over n > C processes that all want
//     more cannot be split; the units a max-min round leaves over rotate
//     once per lease time (FairShares), so each process is granted a unit
//     within ⌈n/k⌉ lease times of k units left over, plus a refresh for the
//     previous holder to give it back.
//   - Convergence: a new process has its fair share once the others have
//     refreshed and confirmed their smaller grants (within R of its first
//     request, and one round trip); a new budget is shared
//     by the processes that use it within two rounds of R/4.
//
// The step is after Google Doorman's server (youtube/doorman,
// doc/design.md and doc/algorithms.md): FAIR_SHARE (max-min) allocation of
// what clients want, leases with an expiry and a refresh interval, and a
// learning mode for one lease time after the allocator lost its state (a
// Redis restart or failover), in which it only confirms what clients say
// they hold. The step is a pure function of its state and now, so one
// definition serves the in-memory allocator and its Redis twin.
package lease

import (
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// MaxCapacity is the largest budget: its units and every sum of them are
// exact in a float64, so the Redis twin computes the same grants.
const MaxCapacity = 1 << 50

// Allocator is the allocation rule for one budget.
type Allocator struct {
	// Capacity is the budget, in whole units (units/s for a rate, units
	// for a concurrency budget). Required.
	Capacity int64
	// Lease is how long a grant holds. Required.
	Lease time.Duration
	// Refresh is how often a client should ask again; default Lease/4
	// (Doorman's defaults are 60 s and 16 s).
	Refresh time.Duration
}

// Validate reports an allocator that cannot hand anything out.
func (a Allocator) Validate() error {
	switch {
	case a.Capacity < 1 || a.Capacity > MaxCapacity:
		return errors.New("lease: capacity must be in [1, 2^50]")
	case a.Lease <= 0:
		return errors.New("lease: lease time must be > 0")
	case a.Refresh < 0 || a.Refresh > a.Lease:
		return errors.New("lease: refresh interval must be in (0, lease time]")
	}
	return nil
}

func (a Allocator) refresh() time.Duration {
	if a.Refresh > 0 {
		return a.Refresh
	}
	return a.Lease / 4
}

// turn is the number of whole lease times since the clock's zero, in
// microseconds as the Redis twin counts them: the rotation of the units a
// max-min round cannot split (FairShares).
func (a Allocator) turn(now clock.Instant) int64 {
	return (int64(now) / int64(time.Microsecond)) / max(a.Lease.Microseconds(), 1)
}

// Holding is one client's lease in the allocator's state.
type Holding struct {
	Client string
	Has    int64         // granted, until Expiry
	Wants  int64         // what it last asked for
	Expiry clock.Instant // when the grant lapses
	// Spare is what a client that holds nothing was told it may spend as
	// its safe share while the allocator learns (Grant.Safe); it counts
	// against the room until the client's next step (beyond what the
	// client has in use, which it spends within its safe share).
	Spare int64
	// InUse is what the client reported in use at its last step (the
	// slots of a concurrency budget in flight, the rate a gate spent until
	// the answer applied): until it steps again it
	// counts against the room as much as its grant, when larger.
	InUse int64
}

// taken is what h keeps from the others: its grant, or what it reported
// in use when that is more.
func (h Holding) taken() int64 { return max(h.Has, h.InUse) }

// State is one budget's allocator state: the live holdings, and the end of
// a learning period. The zero State is an allocator that has just lost its
// state: its first step starts learning.
type State struct {
	Holdings []Holding
	// Started reports that the state has been initialized (a learning
	// period begun).
	Started bool
	// LearnUntil is the end of the learning period.
	LearnUntil clock.Instant
}

// Request is a client's refresh.
type Request struct {
	Client string
	// Wants is what the client would use, from its recent demand.
	Wants int64
	// Has is what the client holds now by its own account (its last grant,
	// if unexpired): during learning the allocator confirms it.
	Has int64
	// InUse is what the client has in use now, or may use until this
	// step's answer applies (a concurrency budget's slots in flight, a
	// rate gate's current grant or safe share): a grant that shrank below
	// it cannot take that back at once, so the others are not granted it
	// until the client's next step.
	InUse int64
	// Release gives the lease back (a graceful shutdown).
	Release bool
}

// Grant is the allocator's answer.
type Grant struct {
	Has      int64         // granted, in the budget's unit
	Expiry   clock.Instant // when it lapses unless refreshed
	Refresh  time.Duration // when to ask again (during learning: at its end)
	Learning bool          // the allocator is learning: Has only confirms
	Clients  int           // live holdings, this one included
	// Safe is the client's safe share, in the budget's unit: what it may
	// spend without a live lease (FailSafe). Outside learning it is the
	// capacity ÷ Clients; while learning, a client that holds nothing gets
	// its max-min share of what no confirmed holding or other safe share
	// takes, so a new budget is spent from its first step.
	Safe int64
}

// Step applies one request to st at now and returns the client's grant.
//
// Outside learning the client's new grant is its max-min fair share of the
// capacity over every live client's wants (FairShares), but never more
// than the capacity less what the others hold now (their grants, or what
// they reported in use when more): the others keep their leases until
// they refresh, so the sum of the grants never exceeds the capacity, nor
// does what a concurrency budget's holders have in flight, and a client's
// share grows as the others shrink to theirs (one refresh interval). During learning (one lease time after the state was
// lost) a client is granted what it says it has, within what the others
// are confirmed to hold, and a new client nothing; a client that holds
// nothing is told a safe share (Grant.Safe) of what neither confirmed
// holdings nor the other safe shares take, and asks again within a quarter
// of the refresh interval. Expired holdings are dropped first.
func (a Allocator) Step(st *State, r Request, now clock.Instant) Grant {
	if !st.Started {
		st.Started, st.LearnUntil = true, now.Add(a.Lease)
	}
	st.Holdings = slices.DeleteFunc(st.Holdings, func(h Holding) bool { return h.Expiry <= now })
	i := slices.IndexFunc(st.Holdings, func(h Holding) bool { return h.Client == r.Client })
	if !r.Release && r.Has > 0 && i < 0 && now >= st.LearnUntil {
		// The client spends a lease, by its own clock, that the state no
		// longer holds (a holding outlives its holder's lease): the
		// allocator's clock stepped forward (a Redis host's wall clock)
		// past holdings still spent, or part of the state was lost. The
		// others' may be gone too: learn again, confirming what holders
		// say they hold.
		st.LearnUntil = now.Add(a.Lease)
	}
	if r.Release {
		if i >= 0 {
			st.Holdings = slices.Delete(st.Holdings, i, i+1)
		}
		return Grant{Refresh: a.refresh()}
	}
	if i < 0 {
		st.Holdings = append(st.Holdings, Holding{Client: r.Client})
		i = len(st.Holdings) - 1
	}
	// what the others keep (their grants or slots in use), what their
	// safe shares add to that (a client spending its safe share has its
	// slots in flight within it: counted once), and what the confirmed
	// holders keep
	held, spared, kept := int64(0), int64(0), int64(0)
	for j, h := range st.Holdings {
		if j != i {
			held += h.taken()
			spared += max(h.Spare-h.taken(), 0)
			if h.Has > 0 {
				kept += h.taken()
			}
		}
	}
	h := &st.Holdings[i]
	h.Wants = min(max(r.Wants, 0), a.Capacity)
	h.InUse = min(max(r.InUse, 0), a.Capacity)
	learning := now < st.LearnUntil
	turn := a.turn(now)
	g := Grant{Refresh: a.refresh(), Learning: learning, Clients: len(st.Holdings)}
	h.Has, h.Spare = 0, 0
	switch {
	case !learning:
		h.Has = min(FairShares(a.Capacity, st.Holdings, turn)[r.Client], max(a.Capacity-held-spared, 0))
		g.Safe = a.Capacity / int64(len(st.Holdings))
	case r.Has > 0: // a holder from before the loss: confirmed, never cut for a safe share
		h.Has = min(r.Has, max(a.Capacity-held, 0))
		g.Safe = a.Capacity / int64(len(st.Holdings))
	default:
		var empty []Holding
		for _, o := range st.Holdings {
			if o.Has == 0 {
				empty = append(empty, o)
			}
		}
		h.Spare = min(FairShares(max(a.Capacity-kept, 0), empty, turn)[r.Client], max(a.Capacity-held-spared, 0))
		g.Safe = h.Spare
	}
	h.Expiry = now.Add(a.Lease)
	g.Has, g.Expiry = h.Has, h.Expiry
	if learning { // ask again soon, and as the learning period ends
		g.Refresh = min(g.Refresh/4, max(st.LearnUntil.Sub(now), time.Millisecond))
	}
	return g
}

// FairShares is the max-min fair allocation of capacity whole units
// between the holdings' wants (Doorman's FAIR_SHARE on integers): rounds
// of equal shares, each holding taking at most what it still wants, until
// the capacity or the wants run out. The k units an equal share leaves
// over (fewer than the n holdings still wanting) go one each to k of them
// in client order, starting at the (turn·k mod n)-th: as turn advances
// (Step passes one per lease time) the units rotate, so every holding gets
// whole units in its turn, within ⌈n/k⌉ turns, where a fixed order left the
// last holders of a budget smaller than its holders nothing for good. No
// holding gets more than it wants, and when the wants exceed the capacity
// the shares sum to it.
func FairShares(capacity int64, hs []Holding, turn int64) map[string]int64 {
	order := make([]int, len(hs))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(hs[a].Client, hs[b].Client) })
	got := make(map[string]int64, len(hs))
	active := slices.DeleteFunc(order, func(i int) bool { return hs[i].Wants <= 0 })
	left := capacity
	for len(active) > 0 && left > 0 {
		per := left / int64(len(active))
		if per == 0 { // fewer units than claimants: one each, in rotation
			n := int64(len(active))
			off := ((turn%n)*(left%n)%n + n) % n
			for k := int64(0); k < left; k++ {
				got[hs[active[(off+k)%n]].Client]++
			}
			break
		}
		next := active[:0]
		for _, i := range active {
			give := min(per, hs[i].Wants-got[hs[i].Client])
			got[hs[i].Client] += give
			left -= give
			if got[hs[i].Client] < hs[i].Wants {
				next = append(next, i)
			}
		}
		active = next
	}
	return got
}
