package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// FailurePolicy is what a gate does when its store cannot decide (Redis
// down, slow or partitioned).
type FailurePolicy uint8

const (
	// FailOpen admits: the limiter is a soft policy signal and a store
	// outage must not become an API outage. The default.
	FailOpen FailurePolicy = iota
	// FailClosed rejects with reason dependency (503): for limits whose
	// violation is worse than unavailability.
	FailClosed
	// LocalFallback decides on a conservative in-process limiter instead
	// (Options.Fallback), e.g. the fleet limit divided by the replicas.
	LocalFallback
)

var failureNames = [...]string{"fail_open", "fail_closed", "local_fallback"}

// String returns "fail_open", "fail_closed" or "local_fallback".
func (p FailurePolicy) String() string {
	if int(p) < len(failureNames) {
		return failureNames[p]
	}
	return "unknown"
}

// ParseFailurePolicy parses "fail_open", "fail_closed" or
// "local_fallback". The error lists the names.
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	for i, n := range failureNames {
		if n == s {
			return FailurePolicy(i), nil
		}
	}
	return 0, fmt.Errorf("gate: failure policy %q is not one of %s", s, strings.Join(failureNames[:], ", "))
}

// DefaultRetryHint is the retry-after of a rejection without an exact wait
// when Options names none.
const DefaultRetryHint = time.Second

// Options configures the gates over a store (RateLimit, InFlight, Pacer,
// FleetUsage). The zero value is valid: scope service, refunds on, fail
// open.
type Options struct {
	// Scope is what the limit is counted over; it picks the state key from
	// the request (see sluice.Scope.Key). Default ScopeService.
	Scope sluice.Scope
	// NoRefund keeps tokens taken by a request that a later gate rejected.
	// By default they are refunded, so a tenant is not charged for work
	// that never ran. Concurrency slots are always released.
	NoRefund bool
	// OnFailure is what to do when the store fails. Default FailOpen.
	OnFailure FailurePolicy
	// Fallback is the in-process limiter LocalFallback decides on. Under
	// FailOpen, when set, it decides until the store has answered once:
	// a process that starts under load while its store is unreachable or
	// still loading its scripts admits at most the fallback's limit (the
	// fleet limit ÷ its replicas), not everything, and fails open only
	// once the store has shown it works (a later outage). A rate gate
	// keeps the two in step: under LocalFallback what the store admits is
	// taken from the fallback too, and, for a quota that refills (a token
	// bucket, GCRA) on a store.Debiter, what the fallback admits is charged
	// to the store once it answers again, so that neither starts an outage,
	// or its end, with a burst the other spent (the ledger, fallback.go,
	// says what it does not keep in step).
	Fallback store.Limiter
	// RetryHint is the retry-after a rejection without an exact wait
	// reports (concurrency limits, store failures). Default
	// DefaultRetryHint.
	RetryHint time.Duration
	// Reason, if set, replaces the gate's rejection reason: a concurrency
	// budget that protects a shared resource answers overload (503).
	Reason sluice.Reason
}

func (o *Options) validate(name string) error {
	if name == "" {
		return errors.New("gate: empty name")
	}
	if o.OnFailure == LocalFallback && o.Fallback == nil {
		return fmt.Errorf("gate %q: local_fallback needs a fallback limiter", name)
	}
	if o.RetryHint < 0 {
		return fmt.Errorf("gate %q: negative retry hint", name)
	}
	if o.RetryHint == 0 {
		o.RetryHint = DefaultRetryHint
	}
	return nil
}

func (o *Options) reasonOr(def sluice.Reason) sluice.Reason {
	if o.Reason != sluice.ReasonNone {
		return o.Reason
	}
	return def
}

