package sluice

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// MaxGates is the most gates one Chain may hold.
const MaxGates = 16

// Observer receives what a Chain decides, for metrics and logs. Methods are
// called synchronously on the decision path and must be cheap and safe for
// concurrent use; the pointers they receive are valid only during the call.
type Observer interface {
	// Decided is called once per Chain.Decide with the final verdict and the
	// time the decision took. d is valid during the call only (the chain
	// reuses it): an observer that keeps it keeps a copy.
	Decided(r *Request, d *Decision, took time.Duration)
	// ShadowRejected is called when a gate in ModeShadow would have rejected r.
	ShadowRejected(r *Request, d *Decision)
	// Done is called once per admitted request when its Ticket is done.
	Done(r *Request, c Completion)
}

// ChainOptions configures a Chain. The zero value is valid.
type ChainOptions struct {
	// Clock supplies now to every gate. Default: clock.System.
	Clock clock.Clock
	// Observer, if set, receives every decision and completion.
	Observer Observer
	// Modes sets the initial mode of gates by name; gates not listed start
	// in ModeEnforce.
	Modes map[string]Mode
}

// Chain runs gates in order, cheapest and earliest first, and turns their
// verdicts into one Decision and, when admitted, one Ticket.
//
// When a gate rejects (in ModeEnforce), the permits of the gates before it
// are released with OutcomeRejected, in reverse order, and the rejection is
// returned. A gate in ModeShadow that would reject is reported to the
// Observer and the request goes on; a gate in ModeOff is skipped. Modes are
// switched at run time with SetMode without locking the decision path.
//
// A Chain is safe for concurrent use.
type Chain struct {
	gates    []*entry
	policies []Policy
	clock    clock.Clock
	obs      Observer
	pool     sync.Pool
	waits    bool // a gate may wait in Decide (Waiter)
	spends   bool // every gate spends at admission (Gate)
}

type entry struct {
	gate   Gate
	mode   atomic.Uint32
	waits  bool // the gate may wait in Decide (Waiter)
	spends bool // the gate spends at admission (Gate)
}

// ErrUnknownGate is returned by SetMode for a name no gate of the chain has.
var ErrUnknownGate = errors.New("sluice: unknown gate")

// NewChain builds a chain of gates, evaluated in the order given. It returns
// an error for a nil gate, a duplicate or empty name, more than MaxGates
// gates, or a Modes entry naming no gate.
func NewChain(opts ChainOptions, gates ...Gate) (*Chain, error) {
	if len(gates) > MaxGates {
		return nil, fmt.Errorf("sluice: %d gates, at most %d allowed", len(gates), MaxGates)
	}
	c := &Chain{clock: opts.Clock, obs: opts.Observer, spends: true}
	if c.clock == nil {
		c.clock = clock.System
	}
	seen := make(map[string]bool, len(gates))
	for i, g := range gates {
		if g == nil {
			return nil, fmt.Errorf("sluice: gate %d is nil", i)
		}
		name := g.Name()
		if name == "" {
			return nil, fmt.Errorf("sluice: gate %d has an empty name", i)
		}
		if seen[name] {
			return nil, fmt.Errorf("sluice: duplicate gate name %q", name)
		}
		seen[name] = true
		e := &entry{gate: g}
		if m, ok := opts.Modes[name]; ok {
			if m > ModeOff {
				return nil, fmt.Errorf("sluice: gate %q: invalid mode %d", name, m)
			}
			e.mode.Store(uint32(m))
		}
		c.gates = append(c.gates, e)
		if a, ok := As[Advertiser](g); ok {
			if p := a.Policy(); p.Scope.PerCaller() {
				c.policies = append(c.policies, p)
			}
		}
		if w, ok := As[Waiter](g); ok && w.MayWait() {
			c.waits, e.waits = true, true
		}
		if s, ok := g.(spender); ok && s.SpendsAtAdmission() {
			e.spends = true
		} else {
			c.spends = false
		}
	}
	for name := range opts.Modes {
		if !seen[name] {
			return nil, fmt.Errorf("%w %q in modes", ErrUnknownGate, name)
		}
	}
	c.pool.New = func() any { return &ticket{chain: c} }
	return c, nil
}

