package sluice

// Jitter spreads Retry-After values so that clients rejected together do
// not come back together. A value of base seconds becomes uniform over the
// whole seconds [base, base + spread], spread = max(Min, ⌈base·Fraction⌉).
// It never goes below the true wait. The zero Jitter is off. The HTTP
// middleware, the servers and the gRPC interceptors take one.
type Jitter struct {
	// Fraction of the wait added at most, e.g. 0.5.
	Fraction float64
	// Min is the least spread in seconds, so short waits are spread too.
	Min int64
}

// DefaultJitter spreads a wait of w seconds over [w, w + max(1, ⌈w/2⌉)].
var DefaultJitter = Jitter{Fraction: 0.5, Min: 1}
