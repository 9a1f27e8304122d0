// Package redis keeps sluice's limiter state in Redis or Redis Cluster, so a
// fleet shares one budget: each algorithm step of package limit runs as one
// atomic Lua script (EVALSHA, reloaded on NOSCRIPT), on Redis time, with
// keys hash-tagged so one limiter key lives in one slot. It needs Redis 6.0
// or later (the token bucket keeps its key's TTL with SET KEEPTTL).
//
//	spec, _ := redis.tokenBucketSpec("request-rate", tb) // checked without a connection
//	st, _ := redis.New(redis.Options{Addrs: []string{"127.0.0.1:6379"}})
//	lim := st.Limiter(spec)
//	g, _ := gate.NewRateLimit("request-rate", lim, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.FailOpen})
//
// The client is redis/rueidis: it pipelines concurrent commands on shared
// connections automatically, which is what a decision path with many
// concurrent callers needs (measured: about 2× go-redis/v9 on the same
// script; BENCHMARKS.md). On a standalone server, a call that finds one of
// a few dedicated connections idle (lanes.go) writes its command and reads
// the reply itself instead, without the pipeline's two goroutine hand-offs,
// so a caller with few others under way pays one round trip; the rest are
// pipelined. On top of that, concurrent decisions of one
// limiter that share a node and slot are sent as one script call that runs
// each step in turn (batch.go, Options.Batch): every step is still atomic
// and exact, and Redis, whose one core is the bottleneck, pays its
// per-command costs once per batch.
//
// # Failures
//
// Every call has a timeout (Options.Timeout, default 50 ms: long enough
// that a busy 2-core host does not turn its own scheduling delays into
// store failures) and runs behind a breaker per Redis master. Redis does
// nothing with a call it reaches after the timeout, and says so; a call
// waits a grace longer for its reply (Options.ReplyGrace, default the
// timeout), so that a reply Redis sent in time and this process read late,
// because its host or its scheduler stalled, still decides the call: a
// stall of this host is not taken for a failure of Redis. A connection
// that fails opens the breaker at once; a call that only times out makes
// the store check the node with a probe first, and the breaker opens only
// if the probe fails too, so a slow moment of this process does not send
// every gate to its failure policy. Open, the store answers ErrUnavailable
// at once without calling Redis (but a lease step still goes: one per
// holder every quarter of a refresh interval, and a learning allocator
// must hear from every holder before it tells the others shares of the
// room their old leases hold), and a background probe (loading the
// scripts) once per Options.ProbeEvery (default 1 s) closes it when Redis
// answers again: normal decisions resume within one probe interval of
// Redis returning. (After a restart, each connection the client pooled
// fails its first command at once: the probe retries once on a new one,
// and a decision that fails so within an interval of the probe is checked
// with a PING rather than reopening the breaker.) On a Cluster each master
// has its own breaker (breaker.go, from CLUSTER SLOTS), so a dead master
// sends only its slots to the failure policies. A caller's ended context
// and an error reply about one key's data fail that decision alone. Gates
// turn ErrUnavailable into their failure policy (fail_open, fail_closed,
// local_fallback).
//
// New does not need Redis to be up: a store created while Redis is
// unreachable answers ErrUnavailable and connects when a probe first
// reaches it, so a service restarted during an outage starts and decides
// by its failure policies.
//
// # Bounds
//
// A timed-out call has no lasting effect, with one bounded exception.
// Every call carries the Redis time after which it does nothing: its
// timeout after its sending, before its caller gives up (on Redis' clock as
// estimated from earlier replies, which tell Redis' time): a call that
// Redis reaches later — queued behind a stall, a CLIENT PAUSE or a DEBUG
// SLEEP — changes nothing. A call that Redis ran
// in time but whose reply came back late has taken effect: tokens taken
// then stay taken (the limit errs strict by at most the cost of the calls
// whose replies were in flight when their callers gave up), and a
// concurrency permit taken then is released by the store: permits of
// failed takes and releases that failed are retried (journal.go) when the
// node answers again, so no permit stays held by a request that is not in
// flight beyond one probe interval after Redis returns (not the permit
// TTL). A release is idempotent; a retried one can never free a permit
// twice.
//
// Clock steps of the Redis host: the scripts follow package limit (see
// limit.ClockTolerance): a step back of more than 5 s moves each state to
// the new time with what it holds; a smaller one delays its keys by at most
// the step; a step forward refills at most one quota per key, once, and a
// step forward beyond a concurrency ttl frees the permits in flight then.
//
// Largest limits: Lua numbers are doubles, exact below 2^53. A token
// bucket needs burst × rate period below 2^53 ns (bursts up to 9e6 at 1/s),
// GCRA and the leaky bucket burst (queue+1) × max(period, 1000 × tokens)
// below 2^53, a sliding window limit × window in µs below 2^53, and the
// counting algorithms (fixed window, sliding log, concurrency) a limit of
// at most MaxCount (2^52). The constructors refuse anything larger; the
// memory store holds every limit package limit accepts (up to 2^61).
package redis

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