// Clock returns the chain's clock.
func (c *Chain) Clock() clock.Clock { return c.clock }

// MayWait reports whether Decide may wait: whether one of the chain's gates
// is a Waiter that may wait (a wait queue). A server that can tell when a
// client goes away only at some cost (polling its connection) need pay it
// only then.
func (c *Chain) MayWait() bool { return c.waits }

// Gates returns the chain's gates in evaluation order.
func (c *Chain) Gates() []Gate {
	gs := make([]Gate, len(c.gates))
	for i, e := range c.gates {
		gs[i] = e.gate
	}
	return gs
}

// Policies returns the quotas a caller may be told of: those of the chain's
// Advertisers (found through wrappers with As) that are counted per caller
// (Scope.PerCaller), in chain order. A quota shared by all callers (a
// service-wide rate) is left out: it protects capacity, its remaining
// count is everyone's, and a caller can do nothing with it.
// The slice is shared; do not modify it.
func (c *Chain) Policies() []Policy { return c.policies }

// SetMode switches the named gate's mode. It takes effect for decisions that
// start after it returns; permits already held are released as usual.
func (c *Chain) SetMode(name string, m Mode) error {
	if m > ModeOff {
		return fmt.Errorf("sluice: invalid mode %d", m)
	}
	for _, e := range c.gates {
		if e.gate.Name() == name {
			e.mode.Store(uint32(m))
			return nil
		}
	}
	return fmt.Errorf("%w %q", ErrUnknownGate, name)
}

// Mode returns the named gate's current mode.
func (c *Chain) Mode(name string) (Mode, bool) {
	for _, e := range c.gates {
		if e.gate.Name() == name {
			return Mode(e.mode.Load()), true
		}
	}
	return 0, false
}

type held struct {
	gate   int
	permit Permit
}

