package client

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Local rejections: a request the client refuses to send. Both are
// distinguishable with errors.Is and wrap ErrLocal.
var (
	// ErrLocal is the parent of the local rejections.
	ErrLocal = errors.New("client: rejected locally")
	// ErrThrottled: the adaptive throttle rejected the request (the server
	// has been refusing most requests lately).
	ErrThrottled = fmt.Errorf("%w: adaptive throttle (the server refuses most requests)", ErrLocal)
	// ErrPaced: keeping the server's advertised quota would delay the
	// request past its deadline or past Options.WaitCap.
	ErrPaced = fmt.Errorf("%w: quota pacing would pass the deadline or the wait cap", ErrLocal)
)

// Options configures a Retrier. The zero value is valid: the defaults below.
type Options struct {
	// MaxAttempts bounds the attempts of one request, the first included.
	// Default 3; 1 never retries.
	MaxAttempts int
	// Backoff is the jittered exponential backoff between attempts
	// (default Base 100 ms, Cap 10 s).
	Backoff Backoff
	// FloorSpread is the upward jitter added to a server's wait
	// (Retry-After, gRPC pushback), as a fraction of it: a wait of w
	// becomes uniform over [w, w·(1 + FloorSpread)]. Default 1; negative:
	// none (the exact wait).
	FloorSpread float64
	// BudgetRatio is the retry budget: retries per request, over time.
	// Default 0.1; negative: no budget (MaxAttempts alone bounds retries).
	BudgetRatio float64
	// BudgetBurst is the retries the budget saves up, and starts with.
	// Default 10.
	BudgetBurst float64
	// ThrottleK is the adaptive throttle's multiplier K. Default 2;
	// negative: no throttle.
	ThrottleK float64
	// ThrottleWindow is the throttle's sliding window (default 2 minutes,
	// the book's), in ThrottleBuckets buckets (default 24).
	ThrottleWindow  time.Duration
	ThrottleBuckets int
	// ThrottleMin is the requests the window must hold before the
	// throttle rejects anything. Default 10; negative: 0.
	ThrottleMin int64
	// PaceBelow starts pacing to an advertised quota once the remaining
	// units fall to this fraction of it. Default 0.1; negative: no pacing
	// (a RateLimit field with r=0 is still a floor for a refused request's
	// retry, through its Retry-After).
	PaceBelow float64
	// WaitCap is the longest the client sleeps inside one call, before a
	// retry or to keep a quota, whatever the server asks (a Retry-After of
	// an hour, a quota that resets tomorrow). A retry that would wait
	// longer is not made (the refusal is returned, Next stops with
	// StopWaitCap) and pacing that would wait longer refuses the request
	// (ErrPaced). Default 20 s; negative: no cap (the request's context
	// alone bounds the wait). The backoff's own Cap is below it.
	WaitCap time.Duration
	// Clock tells the time (default clock.System).
	Clock clock.Clock
	// Sleep waits d or until ctx is done, returning ctx's error then
	// (default: a timer). Tests give one that moves a fake clock.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand is the source of the jitter and of the throttle's draws
	// (default: the runtime's random source). It is used under the
	// Retrier's lock.
	Rand rand.Source
	// Observer receives the client's counts (nil: none); see Metrics.
	Observer Observer
}

// validate reports the first field out of range.
func (o *Options) validate() error {
	switch {
	case o.MaxAttempts < 0 || o.MaxAttempts > 100:
		return fmt.Errorf("client: MaxAttempts %d, want 1 to 100 (0: default 3)", o.MaxAttempts)
	case o.Backoff.Base < 0 || o.Backoff.Cap < 0 || (o.Backoff.Cap > 0 && o.Backoff.Base > o.Backoff.Cap):
		return fmt.Errorf("client: Backoff base %v, cap %v: want 0 < base ≤ cap", o.Backoff.Base, o.Backoff.Cap)
	case math.IsNaN(o.FloorSpread) || o.FloorSpread > 100:
		return fmt.Errorf("client: FloorSpread %v, want ≤ 100", o.FloorSpread)
	case o.WaitCap > 0 && max(o.Backoff.Cap, o.Backoff.Base) > o.WaitCap:
		return fmt.Errorf("client: Backoff base %v, cap %v above WaitCap %v: every long backoff would end the call", o.Backoff.Base, o.Backoff.Cap, o.WaitCap)
	}
	return o.validateBudgets()
}

