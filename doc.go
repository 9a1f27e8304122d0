// Package sluice is admission control for Go services: one decision
// pipeline (a Chain of Gates) that decides, per request and before any
// scarce work starts, whether to admit it, and when it rejects, says why,
// for whom and when to come back.
//
// The vocabulary lives here: a Request (tenant, server-authorized class,
// operation, cost in demand units, deadline) goes through a Chain of Gates,
// cheapest first. Entitlement gates (rate limits) reject with reason
// policy_rate and answer 429; protection gates (concurrency, shedders)
// reject with overload and answer 503. An admitted request carries a
// Ticket that must be done exactly once, on every path, with its Outcome;
// useful completions before the deadline are goodput.
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
//	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}),
//		gate.Options{Scope: sluice.ScopeTenant})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate)
//
//	d, err := chain.Do(ctx, &sluice.Request{Tenant: key, Cost: 1}, func(ctx context.Context) error {
//		return serve(ctx)
//	})
//	if !d.Admitted { /* 429 with d.RetryAfter */ }
//
// Gates switch between enforce, shadow (decide and record, never block) and
// off at run time with Chain.SetMode, without locks on the decision path.
//
// # Internal organization
//
// The packages form layers, and a package imports only from the layers
// below its own (TestLayers enforces it, and fails on a package placed in
// none):
//
//  0. Vocabulary: this package (Request, Decision, Gate, Chain, Ticket),
//     clock, and internal utilities that import nothing above it
//     (internal/gatetest drives one gate outside a chain, for tests).
//  1. Algorithms and wire formats: limit (token bucket, GCRA, windows,
//     concurrency counts as pure functions of a state), the lease
//     allocator's step and service-time estimates (internal/leasealloc,
//     internal/servicetime), internal/wire (every wire format: headers,
//     envelopes, problem bodies), identify.
//  2. Stores that run the algorithms: store (the interface), store/memory,
//     store/redis (the Lua twins), and the one registry of algorithms that
//     builds each on either store (internal/algorithm), for the policy
//     file and the Envoy rate limit service.
//  3. Gates: gate (rate and in-flight gates over a store), adaptive, shed,
//     fair, queue, lease. A gate package imports no other gate package;
//     what two gates share lives a layer down.
//  4. Assembly: policy (a policy file into a Chain), metrics. (The
//     Envoy rate limit service, package rls, sits on this layer too, in
//     module grpcgate beside its gRPC adapter.)
//  5. Surfaces: httpgate (whose implementation, internal/httpcore, the
//     servers share), client, proxy, serve and their lifecycle
//     (internal/host).
package sluice
