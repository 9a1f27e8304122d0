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
	// HandleKey: the step ran on the key's own state.
	HandleKey store.Handle = 1
	// HandleOverflow: the table was full and the step ran on the shard's
	// shared overflow state.
	HandleOverflow store.Handle = 2
)

// Keyed is a store.Limiter in process memory: algorithm A over one state S
// per key, held in a Table. Take and Refund never fail and, for a key that
// already exists, never allocate.
type Keyed[S any, A limit.Algorithm[S]] struct {
	alg   A
	table *Table[S]
	byDL  func(s *S, now, cost, deadline int64) limit.Result
}

type deadlineTaker[S any] interface {
	TakeBy(s *S, now, cost, deadline int64) limit.Result
}

var _ store.Limiter = (*Keyed[limit.TokenBucketState, *limit.TokenBucket])(nil)

// NewKeyed returns a keyed limiter running alg. Algorithms with a TakeBy
// method (limit.LeakyBucket) receive the request's deadline.
func NewKeyed[S any, A limit.Algorithm[S]](alg A, opts Options) *Keyed[S, A] {
	k := &Keyed[S, A]{alg: alg, table: NewTable(opts, alg.Fresh)}
	if dt, ok := any(alg).(deadlineTaker[S]); ok {
		k.byDL = dt.TakeBy
	}
	return k
}

// Take runs one step for key; err is always nil.
func (k *Keyed[S, A]) Take(_ context.Context, key string, now clock.Instant, cost int64, deadline clock.Instant) (limit.Result, store.Handle, error) {
	s, overflow, g := k.table.Lock(key, int64(now), true)
	var r limit.Result
	if k.byDL != nil {
		r = k.byDL(s, int64(now), cost, int64(deadline))
	} else {
		r = k.alg.Take(s, int64(now), cost)
	}
	g.Unlock()
	if overflow {
		return r, HandleOverflow, nil
	}
	return r, HandleKey, nil
}

// Refund gives cost units back to the state h names; err is always nil.
func (k *Keyed[S, A]) Refund(_ context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if h == HandleOverflow {
		s, g := k.table.LockOverflow(key)
		k.alg.Refund(s, int64(now), cost)
		g.Unlock()
		return nil
	}
	s, _, g := k.table.Lock(key, int64(now), false)
	if s != nil {
		k.alg.Refund(s, int64(now), cost)
	}
	g.Unlock()
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
	return n
}

// Limit returns the algorithm's quota.
func (k *Keyed[S, A]) Limit() int64 { return k.alg.Limit() }

// Window returns the algorithm's window.
func (k *Keyed[S, A]) Window() time.Duration { return k.alg.Window() }

// Table returns the underlying table (for sizes and overflow counts).
func (k *Keyed[S, A]) Table() *Table[S] { return k.table }
