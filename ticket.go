package sluice

import (
	"sync/atomic"

	"github.com/sluice-go/sluice/clock"
)

// Ticket is the handle of one admitted request. Done must be called exactly
// once when the work ends, on every path (success, error, panic, timeout,
// client cancellation); it releases every permit the chain's gates hold for
// the request and reports the outcome and latency.
//
// Ticket is a small value that may be copied freely: Done on any copy
// releases at most once, and later calls (or calls on the zero Ticket of a
// rejection) return false. Tickets are recycled, but a stale copy can never
// release a later request's permits.
type Ticket struct {
	t   *ticket
	gen uint64
}

type ticket struct {
	gen   atomic.Uint64
	chain *Chain
	req   Request
	start clock.Instant
	n     int
	held  [MaxGates]held
	dec   [2]Decision // where the gates write their verdicts (Chain.Decide)
}

// Valid reports whether t belongs to an admitted request that is not done yet.
func (t Ticket) Valid() bool { return t.t != nil && t.t.gen.Load() == t.gen }

// Done releases the ticket with outcome o. OutcomeUseful and
// OutcomeErrored are turned into OutcomeLate when the request's deadline
// has passed: work that ends past its deadline, whatever its answer (a
// 504 at the deadline included), is a late completion with its whole
// latency, the strongest overload signal there is, and never an error the
// gates would learn nothing from. It returns true for the call that
// released, false for every other call. In a chain whose gates all spend
// their quota at admission (rate limits) and that has no Observer, Done of
// an outcome other than OutcomeRejected reads no clock and calls no gate.
// A gate whose Release panics does not keep the other gates' permits:
// they are released before the panic goes on to the caller, and the
// Ticket stays done.
func (t Ticket) Done(o Outcome) bool { return t.DoneCost(o, 0) }

// DoneCost is Done with the work's actual cost in demand units, learned
// when it ended (the units an upstream reports it spent, rows read, bytes
// sent): the rate gates that charged the request's estimated Cost at
// admission charge the difference to the same keys, or give it back
// (Completion.Cost), so a caller that under-declares pays in its next
// requests. cost ≤ 0 keeps the estimate; a cost above MaxCost counts as
// MaxCost.
func (t Ticket) DoneCost(o Outcome, cost int64) bool {
	tk := t.t
	if tk == nil || !tk.gen.CompareAndSwap(t.gen, t.gen+1) {
		return false
	}
	c := tk.chain
	if c.spends && c.obs == nil && cost <= 0 && o != OutcomeRejected {
		// Every gate spent its quota at admission, the work was not
		// turned away after it (which gives the quota back), and nobody
		// is told: there is nothing to release and no time to read.
		// (tk.req is overwritten when tk is next used.)
		c.pool.Put(tk)
		return true
	}
	now := c.clock.Now()
	if (o == OutcomeUseful || o == OutcomeErrored) && tk.req.Deadline != 0 && now > tk.req.Deadline {
		o = OutcomeLate
	}
	comp := Completion{Outcome: o, Now: now, Latency: max(now.Sub(tk.start), 0), Cost: min(max(cost, 0), MaxCost)}
	c.release(tk.held[:tk.n], &tk.req, comp)
	if c.obs != nil {
		c.obs.Done(&tk.req, comp)
	}
	c.pool.Put(tk) // tk.req is overwritten when tk is next used
	return true
}
