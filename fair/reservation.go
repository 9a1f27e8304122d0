package fair

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// MaxRate is the largest capacity, reserve or maximum a Reservation takes,
// in work units/s (2^26, about 67 million): with a bucket depth of at most
// MaxDepth every balance, kept in nano-units, stays below 2^62, so that two
// of them add up inside an int64.
const MaxRate = 1 << 26

// maxDepth is the longest Burst or Revocation a Reservation takes.
const maxDepth = time.Minute

// unlisted names, in Usage, the classes a reservation has no share for.
const unlisted = "unlisted"

// ClassShare is one class's part of a Reservation's capacity, in work
// units/s.
type ClassShare struct {
	// Class is the server-authorized class it applies to.
	Class string
	// Reserve is the rate the class always finds, whatever the others do.
	Reserve int64
	// Max caps everything the class takes, its reserve and what it borrows;
	// 0 means the usable capacity (Capacity − Recovery).
	Max int64
	// NoBorrow keeps the class to its reserve: it never spends the pool.
	NoBorrow bool
	// Tenant caps each tenant of the class, units/s (the tenant level of
	// the budget below the class); 0 means no cap. A tenant's bucket holds
	// Tenant·Burst.
	Tenant int64
}

// ReservationOptions configures a Reservation. Rates are in work units/s
// (the cost of a request is its units).
type ReservationOptions struct {
	// Capacity is what the protected resource serves, units/s. Required.
	Capacity int64
	// Recovery is kept out of every class's reach, units/s: the headroom a
	// service needs to recover and to run its control plane.
	Recovery int64
	// Classes are the reservations; their reserves sum to at most
	// Capacity − Recovery. Classes not listed have no reserve and only
	// borrow. What no class reserves goes to the pool.
	Classes []ClassShare
	// Burst is the depth of each class's own bucket, as time at its
	// reserve (a class idle for Burst may then admit Reserve·Burst units at
	// once). Default 100 ms.
	Burst time.Duration
	// Revocation bounds a reclaim: the pool that borrowers spend holds at
	// most (Capacity − Recovery)·Revocation units, so once an owner takes
	// its reserve again the borrowed work admitted after it came back is
	// served within Revocation. Default 1 s.
	Revocation time.Duration
}

// reservationGate is the gate NewReservation returns.
type reservationGate struct {
	name   string
	opts   ReservationOptions
	usable int64
	byName map[string]int
	other  *classState // classes not listed: no reserve, borrow only

	mu      sync.Mutex
	last    clock.Instant
	started bool
	classes []classState
	pool    bucket // nano-units
	spare   int64  // units/s no class reserves, into the pool
}

type classState struct {
	share ClassShare
	own   bucket // nano-units, filled at share.Reserve
	cap   bucket // nano-units, filled at share.Max; unused when Max is 0
	// tenants holds the buckets of tenants that are not full (a full one
	// is the same as none, so dropping it loses nothing): at most the
	// tenants admitted within one bucket's refill time.
	tenants map[string]*tenantBucket
	swept   clock.Instant
	kept    int // tenants left by the last sweep
	// tenantSize is a tenant bucket's depth, nano-units
	tenantSize int64
	// wanted is when the class last had a request turned away, here or by
	// a later gate: for a bucket's depth after it, the class is not idle,
	// and what overflows its bucket is not lent.
	wanted  clock.Instant
	wanting bool
	// The class's turn at the pool: the units it drew from it (its tag),
	// when it last asked the pool, and when the pool last refused it.
	poolTag            float64
	poolAsked, refused clock.Instant
	poolNeed           int64 // nano-units its last ask needed from the pool
	// counters, in units
	admitted, borrowed, rejected int64
}

type tenantBucket struct {
	n    int64 // nano-units
	last clock.Instant
}

// bucket is a balance in nano-units (1e-9 units): at a rate of r units/s it
// gains r nano-units per nanosecond, exactly.
type bucket struct {
	rate, size, n int64
}

