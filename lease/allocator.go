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
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/fair"
)

// Allocator is the allocation rule for one budget.
type Allocator struct {
	// Capacity is the budget, in its unit (units/s for a rate, units for
	// a concurrency budget). Required.
	Capacity float64
	// Lease is how long a grant holds. Required.
	Lease time.Duration
	// Refresh is how often a client should ask again; default Lease/4
	// (Doorman's defaults are 60 s and 16 s).
	Refresh time.Duration
}

// Validate reports an allocator that cannot hand anything out.
func (a Allocator) Validate() error {
	switch {
	case !(a.Capacity > 0):
		return errors.New("lease: capacity must be > 0")
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

// Holding is one client's lease in the allocator's state.
type Holding struct {
	Client string
	Has    float64       // granted, until Expiry
	Wants  float64       // what it last asked for
	Expiry clock.Instant // when the grant lapses
}

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
	Wants float64
	// Has is what the client holds now by its own account (its last grant,
	// if unexpired): during learning the allocator confirms it.
	Has float64
	// Release gives the lease back (a graceful shutdown).
	Release bool
}

// Grant is the allocator's answer.
type Grant struct {
	Has      float64       // granted, in the budget's unit
	Expiry   clock.Instant // when it lapses unless refreshed
	Refresh  time.Duration // when to ask again
	Learning bool          // the allocator is learning: Has only confirms
}

// Step applies one request to st at now and returns the client's grant.
//
// Outside learning the client's new grant is its max-min fair share of the
// capacity over every live client's wants (fair.MaxMin), but never more
// than the capacity less what the others hold now: the others keep their
// leases until they refresh, so the sum of the grants never exceeds the
// capacity, and a client's share grows as the others shrink to theirs (one
// refresh interval). During learning (one lease time after the state was
// lost) a client is granted what it says it has, within what is left, and
// a new client nothing. Expired holdings are dropped first.
func (a Allocator) Step(st *State, r Request, now clock.Instant) Grant {
	if !st.Started {
		st.Started, st.LearnUntil = true, now.Add(a.Lease)
	}
	st.Holdings = slices.DeleteFunc(st.Holdings, func(h Holding) bool { return h.Expiry <= now })
	i := slices.IndexFunc(st.Holdings, func(h Holding) bool { return h.Client == r.Client })
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
	others := 0.0
	for j, h := range st.Holdings {
		if j != i {
			others += h.Has
		}
	}
	room := max(a.Capacity-others, 0)
	h := &st.Holdings[i]
	h.Wants = max(r.Wants, 0)
	learning := now < st.LearnUntil
	var has float64
	if learning {
		has = min(max(r.Has, 0), room)
	} else {
		wants := make([]float64, len(st.Holdings))
		for j := range st.Holdings {
			wants[j] = st.Holdings[j].Wants
		}
		has = min(fair.MaxMin(a.Capacity, wants, nil)[i], room)
	}
	h.Has, h.Expiry = has, now.Add(a.Lease)
	return Grant{Has: has, Expiry: h.Expiry, Refresh: a.refresh(), Learning: learning}
}