//go:embed lua/prelude.lua
var preludeLua string

//go:embed lua/common.lua
var commonLua string

// connWriteTimeout is the client's ConnWriteTimeout: how long a write may
// take before the connection is given up, and the longest a call on a
// lane (lanes.go) may wait for its reply.
const connWriteTimeout = 200 * time.Millisecond

// maxTimeout bounds Options.Timeout and Options.ReplyGrace: an hour each,
// so that the instants computed from them stay far inside int64.
const maxTimeout = time.Hour

// Defaults of Options.
const (
	DefaultTimeout    = 50 * time.Millisecond
	DefaultProbeEvery = time.Second
)

// Options configures a Store.
type Options struct {
	// Addrs are the Redis addresses (one standalone server, or any nodes of
	// a cluster: the topology is discovered).
	Addrs []string
	// Timeout bounds each call: Redis does nothing with a call it reaches
	// later than Timeout after the call started (on Redis' clock as
	// estimated from earlier replies). Default DefaultTimeout (50 ms); at
	// most an hour.
	Timeout time.Duration
	// ReplyGrace is how much longer than Timeout a call that Redis may
	// have run in time waits for its reply. A reply that comes in the
	// grace and says Redis ran the call within Timeout decides it: only
	// this process read it late (its host or its scheduler stalled), and
	// Redis was not slow, so the decision is Redis' and not the failure
	// policy's. A reply that says Redis reached the call late, or none by
	// Timeout + ReplyGrace, is a failure as before. Default: Timeout (a
	// call that fails takes up to twice Timeout, until the breaker opens);
	// negative: no grace; at most an hour.
	ReplyGrace time.Duration
	// ProbeEvery is how long the breaker stays open after a failure before
	// one probe call may try again. Default DefaultProbeEvery (1 s).
	ProbeEvery time.Duration
	// Prefix starts every key. Default "sluice".
	Prefix string
	// FlushDelay is how long the client pauses after each write to Redis
	// to gather more commands into the next (rueidis' MaxFlushDelay).
	// Default none (0, or negative): concurrent decisions already share
	// script calls (Batch), and a pause only delays the callers that wait
	// for it. Measured (bench/sweep_test.go), a 100 µs pause made 4 and 16
	// concurrent callers 11× and 6× slower and gained nothing at 256.
	FlushDelay time.Duration
	// Batch is the most decisions of one limiter sent to Redis as one
	// script call when callers overlap (batch.go): each step stays atomic
	// and exact, and Redis pays its per-command costs once per batch. While
	// a limiter has at most 4 decisions under way each goes out alone, as
	// with 1: so few gain nothing from sharing a call. Default 64; 1: every
	// decision is its own call.
	Batch int
	// Username and Password authenticate the store's connections (HELLO
	// with AUTH, Redis 6 and later; an empty Username is the default user),
	// on every node of a Cluster. None: no authentication.
	Username, Password string
	// TLS, if set, secures the connections with this configuration (its
	// ServerName empty: each address's host is verified). Nil: plain TCP.
	TLS *tls.Config
	// Client, if set, is used instead of dialing Addrs (and the settings
	// above are the client's own).
	Client rueidis.Client
	// Clock times the breaker (how long it stays open before a probe) and
	// the calls' expiry. Default clock.System. (Decisions take their time
	// from Redis, unless DecisionClock is set.)
	Clock clock.Clock
	// DecisionClock, if set, is the time the scripts decide at, read as
	// nanoseconds since the Unix epoch (sent in µs), instead of Redis TIME:
	// for callers whose windows must follow their own clock, and for tests
	// on a fake clock. Every process sharing the keys must then read the
	// same epoch. Default nil: Redis TIME, one clock for the whole fleet.
	DecisionClock clock.Clock
}

