// Package policy turns a policy file (YAML: the service, its store, how
// requests are identified, routes with class and cost, and a list of gates)
// into a running sluice Chain, and checks files without building them.
// Every error names the file, the line and the field at fault.
//
//	f, err := policy.Load("routes-api.yaml") // parse and validate; never dials
//	if err != nil {
//		log.Fatal(err) // routes-api.yaml:12: gates[1].rate: limit: invalid rate "100/x" ...
//	}
//	rt, err := policy.Build(f, nil, policy.Options{}) // opens the store (Redis need not be up)
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer rt.Close()
//	mw, _ := httpgate.New(rt.Chain, httpgate.Config{Rules: rt.Rules})
//
// # Validation and construction
//
// Parse reads a file and Validate checks everything a build would check
// (each algorithm's parameters, what a Redis script can hold, classes and
// tiers against the routes) as a pure function of the file: `sluice check`
// works on a laptop without Redis. Build validates again, then opens the
// store and builds the gates; Redis need not be up (the gates decide by
// their failure policies until it answers). A
// Build with the previous Runtime keeps the state of gates whose meaning
// did not change, so a hot reload does not reset limits.
//
// Errors are an Errors list of Error values (file, line, field path,
// message) that keep their cause: errors.Is and errors.As see through them
// to limit.ErrInvalidParams, store.ErrUnavailable and the other sentinels
// of the packages below.
//
// # Gate kinds
//
// Each gate kind is one spec in its own file (tokenbucket.go,
// concurrency.go, ladder.go, ...), registered in the kinds list of kind.go:
// its name and doc, its default scope, whether it keeps state in the store
// (so on_failure applies), the reason of its rejections (from which 429 or
// 503 follows, by sluice.Decision.Entitlement), and a params type with its
// fields (key, meaning and unit, default, how the value is read), a check
// that never dials, a build, a line for the spec text and a state key for
// reloads. The reference of the policy file (docs/policy.md) is generated
// by Reference from the same registry and from the schema of the other
// keys (schema.go), which the parser reads its key lists from.
//
// Adding a gate kind touches:
//  1. its own file: var fooKind = &kind{...} and fooParams with fields,
//     check, build, describe and stateKey;
//  2. one line in the kinds list of kind.go;
//  3. its docs: the kind's doc and its fields' docs in that file, then
//     `go test ./policy -run TestReference -rewrite` to regenerate the
//     reference.
//
// Nothing else in the parser, the validator, the builder or the spec text
// names a kind.
package policy
