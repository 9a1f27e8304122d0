package gate

import (
	"context"
	"slices"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// classGate is the gate ForClasses returns.
type classGate struct {
	sluice.Gate
	classes []string
}

var _ sluice.Wrapper = (*classGate)(nil)

// ForClasses returns g applied only to requests whose class is in classes.
//
// The gate applies g only to requests of the listed classes; requests of
// other classes pass it untouched. It is how one chain holds a budget per
// class (a premium reservation that free traffic never draws on).
//
// Decide asks the wrapped gate when r's class is listed, and admits
// otherwise.
//
// Release forwards to the wrapped gate when it decided r.
//
// Unwrap returns the gate applied to the listed classes, so that its
// capabilities stay visible through the filter (sluice.As).
func ForClasses(g sluice.Gate, classes []string) sluice.Gate {
	return &classGate{Gate: g, classes: slices.Clone(classes)}
}

func (c *classGate) applies(r *sluice.Request) bool {
	return slices.Contains(c.classes, r.Class)
}

// Decide asks the wrapped gate when r's class is listed, and admits
// otherwise.
func (c *classGate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	if !c.applies(r) {
		d.Admitted = true
		return 0
	}
	return c.Gate.Decide(ctx, r, now, d)
}

// SpendsAtAdmission reports whether the wrapped gate spends its quota at
// admission (see sluice.Gate): the filter holds nothing of its own.
func (c *classGate) SpendsAtAdmission() bool {
	s, ok := c.Gate.(interface{ SpendsAtAdmission() bool })
	return ok && s.SpendsAtAdmission()
}

// Release forwards to the wrapped gate when it decided r.
func (c *classGate) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if c.applies(r) {
		c.Gate.Release(r, p, done)
	}
}

// Unwrap returns the gate applied to the listed classes, so that its
// capabilities stay visible through the filter (sluice.As).
func (c *classGate) Unwrap() sluice.Gate { return c.Gate }