// Store is a Redis-backed state store. It is safe for concurrent use.
type Store struct {
	opts Options
	own  bool // the store dialed its client: the last of its sharers closes it

	conn    atomic.Pointer[connection] // nil until Redis was first reached
	connMu  sync.Mutex                 // one dial at a time
	breaker                            // the store's own: standalone, or a Cluster whose slots are unknown
	// Cluster: the breaker of each slot's master (nil: not known yet).
	slots    atomic.Pointer[[slotCount]*breaker]
	nodes    map[string]*breaker // by address, guarded by nodesMu
	nodesMu  sync.Mutex
	probes   sync.WaitGroup
	closeMu  sync.Mutex // orders probes.Add against Close
	closed   bool
	done     chan struct{} // closed by Close: the breakers' watches end
	checked  atomic.Bool   // check has run to its end (New, or the first probe that reached Redis)
	failures atomic.Int64
	journal  journal
	noExpiry bool // tests: calls never expire, so only the journal cleans up

	// leaseLate holds, per budget and client, until when a lease step
	// that failed may still run on Redis (lease.go); guarded by leaseMu.
	leaseLate map[string]clock.Instant
	leaseMu   sync.Mutex
}

// connection is a connected client and what it found, and how many stores
// share it (Share).
type connection struct {
	client  rueidis.Client
	cluster bool
	users   atomic.Int32
	lanes   lanes // standalone: dedicated connections for the calls that find one idle (lanes.go)
}

// New returns a store on Redis. It checks the options but does not need
// Redis to be up: while it cannot be reached the store answers
// ErrUnavailable (the gates decide by their failure policies) and its
// probe connects once per ProbeEvery until Redis answers.
func New(opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ProbeEvery <= 0 {
		opts.ProbeEvery = DefaultProbeEvery
	}
	opts.Timeout = min(opts.Timeout, maxTimeout)
	switch {
	case opts.ReplyGrace == 0:
		opts.ReplyGrace = opts.Timeout
	case opts.ReplyGrace < 0:
		opts.ReplyGrace = 0
	}
	opts.ReplyGrace = min(opts.ReplyGrace, maxTimeout)
	if opts.Batch <= 0 {
		opts.Batch = 64
	}
	if opts.Prefix == "" {
		opts.Prefix = "sluice"
	}
	if opts.Clock == nil {
		opts.Clock = clock.System
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redis: prefix %q: braces would change the keys' hash tags", opts.Prefix)
	}
	opts.FlushDelay = max(opts.FlushDelay, 0)
	s := &Store{opts: opts, done: make(chan struct{})}
	s.journal.s = s
	if opts.Client != nil {
		s.setConn(opts.Client)
		return s, nil
	}
	if len(opts.Addrs) == 0 {
		return nil, errors.New("redis: no addresses")
	}
	for _, a := range opts.Addrs {
		if err := checkAddr(a); err != nil {
			return nil, fmt.Errorf("redis: address %q: %v", a, err)
		}
	}
	s.own = true
	err := s.dial()
	if err == nil {
		var done bool
		done, err = s.check()
		s.checked.Store(done)
	} else if alert := s.tlsAlert(err); alert != nil {
		err = alert
	}
	if err != nil {
		if u := (*unavailable)(nil); errors.As(err, &u) && refusal(u.err) {
			s.Close()
			return nil, fmt.Errorf("%w: %w", ErrRefused, u.err)
		}
		// Not reachable now: start open, and let the probe connect.
		s.breaker.setCause(err)
		s.breaker.openUntil.Store(int64(opts.Clock.Now()))
		s.breaker.open.Store(true)
		s.watch(&s.breaker)
	}
	return s, nil
}

