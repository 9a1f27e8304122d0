package limit

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// Status is the verdict of one algorithm step.
type Status uint8

const (
	// Allowed: the cost was taken; proceed (after Result.Wait, if any).
	Allowed Status = iota
	// Denied: not now; the same cost can be admitted after Result.RetryAfter
	// if nothing else takes capacity meanwhile.
	Denied
	// Exceeded: the cost is larger than the limit can ever grant (for
	// example cost above burst). Retrying cannot help; RetryAfter is 0.
	Exceeded
	// Invalid: the cost is ≤ 0. Nothing was taken.
	Invalid
	// TooLate: a pacing step would make the request wait past its deadline.
	// Nothing was taken.
	TooLate
)

var statusNames = [...]string{"allowed", "denied", "exceeded", "invalid", "too_late"}

// String returns the status name, e.g. "denied".
func (s Status) String() string {
	if int(s) < len(statusNames) {
		return statusNames[s]
	}
	return "unknown"
}

// Result is the outcome of one algorithm step. All durations are exact
// (rounded up to the nanosecond) and non-negative.
type Result struct {
	// Status is the verdict.
	Status Status
	// Limit is the quota in demand units (burst, window limit, queue size
	// or concurrency limit).
	Limit int64
	// Remaining is the whole units still available after this step, in
	// [0, Limit].
	Remaining int64
	// RetryAfter is, for Denied, the exact wait until the same cost fits;
	// 0 otherwise.
	RetryAfter time.Duration
	// ResetAfter is the time until the state is back to fresh (full bucket,
	// empty window) if nothing else arrives.
	ResetAfter time.Duration
	// Wait is, for Allowed results of pacing algorithms (LeakyBucket), how
	// long the caller must wait before proceeding; 0 otherwise.
	Wait time.Duration
}

// OK reports whether the step admitted.
func (r Result) OK() bool { return r.Status == Allowed }

// Algorithm is one rate algorithm as an exact step function over its state S.
// A zero S is the fresh state (a full bucket, an empty window). Methods do
// not synchronize: the store that holds S makes each call atomic.
type Algorithm[S any] interface {
	// Take tries to take cost units at instant now (monotonic ns).
	Take(s *S, now clock.Instant, cost int64) Result
	// Refund returns cost units taken by an earlier Allowed Take (a later
	// gate rejected the request). It never lifts the state above fresh.
	Refund(s *S, now clock.Instant, cost int64)
	// Fresh reports whether s is equivalent to the zero state at now, so a
	// store may drop it without changing any later decision: nothing held,
	// and no instant later than now that a stale reading would be counted
	// at.
	Fresh(s *S, now clock.Instant) bool
	// Limit returns the quota in demand units (for headers).
	Limit() int64
	// Window returns the time a fully used quota takes to come back.
	Window() time.Duration
}

// ClockTolerance is how far a reading of now may lag behind a state's
// latest instant and still be a stale reading: a goroutine that read the
// clock before another one updated the state, or the small skew between the
// clocks of two Redis nodes after a failover. Stale readings are exact (they
// never create capacity; a denial waits for the state's own instant first,
// so a retry-after can exceed the algorithm's window by up to this much). A
// reading further behind is a step of the clock: the state is moved to the
// new time with what it holds (the bucket's deficit, the window's count),
// so a step back neither locks a key out for the step's length nor hands
// out capacity the state did not have. A step forward looks like elapsed
// time: it refills at most one full quota per key, once.
const ClockTolerance = 5 * time.Second

const tolerance = int64(ClockTolerance)

// ErrInvalidParams wraps every construction error of an algorithm.
var ErrInvalidParams = errors.New("limit: invalid parameters")

// paramErr returns an error wrapping ErrInvalidParams that names the
// constructor argument at fault.
func paramErr(name, format string, args ...any) error {
	return param.Errorf(name, "%w: %s", ErrInvalidParams, fmt.Sprintf(format, args...))
}

// maxWindow is the longest window a window algorithm accepts: it keeps
// window arithmetic (start + 2·window) far from int64 overflow.
const maxWindow = 366 * 24 * time.Hour

// maxScaled bounds every fixed-point product an algorithm keeps (burst × period
// in ns, and so on), leaving headroom so sums of two such values never overflow.
const maxScaled = 1 << 61

func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a > 0) == (b > 0) {
		q++
	}
	return q
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// divider divides non-negative int64 values by a fixed positive divisor
// exactly, using a float reciprocal estimate corrected with one multiply, so
// the hot path avoids a hardware 64-bit divide (tens of cycles).
type divider struct {
	d     int64
	recip float64
}

func newDivider(d int64) divider { return divider{d: d, recip: 1 / float64(d)} }

// floor returns ⌊x/d⌋ for x ≥ 0.
func (v divider) floor(x int64) int64 {
	if v.d == 1 {
		return x
	}
	q := int64(float64(x) * v.recip)
	r := x - q*v.d
	switch {
	case r < 0:
		q--
		r += v.d
	case r >= v.d:
		q++
		r -= v.d
	}
	if r < 0 || r >= v.d {
		return x / v.d // estimate off by more than one: only for quotients near 2^53
	}
	return q
}

// ceil returns ⌈x/d⌉ for x ≥ 0.
func (v divider) ceil(x int64) int64 {
	if v.d == 1 {
		return x
	}
	q := v.floor(x)
	if q*v.d != x {
		q++
	}
	return q
}

// Debiter is an Algorithm that can charge units after the fact: the part of
// a request's cost that its work turned out to need beyond what was taken
// when it was admitted (a true-up; the other way, a credit, is Refund). A
// debit is taken whatever the state holds, but never past an empty state:
// a tenant that under-declared finds its quota spent, and its next
// requests wait for it to come back. Costs ≤ 0 are ignored; a cost above
// the limit counts as the limit.
//
// Charging e when admitted and the true-up a−e later leaves the same state
// as charging a up front (the property tests hold it), except that a debit
// meets what the state holds when it comes: one that finds a token bucket
// refilled to full in between is charged whole, where charging up front
// would have refilled part of it (never less than up front), and a
// window's debit counts in the window the work ended in.
type Debiter[S any] interface {
	Debit(s *S, now clock.Instant, cost int64)
}
