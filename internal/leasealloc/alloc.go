// Package leasealloc is the lease allocator's step (package lease's
// Allocator): a pure function of its state and now, which the in-memory
// allocator and its Redis twin (package store/redis) both run. Package
// lease documents it and re-exports its types.
package leasealloc

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

// RefreshEvery is how often a holder asks again: Refresh, or a quarter of
// the lease time when Refresh is 0.
func (a Allocator) RefreshEvery() time.Duration {
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
	// Spare is what the client was told it may spend as its safe share
	// while the allocator learns (Grant.Safe): a holder's confirmed grant
	// and a share of what the confirmed holdings leave, or that share
	// alone for a client that holds nothing. It counts against the room
	// until the client's next step (beyond what the client holds or has in
	// use, which it spends within its safe share).
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
	// takes, so a new budget is spent from its first step, and a holder
	// its confirmed grant plus such a share for what it wants beyond it
	// once every holder has reported (its grant alone before), which it
	// spends while learning when larger than the grant.
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
// of the refresh interval. Once the learning period is a refresh interval
// old (every holder from before the loss has reported by then), a holder
// is told its confirmed holding plus such a share for what it wants beyond
// it, so an idle fleet whose load comes back is not held to its idle
// grants for the whole lease time. Expired holdings are dropped first.
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
		return Grant{Refresh: a.RefreshEvery()}
	}
	if i < 0 {
		st.Holdings = append(st.Holdings, Holding{Client: r.Client})
		i = len(st.Holdings) - 1
	}
	// what the others keep (their grants or slots in use), and what their
	// safe shares add to that (a client spending its safe share has its
	// slots in flight within it: counted once)
	held, spared := int64(0), int64(0)
	for j, h := range st.Holdings {
		if j != i {
			held += h.taken()
			spared += max(h.Spare-h.taken(), 0)
		}
	}
	h := &st.Holdings[i]
	h.Wants = min(max(r.Wants, 0), a.Capacity)
	h.InUse = min(max(r.InUse, 0), a.Capacity)
	learning := now < st.LearnUntil
	turn := a.turn(now)
	g := Grant{Refresh: a.RefreshEvery(), Learning: learning, Clients: len(st.Holdings)}
	h.Has, h.Spare = 0, 0
	switch {
	case !learning:
		h.Has = min(FairShares(a.Capacity, st.Holdings, turn)[r.Client], max(a.Capacity-held-spared, 0))
		g.Safe = a.Capacity / int64(len(st.Holdings))
	case r.Has > 0:
		// A holder from before the loss: confirmed, never cut for a safe
		// share while the others may not yet have reported. One that
		// reports a refresh interval or more into learning (its
		// refreshes failed meanwhile) is confirmed what the others'
		// holdings and safe shares leave: it spent its old lease until
		// now, on top of those shares (the 2C after a loss).
		h.Has = min(r.Has, max(a.Capacity-held, 0))
		// and, for what it wants beyond that, a safe share as the
		// clients holding nothing get, once every holder has reported
		// (holders refresh every interval): an idle fleet whose load
		// comes back while the allocator learns is not held to its idle
		// grants for the whole lease time, and a busy one's holdings are
		// not handed out twice before their holders report them
		h.Spare = h.Has
		if now >= a.sparesFrom(st) {
			h.Spare += a.spareShare(st, r.Client, held+h.Has+spared, turn)
		}
		g.Safe = h.Spare
	default:
		h.Spare = a.spareShare(st, r.Client, held+spared, turn)
		g.Safe = h.Spare
	}
	h.Expiry = now.Add(a.Lease)
	g.Has, g.Expiry = h.Has, h.Expiry
	if learning { // ask again soon, as holders get safe shares, and as the learning period ends
		g.Refresh = min(g.Refresh/4, max(st.LearnUntil.Sub(now), time.Millisecond))
		if spareAt := a.sparesFrom(st); spareAt > now {
			g.Refresh = min(g.Refresh, max(spareAt.Sub(now), time.Millisecond))
		}
	}
	return g
}

// sparesFrom is when holders start to get safe shares beyond their
// confirmed holdings: a refresh interval into learning (in whole µs, as the
// Redis twin counts it), when every holder from before the loss has
// reported.
func (a Allocator) sparesFrom(st *State) clock.Instant {
	return st.LearnUntil.Add(a.RefreshEvery().Truncate(time.Microsecond) - a.Lease)
}

// spareShare is client's safe share while learning, beyond its confirmed
// holding: its max-min share, by what each client wants beyond its
// confirmed holding, of what the confirmed holdings leave (the capacity
// less every confirmed grant), within what neither the holdings nor the
// other safe shares take (the capacity less taken). A holder spending a
// safe share reports it in use: that counts in taken, not as confirmed, or
// the holder that asked first would keep the room from the others.
func (a Allocator) spareShare(st *State, client string, taken int64, turn int64) int64 {
	beyond := make([]Holding, len(st.Holdings))
	confirmed := int64(0)
	for i, o := range st.Holdings {
		beyond[i] = Holding{Client: o.Client, Wants: max(o.Wants-o.Has, 0)}
		confirmed += o.Has
	}
	return min(FairShares(max(a.Capacity-confirmed, 0), beyond, turn)[client], max(a.Capacity-taken, 0))
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
