package redis

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// breaker guards the calls to one Redis master (or, with an empty addr,
// to the whole store). Open, its decisions fail fast with ErrUnavailable
// and one background probe per Options.ProbeEvery tries the node again.
// On a Cluster each master has its own, so a dead master sends only its
// slots to the gates' failure policies while the others keep deciding on
// Redis.
//
// It also keeps the node's clock as seen from here: offset is the largest
// lower bound of Redis TIME − this process's monotonic clock (µs) among
// the replies of the current second, so that a call can tell Redis when
// its caller gives up.
type breaker struct {
	addr      string
	open      atomic.Bool
	openUntil atomic.Int64 // the clock.Instant before which no probe goes
	closedAt  atomic.Int64 // the clock.Instant a probe last closed it
	probing   atomic.Bool  // one probe at a time
	// checking: a call failed on a broken connection and a check of the
	// node is under way; calls fail fast until it ends (held).
	checking atomic.Bool
	watching atomic.Bool  // a watch runs (see Store.watch)
	offset   atomic.Int64 // µs
	epoch    atomic.Int64 // local µs when the current offset estimate began
	known    atomic.Bool  // offset holds an estimate
	readMu   sync.Mutex
	reading  chan struct{} // closed when the clock read under way ends (nil: none)
	// cause is the error the calls it fails fast get: ErrUnavailable with
	// what opened it last (built once per opening, not per call), so that
	// a gate's log says why (a refused password, a connection refused),
	// not only that.
	cause atomic.Pointer[error]
}

// setCause makes why the cause of b's opening.
func (b *breaker) setCause(why error) {
	if u := (*unavailable)(nil); errors.As(why, &u) {
		why = u.err
	}
	var err error = &openCause{store.ErrUnavailable.Error() + ": " + why.Error(), NotRefused}
	if k := RefusalOf(why); k != NotRefused {
		err = &openCause{store.ErrUnavailable.Error() + ": " + ErrRefused.Error() + ": " + why.Error(), k}
	}
	b.cause.Store(&err)
}

// openCause is the error of the calls an open breaker fails fast: it
// matches store.ErrUnavailable, and ErrRefused when Redis refused the
// store's settings (RefusalOf tells what), and reads as what opened the
// breaker.
type openCause struct {
	msg     string
	refused Refusal
}

func (c *openCause) Error() string { return c.msg }
func (c *openCause) Is(target error) bool {
	return target == store.ErrUnavailable || c.refused != NotRefused && target == ErrRefused
}

// name names b's node in an error: its address, or "Redis" for the
// store's own breaker.
func (b *breaker) name() string {
	if b.addr == "" {
		return "Redis"
	}
	return b.addr
}

// unavailable returns the error of a call b fails fast.
// held reports whether calls must not go to b's node now: b is open, or a
// broken connection's check is under way.
func (b *breaker) held() bool { return b.open.Load() || b.checking.Load() }

func (b *breaker) unavailable() error {
	if p := b.cause.Load(); p != nil {
		return *p
	}
	return store.ErrUnavailable
}

// observe takes a reply's Redis time (µs) of a call sent at local instant
// sent and whose reply was read at local instant at. Redis ran the call
// between its sending and at, so Redis time − at is a lower bound of the
// offset; the largest of a second is the estimate, and a new second starts
// afresh, so a step of either clock is followed within a second. A reply
// read more than quick after its sending (this process stalled before
// reading it) is a bound low by the stall: it may raise the current
// estimate but does not start a new one, or every call after it would
// carry an expiry early by the stall and Redis would refuse calls it
// reached in time. An estimate no quick reply renewed for staleEstimate
// starts afresh from a slow one all the same: where every round trip is
// slower than quick (a distant Redis), Redis' clock falling behind would
// otherwise never be followed, and expiries would stay late by the fall.
func (b *breaker) observe(redisUs int64, sent, at clock.Instant, quick time.Duration) {
	if redisUs <= 0 {
		return
	}
	local := int64(at) / 1000
	l := redisUs - local
	age := local - b.epoch.Load()
	if !b.known.Load() || (age > 1e6 && at.Sub(sent) <= quick) || age > staleEstimate {
		b.offset.Store(l)
		b.epoch.Store(local)
		b.known.Store(true)
		return
	}
	for {
		old := b.offset.Load()
		if l <= old || b.offset.CompareAndSwap(old, l) {
			return
		}
	}
}

// staleEstimate is how long (µs) an offset estimate lasts without a quick
// reply to renew it (breaker.observe).
const staleEstimate = 10e6