// fill adds elapsed ns at b's rate and returns what did not fit, at most
// about spill (the room the overflow can go to).
func (b *bucket) fill(elapsed, spill int64) (overflow int64) {
	if b.rate == 0 || elapsed <= 0 {
		return 0
	}
	// Past one full bucket the rest is all overflow; cap the products.
	if limit := b.size/b.rate + 1; elapsed > limit {
		overflow = min(elapsed-limit, spill/b.rate+1) * b.rate
		elapsed = limit
	}
	b.n += elapsed * b.rate
	if b.n > b.size {
		overflow += b.n - b.size
		b.n = b.size
	}
	return overflow
}

func (b *bucket) add(n int64) { b.n = min(b.n+n, b.size) }

const nano = int64(time.Second) // nano-units per unit

// depth is the size of a bucket filled at rate units/s that holds burst
// (ns) of it, in nano-units: at least one unit, so that a small rate
// still admits a request of cost 1.
func depth(rate, burst int64) int64 {
	if rate == 0 {
		return 0
	}
	return max(rate*burst, nano)
}

// stepBack is how far back a reading may be before the gate takes it for a
// step of the clock and carries its state to the new time (as the limit
// package's algorithms do), rather than a reading a little out of order.
const stepBack = 5 * time.Second

// NewReservation returns a reservation gate named name. An error names the
// option or class at fault.
//
// The gate divides a capacity in work units/s between
// classes (the class reservations of a hierarchical budget). Each class
// with a reserve has a token bucket filled at its reserve; a full bucket's
// overflow, and the rate no class reserves, fill a shared pool that any
// class that may borrow spends once its own bucket is short, in max-min
// fair shares between the classes borrowing (poolTurnLocked). An idle
// reservation is so lent at once, and reclaimed at once: the owner's
// bucket is full when it comes back, new borrowing stops as its overflow
// stops, and the pool drains; admitted work is never cancelled. A class
// is idle only while none of its requests is turned away: for Burst after
// one is (here, or by a later gate, which hands the units back), its
// overflow is not lent, so a reserve that a later gate keeps its owner
// from using does not flow to the borrowers.
//
// Accounting (stated, and checked by property tests): every balance is
// filled by flows that add up to Capacity − Recovery, so the work admitted
// in any window of length T is at most (Capacity − Recovery)·T + Depth(),
// and a class with demand at or above its reserve admits at least
// Reserve·T − its bucket's depth, for requests its bucket holds: size
// Burst so that Reserve·Burst (and Max·Burst, Tenant·Burst) holds the
// class's largest request (every bucket holds at least one unit; a
// request above the class's own bucket is funded by the pool only, and
// one above everything the class can ever hold is refused as not
// retryable). The pool starts empty. Balances are integers in
// nano-units, exact for every rate up to MaxRate and depth up to MaxDepth. A request of the class rejected here has
// reason overload (503) and is retryable after its own bucket refills its
// cost. A class refused for its own Max (while the capacity had room) has
// spent its entitlement: reason policy_rate (429) at scope class. Below
// the class, a tenant over the class's tenant cap is rejected with reason
// policy_rate (429) at scope tenant: the levels service → class → tenant
// are each enforced. A request a later gate rejects gets
// its units back. It is safe for
// concurrent use.
//
// Decide admits r if its class's own bucket, topped up from the pool when
// the class may borrow, holds its cost, and the class's maximum and its
// tenant's cap allow it. A cost no bucket of the class can ever hold (above
// its own bucket and the pool, its maximum's bucket or its tenant's) is
// rejected as not retryable.
//
// Release gives the units back when a later gate rejected the request:
// what came from the pool to the pool, the rest to the class's bucket.
// Admitted work keeps what it took.
func NewReservation(name string, opts ReservationOptions) (sluice.Gate, error) {
	return gateOf(newReservation(name, opts))
}