// dial connects to Addrs unless connected already.
func (s *Store) dial() error {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn.Load() != nil {
		return nil
	}
	// A dial is bounded tightly (New dials on its caller's path, a probe on
	// a paused Redis), but a TLS handshake, its certificate checked, can
	// take a loaded host longer than a TCP connect.
	dialTimeout := 100 * time.Millisecond
	if s.opts.TLS != nil {
		dialTimeout = time.Second
	}
	c, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:      s.opts.Addrs,
		Username:         s.opts.Username,
		Password:         s.opts.Password,
		TLSConfig:        s.opts.TLS,
		DisableCache:     true,
		ConnWriteTimeout: connWriteTimeout,
		MaxFlushDelay:    s.opts.FlushDelay,
		Dialer:           net.Dialer{Timeout: dialTimeout},
	})
	if err != nil {
		return &unavailable{err}
	}
	s.closeMu.Lock()
	closed := s.closed
	s.closeMu.Unlock()
	if closed {
		c.Close()
		return store.ErrUnavailable
	}
	s.setConn(c)
	return nil
}

// check runs, once the store has connected, what its calls need of the
// server's access control: a script (EVALSHA, EVAL when Redis does not
// hold it yet) on keys of the store's prefix that runs each command the
// store's scripts run, and the clock read sent as EVAL (learnClock's), on
// every master of a Cluster (each has its own ACL). A user whose ACL lacks
// any of it would have every decision fail from the first, each a log
// line saying only that Redis is unavailable; New refuses it instead,
// naming what is denied, and so does a read-only replica. done reports
// whether every node answered: a check that times out or fails otherwise
// is left to the next probe (Store.checked).
func (s *Store) check() (done bool, err error) {
	cn := s.conn.Load()
	if cn == nil {
		return false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.Timeout, time.Second))
	defer cancel()
	tags := []string{"check"}
	if cn.cluster {
		if tags = s.checkTags(); tags == nil {
			return false, nil // the slot map is not known yet
		}
	}
	for _, tag := range tags {
		p := s.opts.Prefix + ":{" + tag + "}"
		res := checkScript.Exec(ctx, cn.client, []string{p + ":s", p + ":h", p + ":z"}, nil)
		if err := res.Error(); err != nil {
			if refusal(err) {
				return true, &unavailable{err}
			}
			return false, nil
		}
		switch denied, _ := res.ToString(); {
		case denied == "!READONLY":
			return true, &unavailable{errReplica}
		case denied != "":
			return true, &unavailable{&aclError{denied}}
		}
		err := cn.client.Do(ctx, cn.client.B().Eval().Script(clockLua).Numkeys(1).Key(p+":s").Build()).Error()
		if err != nil {
			if refusal(err) {
				return true, &unavailable{err}
			}
			return false, nil
		}
	}
	return true, nil
}

// checkTags returns one hash tag per master of the Cluster (its keys on a
// slot that master holds), or nil while the slot map is unknown.
func (s *Store) checkTags() []string {
	m := s.slots.Load()
	if m == nil {
		return nil
	}
	want := map[*breaker]bool{}
	for _, b := range m {
		if b != nil {
			want[b] = true
		}
	}
	var tags []string
	for i := 0; len(want) > 0 && i < 1<<22; i++ {
		tag := "check-" + strconv.Itoa(i)
		if b := m[keySlot("{"+tag+"}")]; want[b] {
			delete(want, b)
			tags = append(tags, tag)
		}
	}
	return tags
}