// Decide runs the gates for r. When admitted, the returned Ticket must be
// done exactly once (Ticket.Done) when the work ends, on every path; when
// rejected, the Ticket is the zero Ticket and Done is a no-op.
//
// Decide validates r first (see Request.Validate; a zero Cost becomes 1)
// and rejects a malformed request with ReasonInvalid, and a request whose
// Deadline has already passed with ReasonDeadline, before any gate runs.
// Among admitting gates, the returned Decision is the one closest to
// exhaustion (lowest Remaining/Limit) among those counted per caller, or
// among all when none is, so headers describe the tightest limit the
// caller can act on.
//
// A gate (its Decide or Release) or the Observer that panics during
// Decide does not keep the permits the gates before it took: they are
// given back, each once, as for a rejection, and the panic goes on to the
// caller.
func (c *Chain) Decide(ctx context.Context, r *Request) (d Decision, tk Ticket) {
	now := c.clock.Now()
	// The gates and the observer see the ticket's copy of r, never r: a
	// pointer passed through an interface escapes, and a Request the
	// caller declared on its stack would be moved to the heap per call.
	// The gates' verdicts are written in place in the ticket too.
	t := c.pool.Get().(*ticket)
	r.retest = false // a mark of an earlier decision, also for a request refused as invalid
	if !r.valid() && r.Validate() != nil {
		t.req.set(r)
		t.dec[0].Reason = ReasonInvalid
		return c.refuse(t, r, &t.dec[0], now), Ticket{}
	}
	t.req.set(r)
	req := &t.req
	if r.Deadline != 0 && now >= r.Deadline {
		t.dec[0].Reason = ReasonDeadline
		return c.refuse(t, r, &t.dec[0], now), Ticket{}
	}
	hs := &t.held // the permits are kept where the ticket keeps them: no copy
	n := 0        // the permits held, and not yet given back or handed out in the Ticket
	// A gate or the observer that panics must not keep the permits of the
	// gates before it (a concurrency limit would lose a slot for good):
	// they are given back as for a rejection, and the panic goes on.
	defer func() { c.abandon(t, n) }()
	// best is the tightest admitting verdict so far (the zero Decision
	// until one with a quota admits); cur is where the next gate writes.
	best, cur := &t.dec[0], &t.dec[1]
	level := LevelNormal
	for i, e := range c.gates {
		m := Mode(e.mode.Load())
		if m == ModeOff {
			continue
		}
		p := e.gate.Decide(ctx, req, now, cur)
		if cur.Admitted && e.waits {
			// The gate may have waited: the gates after it decide at the
			// time it let the request go, and a deadline that passed
			// meanwhile rejects it (a pacer after a queue computed its
			// wait from the instant before the queue's).
			now = c.clock.Now()
			if req.Deadline != 0 && now >= req.Deadline {
				hs[n] = held{gate: i, permit: p}
				k := n + 1
				n = 0 // before the release: its permits are its own to give back, panic or not
				c.release(hs[:k], req, Completion{Outcome: OutcomeRejected, Now: now})
				*cur = Decision{Reason: ReasonDeadline, Scope: cur.Scope, Gate: e.gate.Name()}
				return c.refuse(t, r, cur, now), Ticket{}
			}
		}
		if cur.Admitted {
			hs[n] = held{gate: i, permit: p}
			n++
			level = max(level, cur.Level)
			switch {
			case best.Limit <= 0 && cur.Limit > 0: // the first with a quota: cur is the zero verdict after
				best, cur = cur, best
			case tighter(cur, best):
				best, cur = cur, best
				*cur = Decision{}
			default:
				*cur = Decision{}
			}
			continue
		}
		if m == ModeShadow {
			if c.obs != nil {
				c.obs.ShadowRejected(req, cur)
			}
			*cur = Decision{}
			continue
		}
		k := n
		n = 0 // before the release, as above
		c.release(hs[:k], req, Completion{Outcome: OutcomeRejected, Now: now})
		cur.EffectPossible = false
		return c.refuse(t, r, cur, now), Ticket{}
	}
	// The verdict is copied out below with wide loads, which wait for
	// narrow stores to the same bytes still in flight (no store-to-load
	// forwarding): the gate that wrote it has usually set both already.
	if !best.Admitted || best.Level != level {
		best.Admitted, best.Level = true, level
	}
	t.start = now // after any wait in a gate: now was read again after it
	t.n = n
	r.retest = req.retest // what a gate marked on the copy (MarkRetest)
	if c.obs != nil {
		c.report(req, best, now)
	}
	n = 0     // the Ticket has them
	d = *best // into the result: no copy in between
	*best = Decision{}
	return d, Ticket{t: t, gen: t.gen.Load()}
}

// abandon gives back the first n permits t holds, if any, as for a
// rejection: a gate, its Release or the observer panicked while the
// request was being decided.
func (c *Chain) abandon(t *ticket, n int) {
	if n > 0 {
		c.release(t.held[:n], &t.req, Completion{Outcome: OutcomeRejected, Now: c.clock.Now()})
	}
}

// refuse reports rejection *d, written in t, of t's request (the copy of
// r), and returns t to the pool (no Ticket was handed out: its generation
// stays).
func (c *Chain) refuse(t *ticket, r *Request, d *Decision, start clock.Instant) Decision {
	r.retest = t.req.retest // what a gate marked on the copy (MarkRetest)
	if c.obs != nil {
		c.report(&t.req, d, start)
	}
	out := *d
	t.dec = [2]Decision{} // t.req is overwritten when t is next used
	c.pool.Put(t)
	return out
}

