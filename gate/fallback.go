package gate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// ledger keeps a rate gate's store and its local fallback (Options.Fallback)
// in step, so that a store that fails and recovers, again and again, admits
// no more than one of them would alone. Each spent while the other
// refilled: the fallback was full whenever the store failed (the store had
// decided until then) and the store full when it came back (the fallback
// had decided meanwhile), and a Redis that flapped every second let a
// tenant through at twice its limit.
//
//   - While the store decides (LocalFallback), each admission is taken
//     from the fallback too, as far as it holds units: the fallback starts
//     an outage where this process's spending left it.
//   - While the fallback decides, a refilling quota's admissions (a token
//     bucket's, GCRA's) are owed to the store, by key, and charged to it
//     (store.Debiter: never past empty) once it answers again: the key's
//     debt on the key's next decision, and one other key's with each
//     decision, until none is owed. Charged late, a debt is exact while
//     the store's bucket did not fill up meanwhile; what refilled past a
//     full bucket since the key's first admission owed (its rate times that
//     time, less one burst) is taken off the debt, so a light tenant's long
//     outage is not charged against the full bucket it would have had. A
//     window's admissions are not owed: charged after the window turned,
//     they would count in the next one.
//
// What it does not keep in step: each replica's fallback (limit ÷
// replicas) mirrors its own admissions only, so a fleet whose load was
// uneven can begin an outage with up to one fleet burst unspent; and the
// debts of a gate a reload replaced are dropped (package policy carries
// the fallback's own state over). Only a limiter whose quota
// refills or has a window has a ledger: a concurrency permit goes back
// when its request ends.
type ledger struct {
	mirror bool          // take the store's admissions from the fallback too
	owes   bool          // book the fallback's admissions as debts
	burst  float64       // the store's quota (Limit), for the debts' refill
	fill   time.Duration // the time it takes to refill (Window)
	owing  atomic.Bool   // debts holds something
	mu     sync.Mutex    // guards debts
	debts  map[string]debt
}

// debt is what a key owes the store: units, owed since its first
// admission owed.
type debt struct {
	units int64
	since clock.Instant
}

// maxDebts bounds the keys owed at once: past it, a new key's fallback
// admissions are not owed (an outage over more tenants than this leaves
// the rest's store quota as the fallback found it).
const maxDebts = 1 << 16

// newLedger returns the ledger of a gate with opts over lim, or nil when
// it needs none.
func newLedger(lim store.Limiter, opts *Options, refills bool) *ledger {
	if opts.Fallback == nil || (!refills && lim.Window() <= 0) {
		return nil
	}
	_, debits := lim.(store.Debiter)
	l := &ledger{mirror: opts.OnFailure == LocalFallback, owes: refills && debits && lim.Window() > 0,
		burst: float64(lim.Limit()), fill: lim.Window()}
	if !l.mirror && !l.owes {
		return nil
	}
	return l
}

// mirroredBit marks the permit of a store admission the fallback took
// too, so that a refund goes to both (a store handle of a rate limiter is
// small: memory's 1 or 2, Redis' 1).
const mirroredBit = sluice.Permit(1) << 62

// stored books a decision the store made for key (admitted: cost units
// taken, handle h), charges what the store is owed, and returns the
// permit to hold.
func (b *base) stored(key string, now clock.Instant, cost int64, admitted bool, h store.Handle) sluice.Permit {
	l, p := b.ledger, sluice.Permit(h)
	if l.mirror && admitted && p < mirroredBit {
		// When the fallback holds the units; when it cannot, it has no
		// burst left to give an outage anyway.
		if res, _, err := b.opts.Fallback.Take(context.Background(), key, now, cost, 0); err == nil && res.Status == limit.Allowed {
			p |= mirroredBit
		}
	}
	if l.owing.Load() {
		b.settleDebts(key, now)
	}
	return p
}

// owe books units (negative: given back) the fallback admitted for key at
// now, owed to the store.
func (l *ledger) owe(key string, units int64, now clock.Instant) {
	if !l.owes {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.debts == nil {
		l.debts = map[string]debt{}
	}
	v, ok := l.debts[key]
	switch {
	case !ok && (units <= 0 || len(l.debts) >= maxDebts):
		return
	case v.units+units <= 0:
		delete(l.debts, key)
	default:
		if !ok {
			v.since = now
		}
		v.units += units
		l.debts[key] = v
	}
	l.owing.Store(len(l.debts) > 0)
}

// take removes and returns key's debt and, when another key is owed, that
// one's too (other is "" when none).
func (l *ledger) take(key string) (own debt, other string, otherDebt debt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	own = l.debts[key]
	delete(l.debts, key)
	for k, v := range l.debts {
		other, otherDebt = k, v
		delete(l.debts, k)
		break
	}
	l.owing.Store(len(l.debts) > 0)
	return own, other, otherDebt
}

// due is what of d is still owed at now: less what the quota refilled
// past one burst since the debt began (a full bucket loses it).
func (l *ledger) due(d debt, now clock.Instant) int64 {
	over := l.burst*float64(now.Sub(d.since))/float64(l.fill) - l.burst
	if over <= 0 {
		return d.units
	}
	if over >= float64(d.units) {
		return 0
	}
	return d.units - int64(over)
}

// settleDebts charges the store key's debt and one other key's. A charge
// the store fails is owed again.
func (b *base) settleDebts(key string, now clock.Instant) {
	own, other, otherDebt := b.ledger.take(key)
	d := b.lim.(store.Debiter)
	for _, c := range [...]struct {
		key string
		d   debt
	}{{key, own}, {other, otherDebt}} {
		units := b.ledger.due(c.d, now)
		if units <= 0 {
			continue
		}
		if err := d.Debit(context.Background(), c.key, 0, now, units); err != nil {
			b.ledger.owe(c.key, units, c.d.since) // owed since it began
		}
	}
}

// fellBack books a decision the fallback made (in place of the failed
// store) at now that took units, owed to the store.
func (b *base) fellBack(key string, res *limit.Result, units int64, now clock.Instant) {
	if b.ledger != nil && res.Status == limit.Allowed {
		b.ledger.owe(key, units, now)
	}
}
