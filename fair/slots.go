package fair

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// SlotOptions configures a Slots reservation, in concurrent work units (a
// request holds its cost in units from admission until it is done).
type SlotOptions struct {
	// InFlight is the work the protected resource runs at once, in units.
	// Required.
	InFlight int64
	// Recovery is kept out of every class's reach, in units, but one: an
	// owner whose reserve is lent takes it back at once from here. So it
	// also bounds the reserved units lent to other classes (none without
	// it), and the units held never pass InFlight.
	Recovery int64
	// Classes are the reservations (ClassShare's Reserve and Max in
	// concurrent units; Tenant does not apply). Reserves sum to at most
	// InFlight − Recovery; classes not listed only borrow.
	Classes []ClassShare
	// Revocation bounds a reclaim: only a request whose deadline is at
	// most Revocation away may borrow (its work, bounded by its deadline,
	// gives the units back by then), and a class turned away for want of
	// room lends nothing for Revocation. Default 1 s.
	Revocation time.Duration
}

// slots is the gate NewSlots returns.
type slots struct {
	name   string
	opts   SlotOptions
	usable int64
	spare  int64 // units no class reserves
	byName map[string]int

	mu        sync.Mutex
	held      int64 // all units held
	lent      int64 // reserved units lent past their class's reserve
	spareUsed int64 // units no class reserves, held
	classes   []slotClass
	other     slotClass
}

type slotClass struct {
	share    ClassShare
	own      int64 // units held within the reserve
	borrowed int64 // units held past it
	wanted   clock.Instant
	wanting  bool
}

// NewSlots returns a concurrent-units reservation gate named name.
//
// The gate divides concurrent work units between classes:
// each class may always hold its reserve; a class past its reserve (and a
// class with none) may use the units no class reserves, and borrow units
// other classes' reserves leave idle, never beyond InFlight − Recovery in
// all nor past its Max.
//
// Reclaim: admitted work is never cancelled, so reserved units are lent
// only out of the recovery headroom's size (at most Recovery units lent
// at once): an owner that comes back to find its reserve lent is admitted
// at once into the headroom, never refused below its reserve, with or
// without a queue in front. Only a request whose deadline is within
// Revocation borrows a reserved unit (unreserved units need no reclaim and
// go to any deadline), so the headroom is back within Revocation (plus
// the grace its server gives a request past its deadline), and an owner
// that reclaims into the headroom stops all lending for Revocation: the
// units held pass InFlight − Recovery only while an owner reclaims, and
// never pass InFlight. A request that finds no room is rejected with
// reason concurrency, retryable: a wait queue in front (package queue)
// holds it until units free. Every release gives the units back. It is
// safe for concurrent use.
//
// Decide admits r within its class's reserve; past it, on the units no
// class reserves, and then on idle reserved units when its deadline is
// within the revocation time. A request that could never be admitted so
// (its cost above every part it may use) is rejected as not retryable.
//
// Release gives the request's units back (permit 1: within its reserve,
// 2: borrowed from a reserve, 3: from the units no class reserves).
//
// ConcurrencyLimit returns the usable units and the units held, so a wait
// queue in front predicts waits from it.
func NewSlots(name string, opts SlotOptions) (sluice.Gate, error) {
	return gateOf(newSlots(name, opts))
}

// newSlots is NewSlots with the concrete type.
func newSlots(name string, opts SlotOptions) (*slots, error) {
	if name == "" {
		return nil, errors.New("reservation: empty name")
	}
	if opts.Revocation == 0 {
		opts.Revocation = time.Second
	}
	switch {
	case opts.InFlight < 1 || opts.InFlight > sluice.MaxCost:
		return nil, param.Errorf("InFlight", "reservation %s: inflight %d units outside [1, %d]", name, opts.InFlight, int64(sluice.MaxCost))
	case opts.Recovery < 0 || opts.Recovery >= opts.InFlight:
		return nil, param.Errorf("Recovery", "reservation %s: recovery %d units, want in [0, inflight %d)", name, opts.Recovery, opts.InFlight)
	case opts.Revocation < time.Millisecond || opts.Revocation > maxDepth:
		return nil, param.Errorf("Revocation", "reservation %s: revocation %v outside [1ms, %v]", name, opts.Revocation, maxDepth)
	}
	g := &slots{name: name, opts: opts, usable: opts.InFlight - opts.Recovery, byName: map[string]int{}}
	byName, reserved, err := checkShares(name, opts.Classes, g.usable, "units", false)
	if err != nil {
		return nil, err
	}
	g.byName = byName
	for _, c := range opts.Classes {
		g.classes = append(g.classes, slotClass{share: c})
	}
	g.spare = g.usable - reserved
	g.other.share.Class = unlisted
	return g, nil
}

// Name returns the gate's name.
func (g *slots) Name() string { return g.name }