// newReservation is NewReservation with the concrete type.
func newReservation(name string, opts ReservationOptions) (*reservationGate, error) {
	if name == "" {
		return nil, errors.New("reservation: empty name")
	}
	if opts.Burst == 0 {
		opts.Burst = 100 * time.Millisecond
	}
	if opts.Revocation == 0 {
		opts.Revocation = time.Second
	}
	switch {
	case opts.Capacity < 1 || opts.Capacity > MaxRate:
		return nil, param.Errorf("Capacity", "reservation %s: capacity %d units/s outside [1, %d]", name, opts.Capacity, int64(MaxRate))
	case opts.Recovery < 0 || opts.Recovery >= opts.Capacity:
		return nil, param.Errorf("Recovery", "reservation %s: recovery %d units/s, want in [0, capacity %d)", name, opts.Recovery, opts.Capacity)
	case opts.Burst < time.Millisecond || opts.Burst > maxDepth:
		return nil, param.Errorf("Burst", "reservation %s: burst %v outside [1ms, %v]", name, opts.Burst, maxDepth)
	case opts.Revocation < time.Millisecond || opts.Revocation > maxDepth:
		return nil, param.Errorf("Revocation", "reservation %s: revocation %v outside [1ms, %v]", name, opts.Revocation, maxDepth)
	}
	g := &reservationGate{name: name, opts: opts, usable: opts.Capacity - opts.Recovery, byName: map[string]int{}}
	byName, reserved, err := checkShares(name, opts.Classes, g.usable, "units/s", true)
	if err != nil {
		return nil, err
	}
	g.byName = byName
	burst, revocation := int64(opts.Burst), int64(opts.Revocation)
	for _, c := range opts.Classes {
		s := classState{share: c, own: bucket{rate: c.Reserve, size: depth(c.Reserve, burst)}, tenants: map[string]*tenantBucket{},
			tenantSize: depth(c.Tenant, burst)}
		s.own.n = s.own.size
		if c.Max > 0 {
			s.cap = bucket{rate: c.Max, size: depth(c.Max, burst)}
			s.cap.n = s.cap.size
		}
		g.classes = append(g.classes, s)
	}
	g.other = &classState{share: ClassShare{Class: unlisted}}
	g.spare = g.usable - reserved
	g.pool = bucket{size: g.usable * revocation}
	return g, nil
}

// Name returns the gate's name.
func (g *reservationGate) Name() string { return g.name }

// checkShares validates the shares of a reservation named name over usable
// units (in unit) and returns their index by class and the sum of their
// reserves; rates take a tenant cap, in-flight units do not.
func checkShares(name string, shares []ClassShare, usable int64, unit string, rates bool) (map[string]int, int64, error) {
	byName := map[string]int{}
	reserved := int64(0)
	for i, c := range shares {
		var err error
		switch {
		case c.Class == "":
			err = fmt.Errorf("reservation %s: classes[%d] has no class", name, i)
		case c.Reserve < 0 || c.Max < 0:
			err = fmt.Errorf("reservation %s: class %s: negative reserve or max", name, c.Class)
		case c.Reserve > usable || c.Max > usable:
			err = fmt.Errorf("reservation %s: class %s: reserve %d or max %d above the usable %d %s (capacity − recovery)",
				name, c.Class, c.Reserve, c.Max, usable, unit)
		case c.Max > 0 && c.Max < c.Reserve:
			err = fmt.Errorf("reservation %s: class %s: max %d below its reserve %d", name, c.Class, c.Max, c.Reserve)
		case rates && (c.Tenant < 0 || c.Tenant > MaxRate):
			err = fmt.Errorf("reservation %s: class %s: tenant rate %d outside [0, %d]", name, c.Class, c.Tenant, int64(MaxRate))
		case !rates && c.Tenant != 0:
			err = fmt.Errorf("reservation %s: class %s: a tenant cap applies to rates (capacity), not in-flight units", name, c.Class)
		}
		if _, dup := byName[c.Class]; dup && err == nil {
			err = fmt.Errorf("reservation %s: class %s listed twice", name, c.Class)
		}
		if err != nil {
			return nil, 0, param.Errorf("Classes", "%w", err)
		}
		byName[c.Class] = i
		reserved += c.Reserve
	}
	if reserved > usable {
		return nil, 0, param.Errorf("Classes", "reservation %s: reserves add up to %d %s, above the usable %d (capacity − recovery)", name, reserved, unit, usable)
	}
	return byName, reserved, nil
}