// expiry returns the Redis time (µs, as a script argument) after which a
// call sent at local instant start is given up: start + timeout on Redis'
// clock, by the offset estimate; "0" (none) before any reply, which is why
// a call that must expire learns the clock first (learnClock). The estimate
// errs early by the return time of its best reply, so Redis treats a call
// as late slightly before its caller does, never after.
func (b *breaker) expiry(start clock.Instant, timeout time.Duration) string {
	if !b.known.Load() {
		return "0"
	}
	return strconv.FormatInt(int64(start)/1000+b.offset.Load()+timeout.Microseconds(), 10)
}

// clockLua reads Redis' clock (µs) on the node that holds its key. It is
// sent whole (EVAL: it is short), so that the read is one round trip
// even before Redis holds the store's scripts.
const clockLua = "local t = redis.call('TIME') return tonumber(t[1]) * 1000000 + tonumber(t[2])"

// learnClock makes sure b knows its node's clock before a call that must
// expire by it is sent. Until a first reply came, such a call could not
// tell Redis when its caller gives up, and ran whenever Redis reached it:
// a store started against a stalled Redis had every call of the stall run
// once Redis resumed, long after its caller had failed (tokens taken for
// decisions already made, a lease step landing after a newer one). The
// clock is read once, by a script on key (on a Cluster it runs on key's
// master, b's node); concurrent callers wait for the read under way. ctx
// and dl bound the wait; failed is told the read's error, if it fails (the
// caller decides whether it is news about Redis: Store.failed). It returns
// nil once the clock is known, else an error wrapping
// store.ErrUnavailable; nothing of the caller's call was sent then.
func (s *Store) learnClock(ctx context.Context, dl time.Time, cn *connection, b *breaker, key string, failed func(error)) error {
	if b.known.Load() {
		return nil
	}
	ctx, cancel := context.WithDeadline(ctx, dl)
	defer cancel()
	for !b.known.Load() {
		if b.open.Load() { // a read that failed just now opened it
			return b.unavailable()
		}
		b.readMu.Lock()
		r := b.reading
		lead := r == nil
		if lead {
			r = make(chan struct{})
			b.reading = r
		}
		b.readMu.Unlock()
		if !lead {
			select {
			case <-r:
				continue
			case <-ctx.Done():
				return fmt.Errorf("%w: waiting for Redis' clock: %v", store.ErrUnavailable, ctx.Err())
			}
		}
		sent := clock.Now()
		v, err := cn.client.Do(ctx, cn.client.B().Eval().Script(clockLua).Numkeys(1).Key(key).Build()).AsInt64()
		if err == nil {
			b.observe(v, sent, clock.Now(), s.quick())
			if !b.known.Load() {
				err = fmt.Errorf("redis: TIME read as %d", v)
			}
		}
		b.readMu.Lock()
		b.reading = nil
		b.readMu.Unlock()
		close(r)
		if err != nil {
			failed(err)
			return fmt.Errorf("%w: reading Redis' clock: %v", store.ErrUnavailable, err)
		}
	}
	return nil
}

// maybeProbe starts a background probe of b when it is open and its
// interval has passed. Open: every decision it guards fails fast; once per
// ProbeEvery a probe runs (with a generous timeout, since a fresh
// connection must be set up) and closes it when Redis answers.
func (s *Store) maybeProbe(b *breaker) {
	if s.opts.Clock.Now() >= clock.Instant(b.openUntil.Load()) {
		s.startProbe(b, s.probe)
	}
}

// suspect starts a check of b's node after a call timed out, unless a
// probe is under way: the breaker opens only if the node does not answer a
// PING within a few timeouts either. A timeout alone may be this
// process's own doing (a busy host) and must not send every gate to its
// failure policy.
func (s *Store) suspect(b *breaker) { s.startProbe(b, s.confirm) }

// suspectBroken starts the check of suspect after a call failed on a
// broken connection (why), and holds the node's calls until it ends: they
// fail fast with why. A dead node refuses each call at once, so while the
// check ran every caller's next call went out and failed too (dozens a
// check on a loaded host, each a dial against the dead node); a restarted
// one answers the check's PING within a round trip.
func (s *Store) suspectBroken(b *breaker, why error) {
	if b.probing.Load() {
		return // a probe is under way: it decides
	}
	b.setCause(why)
	b.checking.Store(true)
	if !s.startProbe(b, func(b *breaker) {
		defer b.checking.Store(false)
		s.confirm(b)
	}) {
		b.checking.Store(false)
	}
}

// startProbe runs probe(b) in the background unless one runs already or
// the store is closed; it reports whether it started it.
func (s *Store) startProbe(b *breaker, probe func(*breaker)) bool {
	if !b.probing.CompareAndSwap(false, true) {
		return false
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		b.probing.Store(false)
		return false
	}
	s.probes.Add(1)
	go func() {
		defer s.probes.Done()
		defer b.probing.Store(false)
		probe(b)
	}()
	return true
}

// trip counts a failed call and opens b for ProbeEvery; why is what
// failed.
func (s *Store) trip(b *breaker, why error) {
	s.failures.Add(1)
	s.reopen(b, why)
}