// validateBudgets checks the retry budget, the adaptive throttle and the
// pacing.
func (o *Options) validateBudgets() error {
	switch {
	case math.IsNaN(o.BudgetRatio) || o.BudgetRatio > 100 || math.IsNaN(o.BudgetBurst) || o.BudgetBurst < 0 || o.BudgetBurst > 1e9:
		return fmt.Errorf("client: budget ratio %v, burst %v: want ratio ≤ 100 and burst in [0, 1e9]", o.BudgetRatio, o.BudgetBurst)
	case math.IsNaN(o.ThrottleK) || o.ThrottleK > 1000 || o.ThrottleWindow < 0 || o.ThrottleBuckets < 0 || o.ThrottleBuckets > 10000:
		return fmt.Errorf("client: throttle K %v, window %v, buckets %d: want K ≤ 1000, window ≥ 0, 0 to 10000 buckets", o.ThrottleK, o.ThrottleWindow, o.ThrottleBuckets)
	case math.IsNaN(o.PaceBelow) || o.PaceBelow > 1:
		return fmt.Errorf("client: PaceBelow %v, want ≤ 1", o.PaceBelow)
	}
	return nil
}

func (o *Options) defaults() {
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 3
	}
	if o.Backoff.Base == 0 {
		o.Backoff.Base = 100 * time.Millisecond
	}
	if o.Backoff.Cap == 0 {
		o.Backoff.Cap = 10 * time.Second
		if o.WaitCap > 0 {
			o.Backoff.Cap = min(o.Backoff.Cap, o.WaitCap)
		}
		o.Backoff.Cap = max(o.Backoff.Cap, o.Backoff.Base)
	}
	if o.FloorSpread == 0 {
		o.FloorSpread = 1
	}
	if o.BudgetRatio == 0 {
		o.BudgetRatio = 0.1
	}
	if o.BudgetBurst == 0 {
		o.BudgetBurst = 10
	}
	if o.ThrottleK == 0 {
		o.ThrottleK = 2
	}
	if o.ThrottleWindow == 0 {
		o.ThrottleWindow = 2 * time.Minute
	}
	if o.ThrottleBuckets == 0 {
		o.ThrottleBuckets = 24
	}
	if o.ThrottleMin == 0 {
		o.ThrottleMin = 10
	}
	o.ThrottleMin = max(o.ThrottleMin, 0)
	if o.PaceBelow == 0 {
		o.PaceBelow = 0.1
	}
	if o.WaitCap == 0 {
		o.WaitCap = max(20*time.Second, o.Backoff.Cap)
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	if o.Sleep == nil {
		o.Sleep = sleep
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Retrier is the client policy shared by every transport (package client's
// RoundTripper, grpcgate's client interceptors): which failures to retry,
// how long to wait, and the per-client state that keeps retries from
// amplifying an overload: the retry budget, the adaptive throttle and the
// quota pacer. Use one Retrier per client of one service: its budget and
// throttle describe that service. It is safe for concurrent use.
type Retrier struct {
	o Options

	mu       sync.Mutex
	rnd      *rand.Rand // nil: the runtime's
	budget   *Budget    // nil: none
	throttle *Throttle  // nil: none
	pacer    *pacer     // nil: none
}

// New returns a Retrier, or the error of Options.Validate.
func New(o Options) (*Retrier, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	o.defaults()
	r := &Retrier{o: o}
	if o.Rand != nil {
		r.rnd = rand.New(o.Rand)
	}
	if o.BudgetRatio > 0 {
		r.budget = NewBudget(o.BudgetRatio, o.BudgetBurst)
	}
	if o.ThrottleK > 0 {
		r.throttle = NewThrottle(o.ThrottleK, o.ThrottleWindow, o.ThrottleBuckets, o.ThrottleMin)
	}
	if o.PaceBelow >= 0 {
		r.pacer = newPacer(o.PaceBelow)
	}
	return r, nil
}

// Now reads the Retrier's clock.
func (r *Retrier) Now() clock.Instant { return r.o.Clock.Now() }

// float64Locked draws a uniform value in [0, 1).
func (r *Retrier) float64Locked() float64 {
	if r.rnd == nil {
		return rand.Float64()
	}
	return r.rnd.Float64()
}

// Uint64 draws a uniform value (for request ids).
func (r *Retrier) Uint64() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rnd == nil {
		return rand.Uint64()
	}
	return r.rnd.Uint64()
}

// ThrottleProbability returns the adaptive throttle's current local
// rejection probability (0 without a throttle).
func (r *Retrier) ThrottleProbability() float64 {
	if r.throttle == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.throttle.probability(r.o.Clock.Now())
}

// Result is how one attempt ended, as a transport reads it.
type Result struct {
	// OK: the attempt succeeded, or failed in a way no retry changes (a
	// 4xx other than 429, a handler's own error): no retry.
	OK bool
	// Refused: the server refused the attempt for load or quota (429, 503,
	// RESOURCE_EXHAUSTED, UNAVAILABLE from an admission gate). Anything
	// else that reached the server counts as accepted by the throttle.
	Refused bool
	// Unanswered: no answer came (a transport error, a per-attempt
	// timeout); it counts as not accepted.
	Unanswered bool
	// Retryable: the server says a retry may succeed (false: "do not
	// retry": a sluice envelope's retryable false, a negative pushback).
	Retryable bool
	// EffectPossible: the attempt may have had an effect (the work may
	// have started), so only a replay-safe request is retried.
	EffectPossible bool
	// Wait is the server's least wait before a retry (Retry-After, gRPC
	// pushback; 0: none).
	Wait time.Duration
	// Cause names the failure in the retry metrics ("refused", "error",
	// "timeout", "upstream").
	Cause string
}

// Call is one logical request and its attempts. It is used by one
// goroutine.
type Call struct {
	r        *Retrier
	ctx      context.Context
	safe     bool          // replay-safe: idempotent, or carrying an idempotency key
	deadline clock.Instant // on the Retrier's clock; 0: none
	attempts int
	pending  bool // an attempt was sent whose outcome the throttle has not counted
}

// Begin starts a logical request: it counts it and credits the retry
// budget. replaySafe says whether the request may be repeated after an
// attempt that may have had an effect (an idempotent method, an
// idempotency key) and whether its body can be sent again.
func (r *Retrier) Begin(ctx context.Context, replaySafe bool) *Call {
	r.o.Observer.Request()
	if r.budget != nil {
		r.mu.Lock()
		r.budget.Deposit()
		r.mu.Unlock()
	}
	c := &Call{r: r, ctx: ctx, safe: replaySafe}
	if dl, ok := ctx.Deadline(); ok {
		// The deadline is wall time: carry it over to the Retrier's clock
		// once, so that every later comparison reads one clock.
		c.deadline = r.o.Clock.Now().Add(max(time.Until(dl), 0))
		if c.deadline == 0 {
			c.deadline = 1
		}
	}
	return c
}

// deadlineAt returns the request's deadline on the Retrier's clock (false:
// none).
func (c *Call) deadlineAt() (clock.Instant, bool) { return c.deadline, c.deadline != 0 }

// attemptsMade returns the attempts sent so far.
func (c *Call) attemptsMade() int { return c.attempts }

// Admit decides whether the next attempt may go: the adaptive throttle may
// refuse it (ErrThrottled) and the quota pacer may delay it, waiting here,
// or refuse it when the wait would pass the context's deadline (ErrPaced).
// It returns the context's error if the context ends while pacing.
func (c *Call) Admit() error {
	r := c.r
	r.mu.Lock()
	now := r.o.Clock.Now()
	if r.throttle != nil && !r.throttle.Allow(now, r.float64Locked()) {
		r.mu.Unlock()
		r.o.Observer.LocalReject("throttle")
		return ErrThrottled
	}
	var wait time.Duration
	if r.pacer != nil {
		wait = r.pacer.Reserve(now)
	}
	if wait > 0 && !c.paceFits(now, wait) {
		r.pacer.Cancel()
		r.mu.Unlock()
		r.o.Observer.LocalReject("pace")
		return ErrPaced
	}
	r.mu.Unlock()
	if wait > 0 {
		r.o.Observer.Paced(wait)
		if err := r.o.Sleep(c.ctx, wait); err != nil {
			r.mu.Lock()
			r.pacer.Cancel() // the slot goes to the next request
			r.mu.Unlock()
			return err
		}
	}
	c.attempts++
	c.pending = true
	r.o.Observer.Attempt(c.attempts > 1)
	return nil
}

// End records how the last attempt ended without deciding on a retry:
// for a transport that will not retry it whatever the outcome (a stream
// that has sent more than it can replay). Each attempt Admit let go is
// counted once, by End or Next, whichever comes first.
func (c *Call) End(res Result) {
	c.r.mu.Lock()
	c.endLocked(res)
	c.r.mu.Unlock()
}

// endLocked counts the pending attempt's outcome for the throttle. r.mu
// must be held.
func (c *Call) endLocked(res Result) {
	if c.pending && c.r.throttle != nil {
		c.r.throttle.Done(c.r.o.Clock.Now(), !res.Refused && !res.Unanswered)
	}
	c.pending = false
}

// fits reports whether waiting d from now leaves time before the
// context's deadline.
func (c *Call) fits(now clock.Instant, d time.Duration) bool {
	return c.deadline == 0 || d < c.deadline.Sub(now)
}

// paceFits reports whether a pacing wait of d is within the deadline and
// the wait cap.
func (c *Call) paceFits(now clock.Instant, d time.Duration) bool {
	return c.fits(now, d) && (c.r.o.WaitCap <= 0 || d <= c.r.o.WaitCap)
}

// Observe reads the quota a response advertised (RateLimit and
// RateLimit-Policy members) for the pacer.
func (r *Retrier) Observe(limits []Limit, quotas []Quota) {
	if r.pacer == nil || len(limits) == 0 {
		return
	}
	r.mu.Lock()
	r.pacer.Observe(r.o.Clock.Now(), limits, quotas)
	r.mu.Unlock()
}

// Why a call stops retrying.
const (
	StopDone      = "done" // the attempt succeeded or failed for good
	StopNotRetry  = "not_retryable"
	StopUnsafe    = "not_replay_safe"
	StopAttempts  = "attempts"
	StopBudget    = "budget"
	StopDeadline  = "deadline"
	StopWaitCap   = "wait_cap" // the server asked for a wait above Options.WaitCap
	StopCancelled = "cancelled"
)

// Next records how the last attempt ended (unless End did) and decides
// whether to retry:
// it returns the wait before the next attempt and "" to retry, or the
// reason to stop (one of the Stop constants). The wait is the larger of the
// backoff's full-jitter draw and the server's wait jittered upward; a retry
// that could not start before the context's deadline is not made, nor one
// past MaxAttempts or the retry budget.
func (c *Call) Next(res Result) (time.Duration, string) {
	r := c.r
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.o.Clock.Now()
	c.endLocked(res)
	switch {
	case res.OK:
		return 0, StopDone
	case c.ctx.Err() != nil:
		return 0, StopCancelled
	case !res.Retryable:
		return 0, StopNotRetry
	case res.EffectPossible && !c.safe:
		return 0, StopUnsafe
	case c.attempts >= r.o.MaxAttempts:
		return 0, StopAttempts
	}
	wait := r.o.Backoff.Delay(c.attempts, r.float64Locked())
	if res.Wait > 0 {
		spread := max(r.o.FloorSpread, 0)
		wait = max(wait, Floor(res.Wait, spread, r.float64Locked()))
	}
	if !c.fits(now, wait) {
		return 0, StopDeadline
	}
	if r.o.WaitCap > 0 && wait > r.o.WaitCap {
		return 0, StopWaitCap
	}
	if r.budget != nil && !r.budget.Withdraw() {
		r.o.Observer.BudgetExhausted()
		return 0, StopBudget
	}
	r.o.Observer.Retry(res.Cause)
	return wait, ""
}

// Wait sleeps d (the wait Next returned) or until the context ends.
func (c *Call) Wait(d time.Duration) error { return c.r.o.Sleep(c.ctx, d) }