// Refuse records a rejection decided outside the gates (for example a
// malformed header found by the HTTP layer) so observers count it like any
// other, and returns d.
func (c *Chain) Refuse(r *Request, d Decision) Decision {
	d.Admitted, d.EffectPossible = false, false
	if c.obs != nil {
		// The observer sees a pooled copy: through the interface the
		// pointer escapes, and a copy per decision would be the
		// rejection path's largest allocation.
		od := decisionPool.Get().(*Decision)
		*od = d
		c.report(r, od, c.clock.Now())
		*od = Decision{}
		decisionPool.Put(od)
	}
	return d
}

// decisionPool holds the copies of decisions Refuse shows the observer.
var decisionPool = sync.Pool{New: func() any { return new(Decision) }}

// report tells the observer of decision *d, which stays valid during the
// call, on r, decided from start.
func (c *Chain) report(r *Request, d *Decision, start clock.Instant) {
	c.obs.Decided(r, d, c.clock.Now().Sub(start))
}

// tighter reports whether admitted decision a is closer to exhaustion than b.
// Decisions without a quota (Limit 0) never win over one with a quota, nor
// a quota shared by all callers over one counted per caller.
func tighter(a, b *Decision) bool {
	if a.Limit <= 0 {
		return false
	}
	if b.Limit <= 0 {
		return true
	}
	if pa, pb := a.Scope.PerCaller(), b.Scope.PerCaller(); pa != pb {
		return pa
	}
	// a.Remaining/a.Limit < b.Remaining/b.Limit, exactly, in 128 bits:
	// both sides are non-negative and below 2⁶³, and no division is made.
	ah, al := bits.Mul64(uint64(max(a.Remaining, 0)), uint64(b.Limit))
	bh, bl := bits.Mul64(uint64(max(b.Remaining, 0)), uint64(a.Limit))
	return ah < bh || ah == bh && al < bl
}

// release hands the permits hs back to their gates, in reverse order; to a
// gate that spends at admission only when there is something for it to do
// (a refusal, a cost). A Release that panics does not keep the permits of
// the gates after it in that order: they are handed back before the panic
// goes on (a concurrency limit would lose a slot for good).
func (c *Chain) release(hs []held, r *Request, comp Completion) {
	n := len(hs) // the permits not handed back yet
	defer func() {
		if n > 0 {
			c.release(hs[:n], r, comp)
		}
	}()
	spent := comp.Outcome != OutcomeRejected && comp.Cost == 0
	for n > 0 {
		n--
		e := c.gates[hs[n].gate]
		if spent && e.spends {
			continue
		}
		e.gate.Release(r, hs[n].permit, comp)
	}
}

// Do decides r and, when admitted, runs fn and releases the Ticket on every
// path: OutcomeUseful when fn returns nil, OutcomeCancelled when fn fails
// after ctx was cancelled (the caller went away), OutcomeErrored when fn
// returns another error, panics or calls runtime.Goexit; past the
// request's deadline (ctx's deadline among them) useful and errored work
// count as OutcomeLate (Ticket.Done). A panic goes on after the release.
// When rejected, fn is not called and the returned error is nil: check
// Decision.Admitted.
func (c *Chain) Do(ctx context.Context, r *Request, fn func(context.Context) error) (d Decision, err error) {
	d, t := c.Decide(ctx, r)
	if !d.Admitted {
		return d, nil
	}
	finished := false
	defer func() {
		if !finished { // fn panicked or called runtime.Goexit
			t.Done(OutcomeErrored)
		}
	}()
	err = fn(ctx)
	finished = true
	switch {
	case err == nil:
		t.Done(OutcomeUseful)
	case errors.Is(ctx.Err(), context.Canceled):
		t.Done(OutcomeCancelled)
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		t.Done(OutcomeLate) // ctx's deadline, which r may not carry

	default:
		t.Done(OutcomeErrored)
	}
	return d, err
}
