// Package store defines the backend interface behind sluice's keyed limiters:
// a Limiter makes one algorithm step of package limit atomic for a key, in
// process (package store/memory) or across a fleet (Redis).
//
// Gates talk to a Limiter and never to a backend directly, so every gate
// runs unchanged on every backend:
//
//	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
//	var lim store.Limiter = memory.NewKeyed(tb, memory.Options{})
//	res, h, err := lim.Take(ctx, "tenant-42", clock.Now(), 1, 0)
package store

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
)

// Handle identifies what a Take holds, so that Refund returns it to the same
// place (for example the overflow state of a full memory table, or a fleet
// permit id). Backends define its values, never 0 for a successful Take
// and never with bit 63 set (reserved for callers: gates mark permits held
// by their local fallback with it); callers pass it back unchanged.
type Handle uint64

// Limiter is one keyed rate or concurrency limit on some backend.
// Implementations must be safe for concurrent use.
type Limiter interface {
	// Take applies one step for key: cost demand units at now (on the
	// caller's clock; backends with their own clock, such as Redis, may
	// ignore it) for a request that must proceed before deadline (0 = none;
	// only pacing algorithms use it). A denial is a Result, not an error:
	// err is non-nil only when the backend failed, and then wraps
	// ErrUnavailable.
	Take(ctx context.Context, key string, now clock.Instant, cost int64, deadline clock.Instant) (limit.Result, Handle, error)
	// Refund returns cost units taken by an Allowed Take with handle h: the
	// tokens of a request a later gate rejected, or the slots of a finished
	// request for concurrency limits.
	Refund(ctx context.Context, key string, h Handle, now clock.Instant, cost int64) error
	// Limit returns the quota in demand units.
	Limit() int64
	// Window returns the time a fully used quota takes to come back (0 for
	// concurrency limits).
	Window() time.Duration
}

// Debiter is a Limiter that can charge units after the fact (a true-up:
// the part of a request's cost its work needed beyond what Take took; the
// other way is Refund). Debit takes cost more units for key whatever the
// state holds, never past empty (limit.Debiter); h is the handle of the
// request's Take. Algorithms without a debit (concurrency, a leaky bucket,
// a sliding log) charge nothing and return nil.
type Debiter interface {
	Debit(ctx context.Context, key string, h Handle, now clock.Instant, cost int64) error
}

// Refiller is a Limiter whose quota refills continuously, a token bucket or
// GCRA: its Limit is the burst and Limit ÷ Window the sustained rate,
// where a window's Limit comes back whole at once. A rejection's message
// says which (package wire).
type Refiller interface {
	Refills() bool
}

// OldestReleaser is a concurrency Limiter whose permits live in a store
// shared by processes (package store/redis): it frees the oldest permits
// of key, whole, whose slots fit in slots, whichever process took them,
// and returns the slots freed. A protocol whose releases come without
// their permit and may reach any process (the Envoy rate limit service's
// is_negative_hits) releases through it.
type OldestReleaser interface {
	ReleaseOldest(ctx context.Context, key string, slots int64) (int64, error)
}

// ErrUnavailable wraps every backend failure (timeout, connection refused,
// script error): the limiter could not decide.
var ErrUnavailable = errors.New("store: backend unavailable")
