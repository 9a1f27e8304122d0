// Package grpcgate is sluice as gRPC server interceptors: each call is
// identified with the server-side rules of package identify (the full
// method "/pkg.Service/Method" is the path, "POST" the method, as on the
// wire), decided by a sluice Chain before the handler runs, and either
// refused with a gRPC status that says whose fault it is and when to come
// back, or run with its Ticket released on every path. It is a module of
// its own (github.com/sluice-go/sluice/grpcgate), so that users of the core
// library do not pull gRPC.
//
//	ic, err := grpcgate.New(chain, grpcgate.Options{Rules: identify.Rules{
//		TenantHeader: "x-api-key",
//		Routes: []identify.Route{
//			{Path: "/acme.v1.Orders/Create", Class: sluice.ClassCritical,
//				Cost: identify.Cost{Header: "x-items", Per: 10, Max: 50}},
//			{Path: "/acme.v1.Reports/*", Class: sluice.ClassSheddable},
//		},
//	}})
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(recovery, ic.Unary()),
//		grpc.ChainStreamInterceptor(ic.Stream()))
//
// # Identification
//
// A call is identified as the HTTP/2 request it is (PROTOCOL-HTTP2.md in
// github.com/grpc/grpc: every call is a POST to "/Service/Method"), so one
// policy file's routes classify a call the same way here and at an Envoy
// in front running package extauthz:
//
//   - the tenant is the metadata value of Rules.TenantHeader (matched
//     without case, as gRPC lowercases metadata keys);
//   - class, operation and cost come from the first route whose Path
//     matches the full method and whose Method is empty or "POST"; a
//     route's Cost.Header names a metadata key;
//   - the deadline is the call's own gRPC deadline (grpc-timeout), capped
//     at Rules.MaxDeadline, or Rules.DefaultDeadline for calls without
//     one; Rules.DeadlineHeader is not read (gRPC carries its own);
//   - the request id of Rules.RequestIDHeader is echoed, or one is
//     generated, in the trailer of every refusal.
//
// Route paths match the method name segment by segment ("*" for one
// segment, as in "/acme.v1.Reports/*"); PathExact is the natural choice
// for gRPC, whose server dispatches on the exact name, but the lenient
// default only ever matches more case variants of names, never fewer.
//
// # Status mapping
//
// The split is httpgate's (sluice.Decision.Entitlement) with gRPC's codes
// (grpc/grpc doc/statuscodes.md; google.rpc.Code maps RESOURCE_EXHAUSTED
// to HTTP 429 and UNAVAILABLE to 503):
//
//	decision                                  HTTP  gRPC
//	policy_rate; concurrency per tenant       429   RESOURCE_EXHAUSTED
//	concurrency shared, overload, queue,      503   UNAVAILABLE
//	  deadline, dependency
//	invalid (malformed tenant or cost)        400   INVALID_ARGUMENT
//
// Every refusal carries, in its trailer (a refusal is Trailers-Only: no
// header metadata is sent, so that clients may retry it, gRFC A6
// "When Retries are Valid"):
//
//   - grpc-retry-pushback-ms (gRFC A6 "Pushback"): the wait in
//     milliseconds when the refusal is retryable, spread by Options.Jitter
//     since gRPC clients retry after exactly the pushback; "-1" (do not
//     retry) when retrying cannot help; absent for INVALID_ARGUMENT (a
//     pushback, even "do not retry", counts as a failure in the client's
//     retry throttle, which malformed requests must not drain) and for
//     retryable refusals without a known wait (the client's backoff
//     applies);
//   - ratelimit and ratelimit-policy: the RateLimit fields httpgate sends
//     (draft-ietf-httpapi-ratelimit-headers-10, see package wire);
//   - the request id.
//
// The status's details hold a google.rpc.ErrorInfo (reason, domain
// ErrorDomain, and the gate, scope and retryable as metadata) and, when
// there is a wait, a google.rpc.RetryInfo with the same delay as the
// pushback; the message is httpgate's envelope message.
//
// Admitted calls carry ratelimit and ratelimit-policy in their trailer,
// not their header: header metadata sent before a handler fails would
// commit the call and make its failure unretryable (gRFC A6).
//
// # Completion
//
// A Ticket is done when the handler returns, with the outcome of its
// status (Outcome): OK useful (late past the deadline), CANCELED or a
// cancelled call cancelled, DEADLINE_EXCEEDED late, the server-fault codes
// (UNKNOWN, INTERNAL, UNIMPLEMENTED, UNAVAILABLE, DATA_LOSS) errored, and
// the caller-fault codes useful, as httpgate counts a 4xx. A panicking
// handler releases its permits as errored and the panic goes on; install a
// recovery interceptor outside this one if the server must survive it. A
// stream holds its permits from its start until its handler returns.
//
// Packages envoyrls and extauthz below this one answer Envoy's rate limit
// service and external authorization protocols from sluice.
package grpcgate
