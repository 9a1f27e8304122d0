package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// The release journal: concurrency permits owed back to Redis. A take
// whose call failed after it may have reached Redis (it timed out, or the
// connection broke under it) may hold a permit there that no request
// holds; a release whose call failed leaves its permit held. Both are
// recorded here and sent again — releases are idempotent, so a permit that
// was never taken, or is already gone, costs nothing — as soon as the node
// answers: right away while the breaker is closed, else by the probe that
// closes it. So after an outage no permit stays held by a request that is
// not in flight for longer than one probe interval, instead of the permit
// TTL.

// journalCap bounds the releases kept; beyond it the oldest are dropped
// and heal by their permit TTL, as a crashed holder's do.
const journalCap = 1 << 16

// release is one permit owed back to Redis.
type release struct {
	l    *limiter
	key  string
	h    store.Handle
	cost int64
}

type journal struct {
	s        *Store
	mu       sync.Mutex
	pending  []release
	draining bool
	retryAt  clock.Instant // no drain on a kick before this after a failed one
	retry    *time.Timer   // the drain after a failed one
	owes     atomic.Bool   // pending is not empty: successful calls kick a drain
	dropped  atomic.Int64
}

// add records a release owed to Redis and starts sending it.
func (j *journal) add(r release) {
	j.mu.Lock()
	if len(j.pending) >= journalCap {
		j.pending = j.pending[1:]
		j.dropped.Add(1)
	}
	j.pending = append(j.pending, r)
	j.owes.Store(true)
	j.mu.Unlock()
	j.kick()
}

// owed returns the releases not yet sent.
func (j *journal) owed() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.pending)
}

// kick starts a drain in the background unless one runs, nothing is owed,
// or the last one failed less than a probe interval ago (then its timer
// will).
func (j *journal) kick() { j.start(false) }

// start starts a drain; force ignores retryAt (the retry timer).
func (j *journal) start(force bool) {
	s := j.s
	j.mu.Lock()
	if j.draining || len(j.pending) == 0 || (!force && s.opts.Clock.Now() < j.retryAt) {
		j.mu.Unlock()
		return
	}
	j.draining = true
	j.mu.Unlock()
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		j.mu.Lock()
		j.draining = false
		j.mu.Unlock()
		return
	}
	s.probes.Add(1)
	go func() {
		defer s.probes.Done()
		j.drain(s.opts.Timeout)
	}()
}

// drain sends the owed releases, oldest first, until none is left or one
// fails; what failed stays for the next drain.
func (j *journal) drain(timeout time.Duration) {
	for {
		j.mu.Lock()
		if len(j.pending) == 0 {
			j.draining = false
			j.owes.Store(false)
			j.mu.Unlock()
			return
		}
		r := j.pending[0]
		j.mu.Unlock()
		if err := r.l.release(context.Background(), r.key, r.h, r.cost, timeout); err != nil {
			j.mu.Lock()
			j.draining = false
			j.retryAt = j.s.opts.Clock.Now().Add(j.s.opts.ProbeEvery)
			if j.retry == nil {
				j.retry = time.AfterFunc(j.s.opts.ProbeEvery, func() { j.start(true) })
			} else {
				j.retry.Reset(j.s.opts.ProbeEvery)
			}
			j.mu.Unlock()
			return
		}
		j.mu.Lock()
		if len(j.pending) > 0 && j.pending[0] == r {
			j.pending = j.pending[1:]
		}
		j.mu.Unlock()
	}
}

// flush is a last drain at Close (after which no drain starts).
func (j *journal) flush(timeout time.Duration) {
	j.mu.Lock()
	if j.retry != nil {
		j.retry.Stop()
	}
	pending := j.pending
	j.pending = nil
	j.owes.Store(false)
	j.mu.Unlock()
	for _, r := range pending {
		if r.l.release(context.Background(), r.key, r.h, r.cost, timeout) != nil {
			return
		}
	}
}