// Depth returns the most the gate can admit at once after every class
// has been idle, in units (rounded up): the own buckets and the pool, full.
func (g *reservationGate) Depth() int64 {
	d := g.pool.size
	for i := range g.classes {
		d += g.classes[i].own.size
	}
	return (d + nano - 1) / nano
}

func (g *reservationGate) class(name string) *classState {
	if i, ok := g.byName[name]; ok {
		return &g.classes[i]
	}
	return g.other
}

// advanceLocked fills every balance up to now: the own buckets at their
// reserves, the pool at the unreserved rate and with their overflow.
// REQUIRES: g.mu held.
func (g *reservationGate) advanceLocked(now clock.Instant) {
	if !g.started {
		g.started, g.last = true, now
		return
	}
	elapsed := int64(now - g.last)
	if elapsed <= 0 {
		if elapsed < -int64(stepBack) {
			g.last = now // the clock stepped back: carry the state to the new time
		}
		return // or a reading from another goroutine, taken a little earlier
	}
	g.last = now
	spill := int64(0)
	for i := range g.classes {
		c := &g.classes[i]
		over := c.own.fill(elapsed, g.pool.size)
		if c.wanting && now.Sub(c.wanted) < g.opts.Burst {
			over = 0 // the owner is not idle: its requests were turned away
		}
		spill = min(spill+over, g.pool.size)
		if c.share.Max > 0 {
			c.cap.fill(elapsed, 0)
		}
	}
	g.pool.add(spill)
	if g.spare > 0 {
		g.pool.add(min(elapsed, g.pool.size/g.spare+1) * g.spare)
	}
}

// Decide admits r if its class's own bucket, topped up from the pool when
// the class may borrow, holds its cost, and the class's maximum and its
// tenant's cap allow it. A cost no bucket of the class can ever hold (above
// its own bucket and the pool, its maximum's bucket or its tenant's) is
// rejected as not retryable.
func (g *reservationGate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *reservationGate) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	units := max(r.Cost, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceLocked(now)
	c := g.class(r.Class)
	if units > g.mostLocked(c) {
		c.rejected += units
		d := sluice.Decision{Reason: sluice.ReasonOverload, Scope: sluice.ScopeService, Gate: g.name}
		if c.share.Tenant > 0 && units > c.tenantSize/nano {
			d.Reason, d.Scope = sluice.ReasonPolicyRate, sluice.ScopeTenant // above the tenant's own cap
		}
		return d, 0
	}
	cost := units * nano
	fromPool := max(cost-c.own.n, 0)
	ok := fromPool == 0 || (!c.share.NoBorrow && g.poolTurnLocked(c, fromPool, now))
	if ok && c.share.Max > 0 && c.cap.n < cost {
		// The class has spent what its maximum allows while the capacity
		// had room for it: its own entitlement, 429 at scope class.
		c.rejected += units
		return sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeClass, Gate: g.name, Retryable: true,
			RetryAfter: time.Duration((cost - c.cap.n + c.share.Max - 1) / c.share.Max)}, 0
	}
	if !ok {
		c.rejected += units
		c.wanted, c.wanting = now, true
		return sluice.Decision{Reason: sluice.ReasonOverload, Scope: sluice.ScopeService, Gate: g.name,
			Retryable: true, RetryAfter: g.retryAfterLocked(c, cost)}, 0
	}
	if c.share.Tenant > 0 {
		if left := g.tenantLocked(c, r.Tenant, now, cost); left > 0 {
			c.rejected += units
			return sluice.Decision{Reason: sluice.ReasonPolicyRate, Scope: sluice.ScopeTenant, Gate: g.name, Retryable: true,
				RetryAfter: time.Duration((left + c.share.Tenant - 1) / c.share.Tenant)}, 0
		}
	}
	c.own.n -= cost - fromPool
	g.pool.n -= fromPool
	if c.share.Max > 0 {
		c.cap.n -= cost
	}
	c.admitted += units
	c.borrowed += fromPool / nano
	return sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: g.name}, sluice.Permit(fromPool / nano)
}