// reopen opens b for another ProbeEvery; why (if not nil) is what failed,
// told to the calls failed fast meanwhile.
func (s *Store) reopen(b *breaker, why error) {
	if why != nil {
		b.setCause(why)
	}
	b.openUntil.Store(int64(s.opts.Clock.Now().Add(s.opts.ProbeEvery)))
	b.open.Store(true)
	s.watch(b)
}

// watch makes sure that an open b is probed once per ProbeEvery even when
// no call comes: a store without traffic (a quiet night, a gate only some
// requests reach) must be closed again when its first call after Redis
// came back arrives, not decide that call by the failure policy. One watch
// per breaker runs, on a real-time ticker (a quarter of ProbeEvery), until
// b closes or the store does; each tick starts the probe a call would (maybeProbe: after
// openUntil on Options.Clock, so a test's clock still says when).
func (s *Store) watch(b *breaker) {
	if !b.watching.CompareAndSwap(false, true) {
		return
	}
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		b.watching.Store(false)
		return
	}
	s.probes.Add(1)
	go func() {
		defer s.probes.Done()
		// A quarter of the interval: a probe starts within that of
		// openUntil (a tick of the interval itself, just short of openUntil
		// after a slow probe, would wait a second interval).
		t := time.NewTicker(max(s.opts.ProbeEvery/4, 5*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-s.done:
				b.watching.Store(false)
				return
			case <-t.C:
			}
			if !b.open.Load() {
				b.watching.Store(false)
				// An opening between the load and the store found the
				// watch still running: go on watching for it.
				if !b.open.Load() || !b.watching.CompareAndSwap(false, true) {
					return
				}
			}
			s.maybeProbe(b)
		}
	}()
}

// nodesOf returns the clients of b's node: one master, or every node for
// the store's own breaker.
func (s *Store) nodesOf(ctx context.Context, cn *connection, b *breaker) (map[string]rueidis.Client, bool) {
	nodes := cn.client.Nodes()
	if b.addr == "" {
		return nodes, true
	}
	s.refreshSlots(ctx)
	node, ok := nodes[b.addr]
	if !ok || !s.owns(b) {
		return nil, false // no longer a master of any slot
	}
	return map[string]rueidis.Client{b.addr: node}, true
}

// confirm checks, after a timeout, whether b's node answers a PING within
// a few timeouts; if not, b opens.
func (s *Store) confirm(b *breaker) {
	cn := s.conn.Load()
	if cn == nil || b.open.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(4*s.opts.Timeout, 100*time.Millisecond))
	defer cancel()
	nodes, ok := s.nodesOf(ctx, cn, b)
	if !ok {
		return
	}
	for _, node := range nodes {
		err := node.Do(ctx, node.B().Ping().Build()).Error()
		if brokenConn(ctx, err) { // a stale connection: the retry dials a new one
			err = node.Do(ctx, node.B().Ping().Build()).Error()
		}
		if !answered(err) {
			s.trip(b, fmt.Errorf("PING %s: %w", b.name(), err))
			return
		}
	}
}

// answered reports whether err, a command's, means its node answered:
// nil, or the user's ACL denying that one command (NOPERM). A user who may
// not PING, or SCRIPT LOAD (the calls fall back to EVAL), has an answering
// Redis all the same; New's check found the commands the calls need.
func answered(err error) bool {
	if err == nil {
		return true
	}
	re, reply := rueidis.IsRedisErr(err)
	return reply && strings.HasPrefix(re.Error(), "NOPERM")
}

// brokenConn reports whether err, from a call under ctx, is a connection
// that broke (EOF, reset, refused) rather than a reply of Redis or a
// timeout. After Redis restarted, each connection the client pooled while
// it was away fails its first command so at once, and the client then
// drops it: a retry dials a new one.
func brokenConn(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	_, reply := rueidis.IsRedisErr(err)
	return !reply
}

// justClosed reports whether a probe closed b less than a probe interval
// ago: its node answered then, so a broken connection now is more likely
// one the client pooled before a restart than a node that went away again.
func (s *Store) justClosed(b *breaker) bool {
	at := b.closedAt.Load()
	return at != 0 && s.opts.Clock.Now() < clock.Instant(at).Add(s.opts.ProbeEvery)
}