// base holds what every limit gate shares.
type base struct {
	name      string
	lim       store.Limiter
	opts      Options
	reason    sluice.Reason
	unit      sluice.Unit
	failures  atomic.Int64
	fallbacks atomic.Int64
	lastLog   atomic.Int64
	answered  atomic.Bool   // the store has decided once
	refills   bool          // lim refills continuously (store.Refiller)
	window    time.Duration // lim.Window(), read once: a limiter's window is fixed
	ledger    *ledger       // a rate gate's with a fallback: the store and it kept in step (nil: none)
}

// newBase returns the base of a gate named name over lim.
func newBase(name string, lim store.Limiter, opts Options, reason sluice.Reason, unit sluice.Unit) base {
	r, _ := lim.(store.Refiller)
	return base{name: name, lim: lim, opts: opts, reason: reason, unit: unit, refills: r != nil && r.Refills(), window: lim.Window()}
}

// Name returns the gate's name.
func (b *base) Name() string { return b.name }

// Policy returns the gate's quota for the RateLimit-Policy header field.
func (b *base) Policy() sluice.Policy {
	return sluice.Policy{Name: b.name, Quota: b.lim.Limit(), Window: b.lim.Window(), Unit: b.unit, Scope: b.opts.Scope}
}

// Failures returns how many decisions the store could not make.
func (b *base) Failures() int64 { return b.failures.Load() }

// FailurePolicy names what decides while the store cannot.
func (b *base) FailurePolicy() string { return b.opts.OnFailure.String() }

// take runs the store step, applying the failure policy on error. The
// returned handle is 0 when nothing is held (fail open). Permits encode the
// handle in the low bits and whether the fallback holds it in bit 63.
func (b *base) take(ctx context.Context, key string, r *sluice.Request, now clock.Instant, cost int64) (limit.Result, sluice.Permit, bool) {
	res, h, err := b.lim.Take(ctx, key, now, cost, r.Deadline)
	if err == nil {
		b.heard()
		if b.ledger != nil {
			return res, b.stored(key, now, cost, res.Status == limit.Allowed, h), true
		}
		return res, sluice.Permit(h), true
	}
	return b.failed(ctx, key, r, now, cost, err)
}

// failed applies the failure policy to a store step that failed with err.
func (b *base) failed(ctx context.Context, key string, r *sluice.Request, now clock.Instant, cost int64, err error) (limit.Result, sluice.Permit, bool) {
	b.failures.Add(1)
	b.logFailure(err)
	policy := b.opts.OnFailure
	if policy == FailOpen && b.opts.Fallback != nil && !b.answered.Load() {
		policy = LocalFallback // start-up: open only once the store has answered
	}
	switch policy {
	case LocalFallback:
		res, h, err := b.opts.Fallback.Take(ctx, key, now, cost, r.Deadline)
		if err == nil {
			b.fallbacks.Add(1)
			b.fellBack(key, &res, cost, now)
			return res, sluice.Permit(h) | fallbackBit, true
		}
		fallthrough
	case FailClosed:
		return limit.Result{}, 0, false
	}
	return limit.Result{Status: limit.Allowed}, 0, true // fail open: nothing held
}

const fallbackBit = sluice.Permit(1) << 63

// handle is permit p's store handle, and whether the fallback took the
// units too (mirroredBit: only a rate gate with a ledger sets it, and its
// store's handles are small; a concurrency permit's may use bit 62).
func (b *base) handle(p sluice.Permit) (store.Handle, bool) {
	h := store.Handle(p &^ fallbackBit)
	if b.ledger != nil && p&mirroredBit != 0 {
		return h &^ store.Handle(mirroredBit), true
	}
	return h, false
}

// logFailure logs a store failure at most once per second per gate: the
// decision path must stay cheap while the store is down.
func (b *base) logFailure(err error) {
	now := time.Now().UnixNano()
	last := b.lastLog.Load()
	if now-last < int64(time.Second) || !b.lastLog.CompareAndSwap(last, now) {
		return
	}
	slog.Warn("gate store unavailable; deciding by failure policy (logged at most once per second)",
		"gate", b.name, "policy", b.opts.OnFailure.String(), "failures", b.failures.Load(), "err", err)
}

