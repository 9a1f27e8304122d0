package lease

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Leaser runs a budget's allocator step: the Redis store's Lease (one
// atomic script per refresh, shared by the fleet), or a Local allocator.
type Leaser interface {
	Lease(ctx context.Context, budget string, a Allocator, r Request) (Grant, error)
}

// Local is an in-process Leaser: one State per budget under a mutex, on
// its Clock (default clock.System). It serves one process's gates, the
// simulator and tests.
type Local struct {
	Clock  clock.Clock
	mu     sync.Mutex
	states map[string]*State
}

// Lease runs a's step on budget's state at the Local's now.
func (l *Local) Lease(_ context.Context, budget string, a Allocator, r Request) (Grant, error) {
	if err := a.Validate(); err != nil {
		return Grant{}, err
	}
	c := l.Clock
	if c == nil {
		c = clock.System
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.states == nil {
		l.states = map[string]*State{}
	}
	st := l.states[budget]
	if st == nil {
		st = &State{}
		l.states[budget] = st
	}
	return a.Step(st, r, c.Now()), nil
}

// Failure is what a lease gate does once its lease has lapsed and cannot
// be refreshed (or before the first grant): Doorman's failure modes.
type Failure uint8

const (
	// FailSafe spends a safe share: SafeShare, by default the allocator's
	// Grant.Safe at the last refresh (the capacity divided by the clients
	// it saw; while it learns, a share of what no holding takes, with a
	// holder's confirmed grant in it), and
	// nothing before the first answer, when the gate knows nothing of the
	// fleet (Doorman's "safe capacity").
	FailSafe Failure = iota
	// FailOpen admits everything (Doorman's optimistic mode).
	FailOpen
	// FailClosed admits nothing (Doorman's pessimistic mode).
	FailClosed
)

// GateOptions configures a lease gate: a rate Gate or a Concurrency gate.
type GateOptions struct {
	// Budget names the global budget; every process of the fleet that
	// shares it uses the same name and Allocator. Required.
	Budget string
	// Client identifies this process among them. Required.
	Client string
	// Allocator is the budget: Capacity in units/s (a rate) or slots (a
	// concurrency budget), the lease time and the refresh interval.
	// Required.
	Allocator Allocator
	// Leaser runs the allocator: the Redis store, or a Local one. Required.
	Leaser Leaser
	// Burst is the depth of a rate gate's local bucket, as time at the
	// granted rate. Default 100 ms.
	Burst time.Duration
	// Headroom is how much more than its recent demand the gate asks for,
	// as a share (so that growing demand is seen). Default 0.1.
	Headroom float64
	// OnFailure is what the gate does without a live lease: before its
	// first grant, once the lease lapsed unrefreshed, and while the
	// allocator learns and grants it nothing. Default FailSafe.
	OnFailure Failure
	// SafeShare is FailSafe's rate (units/s) or slots; 0: the allocator's
	// safe share.
	SafeShare int64
	// Weighted makes a concurrency gate's request hold as many slots as its
	// cost (default one).
	Weighted bool
	// RetryHint is a concurrency gate's retry-after on a rejection (when a
	// slot frees depends on the work in flight, not on time); 0: none.
	RetryHint time.Duration
	// Clock is the gate's clock. Default clock.System.
	Clock clock.Clock
	// Inline refreshes within Decide when a refresh is due, instead of in
	// Run: for an in-process Leaser on a virtual clock (the simulator),
	// where no background loop follows the clock. The decision then calls
	// the Leaser, so never set it with a remote one.
	Inline bool
}

func (o *GateOptions) validate(name string) error {
	switch {
	case name == "":
		return errors.New("lease: empty gate name")
	case o.Budget == "" || o.Client == "":
		return errors.New("lease: a budget and a client name are required")
	case o.Leaser == nil:
		return errors.New("lease: no leaser")
	case o.Headroom < 0 || o.SafeShare < 0 || o.RetryHint < 0:
		return errors.New("lease: negative headroom, safe share or retry hint")
	}
	if err := o.Allocator.Validate(); err != nil {
		return err
	}
	if o.Headroom == 0 {
		o.Headroom = 0.1
	}
	if o.Clock == nil {
		o.Clock = clock.System
	}
	return nil
}

// holder is what the rate and concurrency gates share: the grant, its
// refresh in the background (or inline), the failure mode, and giving the
// lease back. The gate supplies its demand (wants) and what it has in use,
// and is told when the grant changes. Its fields are guarded by mu, which
// the gate's decisions take too.
type holder struct {
	opts GateOptions

	mu       sync.Mutex
	grant    int64 // granted units/s or slots
	expiry   clock.Instant
	granted  bool  // a grant was ever received
	learning bool  // the last grant was from a learning allocator
	safe     int64 // the allocator's safe share at the last grant
	// short is signalled when the gate turns requests away for want of
	// lease: Run refreshes early (at most every Refresh/8) instead of
	// waiting for its interval, so a demand that outgrew the grant is seen.
	short chan struct{}
	// next and early are when an Inline gate refreshes: at the interval,
	// or at early (an eighth of it after the last) once it turned a
	// request away for want of lease.
	next, early clock.Instant
	wanting     bool
	inlining    bool // an Inline refresh is under way
	// lapsed counts the decisions the failure mode made after a lease
	// expired unrefreshed, or before any grant once a refresh failed
	// (Failures); refused is set while the last refresh failed.
	lapsed  int64
	refused bool
	// asked reports a grant of the gate's own asking (not one it took
	// over from the gate it succeeded): its first refresh asks for the
	// capacity.
	asked bool
	// reserve reports in use what the gate may spend until the answer
	// applies: it decides on its old grant meanwhile (a rate gate spends
	// it, a concurrency gate admits on it), and keeps doing so until its
	// expiry when the answer is lost although the step ran (a timeout
	// after Redis ran the script).
	reserve bool
	// confirmAt is set when an answer cut what the gate spends by more
	// than an eighth of what it had reported: the allocator keeps that
	// from the others until the gate's next step, so the gate asks again
	// at once, for confirmWants (the demand it asked for then, not one
	// measured over an instant) if within an eighth of the interval.
	confirmAt    clock.Instant
	confirmWants int64
	// successor, set by Continue, takes the lease over when Run ends;
	// over is set then: the gate spends no lease any more.
	successor *holder
	over      bool

	// The gate's part, called with mu held: what it would use (from its
	// demand since the last refresh; first is true before any grant),
	// what it has in use, and the grant about to change at now.
	wants  func(now clock.Instant, first bool) int64
	inUse  func() int64
	change func(now clock.Instant)
}

// liveLocked reports a grant to spend at now: unexpired, and not a
// learning allocator's nothing. REQUIRES: h.mu held.
func (h *holder) liveLocked(now clock.Instant) bool {
	return h.granted && now < h.expiry && !(h.learning && h.grant == 0)
}

// limitLocked is what the gate spends at now: the grant while it is live
// (with FailSafe, the safe share when larger while the allocator learns),
// else the failure mode's (-1: unlimited). REQUIRES: h.mu held.
func (h *holder) limitLocked(now clock.Instant) int64 {
	if h.liveLocked(now) {
		if h.learning && h.opts.OnFailure == FailSafe {
			// a learning allocator confirms the grant and adds a safe
			// share of what the confirmed holdings leave (Grant.Safe)
			return max(h.grant, h.safe)
		}
		return h.grant
	}
	switch h.opts.OnFailure {
	case FailOpen:
		return -1
	case FailClosed:
		return 0
	}
	if h.opts.SafeShare > 0 {
		return h.opts.SafeShare
	}
	return max(h.safe, 0)
}

// decidedLocked books a decision at now: one the failure mode makes
// because a lease expired unrefreshed, or because no refresh got a grant
// yet and the last one failed (a process that starts while the
// allocator's Redis is down), counts as a failure; not one before the
// first answer, a learning allocator's, or one after the gate stopped
// spending its lease. REQUIRES: h.mu held.
func (h *holder) decidedLocked(now clock.Instant) {
	if !h.over && (h.granted && now >= h.expiry || !h.granted && h.refused) {
		h.lapsed++
	}
}

// Failures returns how many decisions the failure mode made because the
// lease lapsed (its allocator did not answer a refresh in time), for
// sluice_gate_store_failures_total (sluice.FailureCounter).
func (h *holder) Failures() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lapsed
}

// FailurePolicy names the failure mode: "fail_safe", "fail_open" or
// "fail_closed".
func (h *holder) FailurePolicy() string {
	switch h.opts.OnFailure {
	case FailOpen:
		return "fail_open"
	case FailClosed:
		return "fail_closed"
	}
	return "fail_safe"
}

// shortLocked notes a request turned away for want of lease, so the lease
// is asked again early. REQUIRES: h.mu held.
func (h *holder) shortLocked() {
	h.wanting = true
	select {
	case h.short <- struct{}{}:
	default:
	}
}

// inline refreshes an Inline gate when a refresh is due at now.
func (h *holder) inline(ctx context.Context, now clock.Instant) {
	if !h.opts.Inline {
		return
	}
	h.mu.Lock()
	due := !h.inlining && (now >= h.next || (h.wanting && now >= h.early))
	h.inlining = h.inlining || due
	h.mu.Unlock()
	if due { // one at a time: concurrent steps' answers could apply out of order
		wait, _ := h.Refresh(ctx)
		h.mu.Lock()
		h.next, h.early, h.wanting, h.inlining = now.Add(wait), now.Add(h.opts.Allocator.RefreshEvery()/8), false, false
		h.mu.Unlock()
	}
}

// Refresh asks the allocator for a lease sized to the demand the gate saw
// since the last refresh (plus Headroom), and returns when to ask again.
// On an error the current lease runs on until its expiry.
func (h *holder) Refresh(ctx context.Context) (time.Duration, error) {
	now := h.opts.Clock.Now()
	h.mu.Lock()
	r := Request{Client: h.opts.Client, Wants: h.wants(now, !h.asked), InUse: h.inUse()}
	if h.confirmAt != 0 && now.Sub(h.confirmAt) < h.opts.Allocator.RefreshEvery()/8 {
		r.Wants = h.confirmWants
	}
	h.confirmAt = 0
	if h.liveLocked(now) {
		r.Has = h.grant
	}
	if lim := h.limitLocked(now); h.reserve && lim > r.InUse {
		// Until the answer applies the gate spends up to lim (a rate
		// gate its old grant, a concurrency gate the slots it admits
		// meanwhile, which are not in its in-flight count), and on to
		// the old grant's expiry if the answer is lost after the step
		// ran: the allocator keeps lim from the others until the gate's
		// next step, so a shrunk grant frees its room one step later.
		r.InUse = lim
	}
	h.mu.Unlock()
	grant, err := h.opts.Leaser.Lease(ctx, h.opts.Budget, h.opts.Allocator, r)
	if err != nil {
		h.mu.Lock()
		h.refused = true
		h.mu.Unlock()
		return h.opts.Allocator.RefreshEvery() / 4, err
	}
	h.mu.Lock()
	h.refused = false
	// The old grant held until its answer came: the gate measures its
	// demand afresh from here, not from before the round trip (the demand
	// counted meanwhile would be dropped while its time stayed in the next
	// measurement, and on a busy host, where the trip is long, a fleet
	// spent 65-90% of a budget 70 times its demand).
	h.change(max(now, h.opts.Clock.Now()))
	h.grant, h.expiry, h.granted, h.learning, h.safe, h.asked, h.over = grant.Has, grant.Expiry, true, grant.Learning, grant.Safe, true, false
	wait := grant.Refresh
	if lim := h.limitLocked(now); h.reserve && lim >= 0 && r.InUse-max(lim, h.inUse()) > r.InUse/8 {
		// The allocator keeps what this step reserved until the next:
		// confirm the smaller spending at once, so the others get the
		// room (a smaller cut waits for the next refresh).
		h.confirmAt, h.confirmWants, wait = max(now, 1), r.Wants, 0
	}
	h.mu.Unlock()
	return wait, nil
}

// inherit takes over the lease of the gate h succeeds (its Run ended), unless h
// has an answer of its own already.
func (h *holder) inherit(grant int64, expiry clock.Instant, learning bool, safe int64) {
	now := h.opts.Clock.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.granted {
		return
	}
	h.change(now)
	h.grant, h.expiry, h.granted, h.learning, h.safe = grant, expiry, true, learning, safe
}

// stopLocked ends h's lease in this process: a lease given back or handed
// over is not spent any more (the failure mode decides, without the
// allocator's safe share). It returns the lease as it was and the
// successor to hand it to. REQUIRES: h.mu held.
func (h *holder) stopLocked(now clock.Instant) (grant int64, expiry clock.Instant, granted, learning bool, safe int64, to *holder) {
	grant, expiry, granted, learning, safe, to = h.grant, h.expiry, h.granted, h.learning, h.safe, h.successor
	h.change(now)
	h.expiry, h.safe, h.over = now, 0, true
	return grant, expiry, granted, learning, safe, to
}

// Run refreshes the lease until ctx ends, then gives it back (a graceful
// shutdown frees the share at once; a concurrency gate still draining
// keeps only its slots in flight until its holding expires), or hands it
// over to the gate that Continues it; either way the gate spends the lease
// no more (its failure mode decides, without the allocator's safe share),
// until a new Run's refresh. It refreshes every interval the
// allocator names, and early (but not within an eighth of the interval of
// the last refresh) when requests are turned away for want of lease.
func (h *holder) Run(ctx context.Context) {
	early := h.opts.Allocator.RefreshEvery() / 8
	var out outage
	for {
		wait, err := h.Refresh(ctx)
		if ctx.Err() == nil {
			out.tell(h, err, time.Now())
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			// Stop spending the lease, and hand it over to the successor
			// (Continue) or give it back; slots still in flight (a
			// draining concurrency gate) stay counted as in use until the
			// holding expires, so no other process is granted them
			// meanwhile.
			h.mu.Lock()
			grant, expiry, granted, learning, safe, to := h.stopLocked(h.opts.Clock.Now())
			r := Request{Client: h.opts.Client, Release: true}
			if n := h.inUse(); n > 0 {
				r = Request{Client: h.opts.Client, InUse: n}
			}
			h.mu.Unlock()
			if to != nil {
				if granted {
					to.inherit(grant, expiry, learning, safe)
				}
				return
			}
			rctx, cancel := context.WithTimeout(context.Background(), time.Second)
			h.opts.Leaser.Lease(rctx, h.opts.Budget, h.opts.Allocator, r)
			cancel()
			return
		case <-timer.C:
		case <-h.short:
			timer.Stop()
			select {
			case <-ctx.Done():
			case <-time.After(early):
			}
		}
	}
}

// statusLocked is the lease's sluice.LeaseStatus without the bounds.
// REQUIRES: h.mu held.
func (h *holder) statusLocked(now clock.Instant) sluice.LeaseStatus {
	return sluice.LeaseStatus{Capacity: h.opts.Allocator.Capacity, Granted: h.grant, Spending: h.limitLocked(now), Live: h.liveLocked(now)}
}

// GateState is what the admin API shows of a lease gate.
type GateState struct {
	Rate      int64   `json:"granted"` // units/s, or slots
	ExpiresIn float64 `json:"expires_in_s"`
	Live      bool    `json:"live"`
	Learning  bool    `json:"allocator_learning"`
	Spending  int64   `json:"spending"`           // the grant, or the failure mode's (-1: unlimited)
	InFlight  int64   `json:"in_flight,omitzero"` // a concurrency gate's
}

func (h *holder) stateLocked(now clock.Instant) GateState {
	return GateState{Rate: h.grant, ExpiresIn: max(h.expiry.Sub(now), 0).Seconds(), Live: h.liveLocked(now),
		Learning: h.learning, Spending: h.limitLocked(now)}
}

// outage tells, in the log, of refreshes the allocator does not answer:
// a warning at the first, again every outageRetell while they last, and
// a line when it answers again. Meanwhile the gate spends its lease to
// its expiry and then decides by its failure mode, silently otherwise:
// an outage of the allocator's Redis left no trace in the log.
type outage struct {
	since, told time.Time // zero: the allocator answers
	failed      int       // refreshes failed since
	warned      time.Time // the last warning, of any episode
	quiet       int       // episodes since it, begun and over untold
	toldThis    bool      // this episode was warned of
}

// outageRetell is how often a lasting outage is told again.
const outageRetell = 30 * time.Second

// tell books a refresh's outcome (err nil: answered) at now.
func (o *outage) tell(h *holder, err error, now time.Time) {
	switch {
	case err != nil && o.since.IsZero():
		o.since, o.told, o.failed, o.toldThis = now, now, 1, false
		if !o.warned.IsZero() && now.Sub(o.warned) < outageRetell {
			o.quiet++ // an allocator that comes and goes: told at most once an outageRetell
			return
		}
		o.warned, o.toldThis = now, true
		h.mu.Lock()
		left := time.Duration(h.expiry - h.opts.Clock.Now())
		h.mu.Unlock()
		slog.Warn("lease: the allocator did not answer a refresh; the gate spends its lease until it expires, then decides by its failure mode",
			"budget", h.opts.Budget, "client", h.opts.Client, "lease_left", max(left, 0), "brief_outages_untold", o.quiet, "err", err)
		o.quiet = 0
	case err != nil:
		o.failed++
		if now.Sub(o.told) >= outageRetell {
			o.told, o.warned, o.toldThis = now, now, true
			slog.Warn("lease: the allocator still does not answer", "budget", h.opts.Budget, "client", h.opts.Client,
				"for", now.Sub(o.since).Round(time.Second), "refreshes_failed", o.failed, "err", err)
		}
	case !o.since.IsZero():
		if o.toldThis {
			slog.Info("lease: the allocator answers again", "budget", h.opts.Budget, "client", h.opts.Client,
				"after", now.Sub(o.since).Round(time.Millisecond), "refreshes_failed", o.failed)
		}
		o.since, o.told, o.failed, o.toldThis = time.Time{}, time.Time{}, 0, false
	}
}