// errReplica is check's finding for a read-only replica.
var errReplica = errors.New("READONLY the server is a read-only replica: give the store its master's address")

// checkScript runs every command of the store's scripts (store/redis/lua)
// on three keys of the check's own (a string, a hash, a sorted set), each
// under redis.pcall, and answers those the user may not run ("" when
// none; "!READONLY" on a replica); it leaves nothing behind.
var checkScript = rueidis.NewLuaScript(`
local s, h, z = KEYS[1], KEYS[2], KEYS[3]
local calls = {
  {'TIME'}, {'SET', s, '0', 'PX', '10000'}, {'GET', s}, {'INCRBY', s, '0'}, {'DECRBY', s, '0'},
  {'EXISTS', s}, {'PEXPIRE', s, '10000'}, {'SET', s, '0', 'KEEPTTL'},
  {'HSET', h, 'f', '0'}, {'HGET', h, 'f'}, {'HMGET', h, 'f'}, {'HINCRBY', h, 'f', '0'}, {'HGETALL', h}, {'HDEL', h, 'f'},
  {'ZADD', z, '0', 'm'}, {'ZRANGE', z, '0', '0'}, {'ZRANGEBYSCORE', z, '0', '0', 'WITHSCORES'},
  {'ZREVRANGEBYSCORE', z, '0', '0', 'LIMIT', '0', '1'}, {'ZREM', z, 'm'}, {'ZREMRANGEBYSCORE', z, '1', '0'},
  {'DEL', s, h, z},
}
local denied, seen = {}, {}
for _, c in ipairs(calls) do
  local r = redis.pcall(unpack(c))
  if type(r) == 'table' and r.err and string.sub(r.err, 1, 8) == 'READONLY' then
    return '!READONLY'
  end
  if type(r) == 'table' and r.err and not seen[c[1]] then
    local m = string.lower(r.err)
    if string.find(m, 'perm', 1, true) or string.find(m, "can't run", 1, true) or string.find(m, 'acl', 1, true) then
      denied[#denied + 1] = c[1]
      seen[c[1]] = true
    end
  end
end
return table.concat(denied, ' ')
`)

// aclError is check's finding: the commands the user may not run.
type aclError struct{ denied string }

func (e *aclError) Error() string {
	return "NOPERM the user may not run " + e.denied + " (which the store's scripts run): grant them, e.g. +@read +@write +@scripting +time"
}

// tlsAlert looks again, after a dial failed with err other than a
// refusal or a timeout (a reset, an EOF), at what the first server speaks,
// and returns (as unavailable) the refusal it finds, if any:
//   - with TLS, the server's alert refusing the store's TLS settings. Under
//     TLS 1.3 the server judges the client's certificate (or its lack of
//     one) after the client's side of the handshake is done: its alert may
//     come after the client wrote its first command, and the client then
//     reads a reset connection, an outage's error. A connection that does
//     only the handshake and reads gets the alert.
//   - without TLS, a server that completes a TLS handshake (its
//     certificate unchecked: the question is only whether it speaks TLS),
//     which a plain client reads as a reset.
func (s *Store) tlsAlert(err error) error {
	u := (*unavailable)(nil)
	if !errors.As(err, &u) || refusal(u.err) || errors.Is(u.err, os.ErrDeadlineExceeded) || errors.Is(u.err, context.DeadlineExceeded) {
		return nil
	}
	if ne := net.Error(nil); errors.As(u.err, &ne) && ne.Timeout() {
		return nil
	}
	cfg := s.opts.TLS
	if cfg == nil {
		cfg = &tls.Config{InsecureSkipVerify: true}
	}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: time.Second}, Config: cfg}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", s.opts.Addrs[0])
	if err == nil && s.opts.TLS == nil {
		c.Close()
		return &unavailable{errSpeaksTLS}
	}
	if err == nil {
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err = c.Read(make([]byte, 1))
		c.Close()
	}
	if err != nil && s.opts.TLS != nil && refusal(err) {
		return &unavailable{err}
	}
	return nil
}

