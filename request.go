package sluice

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Standard class names, from most to least protected. Classes are
// server-authorized: they come from server-side route rules, never from a
// client-supplied header. Shedding gates drop the lowest tier first:
// sandbox, then sheddable, then default, and critical last.
const (
	ClassCritical  = "critical"
	ClassDefault   = "default"
	ClassSheddable = "sheddable"
	ClassSandbox   = "sandbox"
)

// The header fields sluice owns on a request it admitted and passes on
// (sluice proxy's upstream request, package client's calls downstream):
// the class it admitted the request as and the degradation level it was
// admitted at (absent: normal). A sluice never believes them from a
// client: a proxy strips them from what it forwards, and identification
// reads the class only from peers it trusts (identify.Peers), where it
// can lower a request's class, never raise it.
const (
	ClassHeader = "Sluice-Class"
	LevelHeader = "Sluice-Level"
)

// MaxCost is the largest cost a Request may carry, in demand units. It keeps
// every product of a cost with a rate's period inside int64.
const MaxCost = 1 << 40

// MaxKeyLen is the longest tenant, class or operation a Request may carry,
// in bytes. It bounds per-key memory in stores.
const MaxKeyLen = 256

// Request is what a Chain decides on: who asks (Tenant), with which
// server-authorized priority (Class), for what (Operation), how much of the
// scarce resource it will consume (Cost, in integer demand units), and by
// when it must finish (Deadline).
type Request struct {
	// Tenant identifies the caller, e.g. the API key's owner. May be empty
	// for anonymous traffic (then all anonymous callers share one key).
	Tenant string
	// Class is the server-authorized priority class (ClassCritical, ...).
	Class string
	// Operation names the route or method, e.g. "POST /v1/routes".
	Operation string
	// Cost is the demand of this request in integer demand units, in
	// [1, MaxCost]. The zero value is treated as 1.
	Cost int64
	// Deadline is the instant, on the Chain's clock, by which a response
	// is still useful; 0 means no deadline.
	Deadline clock.Instant
	// Client is the caller's network address, grouped by prefix, as the
	// identity rules found it, for gates counted per client (ScopeClient);
	// empty when no gate counts by it. A state key: never logged.
	Client string

	retest bool // MarkRetest
}

// set copies *src to *r a field at a time: the caller has just written
// *src a field at a time, and a block copy's 16-byte loads, each over two
// of those stores, would wait for them to reach the cache instead of
// taking their values from the store buffer (Chain.Decide).
// TestGatesSeeTheWholeRequest catches a field left out.
func (r *Request) set(src *Request) {
	r.Tenant, r.Class, r.Operation, r.Client = src.Tenant, src.Class, src.Operation, src.Client
	r.Cost, r.Deadline, r.retest = src.Cost, src.Deadline, src.retest
}

// MarkRetest marks r as let through against a gate's own estimate, to
// measure the service again (a deadline gate's retest of a class it turns
// away): the gates after it do not refuse r on their predictions of its
// service time either, or the estimate could never learn that the service
// got faster. The Chain clears the mark when it begins deciding r.
func (r *Request) MarkRetest() { r.retest = true }

// Retest reports whether a gate marked r with MarkRetest.
func (r *Request) Retest() bool { return r.retest }

// ErrInvalidRequest wraps every reason a Request is refused as malformed.
var ErrInvalidRequest = errors.New("sluice: invalid request")

// Validate checks r's fields and normalizes a zero Cost to 1. It returns an
// error wrapping ErrInvalidRequest that names the bad field.
func (r *Request) Validate() error {
	if r.Cost == 0 {
		r.Cost = 1
	}
	if r.valid() {
		return nil
	}
	if r.Cost < 0 || r.Cost > MaxCost {
		return fmt.Errorf("%w: cost %d outside [1, %d]", ErrInvalidRequest, r.Cost, int64(MaxCost))
	}
	if len(r.Tenant) > MaxKeyLen || len(r.Class) > MaxKeyLen || len(r.Operation) > MaxKeyLen || len(r.Client) > MaxKeyLen {
		return fmt.Errorf("%w: tenant, class, operation or client longer than %d bytes", ErrInvalidRequest, MaxKeyLen)
	}
	if r.Deadline < 0 {
		return fmt.Errorf("%w: negative deadline", ErrInvalidRequest)
	}
	return nil
}

// valid reports, without a call, whether Validate would pass r unchanged:
// the rule Validate applies (after a zero Cost becomes 1), which the chain
// checks inline before calling it.
func (r *Request) valid() bool {
	return r.Cost >= 1 && r.Cost <= MaxCost && r.Deadline >= 0 &&
		max(len(r.Tenant), len(r.Class), len(r.Operation), len(r.Client)) <= MaxKeyLen
}

// Outcome is how admitted work ended. Useful completions are goodput.
type Outcome uint8

const (
	// OutcomeUseful: completed correctly before its deadline (goodput).
	OutcomeUseful Outcome = iota
	// OutcomeLate: completed, but after its deadline.
	OutcomeLate
	// OutcomeErrored: failed (error, panic, upstream failure).
	OutcomeErrored
	// OutcomeCancelled: the caller went away or the work was abandoned.
	OutcomeCancelled
	// OutcomeRejected: never started because a later gate of the chain
	// rejected the request; gates may refund what they took.
	OutcomeRejected
)

var outcomeNames = [...]string{"useful", "late", "errored", "cancelled", "rejected"}

// String returns the metric label of o, e.g. "useful".
func (o Outcome) String() string {
	if int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "unknown"
}

// Completion is what a gate learns when a request it admitted ends.
type Completion struct {
	// Outcome is how the work ended.
	Outcome Outcome
	// Now is the release instant on the Chain's clock.
	Now clock.Instant
	// Latency is the time from admission to release: from the moment the
	// request held all its permits, after any wait in a gate (Waiter).
	Latency time.Duration
	// Cost is the work's actual cost in demand units, when the caller
	// learned it (Ticket.DoneCost): rate gates charge the difference from
	// Request.Cost, the estimate taken at admission, or give it back. 0:
	// the estimate stands.
	Cost int64
}
