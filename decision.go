package sluice

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Reason is the stable category of a rejection. The zero value, ReasonNone,
// belongs to admitted decisions. Names follow the project vocabulary and are
// what the wire formats and metrics print.
type Reason uint8

const (
	// ReasonNone marks an admitted decision.
	ReasonNone Reason = iota
	// ReasonPolicyRate: a rate entitlement (token bucket, GCRA, window) is
	// exhausted. The caller's own traffic is at fault.
	ReasonPolicyRate
	// ReasonConcurrency: a concurrency limit is reached.
	ReasonConcurrency
	// ReasonDeadline: the request cannot finish before its deadline. With
	// EffectPossible it answers admitted work that ran out of its deadline
	// (the proxy's 504).
	ReasonDeadline
	// ReasonOverload: a protection gate sheds load to keep the service in
	// its safe region. The service is at fault, not the caller.
	ReasonOverload
	// ReasonDependency: the state a gate needs (for example its Redis store)
	// is unavailable and the gate's failure policy is to reject.
	ReasonDependency
	// ReasonInvalid: the request itself is malformed (cost out of range,
	// bad identity or deadline header). Retrying unchanged cannot help.
	ReasonInvalid
	// ReasonUpstream: not an admission rejection but the answer to an
	// admitted request whose upstream failed (the proxy's 502). The work may
	// have had an effect.
	ReasonUpstream
	// ReasonQueue: the request waited in a concurrency gate's queue and
	// got no slot within the queue's bound (full, or standing: CoDel's
	// drops). The service is at fault, not the caller.
	ReasonQueue
)

// ReasonCount is the number of reasons, ReasonNone included: every Reason
// is below it, so it sizes a table indexed by reason.
const ReasonCount = int(ReasonQueue) + 1

var reasonNames = [ReasonCount]string{"", "policy_rate", "concurrency", "deadline", "overload", "dependency", "invalid", "upstream", "queue"}

// String returns the wire name, e.g. "policy_rate"; "" for ReasonNone.
func (r Reason) String() string {
	if int(r) < len(reasonNames) {
		return reasonNames[r]
	}
	return "unknown"
}

// Scope names what a limit is counted over.
type Scope uint8

const (
	// ScopeService: one count for the whole service (all tenants).
	ScopeService Scope = iota
	// ScopeTenant: one count per tenant.
	ScopeTenant
	// ScopeOperation: one count per operation (route).
	ScopeOperation
	// ScopeTenantOperation: one count per tenant and operation pair.
	ScopeTenantOperation
	// ScopeClass: one count per class.
	ScopeClass
	// ScopeClient: one count per client address (Request.Client), beside
	// whatever key the tenant is: per-IP limits and per-key quotas in one
	// chain.
	ScopeClient
)

var scopeNames = [...]string{"service", "tenant", "operation", "tenant_operation", "class", "client"}

// String returns the wire name, e.g. "tenant".
func (s Scope) String() string {
	if int(s) < len(scopeNames) {
		return scopeNames[s]
	}
	return "unknown"
}

// PerCaller reports whether a limit counted over s belongs to each caller
// (tenant, tenant_operation) rather than being shared by all callers: a
// per-caller limit is an entitlement, a shared one protects capacity.
func (s Scope) PerCaller() bool {
	return s == ScopeTenant || s == ScopeTenantOperation || s == ScopeClient
}

// ParseScope returns the Scope named s: "service", "tenant", "operation",
// "tenant_operation" or "class". The error lists the names.
func ParseScope(s string) (Scope, error) {
	for i, n := range scopeNames {
		if n == s {
			return Scope(i), nil
		}
	}
	return 0, fmt.Errorf("sluice: unknown scope %q (want %s)", s, strings.Join(scopeNames[:], ", "))
}

// Key returns the state key of r under scope s. For ScopeTenantOperation it
// allocates the joined key; every other scope returns a field of r unchanged.
func (s Scope) Key(r *Request) string {
	switch s {
	case ScopeTenant:
		return r.Tenant
	case ScopeOperation:
		return r.Operation
	case ScopeTenantOperation:
		return r.Tenant + "\x00" + r.Operation
	case ScopeClass:
		return r.Class
	case ScopeClient:
		return r.Client
	}
	return ""
}

// Unit is the quota unit a decision counts in, as the RateLimit header
// fields name it.
type Unit uint8

const (
	// UnitRequests: demand units (cost) of requests over a window.
	UnitRequests Unit = iota
	// UnitConcurrentRequests: requests in flight at once.
	UnitConcurrentRequests
)

