// Package gatetest drives one sluice.Gate outside a chain, for tests: the
// gate's verdict comes back by value instead of being written in place.
//
//	d, p := gatetest.Decide(ctx, g, &sluice.Request{Cost: 1}, now)
package gatetest

import (
	"context"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Decide asks g for its verdict on r at now, as a Chain would, and returns
// it with the permit g returned (0 unless it admitted).
func Decide(ctx context.Context, g sluice.Gate, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	var d sluice.Decision
	p := g.Decide(ctx, r, now, &d)
	return d, p
}
