package shed

import (
	"fmt"
	"math"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/store"
)

// NewFleetUsage returns the fleet-usage load shedder of seeds/002: one
// concurrency count for the whole fleet (lim, in memory or on Redis) that
// the reserved classes never draw on. Every other request holds one slot
// from admission until its Ticket is done, and is rejected with reason
// overload (503) while the slots are all held, so non-critical work can
// never occupy the reserved share and critical requests are never rejected
// by this gate. Size lim with FleetUsageLimit.
func NewFleetUsage(name string, lim store.Limiter, reserved []string, opts gate.Options) (*gate.Classes, error) {
	opts.Reason = sluice.ReasonOverload
	opts.Scope = sluice.ScopeService
	g, err := gate.NewConcurrency(name, lim, opts)
	if err != nil {
		return nil, err
	}
	return gate.ExceptClasses(g, reserved), nil
}

// FleetUsageLimit returns the slots non-reserved work may hold:
// ⌊capacity × (1 − Σ reserve)⌋, e.g. 80 of 100 with critical reserved 20%.
// Reserves are fractions in (0, 1) whose sum stays below 1.
func FleetUsageLimit(capacity int64, reserve map[string]float64) (int64, error) {
	if capacity < 1 {
		return 0, fmt.Errorf("fleet usage: capacity %d, want ≥ 1", capacity)
	}
	sum := 0.0
	for class, r := range reserve {
		if math.IsNaN(r) || r <= 0 || r >= 1 {
			return 0, fmt.Errorf("fleet usage: reserve %v for class %q, want a share in (0, 1)", r, class)
		}
		sum += r
	}
	if sum >= 1 {
		return 0, fmt.Errorf("fleet usage: reserves add up to %v, leaving nothing for other classes", sum)
	}
	return max(int64(math.Floor(float64(capacity)*(1-sum)+1e-9)), 1), nil
}