func (g *slots) class(name string) *slotClass {
	if i, ok := g.byName[name]; ok {
		return &g.classes[i]
	}
	return &g.other
}

// lendableLocked is how many reserved units a borrower may take now: the
// idle part of the reserves of classes not wanting theirs back, within
// the recovery headroom, less what is lent already; nothing while an owner
// reclaims. REQUIRES: g.mu held.
func (g *slots) lendableLocked(now clock.Instant) int64 {
	idle := int64(0)
	for i := range g.classes {
		c := &g.classes[i]
		if c.wanting && now.Sub(c.wanted) < g.opts.Revocation {
			return 0
		}
		c.wanting = false
		idle += c.share.Reserve - c.own
	}
	return min(idle, g.opts.Recovery) - g.lent
}

// Decide admits r within its class's reserve; past it, on the units no
// class reserves, and then on idle reserved units when its deadline is
// within the revocation time. A request that could never be admitted so
// (its cost above every part it may use) is rejected as not retryable.
func (g *slots) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *slots) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	k := max(r.Cost, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.class(r.Class)
	mayBorrow := !c.share.NoBorrow && r.Deadline != 0 && r.Deadline.Sub(now) <= g.opts.Revocation
	capOK := c.share.Max == 0 || c.own+c.borrowed+k <= c.share.Max
	if capOK && c.own+k <= c.share.Reserve && g.held+k <= g.usable+g.lent {
		// Within its reserve, always: what is lent of it, at most
		// Recovery, the owner takes back from the headroom (held ≤
		// Σown + spare + lent, and Σown + k ≤ Σreserve ≤ usable − spare).
		if g.held+k > g.usable {
			c.wanted, c.wanting = now, true // reclaiming: lend nothing more for Revocation
		}
		c.own += k
		g.held += k
		return g.admit(), 1
	}
	if capOK && g.held+k <= g.usable {
		switch {
		case !c.share.NoBorrow && g.spareUsed+k <= g.spare:
			c.borrowed += k
			g.spareUsed += k
			g.held += k
			return g.admit(), 3
		case mayBorrow && g.lendableLocked(now) >= k:
			c.borrowed += k
			g.lent += k
			g.held += k
			return g.admit(), 2
		}
	}
	return g.refuse(c, k, mayBorrow), 0
}

// refuse is the rejection of k units for class c: retryable unless k is
// above every part c may use. REQUIRES: g.mu held.
func (g *slots) refuse(c *slotClass, k int64, mayBorrow bool) sluice.Decision {
	d := sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService, Gate: g.name,
		Unit: sluice.UnitConcurrentRequests, Limit: g.usable}
	possible := k <= c.share.Reserve || (!c.share.NoBorrow && (k <= g.spare || (mayBorrow && k <= g.usable)))
	if possible && (c.share.Max == 0 || k <= c.share.Max) {
		d.Retryable, d.RetryAfter = true, time.Second
	}
	return d
}

func (g *slots) admit() sluice.Decision {
	return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name, Unit: sluice.UnitConcurrentRequests, Limit: g.usable}
}

// Release gives the request's units back (permit 1: within its reserve,
// 2: borrowed from a reserve, 3: from the units no class reserves).
func (g *slots) Release(r *sluice.Request, p sluice.Permit, _ sluice.Completion) {
	k := max(r.Cost, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.class(r.Class)
	switch p {
	case 1:
		c.own -= k
	case 2:
		c.borrowed -= k
		g.lent -= k
	case 3:
		c.borrowed -= k
		g.spareUsed -= k
	default:
		return
	}
	g.held -= k
}

// slotUsage is one class's units held in a Slots reservation.
type slotUsage struct {
	Class    string `json:"class"`
	Reserve  int64  `json:"reserve_units"`
	Own      int64  `json:"own_units"`
	Borrowed int64  `json:"borrowed_units"`
}

// Usage returns the units each class holds, listed classes first and then
// "unlisted" for the classes with no share.
func (g *slots) Usage() []slotUsage {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]slotUsage, 0, len(g.classes)+1)
	for _, c := range append(g.classes, g.other) {
		out = append(out, slotUsage{Class: c.share.Class, Reserve: c.share.Reserve, Own: c.own, Borrowed: c.borrowed})
	}
	return out
}

var (
	_ sluice.StateReporter = (*slots)(nil)
	_ sluice.Sizer         = (*slots)(nil)
)

// ReportState returns the units held per class.
func (g *slots) ReportState(clock.Instant) any { return g.Usage() }

// ConcurrencyLimit returns the usable units and the units held, so a wait
// queue in front predicts waits from it.
func (g *slots) ConcurrencyLimit() (limit, inFlight int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return int(g.usable), int(g.held)
}

// gateOf returns g as a sluice.Gate, or err (never a typed nil).
func gateOf[G sluice.Gate](g G, err error) (sluice.Gate, error) {
	if err != nil {
		return nil, err
	}
	return g, nil
}