// errSpeaksTLS is tlsAlert's finding for a store without TLS.
var errSpeaksTLS = errors.New("the server speaks TLS, and the store was given no TLS settings")

// ErrRefused is New's error when Redis refused the store's settings (see
// refusal): wrong credentials, a certificate that does not verify, a
// replica's address, a standalone server given as a cluster's.
var ErrRefused = errors.New("redis: the server refused the store's settings")

// refusal reports whether a dial's error is Redis refusing the store's
// settings, not an outage (see RefusalOf). No probe would do better; New
// reports it. (A plain server sent TLS waits for the rest of a command and
// answers nothing: that reads as an outage.)
func refusal(err error) bool { return RefusalOf(err) != NotRefused || standalone(err) }

// standalone reports whether err is a standalone server's answer to the
// client that several addresses made speak Redis Cluster: every call
// failed, for as long as the process ran.
func standalone(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.Contains(re.Error(), "cluster support disabled")
}

// Refusal is what of a store's settings Redis refused (ErrRefused).
type Refusal int

const (
	NotRefused  Refusal = iota // not a refusal: an outage, or no error
	Credentials                // the password or user (WRONGPASS, NOAUTH; a password for a default user that has none)
	Permissions                // the user's ACL: a command or key the store's scripts need (NOPERM)
	TLS                        // the TLS handshake: a certificate that does not verify, the server's alert (one it requires), an answer that is not TLS
	Replica                    // the address is a read-only replica's (READONLY)
)

// RefusalOf returns what of the store's settings err (New's, or a call's)
// says Redis refused.
func RefusalOf(err error) Refusal {
	if err == nil {
		return NotRefused
	}
	if errors.As(err, new(*aclError)) {
		return Permissions
	}
	if errors.Is(err, errSpeaksTLS) {
		return TLS
	}
	if errors.Is(err, errReplica) {
		return Replica
	}
	if u := (*unavailable)(nil); errors.As(err, &u) {
		return RefusalOf(u.err) // a call's error: the client's inside
	}
	if c := (*openCause)(nil); errors.As(err, &c) {
		return c.refused
	}
	var re *rueidis.RedisError
	if errors.As(err, &re) {
		msg := re.Error()
		switch {
		case strings.HasPrefix(msg, "WRONGPASS"), strings.HasPrefix(msg, "NOAUTH"), strings.Contains(msg, "without any password configured"):
			return Credentials
		case strings.HasPrefix(msg, "NOPERM"), strings.Contains(msg, "user executing the script can't run"): // the latter: Redis 6 and 7.0, inside a script
			return Permissions
		}
		return NotRefused
	}
	var verify *tls.CertificateVerificationError
	var header tls.RecordHeaderError
	var op *net.OpError
	// "remote error": the server's TLS alert (a certificate it requires,
	// or refuses; a version or cipher it does not speak).
	if errors.As(err, &verify) || errors.As(err, &header) || errors.As(err, &op) && op.Op == "remote error" {
		return TLS
	}
	return NotRefused
}

// setConn starts using c, learning the Cluster's slot map.
func (s *Store) setConn(c rueidis.Client) {
	cn := &connection{client: c, cluster: c.Mode() == rueidis.ClientModeCluster}
	cn.users.Store(1)
	s.useConn(cn)
}

// useConn starts using cn.
func (s *Store) useConn(cn *connection) {
	s.conn.Store(cn)
	if cn.cluster {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.refreshSlots(ctx) // if this fails, the store's own breaker guards every slot until a probe succeeds
		cancel()
	}
}

// Close waits for a running probe, tries once to send the releases still
// owed to Redis, and closes the client the store dialed.
func (s *Store) Close() {
	s.closeMu.Lock()
	if !s.closed {
		close(s.done)
	}
	s.closed = true
	s.closeMu.Unlock()
	s.probes.Wait()
	s.journal.flush(s.opts.Timeout)
	cn := s.conn.Load()
	switch {
	case cn == nil:
	case !s.own: // the caller's client: give its connections back
		cn.lanes.close()
	case cn.users.Add(-1) == 0:
		cn.lanes.close()
		cn.client.Close()
	}
}