// refund gives back what take returned.
func (b *base) refund(key string, p sluice.Permit, now clock.Instant, cost int64) {
	if p == 0 {
		return
	}
	lim := b.lim
	if p&fallbackBit != 0 && b.opts.Fallback != nil {
		lim = b.opts.Fallback
		if b.ledger != nil {
			b.ledger.owe(key, -cost, now) // no longer owed to the store
		}
	}
	h, mirrored := b.handle(p)
	if mirrored {
		b.opts.Fallback.Refund(context.Background(), key, 1, now, cost) // what the fallback took too
	}
	// Refunds are best effort: a failed refund only leaves the limit a
	// little stricter until the state refills (or its TTL expires).
	if err := lim.Refund(context.Background(), key, h, now, cost); err != nil {
		b.failures.Add(1)
	}
}

// decision writes the Decision for store result res to *d.
func (b *base) decision(d *sluice.Decision, res *limit.Result) {
	d.Admitted = res.Status == limit.Allowed
	b.quota(d, res)
	switch res.Status {
	case limit.Denied:
		d.Reason, d.Retryable, d.RetryAfter = b.reason, true, res.RetryAfter
		if d.RetryAfter <= 0 {
			d.RetryAfter = b.opts.RetryHint
		}
	case limit.Exceeded:
		d.Reason = b.reason // cost above the limit: retrying cannot help
	case limit.Invalid:
		d.Reason = sluice.ReasonInvalid
	case limit.TooLate:
		d.Reason = sluice.ReasonDeadline
	}
}

// heard records that the store has decided once (a load, and a store only
// the first time: the flag's cache line stays shared between cores).
func (b *base) heard() {
	if !b.answered.Load() {
		b.answered.Store(true)
	}
}

// quota writes to *d what every verdict of the gate tells of its quota
// (inlined: the rate gate's admitted path writes it too).
func (b *base) quota(d *sluice.Decision, res *limit.Result) {
	d.Scope, d.Unit, d.Gate = b.opts.Scope, b.unit, b.name
	d.Limit, d.Window, d.Refills = res.Limit, b.window, b.refills
	d.Remaining, d.ResetAfter = res.Remaining, res.ResetAfter
}

// decide takes cost units for r from its scope, writes the decision to
// *d and returns, when admitted, the permit to release later.
func (b *base) decide(ctx context.Context, r *sluice.Request, now clock.Instant, cost int64, d *sluice.Decision) sluice.Permit {
	key := b.opts.Scope.Key(r)
	res, h, err := b.lim.Take(ctx, key, now, cost, r.Deadline) // take's common path, without a call of its own
	return b.settle(ctx, key, r, now, cost, d, &res, h, err)
}

// settle writes to *d the decision of the store step that returned res
// and h, or failed with err, and returns the permit to hold (0 when it
// rejects).
func (b *base) settle(ctx context.Context, key string, r *sluice.Request, now clock.Instant, cost int64, d *sluice.Decision, res *limit.Result, h store.Handle, err error) sluice.Permit {
	p, ok := sluice.Permit(h), true
	if err == nil {
		b.heard()
		if b.ledger != nil {
			p = b.stored(key, now, cost, res.Status == limit.Allowed, h)
		}
	} else {
		*res, p, ok = b.failed(ctx, key, r, now, cost, err)
	}
	if !ok {
		b.unavailable(d)
		return 0
	}
	b.decision(d, res)
	if !d.Admitted {
		return 0
	}
	return p
}

// unavailable writes the rejection of a store that could not decide to *d.
func (b *base) unavailable(d *sluice.Decision) {
	*d = sluice.Decision{
		Reason: sluice.ReasonDependency, Scope: b.opts.Scope, Unit: b.unit, Gate: b.name,
		Retryable: true, RetryAfter: b.opts.RetryHint,
	}
}

