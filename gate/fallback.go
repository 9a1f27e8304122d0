package gate

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// ledger keeps a rate gate's store and its local fallback (Options.Fallback)
// in step, so that a store that fails and recovers, again and again,
// admits no more than one of them would alone. Each spends while the
// other refills: without it, the fallback was full whenever the store
// failed (the store had decided until then) and the store was full when
// it came back (the fallback had decided meanwhile), and a Redis that
// flapped every second let a tenant through at twice its limit.
//
//   - While the store decides (LocalFallback), each admission is taken
//     from the fallback too, as far as it holds units: the fallback
//     starts an outage where this process's spending left it.
//   - While the fallback decides, its admissions are owed to the store,
//     by key, and charged to it (store.Debiter: never past empty) once it
//     answers again: the key's debt on the key's next decision, and one
//     other key's with each decision, until none is owed.
//
// Only a limiter whose quota refills (a token bucket, GCRA, a window) has
// a ledger: a concurrency permit goes back when its request ends.
type ledger struct {
	mirror bool        // take the store's admissions from the fallback too
	owing  atomic.Bool // debts holds something
	mu     sync.Mutex  // guards debts
	debts  map[string]int64
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
	if _, ok := lim.(store.Debiter); !ok {
		return nil
	}
	return &ledger{mirror: opts.OnFailure == LocalFallback}
}

// stored books a decision the store made for key (admitted: cost units
// taken), and charges what the store is owed.
func (b *base) stored(key string, now clock.Instant, cost int64, admitted bool) {
	l := b.ledger
	if l.mirror && admitted {
		// As far as the fallback holds units; what it cannot take, it
		// has no burst left to give an outage anyway.
		b.opts.Fallback.Take(context.Background(), key, now, cost, 0)
	}
	if l.owing.Load() {
		b.settleDebts(key, now)
	}
}

// owe books units (negative: given back) the fallback admitted for key,
// owed to the store.
func (l *ledger) owe(key string, units int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.debts == nil {
		l.debts = map[string]int64{}
	}
	v, ok := l.debts[key]
	switch {
	case !ok && (units <= 0 || len(l.debts) >= maxDebts):
		return
	case v+units <= 0:
		delete(l.debts, key)
	default:
		l.debts[key] = v + units
	}
	l.owing.Store(len(l.debts) > 0)
}

// take removes and returns key's debt and, when another key is owed, that
// one's too (other is "" when none).
func (l *ledger) take(key string) (own int64, other string, otherUnits int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	own = l.debts[key]
	delete(l.debts, key)
	for k, v := range l.debts {
		other, otherUnits = k, v
		delete(l.debts, k)
		break
	}
	l.owing.Store(len(l.debts) > 0)
	return own, other, otherUnits
}

// settleDebts charges the store key's debt and one other key's. A charge
// the store fails is owed again.
func (b *base) settleDebts(key string, now clock.Instant) {
	own, other, otherUnits := b.ledger.take(key)
	d := b.lim.(store.Debiter)
	for _, c := range [...]struct {
		key   string
		units int64
	}{{key, own}, {other, otherUnits}} {
		if c.units <= 0 {
			continue
		}
		if err := d.Debit(context.Background(), c.key, 0, now, c.units); err != nil {
			b.failures.Add(1)
			b.ledger.owe(c.key, c.units)
		}
	}
}

// fellBack books a decision the fallback made (in place of the failed
// store) that took units, owed to the store.
func (b *base) fellBack(key string, res *limit.Result, units int64) {
	if b.ledger != nil && res.Status == limit.Allowed {
		b.ledger.owe(key, units)
	}
}
