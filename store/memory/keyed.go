package memory

import (
	"context"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// Handles a memory Keyed hands out.
const (
	// handleKey: the step ran on the key's own state.
	handleKey store.Handle = 1
	// handleOverflow: the table was full and the step ran on the shard's
	// shared overflow state.
	handleOverflow store.Handle = 2
)

// Keyed is a store.Limiter in process memory: algorithm A over one state S
// per key. Take and Refund never fail and, for a key that already exists,
// never allocate.
//
// The states live in a hash table sharded by a seeded hash of the key, each
// shard under its own mutex, so decisions on different keys rarely contend.
// It holds at most about Options.MaxKeys keys. When a new key arrives at a
// full shard, the shard first drops every key whose state is fresh (equal
// to a new key's, so dropping it changes no decision), at most once per
// Options.SweepEvery; if the shard is still full, it evicts a key so that
// the new one has its own state: a flood of distinct keys never locks new
// tenants out. Of 16 keys sampled, one seen only once goes first (a flood
// of one-shot keys churns among itself while established tenants keep
// their state), the longest idle first. An evicted key starts fresh if it
// returns, so it may gain one quota per eviction, and only while more
// distinct keys arrive than the table holds. A concurrency key with
// requests in flight is never evicted; a new key that finds only those
// shares the shard's overflow state (limited more strictly, never less).
type Keyed[S any, A limit.Algorithm[S]] struct {
	alg   A
	table *table[S]
	byDL  func(s *S, now clock.Instant, cost int64, deadline clock.Instant) limit.Result
	debit func(s *S, now clock.Instant, cost int64) // nil: the algorithm has none
}

type debiter[S any] interface {
	Debit(s *S, now clock.Instant, cost int64)
}

type deadlineTaker[S any] interface {
	TakeBy(s *S, now clock.Instant, cost int64, deadline clock.Instant) limit.Result
}

var _ store.Limiter = (*Keyed[limit.TokenBucketState, *limit.TokenBucket])(nil)

// NewKeyed returns a keyed limiter running alg. Algorithms with a TakeBy
// method (limit.LeakyBucket) receive the request's deadline.
func NewKeyed[S any, A limit.Algorithm[S]](alg A, opts Options) *Keyed[S, A] {
	k := &Keyed[S, A]{alg: alg, table: newTable(opts, alg.Fresh)}
	if dt, ok := any(alg).(deadlineTaker[S]); ok {
		k.byDL = dt.TakeBy
	}
	if d, ok := any(alg).(debiter[S]); ok {
		k.debit = d.Debit
	}
	if alg.Window() == 0 {
		// A concurrency count: forgetting a key with requests in flight
		// would admit them again.
		k.table.forgettable = alg.Fresh
	}
	return k
}

// Keys returns the keys held, and how many decisions so far evicted a key
// to make room for a new one (the table was full) or ran on a shard's
// shared overflow state (only keys with requests in flight were left).
func (k *Keyed[S, A]) Keys() (held int, evicted, overflowed int64) {
	return k.table.size(), k.table.evicted.Load(), k.table.overflows()
}

// Take runs one step for key; err is always nil.
func (k *Keyed[S, A]) Take(_ context.Context, key string, now clock.Instant, cost int64, deadline clock.Instant) (limit.Result, store.Handle, error) {
	s, now, overflow, g := k.table.lock(key, now, true)
	var r limit.Result
	if k.byDL != nil {
		r = k.byDL(s, now, cost, deadline)
	} else {
		r = k.alg.Take(s, now, cost)
	}
	g.unlock()
	if overflow {
		return r, handleOverflow, nil
	}
	return r, handleKey, nil
}

// Refund gives cost units back to the state h names; err is always nil.
func (k *Keyed[S, A]) Refund(_ context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if h == handleOverflow {
		s, now, g := k.table.lockOverflow(key, now)
		k.alg.Refund(s, now, cost)
		g.unlock()
		return nil
	}
	s, now, _, g := k.table.lock(key, now, false)
	if s != nil {
		k.alg.Refund(s, now, cost)
	}
	g.unlock()
	return nil
}

// Debit charges cost more units to the state h names (store.Debiter);
// err is always nil. An algorithm without a debit charges nothing.
func (k *Keyed[S, A]) Debit(_ context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if k.debit == nil || cost <= 0 {
		return nil
	}
	if h == handleOverflow {
		s, now, g := k.table.lockOverflow(key, now)
		k.debit(s, now, cost)
		g.unlock()
		return nil
	}
	s, now, _, g := k.table.lock(key, now, false)
	if s != nil {
		k.debit(s, now, cost)
	}
	g.unlock()
	return nil
}

// WithAlgorithm returns a limiter running alg on the same table (the same
// per-key state): for a reload that changes a limit but not the meaning of
// the state (a new concurrency limit over the same in-flight counts, a new
// burst over the same bucket). Permits taken on k release correctly on the
// result. REQUIRES: alg reads S the same way as k's algorithm.
func (k *Keyed[S, A]) WithAlgorithm(alg A) *Keyed[S, A] {
	n := &Keyed[S, A]{alg: alg, table: k.table}
	if dt, ok := any(alg).(deadlineTaker[S]); ok {
		n.byDL = dt.TakeBy
	}
	if d, ok := any(alg).(debiter[S]); ok {
		n.debit = d.Debit
	}
	return n
}

// SetMaxKeys changes the key cap (Options.MaxKeys) of k's table, and so of
// every limiter sharing it (WithAlgorithm), keeping every key's state: a
// reload that changes only the cap resets nothing. Lowering it drops no
// key; new keys get slots as old ones become fresh.
func (k *Keyed[S, A]) SetMaxKeys(n int) { k.table.setMaxKeys(n) }

// Limit returns the algorithm's quota.
func (k *Keyed[S, A]) Limit() int64 { return k.alg.Limit() }

// Window returns the algorithm's window.
func (k *Keyed[S, A]) Window() time.Duration { return k.alg.Window() }

// Refills reports whether the algorithm's quota refills continuously (a
// token bucket or GCRA: store.Refiller).
func (k *Keyed[S, A]) Refills() bool {
	r, ok := any(k.alg).(store.Refiller)
	return ok && r.Refills()
}
