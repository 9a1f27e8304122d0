package gate

import (
	"context"
	"slices"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Classes applies a gate only to requests of the listed classes; requests of
// other classes pass it untouched. It is how one chain holds a budget per
// class (a premium reservation that free traffic never draws on).
type Classes struct {
	sluice.Gate
	classes []string
}

var _ sluice.Wrapper = (*Classes)(nil)

// ForClasses returns g applied only to requests whose class is in classes.
func ForClasses(g sluice.Gate, classes []string) *Classes {
	return &Classes{Gate: g, classes: slices.Clone(classes)}
}

func (c *Classes) applies(r *sluice.Request) bool {
	return slices.Contains(c.classes, r.Class)
}

// Decide asks the wrapped gate when r's class is listed, and admits
// otherwise.
func (c *Classes) Decide(ctx context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	if !c.applies(r) {
		return sluice.Decision{Admitted: true}, 0
	}
	return c.Gate.Decide(ctx, r, now)
}

// Release forwards to the wrapped gate when it decided r.
func (c *Classes) Release(r *sluice.Request, p sluice.Permit, done sluice.Completion) {
	if c.applies(r) {
		c.Gate.Release(r, p, done)
	}
}

// Unwrap returns the gate applied to the listed classes, so that its
// capabilities stay visible through the filter (sluice.As).
func (c *Classes) Unwrap() sluice.Gate { return c.Gate }
