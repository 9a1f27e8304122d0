// Package rls answers Envoy's rate limit service protocol
// (envoy.service.ratelimit.v3, RateLimitService/ShouldRateLimit) from
// sluice's limiters: a drop-in for envoyproxy/ratelimit that reads its
// configuration files as they are and decides as it does, call by call, on
// memory, Redis or Redis Cluster. A rate_limit block may also name one of
// sluice's algorithms (token_bucket, gcra, sliding_window, sliding_log,
// concurrency: any of sluice's registry that answers at once),
// so a configuration can move to better limiters without leaving the
// format.
//
//	cfg, err := rls.Load("/srv/runtime_data/current/config") // a file or a folder, one domain per file
//	srv, err := rls.New(cfg, rls.Options{Redis: store, OnFailure: rls.FailOpen})
//	resp, err := srv.ShouldRateLimit(ctx, &rls.Request{Domain: "edge_proxy",
//		Descriptors: []rls.Descriptor{{Entries: []rls.Entry{{Key: "remote_address", Value: ip}}}}})
//	http.Handle("/json", &rls.JSONHandler{Service: srv}) // the peer's POST /json
//
// # Semantics
//
// The fixed window (the default, and the peer's only algorithm) follows
// envoyproxy/ratelimit's src/service/ratelimit.go,
// src/limiter/base_limiter.go and src/redis/fixed_cache_impl.go: windows
// aligned on the Unix epoch and the unit (a month is 30 days, a year 365),
// every hit counted (as INCRBY counts it), over when the count after the
// call exceeds requests_per_unit, duration_until_reset in whole seconds.
// Server.ShouldRateLimit lists the rest: overrides, unlimited, replaces,
// shadow and quota modes, hits_addend. The README's "Envoy rate limit
// service" section tabulates each peer behaviour with the test that
// reproduces it, and the differences.
//
// # Failures and bounds
//
// A call's store work is bounded by Options.Timeout (default 50 ms; the
// descriptors go to Redis concurrently), and a store failure answers by
// Options.OnFailure: an error wrapping ErrUnavailable (the peer's, and
// Envoy then applies failure_mode_deny), OK counted in
// sluice_rls_fail_open_total, or OVER_LIMIT. Malformed calls (no domain,
// no descriptors, more than Options.MaxDescriptors or MaxEntries, an empty
// key, bytes that are not UTF-8, hits above MaxHits, an unknown override
// unit) wrap ErrInvalid and are refused before any store work.
package rls
