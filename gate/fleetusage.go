package gate

import (
	"context"
	"math"
	"slices"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/store"
)

// fleetUsage is the gate NewFleetUsage returns.
type fleetUsage struct {
	base
	reserved []string
}

var (
	_ sluice.Advertiser     = (*fleetUsage)(nil)
	_ sluice.FailureCounter = (*fleetUsage)(nil)
)

// NewFleetUsage returns a fleet-usage gate named name over lim (a limiter
// running limit.Concurrency) that requests of the reserved classes pass
// untouched. opts.Scope and opts.Reason are ignored: the count is
// service-wide and its rejections are overload.
//
// The gate is the fleet-usage load shedder of Stripe's "Scaling your API
// with rate limiters" (Paul Tarjan, 2017): one concurrency count for the
// whole fleet, on a store.Limiter in memory or on Redis, that reserved
// classes never draw on. Every other request holds one slot from admission
// until its Ticket is done and is rejected with reason overload (503) while
// every slot is held, so non-reserved work can never occupy the reserved
// share and reserved requests are never rejected by this gate. Size the
// limiter with FleetUsageLimit. It is safe for concurrent use.
//
// Decide admits a reserved class at once and otherwise takes one slot of
// the fleet-wide count.
//
// Release frees the request's slot, if it took one.
func NewFleetUsage(name string, lim store.Limiter, reserved []string, opts Options) (sluice.Gate, error) {
	opts.Reason = sluice.ReasonOverload
	opts.Scope = sluice.ScopeService
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	return &fleetUsage{base: newBase(name, lim, opts, opts.Reason, sluice.UnitConcurrentRequests),
		reserved: slices.Clone(reserved)}, nil
}

// Decide admits a reserved class at once and otherwise takes one slot of
// the fleet-wide count.
func (g *fleetUsage) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	if slices.Contains(g.reserved, r.Class) {
		d.Admitted = true
		return 0
	}
	return g.decide(ctx, r, now, 1, d)
}

// Release frees the request's slot, if it took one.
func (g *fleetUsage) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	g.refund("", p, c.Now, 1)
}

// FleetUsageLimit returns the slots non-reserved work may hold:
// ⌊capacity × (1 − Σ reserve)⌋, e.g. 80 of 100 with critical reserved 20%.
// Reserves are fractions in (0, 1) whose sum stays below 1; an error names
// the class at fault.
func FleetUsageLimit(capacity int64, reserve map[string]float64) (int64, error) {
	if capacity < 1 {
		return 0, param.Errorf("capacity", "fleet usage: capacity %d, want ≥ 1", capacity)
	}
	sum := 0.0
	for class, r := range reserve {
		if math.IsNaN(r) || r <= 0 || r >= 1 {
			return 0, param.Errorf("reserve", "fleet usage: reserve %v for class %q, want a share in (0, 1)", r, class)
		}
		sum += r
	}
	if sum >= 1 {
		return 0, param.Errorf("reserve", "fleet usage: reserves add up to %v, leaving nothing for other classes", sum)
	}
	return max(int64(math.Floor(float64(capacity)*(1-sum)+1e-9)), 1), nil
}