// poolTurnLocked reports whether class c may draw x nano-units from the
// pool now: the pool holds them, and c has drawn no more than a class the
// pool refused within max(Burst, Revocation). Each class's tag counts the units it drew (a class coming back
// starts at the least tag of the classes then asking, banking nothing), so
// two classes that want more than half of what the pool gets split it
// evenly, and one that wants less gets what it wants, the other the rest
// (max-min; start-time fair queueing on the pool's draws, Goyal, Vin and
// Cheng, SIGCOMM 1996). First come, first served gave the class asking
// more often nearly all of it. REQUIRES: g.mu held.
func (g *reservationGate) poolTurnLocked(c *classState, x int64, now clock.Instant) bool {
	window := max(g.opts.Burst, g.opts.Revocation) // how long a class counts as asking, or refused
	asking := func(d *classState) bool { return d.poolAsked != 0 && now.Sub(d.poolAsked) < window }
	least, leastRefused := math.Inf(1), math.Inf(1)
	for i := -1; i < len(g.classes); i++ {
		if d := g.classAt(i); d != c && asking(d) {
			least = min(least, d.poolTag)
		}
	}
	if !asking(c) && !math.IsInf(least, 1) {
		c.poolTag = max(c.poolTag, least) // back from idle: no credit banked
	}
	// What the classes behind c that asked lately need for their next
	// request stays in the pool for them, and a class behind c that the
	// pool refused stops c altogether until it has caught up.
	keep := int64(0)
	for i := -1; i < len(g.classes); i++ {
		d := g.classAt(i)
		if d == c || !asking(d) || d.poolTag >= c.poolTag {
			continue
		}
		keep += d.poolNeed
		if d.refused != 0 && now.Sub(d.refused) < window {
			leastRefused = min(leastRefused, d.poolTag)
		}
	}
	c.poolAsked, c.poolNeed = max(now, 1), x
	units := float64(x) / float64(nano)
	if g.pool.n < x+keep || c.poolTag > leastRefused {
		c.refused = max(now, 1)
		return false
	}
	c.poolTag += units
	return true
}

// classAt is listed class i, or for -1 the unlisted classes' state.
func (g *reservationGate) classAt(i int) *classState {
	if i < 0 {
		return g.other
	}
	return &g.classes[i]
}

// mostLocked is the largest cost class c can ever be admitted with, in
// units: what its own bucket and (if it borrows) the pool hold when full,
// within its maximum's and its tenants' buckets. REQUIRES: g.mu held.
func (g *reservationGate) mostLocked(c *classState) int64 {
	most := c.own.size
	if !c.share.NoBorrow {
		most += g.pool.size
	}
	if c.share.Max > 0 {
		most = min(most, c.cap.size)
	}
	if c.share.Tenant > 0 {
		most = min(most, c.tenantSize)
	}
	return most / nano
}

// tenantLocked takes cost from tenant's bucket, filled to now, if it holds
// it, and returns 0; otherwise it returns what the bucket lacks. A tenant
// gets a bucket only when it is admitted, and buckets that have filled up
// are dropped (a full bucket is the same as none) once per Burst, or
// sooner when the table has doubled since the last sweep: the table holds
// at most the tenants admitted within one refill time. REQUIRES: g.mu held.
func (g *reservationGate) tenantLocked(c *classState, tenant string, now clock.Instant, cost int64) (lacks int64) {
	rate, size := c.share.Tenant, c.tenantSize
	if now.Sub(c.swept) >= g.opts.Burst || len(c.tenants) > 2*c.kept+1024 {
		c.swept = now
		for k, t := range c.tenants {
			if int64(now-t.last) >= (size-t.n)/rate+1 {
				delete(c.tenants, k)
			}
		}
		c.kept = len(c.tenants)
	}
	t := c.tenants[tenant]
	if t == nil {
		if cost > size {
			return cost - size
		}
		c.tenants[tenant] = &tenantBucket{n: size - cost, last: now}
		return 0
	}
	elapsed := int64(now - t.last)
	if elapsed < -int64(stepBack) {
		t.last, elapsed = now, 0 // the clock stepped back
	}
	b := bucket{rate: rate, size: size, n: t.n}
	b.fill(elapsed, 0)
	t.n, t.last = b.n, max(t.last, now)
	if t.n < cost {
		return cost - t.n
	}
	t.n -= cost
	return 0
}