// Share returns a store with opts (its timeout, probe interval, prefix) on
// s's connection, so that a reload that changes only those settings opens
// no new connection: the connection closes with the last store using it.
// With other addresses, credentials or TLS configuration (compared as
// pointers), or before s has reached Redis, the new store connects on its
// own.
func (s *Store) Share(opts Options) (*Store, error) {
	cn := s.conn.Load()
	if cn == nil || !s.own || !slices.Equal(opts.Addrs, s.opts.Addrs) || opts.Username != s.opts.Username ||
		opts.Password != s.opts.Password || opts.TLS != s.opts.TLS {
		return New(opts)
	}
	if cn.users.Add(1) <= 1 { // closed meanwhile
		cn.users.Add(-1)
		return New(opts)
	}
	// Every option as given (a field named here would be one more to
	// forget), on the shared client instead of a connection of its own.
	o := opts
	o.Addrs, o.Username, o.Password, o.TLS, o.Client = nil, "", "", nil, cn.client
	n, err := New(o)
	if err != nil {
		cn.users.Add(-1)
		return nil, err
	}
	n.opts.Addrs, n.opts.Username, n.opts.Password, n.opts.TLS, n.own = opts.Addrs, opts.Username, opts.Password, opts.TLS, true
	n.useConn(cn)
	if n.opts.Prefix != s.opts.Prefix { // the user's ACL may cover one prefix's keys, not the other's
		if _, err := n.check(); err != nil {
			n.Close()
			return nil, fmt.Errorf("%w: %w", ErrRefused, err.(*unavailable).err)
		}
	}
	return n, nil
}

// Failures returns how many calls failed (timeouts included).
func (s *Store) Failures() int64 { return s.failures.Load() }

// checkAddr refuses an address that no dial can reach: one without a
// port, or whose port is not a number from 1 to 65535 (one was accepted,
// and every call failed until the process was restarted with another).
func checkAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		return err
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return nil
}

// Ping sends one PING through the store's client, under Options.Timeout,
// to the standalone server (on a Cluster, to one node), the way a decision
// is sent (on an idle lane, else pipelined): the round trip no decision on
// Redis can be faster than. It returns ErrUnavailable, with what the last
// dial got, while Redis has not been reached.
func (s *Store) Ping(ctx context.Context) error {
	cn := s.conn.Load()
	if cn == nil {
		return s.breaker.unavailable() // with what the last dial got, if any
	}
	if err := s.ping(ctx, time.Now().Add(s.opts.Timeout), cn); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return nil
}

// Timeout returns the longest a call of the store's limiters waits for
// Redis: Options.Timeout and Options.ReplyGrace (their defaults filled
// in). Every call returns within about this from its start, whatever the
// caller's context, even while a decision waits for a batch.
func (s *Store) Timeout() time.Duration { return s.opts.Timeout + s.opts.ReplyGrace }

// quick is the longest a call's round trip may take for its reply to
// start a new estimate of Redis' clock (breaker.observe): half the timeout.
func (s *Store) quick() time.Duration { return s.opts.Timeout / 2 }

// key builds a hash-tagged key: every key of one limiter and one state key
// maps to one cluster slot.
func (s *Store) key(limiter, key string) string {
	return s.opts.Prefix + ":{" + limiter + ":" + key + "}"
}

// errLate: Redis reached the call after its caller had given up, and did
// nothing.
var errLate = errors.New("redis: the call reached Redis after its timeout and did nothing")

// run executes a script under the timeout and the breaker and returns the
// script's five integers. With expires, the call does nothing if Redis
// reaches it after the timeout (args' last element is its expiry). sent
// reports whether the call may have reached Redis (an error with sent
// false had no effect there).
func (s *Store) run(ctx context.Context, sc *rueidis.Lua, keys []string, args []string, expires bool) (out [5]int64, sent bool, err error) {
	return s.runThrough(ctx, sc, keys, args, expires, false)
}