// rateLimit is the gate NewRateLimit returns.
type rateLimit struct {
	base
}

var _ sluice.Advertiser = (*rateLimit)(nil)

// NewRateLimit returns a rate gate named name over lim.
//
// The gate is an entitlement gate over a rate limiter (token bucket, GCRA or a
// window algorithm): it rejects with reason policy_rate (429) when the
// scope's quota is exhausted, with the exact retry-after, and rejects a cost
// the quota can never grant as not retryable. By default it refunds the
// tokens of a request that a later gate rejected (Options.NoRefund).
//
// Decide takes r.Cost units from r's scope.
//
// Release refunds the tokens when a later gate rejected r (unless
// NoRefund), and trues the charge up to the work's actual cost when the
// completion has one (Completion.Cost): the difference is debited from
// r's scope (store.Debiter; never past an empty state) or refunded to it.
func NewRateLimit(name string, lim store.Limiter, opts Options) (sluice.Gate, error) {
	if err := opts.validate(name); err != nil {
		return nil, err
	}
	g := &rateLimit{newBase(name, lim, opts, opts.reasonOr(sluice.ReasonPolicyRate), sluice.UnitRequests)}
	g.ledger = newLedger(lim, &opts, g.refills)
	return g, nil
}

// Decide takes r.Cost units from r's scope. It is base.decide with the
// admitted path in place, one call fewer on the chain's most common path;
// TestRateGateDecidesAsBase keeps the two alike.
func (g *rateLimit) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	key := g.opts.Scope.Key(r)
	res, h, err := g.lim.Take(ctx, key, now, r.Cost, r.Deadline)
	if err != nil || res.Status != limit.Allowed {
		return g.settle(ctx, key, r, now, r.Cost, d, &res, h, err)
	}
	g.heard()
	d.Admitted = true
	g.quota(d, &res)
	if g.ledger != nil {
		return g.stored(key, now, r.Cost, true, h)
	}
	return sluice.Permit(h)
}

// SpendsAtAdmission reports true: the tokens are taken at admission, and
// Release only refunds them after a later gate's refusal or trues the
// charge up to a completion's cost (see sluice.Gate).
func (g *rateLimit) SpendsAtAdmission() bool { return true }

// Release refunds the tokens when a later gate rejected r (unless
// NoRefund), and trues the charge up to the work's actual cost when the
// completion has one (Completion.Cost): the difference is debited from
// r's scope (store.Debiter; never past an empty state) or refunded to it.
func (g *rateLimit) Release(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	switch {
	case c.Outcome == sluice.OutcomeRejected:
		if !g.opts.NoRefund {
			g.refund(g.opts.Scope.Key(r), p, c.Now, r.Cost)
		}
	case c.Cost > 0 && c.Cost != r.Cost && p != 0:
		g.trueUp(g.opts.Scope.Key(r), p, c.Now, c.Cost-r.Cost)
	}
}

// trueUp debits diff more units (diff > 0) or refunds −diff to the state
// that holds permit p.
func (b *base) trueUp(key string, p sluice.Permit, now clock.Instant, diff int64) {
	if diff < 0 {
		b.refund(key, p, now, -diff)
		return
	}
	lim := b.lim
	if p&fallbackBit != 0 && b.opts.Fallback != nil {
		lim = b.opts.Fallback
		if b.ledger != nil {
			b.ledger.owe(key, diff, now) // owed to the store too
		}
	}
	h, mirrored := b.handle(p)
	if d, ok := b.opts.Fallback.(store.Debiter); ok && mirrored {
		d.Debit(context.Background(), key, 1, now, diff) // what the fallback took too
	}
	if d, ok := lim.(store.Debiter); ok {
		if err := d.Debit(context.Background(), key, h, now, diff); err != nil {
			b.failures.Add(1) // best effort, as a refund
		}
	}
}