// probe checks whether the node(s) behind an open b answer again and
// closes b if so. It connects first if the store never reached Redis, and
// loads the scripts: a restarted Redis has lost them, and a burst of
// decisions must not all fall back to EVAL at once. A node's probe first
// refreshes the slot map, so slots that failed over to another master
// leave the dead one's breaker. Then the releases owed to Redis go out.
func (s *Store) probe(b *breaker) {
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.ProbeEvery, 100*time.Millisecond))
	defer cancel()
	if s.conn.Load() == nil {
		if err := s.dial(); err != nil {
			s.failures.Add(1)
			s.reopen(b, err)
			return
		}
	}
	cn := s.conn.Load()
	nodes, ok := s.nodesOf(ctx, cn, b)
	if !ok {
		b.open.Store(false)
		return
	}
	var err error
	for _, node := range nodes {
		if err = loadScripts(ctx, node); brokenConn(ctx, err) {
			// A connection pooled before a restart fails at once; without
			// the retry the breaker would wait another interval for nothing.
			err = loadScripts(ctx, node)
		}
		if answered(err) {
			err = nil // loaded, or the user may not load them: the calls send EVAL
		}
		if err != nil {
			break
		}
	}
	if err != nil {
		s.failures.Add(1)
		s.reopen(b, fmt.Errorf("loading the scripts on %s: %w", b.name(), err))
		return
	}
	if !s.checked.Load() {
		// New could not check the user's rights (Redis was away): the
		// first probe that reaches it does, and a refusal keeps b open
		// with it as the cause.
		done, err := s.check()
		if err != nil {
			s.failures.Add(1)
			s.reopen(b, err)
			return
		}
		s.checked.Store(done)
	}
	for _, node := range nodes {
		s.warm(ctx, node)
	}
	cn.lanes.dropIdle()
	b.closedAt.Store(int64(s.opts.Clock.Now()))
	b.open.Store(false)
	s.journal.kick()
}

// warm sends a few reads to node once a probe found it again, so that the
// client's connections to it that Redis ended meanwhile (after a restart,
// or a CLIENT KILL) fail on them rather than on a decision: rueidis keeps
// several connections per node (PipelineMultiplex) and sends each keyed
// command on one at random, and an idle one learns it is dead only when a
// command fails on it (then it is replaced). Eight reads find each of two
// connections with probability 1 − 2⁻⁸ (one that fails is replaced, and
// the reads go on).
func (s *Store) warm(ctx context.Context, node rueidis.Client) {
	cmd := node.B().Exists().Key(s.opts.Prefix + ":{warm}").Build().Pin()
	for range 8 {
		if node.Do(ctx, cmd); ctx.Err() != nil {
			return
		}
	}
}

// loadScripts loads every script on node and returns the first error.
func loadScripts(ctx context.Context, node rueidis.Client) error {
	cmds := make(rueidis.Commands, 0, len(scriptTexts))
	for _, st := range scriptTexts {
		cmds = append(cmds, node.B().ScriptLoad().Script(st.src).Build())
	}
	var err error
	for _, r := range node.DoMulti(ctx, cmds...) {
		if err == nil {
			err = r.Error()
		}
	}
	return err
}

// breakerFor returns the breaker that guards key: its slot's master's on a
// Cluster whose slot map is known, the store's own otherwise.
func (s *Store) breakerFor(key string) *breaker {
	if s.slots.Load() == nil {
		return &s.breaker
	}
	return s.breakerForSlot(keySlot(key))
}

// breakerForSlot returns the breaker of slot's master, or the store's own
// while the slot map is unknown.
func (s *Store) breakerForSlot(slot uint16) *breaker {
	if m := s.slots.Load(); m != nil {
		if b := m[slot]; b != nil {
			return b
		}
	}
	return &s.breaker
}

// refreshSlots reads the Cluster's slot map (CLUSTER SLOTS, from any
// node) and points each slot at its master's breaker, keeping the
// breakers (and their state) of masters already known. On error the
// previous map stays.
func (s *Store) refreshSlots(ctx context.Context) {
	cn := s.conn.Load()
	if cn == nil {
		return
	}
	entries, err := cn.client.Do(ctx, cn.client.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return
	}
	var m [slotCount]*breaker
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if s.nodes == nil {
		s.nodes = map[string]*breaker{}
	}
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 3 {
			continue
		}
		lo, err1 := f[0].AsInt64()
		hi, err2 := f[1].AsInt64()
		master, err3 := f[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(master) < 2 || lo < 0 || hi >= slotCount || lo > hi {
			continue
		}
		host, err1 := master[0].ToString()
		port, err2 := master[1].AsInt64()
		if err1 != nil || err2 != nil {
			continue
		}
		addr := host + ":" + strconv.FormatInt(port, 10)
		b := s.nodes[addr]
		if b == nil {
			b = &breaker{addr: addr}
			s.nodes[addr] = b
		}
		for slot := lo; slot <= hi; slot++ {
			m[slot] = b
		}
	}
	s.slots.Store(&m)
}

// owns reports whether b guards at least one slot of the current map.
func (s *Store) owns(b *breaker) bool {
	m := s.slots.Load()
	if m == nil {
		return false
	}
	for _, x := range m {
		if x == b {
			return true
		}
	}
	return false
}