// runPast is run for a call that goes to Redis even while the breaker is
// open: a lease step, one per holder every quarter of a refresh interval
// while they fail. Each is a probe of its own, and a holder held off by the
// breaker until its probe (up to ProbeEvery after a restart) spent its old
// lease meanwhile while the allocator, learning, told the holders that
// reached it shares of the room it leaves.
func (s *Store) runPast(ctx context.Context, sc *rueidis.Lua, keys []string, args []string, expires bool) (out [5]int64, sent bool, err error) {
	return s.runThrough(ctx, sc, keys, args, expires, true)
}

// runThrough is run, or runPast when past is set.
func (s *Store) runThrough(ctx context.Context, sc *rueidis.Lua, keys []string, args []string, expires, past bool) (out [5]int64, sent bool, err error) {
	b := s.breakerFor(keys[0])
	cn := s.conn.Load()
	if cn == nil || (!past && b.held()) {
		s.maybeProbe(b)
		return out, false, b.unavailable()
	}
	start := clock.Now()
	dl := time.Now().Add(s.opts.Timeout)
	wait := dl // how long the reply is waited for
	if expires && !s.noExpiry {
		if err := s.learnClock(ctx, dl, cn, b, keys[0], func(err error) { s.failed(ctx, b, err) }); err != nil {
			return out, false, err
		}
		args[len(args)-1] = b.expiry(start, s.opts.Timeout)
		wait = dl.Add(s.opts.ReplyGrace) // Redis tells whether it ran the call in time
	}
	vals, err := s.exec(ctx, wait, cn, sc, keys, args).AsIntSlice()
	if err == nil && len(vals) != 6 {
		err = fmt.Errorf("script returned %d values", len(vals))
	}
	if err == nil {
		b.observe(vals[5], start, clock.Now(), s.quick())
		if vals[0] == -2 {
			err = errLate
		}
	}
	if err != nil {
		s.failed(ctx, b, err)
		return out, true, &unavailable{err}
	}
	copy(out[:], vals)
	if s.journal.owes.Load() {
		s.journal.kick() // the node answers: send the releases owed to it
	}
	return out, true, nil
}

// failed counts a failed call and decides what it says about b's node:
// nothing when the caller's own context ended or Redis answered about the
// data; a timeout, a call Redis reached after its timeout (errLate: Redis
// was slow, or this process sent it late), or a connection that broke
// (refused, reset, closed), starts
// a check of the node, which opens b only if the node does not answer a
// PING on a fresh connection either; any other failure (a reply refusing
// the store: NOAUTH, LOADING, ...) opens b at once, unless a probe closed
// b less than an interval ago: then it is checked too.
func (s *Store) failed(ctx context.Context, b *breaker, err error) {
	switch {
	case ctx.Err() != nil, dataError(err):
		return
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, errLate):
		s.failures.Add(1)
		s.suspect(b)
	case brokenConn(ctx, err), s.justClosed(b):
		// A broken connection is as often one the client pooled before a
		// restart of Redis, or before Redis ended it (each fails its first
		// command), as a node gone: a sparse gate would spend a probe
		// interval on its failure policy with Redis up. The check's PING
		// dials a new connection; if the node is gone, it fails at once
		// (refused) and b opens; meanwhile the node's calls are held.
		s.failures.Add(1)
		s.suspectBroken(b, err)
	default:
		s.trip(b, err)
	}
}

// dataError reports whether err is an error reply about the data or the
// command (Redis answered), as opposed to a transport failure, a timeout,
// or a reply that says Redis cannot serve now (BUSY, LOADING, CLUSTERDOWN,
// MASTERDOWN, TRYAGAIN).
func dataError(err error) bool {
	re, ok := rueidis.IsRedisErr(err)
	if !ok {
		return false
	}
	msg := re.Error()
	for _, p := range []string{"BUSY", "LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "READONLY"} {
		if strings.HasPrefix(msg, p) {
			return false
		}
	}
	return true
}
