// Package gate holds sluice's gates over a store: NewRateLimit (token
// bucket, GCRA and window entitlements, 429), NewInFlight (in-flight slots
// held until the Ticket is done), NewPacer (a bounded paced queue) and
// NewFleetUsage (a fleet-wide in-flight count with reserved classes, 503),
// each over a store.Limiter so it runs unchanged in memory or on Redis,
// with an explicit failure policy for when its store cannot decide; and
// ForClasses, which applies any gate to some classes only.
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
//	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}),
//		gate.Options{Scope: sluice.ScopeTenant})
//	c, _ := limit.NewConcurrency(20)
//	inflight, _ := gate.NewInFlight("concurrent-requests", memory.NewKeyed(c, memory.Options{}),
//		gate.Options{Scope: sluice.ScopeTenant})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, inflight)
package gate