// Decision is the verdict of a gate or of a whole Chain for one Request.
// A rejection is a value, not an error: Admitted false with a Reason.
//
// Durations are non-negative. RetryAfter is meaningful only when Admitted is
// false and Retryable is true: it is the exact earliest wait after which the
// same request could be admitted, before any jitter; the wire layer rounds it
// up to whole seconds. A rejection that retrying cannot help (cost above the
// burst, invalid input) has Retryable false and RetryAfter 0.
//
// The small fields come first, so that a Decision fills one 64-byte cache
// line.
type Decision struct {
	// Admitted is true when the request may proceed.
	Admitted bool
	// Reason is ReasonNone when admitted, otherwise the rejection category.
	Reason Reason
	// Scope is what the deciding limit is counted over.
	Scope Scope
	// Unit is the quota unit of Limit and Remaining.
	Unit Unit
	// Retryable reports whether retrying the same request later can succeed.
	Retryable bool
	// Refills reports that the quota refills continuously (a token bucket
	// or GCRA): Limit is the burst and Limit ÷ Window the sustained rate.
	// Otherwise a window's Limit comes back whole once per Window.
	Refills bool
	// EffectPossible reports whether the request may have had an effect.
	// Admission rejects before execution, so it is false for every
	// rejection a Chain makes.
	EffectPossible bool
	// Level is the degradation level the service is in for this request
	// (the highest any gate reported): handlers of admitted requests should
	// serve the cheaper result it calls for.
	Level Level
	// Gate is the name of the deciding gate ("" when no gate decided, e.g.
	// an invalid request rejected before the gates ran).
	Gate string
	// Limit is the deciding policy's quota in Unit (burst, window limit or
	// concurrency limit); 0 when the gate has no quota to report.
	Limit int64
	// Window is the policy's window: the time a full quota takes to come
	// back (burst / rate for buckets, the window length for windows); 0 for
	// concurrency limits.
	Window time.Duration
	// Remaining is the quota left in Unit after this decision, 0 ≤ Remaining ≤ Limit.
	Remaining int64
	// ResetAfter is the time until the quota is whole again.
	ResetAfter time.Duration
	// RetryAfter is the exact earliest useful retry delay (see type doc).
	RetryAfter time.Duration
}

// Level is a degradation level: how much a service under pressure cuts
// from the work it admits. Handlers read it from the request context
// (LevelFrom) and serve the cheaper result (skip enrichment, serve cached
// data) above LevelNormal.
type Level uint8

const (
	// LevelNormal: full service.
	LevelNormal Level = iota
	// LevelDegrade: serve degraded results.
	LevelDegrade
	// LevelShed: non-critical work is shed; admitted work is degraded.
	LevelShed
	// LevelRecover: coming back; load is ramped up in stages.
	LevelRecover
)

var levelNames = [...]string{"normal", "degrade", "shed", "recover"}

// String returns "normal", "degrade", "shed" or "recover".
func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return "unknown"
}

type levelKey struct{}

// ContextWithLevel returns ctx carrying level l.
func ContextWithLevel(ctx context.Context, l Level) context.Context {
	return context.WithValue(ctx, levelKey{}, l)
}

// LevelFrom returns the degradation level in ctx (LevelNormal if none).
func LevelFrom(ctx context.Context) Level {
	l, _ := ctx.Value(levelKey{}).(Level)
	return l
}

type classKey struct{}

// ContextWithClass returns ctx carrying the class its request was admitted
// as, which calls made on its behalf pass on (ClassHeader).
func ContextWithClass(ctx context.Context, class string) context.Context {
	return context.WithValue(ctx, classKey{}, class)
}

// ClassFrom returns the class ctx's request was admitted as ("" if none).
func ClassFrom(ctx context.Context) string {
	c, _ := ctx.Value(classKey{}).(string)
	return c
}

type waitKey struct{}

// ContextWithWait returns ctx asking gates that pace admitted requests (a
// leaky bucket's scheduled slot) to add their wait to *w instead of
// sleeping: the caller then delays the work itself. It is for callers that
// run on a virtual clock, such as the simulator; on a real clock, let the
// gates wait.
func ContextWithWait(ctx context.Context, w *time.Duration) context.Context {
	return context.WithValue(ctx, waitKey{}, w)
}

// WaitFrom returns the wait accumulator of ContextWithWait, or nil.
func WaitFrom(ctx context.Context) *time.Duration {
	w, _ := ctx.Value(waitKey{}).(*time.Duration)
	return w
}

// Entitlement reports whether the rejection is about the caller's own usage
// (answered with 429 Too Many Requests) rather than the service's capacity
// (answered with 503 Service Unavailable): policy_rate always, and
// concurrency when the limit is counted per caller (Scope.PerCaller). It is
// the one place the 429-or-503 rule lives.
func (d *Decision) Entitlement() bool {
	switch d.Reason {
	case ReasonPolicyRate:
		return true
	case ReasonConcurrency:
		return d.Scope.PerCaller()
	}
	return false
}