// retryAfterLocked is when the class's own bucket (or, for a class with no
// reserve, the pool at the unreserved rate) holds cost; the revocation
// time when nothing refills at a known rate. REQUIRES: g.mu held.
func (g *reservationGate) retryAfterLocked(c *classState, cost int64) time.Duration {
	switch {
	case c.own.rate > 0 && cost <= c.own.size:
		return time.Duration((cost - c.own.n + c.own.rate - 1) / c.own.rate)
	case g.spare > 0 && !c.share.NoBorrow && cost <= g.pool.size:
		return time.Duration((cost - g.pool.n + g.spare - 1) / g.spare)
	}
	return g.opts.Revocation
}

// Release gives the units back when a later gate rejected the request:
// what came from the pool to the pool, the rest to the class's bucket.
// Admitted work keeps what it took.
func (g *reservationGate) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if done.Outcome != sluice.OutcomeRejected {
		return
	}
	units := max(r.Cost, 1)
	g.mu.Lock()
	defer g.mu.Unlock()
	c := g.class(r.Class)
	if units > g.mostLocked(c) || int64(p) > units {
		return // not a permit this gate gave: it admits no such cost
	}
	cost, fromPool := units*nano, int64(p)*nano
	c.wanted, c.wanting = max(c.wanted, done.Now), true
	c.own.add(cost - fromPool)
	g.pool.add(fromPool)
	if t := c.tenants[r.Tenant]; t != nil && c.share.Tenant > 0 {
		t.n = min(t.n+cost, c.tenantSize)
	}
	if c.share.Max > 0 {
		c.cap.add(cost)
	}
	c.admitted -= units
	c.borrowed -= int64(p)
}

// classUsage is one class's counters in a Reservation, in work units since
// the gate was built.
type classUsage struct {
	Class    string `json:"class"`
	Reserve  int64  `json:"reserve_units_per_s"`
	Admitted int64  `json:"admitted_units"`
	Borrowed int64  `json:"borrowed_units"`
	Rejected int64  `json:"rejected_units"`
}

// reservationState is what the admin API shows of a Reservation.
type reservationState struct {
	Capacity int64        `json:"capacity_units_per_s"`
	Recovery int64        `json:"recovery_units_per_s"`
	Pool     int64        `json:"pool_units"`
	Classes  []classUsage `json:"classes"`
}

var _ sluice.StateReporter = (*reservationGate)(nil)

// Usage returns the counters per class, listed classes first and then
// "unlisted" for the classes with no share.
func (g *reservationGate) Usage() []classUsage {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]classUsage, 0, len(g.classes)+1)
	for _, c := range append(g.classes, *g.other) {
		out = append(out, classUsage{Class: c.share.Class, Reserve: c.share.Reserve, Admitted: c.admitted,
			Borrowed: c.borrowed, Rejected: c.rejected})
	}
	return out
}

// ReportState returns the capacity, the pool's balance and the usage per
// class at now.
func (g *reservationGate) ReportState(now clock.Instant) any {
	g.mu.Lock()
	g.advanceLocked(now)
	pool := g.pool.n / nano
	g.mu.Unlock()
	return reservationState{Capacity: g.opts.Capacity, Recovery: g.opts.Recovery, Pool: pool, Classes: g.Usage()}
}
