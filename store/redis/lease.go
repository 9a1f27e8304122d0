package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/leasealloc"
	"github.com/sluice-go/sluice/store"
)

//go:embed lua/lease.lua
var leaseLua string

var leaseScript = newScript(preludeLua + commonLua + leaseLua)

// Lease runs one step of a's allocator for budget on Redis (the twin of
// leasealloc.Allocator.Step, on Redis' clock): the budget's holdings live in
// one hash, so the step is one atomic script on standalone Redis and on a
// Cluster. The hash expires after two lease times or 10 minutes of Redis'
// time without a call, whichever is longer: then the next call learns, as
// after a restart. The grant's expiry is on the caller's clock (clock.System),
// one lease time after the call was sent: the step runs later, so the
// grant never outlives its holding by the reply's latency. A call that Redis
// reaches after its timeout does nothing; one its caller gave up on before
// (its own context, a connection the client closed on its write timeout)
// may still run until then, so the client's next step
// of the budget is not sent before (it answers ErrUnavailable): an old
// step never lands after a newer one. The error wraps
// store.ErrUnavailable when Redis cannot be reached.
func (s *Store) Lease(ctx context.Context, budget string, a leasealloc.Allocator, r leasealloc.Request) (leasealloc.Grant, error) {
	g, _, err := s.leaseAt(ctx, budget, a, r, 0)
	return g, err
}

// leaseAt is Lease with Redis' now overridden (µs; 0: Redis TIME), for
// tests; it also returns the expiry on Redis' clock (µs).
func (s *Store) leaseAt(ctx context.Context, budget string, a leasealloc.Allocator, r leasealloc.Request, nowUS int64) (leasealloc.Grant, int64, error) {
	if err := a.Validate(); err != nil {
		return leasealloc.Grant{}, 0, err
	}
	op := "take"
	if r.Release {
		op = "release"
	}
	args := []string{strconv.FormatInt(nowUS, 10), op, r.Client,
		strconv.FormatInt(max(r.Wants, 0), 10) + " " + strconv.FormatInt(max(r.Has, 0), 10) + " " + strconv.FormatInt(max(r.InUse, 0), 10),
		packDoubles(a.Capacity, a.Lease.Microseconds(), a.RefreshEvery().Microseconds()), "0"}
	id := budget + "\x00" + r.Client
	sent := clock.Now() // Redis runs the step after this: the grant lapses no later on the caller's clock
	if !r.Release && s.stepMayRun(id, sent) {
		return leasealloc.Grant{}, 0, fmt.Errorf("%w: the previous lease step of %q may still run", store.ErrUnavailable, r.Client)
	}
	v, tried, err := s.runPast(ctx, leaseScript, []string{s.key("lease", budget)}, args, true)
	s.leaseMu.Lock()
	switch {
	case err == nil:
		delete(s.leaseLate, id)
	case tried && mayStillRun(ctx, err):
		// run's deadline is its own start (after sent) plus the timeout,
		// on Redis' clock as estimated early: past this, the step is late
		if s.leaseLate == nil {
			s.leaseLate = map[string]clock.Instant{}
		}
		s.leaseLate[id] = sent.Add(s.opts.Timeout + time.Millisecond)
	}
	s.leaseMu.Unlock()
	if err != nil {
		return leasealloc.Grant{}, 0, err
	}
	refresh := a.Refresh
	if refresh == 0 {
		refresh = a.Lease / 4
	}
	g := leasealloc.Grant{Has: v[1], Refresh: refresh, Learning: v[2] > 0, Clients: int(v[0]), Safe: v[3]}
	if g.Learning { // ask again soon, as holders get safe shares, and as the learning period ends
		g.Refresh = min(refresh/4, max(time.Duration(v[2])*time.Microsecond, time.Millisecond))
		if d := time.Duration(v[2]-a.Lease.Microseconds()+refresh.Microseconds()) * time.Microsecond; d > 0 {
			g.Refresh = min(g.Refresh, max(d, time.Millisecond))
		}
	}
	var expiry int64 // on Redis' clock, when the test named it
	if !r.Release {
		g.Expiry = sent.Add(a.Lease.Truncate(time.Microsecond))
		expiry = nowUS + a.Lease.Microseconds()
	}
	return g, expiry, nil
}

// stepMayRun reports whether a failed lease step of id may still run on
// Redis at now (and forgets one that no longer may).
func (s *Store) stepMayRun(id string, now clock.Instant) bool {
	s.leaseMu.Lock()
	defer s.leaseMu.Unlock()
	until, ok := s.leaseLate[id]
	if ok && now >= until {
		delete(s.leaseLate, id)
		ok = false
	}
	return ok
}

// unavailable is the error of a call sent to Redis that failed: it reads
// and matches as store.ErrUnavailable, and keeps the client's error for
// mayStillRun.
type unavailable struct{ err error }

func (u *unavailable) Error() string        { return store.ErrUnavailable.Error() + ": " + u.err.Error() }
func (u *unavailable) Is(target error) bool { return target == store.ErrUnavailable }

// mayStillRun reports whether a sent call that failed with err may still
// run on Redis: its caller gave up (a timeout, its context) while Redis
// may hold it, unread or queued. Not when Redis answered (an error reply,
// a late call that did nothing) or ended the connection (EOF, a reset,
// refused): Redis drops what it had not run of a connection it closed.
func mayStillRun(ctx context.Context, err error) bool {
	var u *unavailable
	if !errors.As(err, &u) || errors.Is(u.err, errLate) || dataError(u.err) {
		return false
	}
	return ctx.Err() != nil || errors.Is(u.err, context.DeadlineExceeded) || errors.Is(u.err, context.Canceled) ||
		errors.Is(u.err, os.ErrDeadlineExceeded)
}
