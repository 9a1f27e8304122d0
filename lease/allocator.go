// Package lease divides a global budget between processes as leases: each
// process holds a slice of the budget for a lease time and spends it
// in-process, and the allocator hands slices out fairly and never more
// than the budget in all.
//
//	a := lease.Allocator{Capacity: 10000, Lease: 10 * time.Second}
//	var st lease.State
//	g := a.Step(&st, lease.Request{Client: "web-1", Wants: 4000}, now)
//	// g.Has units/s until g.Expiry; ask again every g.Refresh
//
// A Gate spends a process's lease of a rate budget in-process (no call to
// the allocator on the decision path) and refreshes it in the background;
// a Concurrency gate does the same with a budget of slots in flight.
//
// Bounds, for n processes sharing a capacity of C units/s (or C slots)
// with lease time L, refresh interval R and a local bucket of B (time at
// the grant):
//   - Overshoot: the grants never sum above C, so the fleet admits at most
//     C·(T + B) in any window T while the allocator keeps its state. That
//     holds for what the processes spend, not only for what the allocator
//     has on record: a gate spends its old grant until the answer to its
//     refresh applies, and until that grant's expiry when the answer is
//     lost after the step ran (a timeout after Redis ran the script), so
//     each refresh reports what the gate spends as in use, and the
//     allocator keeps it from the others until the gate's next step (a
//     gate whose grant shrank by more than an eighth asks again at once).
//     Likewise a concurrency budget's holders report what they have in
//     flight, so the fleet never has more than C in flight while its
//     processes reach the allocator. After
//     it lost its state (a Redis restart or failover, indistinguishable
//     from a budget that is new) it learns for L: it confirms what holders
//     say they hold and grants nothing new; a process holding nothing is
//     told a safe share of what neither confirmed holdings nor other safe
//     shares take, which it spends under FailSafe; a refresh interval
//     into learning, when every holder has reported, a holder that wants
//     more than its confirmed holding is told such a share too, and
//     spends the larger (an idle fleet regains its budget within R of
//     the learning's start, its learning refreshes timed to meet it, not
//     after L; a holder that first reports later
//     than that, its refreshes failing meanwhile, has spent its old lease
//     on top of those shares, as a holding not yet reported, and is
//     confirmed only what they leave). So a new budget stays
//     within C from its first step, and after a loss the fleet can spend
//     the holdings not yet reported on top of C: at most 2C, and only
//     until those holders refresh (within R when they reach the
//     allocator) and the others ask again after them (R/4); under
//     FailClosed it stays within C throughout. It also learns again when
//     a client says it holds a lease its state no longer has (a holding
//     outlives its holder's lease, so only a forward step of the
//     allocator's clock, a Redis host's wall clock, or a partial loss
//     does that): the holders are confirmed, not granted their room a
//     second time. A client holding nothing that reaches it first is
//     granted from the state as it finds it, so until the holders refresh
//     (within R) the fleet can spend up to 2C, as after a loss. With the
//     allocator unreachable a lease runs to its expiry and then the
//     failure mode decides: FailSafe spends C ÷ (the clients last seen),
//     so the fleet stays within C while no process has a lease, when
//     every process saw the same clients (and within C·n/m when a process
//     last saw m of them). The safe shares come on top of the grants,
//     though, while some processes spend them and the others hold leases:
//     a process cut off alone, or around an outage the leases lapsing and
//     coming back at different moments (the first back is granted its
//     fair share of what the live holdings leave, up to its demand, while
//     the others still spend their safe shares). Then the fleet can spend
//     up to those safe shares more (at most 2C) for as long as that lasts:
//     after an outage, until the last process has reached the allocator.
//     A gate that never had an answer spends nothing (or SafeShare);
//     FailOpen has no bound; FailClosed admits nothing.
//   - Unused allocation: a process whose demand fell keeps its grant until
//     its next refresh, so at most C stays unused for R (and a grant cut
//     by less than an eighth keeps its old size from the others for one
//     more R); a stopped process
//     holds its share for at most L (none after it gives the lease back).
//     While learning, the first process to ask is told all of C until the
//     others have asked (every R/4 while learning): at most C − its demand
//     unused for R/4.
//   - Whole units: a budget of C units over n > C processes that all want
//     more cannot be split; the units a max-min round leaves over rotate
//     once per lease time (max-min fair shares), so each process is granted a unit
//     within ⌈n/k⌉ lease times of k units left over, plus a refresh for the
//     previous holder to give it back.
//   - Convergence: a new process has its fair share once the others have
//     refreshed and confirmed their smaller grants (within R of its first
//     request, and one round trip); a new budget is shared
//     by the processes that use it within two rounds of R/4.
//
// The step is after Google Doorman's server (youtube/doorman,
// doc/design.md and doc/algorithms.md): FAIR_SHARE (max-min) allocation of
// what clients want, leases with an expiry and a refresh interval, and a
// learning mode for one lease time after the allocator lost its state (a
// Redis restart or failover), in which it only confirms what clients say
// they hold. The step is a pure function of its state and now, so one
// definition serves the in-memory allocator and its Redis twin.
package lease

import (
	"github.com/sluice-go/sluice/internal/leasealloc"
)

// MaxCapacity is the largest budget: its units and every sum of them are
// exact in a float64, so the Redis twin computes the same grants.
const MaxCapacity = leasealloc.MaxCapacity

// Allocator divides a budget (Capacity units/s, or slots) between clients
// as leases of Lease time each, refreshed every Refresh (Step).
type Allocator = leasealloc.Allocator

// Holding is one client's lease in an allocator's State.
type Holding = leasealloc.Holding

// State is an allocator's record of a budget's holdings.
type State = leasealloc.State

// Request is what a client asks of a budget in one Step.
type Request = leasealloc.Request

// Grant is a Step's answer: the units the client has until its expiry,
// and when to ask again.
type Grant = leasealloc.Grant
