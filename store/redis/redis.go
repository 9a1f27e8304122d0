// Package redis keeps sluice's limiter state in Redis or Redis Cluster, so a
// fleet shares one budget: each algorithm step of package limit runs as one
// atomic Lua script (EVALSHA, reloaded on NOSCRIPT), on Redis time, with
// keys hash-tagged so one limiter key lives in one slot.
//
// The client is redis/rueidis: it pipelines concurrent commands on shared
// connections automatically, which is what a decision path with many
// concurrent callers needs (measured: about 2× go-redis/v9 on the same script;
// BENCHMARKS.md). On top of that, concurrent decisions of one limiter that
// share a node and slot are sent as one script call that runs each step in
// turn (batch.go, Options.Batch): every step is still atomic and exact, and
// Redis, whose one core is the bottleneck, pays its per-command costs once
// per batch.
//
// Every call has a short timeout (Options.Timeout, default 5 ms) and runs
// behind a breaker: after a failure the store answers ErrUnavailable at once
// without calling Redis, and a background probe (loading the scripts) once
// per Options.ProbeEvery (default 1 s) closes the breaker when Redis
// answers again: while Redis is down the decision path pays the timeout
// only for the calls already in flight when it failed, and normal decisions
// resume within one probe interval of Redis returning. On a Cluster each
// master has its own breaker (breaker.go, from CLUSTER SLOTS), so a dead
// master sends only its slots to the failure policies. A caller's ended
// context and an error reply about one key's data fail that decision alone. Gates turn ErrUnavailable into their failure policy
// (fail_open, fail_closed, local_fallback).
//
//	spec, _ := redis.TokenBucket("request-rate", tb) // checked without a connection
//	st, _ := redis.New(redis.Options{Addrs: []string{"127.0.0.1:6379"}})
//	lim := st.Limiter(spec)
//	g, _ := gate.NewRateLimit("request-rate", lim, gate.Options{Scope: sluice.ScopeTenant, OnFailure: gate.FailOpen})
package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/store"
)

//go:embed lua/common.lua
var commonLua string

//go:embed lua/tokenbucket.lua
var tokenBucketLua string

//go:embed lua/gcra.lua
var gcraLua string

//go:embed lua/fixedwindow.lua
var fixedWindowLua string

//go:embed lua/concurrency.lua
var concurrencyLua string

//go:embed lua/leakybucket.lua
var leakyBucketLua string

//go:embed lua/slidingwindow.lua
var slidingWindowLua string

//go:embed lua/slidinglog.lua
var slidingLogLua string

var (
	sources = []string{tokenBucketLua, commonLua + gcraLua, commonLua + fixedWindowLua,
		commonLua + concurrencyLua, commonLua + leakyBucketLua, commonLua + slidingWindowLua, commonLua + slidingLogLua}
	tokenBucketScript   = rueidis.NewLuaScript(sources[0])
	gcraScript          = rueidis.NewLuaScript(sources[1])
	fixedWindowScript   = rueidis.NewLuaScript(sources[2])
	concurrencyScript   = rueidis.NewLuaScript(sources[3])
	leakyBucketScript   = rueidis.NewLuaScript(sources[4])
	slidingWindowScript = rueidis.NewLuaScript(sources[5])
	slidingLogScript    = rueidis.NewLuaScript(sources[6])

	// The batched forms (batch.go) of the single-key algorithms.
	batchSources = []string{batchSource(tokenBucketLua), commonLua + batchSource(gcraLua), commonLua + batchSource(fixedWindowLua),
		commonLua + batchSource(leakyBucketLua), commonLua + batchSource(slidingWindowLua)}
	tokenBucketBatch   = rueidis.NewLuaScript(batchSources[0])
	gcraBatch          = rueidis.NewLuaScript(batchSources[1])
	fixedWindowBatch   = rueidis.NewLuaScript(batchSources[2])
	leakyBucketBatch   = rueidis.NewLuaScript(batchSources[3])
	slidingWindowBatch = rueidis.NewLuaScript(batchSources[4])
)

// Defaults of Options.
const (
	DefaultTimeout    = 5 * time.Millisecond
	DefaultProbeEvery = time.Second
)

// Options configures a Store.
type Options struct {
	// Addrs are the Redis addresses (one standalone server, or any nodes of
	// a cluster: the topology is discovered).
	Addrs []string
	// Timeout bounds each call. Default DefaultTimeout (5 ms).
	Timeout time.Duration
	// ProbeEvery is how long the breaker stays open after a failure before
	// one probe call may try again. Default DefaultProbeEvery (1 s).
	ProbeEvery time.Duration
	// Prefix starts every key. Default "sluice".
	Prefix string
	// FlushDelay is how long the client may wait to gather concurrent
	// decisions into one write to Redis: fewer syscalls and deeper
	// pipelines under load (measured: 1.5–1.7× the decisions/s on 2 cores)
	// for at most this much added latency. Default 100 µs; negative: none.
	FlushDelay time.Duration
	// Batch is the most decisions of one limiter sent to Redis as one
	// script call when callers overlap (batch.go): each step stays atomic
	// and exact, and Redis pays its per-command costs once per batch.
	// Default 64; 1: every decision is its own call.
	Batch int
	// Client, if set, is used instead of dialing Addrs.
	Client rueidis.Client
	// Clock times the breaker: how long it stays open before a probe.
	// Default clock.System. (Decisions take their time from Redis.)
	Clock clock.Clock
}

// Store is a Redis-backed state store. It is safe for concurrent use.
type Store struct {
	client rueidis.Client
	opts   Options
	own    bool

	breaker // the store's own: standalone, or a Cluster whose slots are unknown
	// Cluster: the breaker of each slot's master (nil: not known yet).
	slots    atomic.Pointer[[slotCount]*breaker]
	nodes    map[string]*breaker // by address, guarded by nodesMu
	nodesMu  sync.Mutex
	probes   sync.WaitGroup
	closeMu  sync.Mutex // orders probes.Add against Close
	closed   bool
	failures atomic.Int64
}

// New connects to Redis.
func New(opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ProbeEvery <= 0 {
		opts.ProbeEvery = DefaultProbeEvery
	}
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
	switch {
	case opts.FlushDelay == 0:
		opts.FlushDelay = 100 * time.Microsecond
	case opts.FlushDelay < 0:
		opts.FlushDelay = 0
	}
	s := &Store{opts: opts, client: opts.Client}
	if s.client == nil {
		if len(opts.Addrs) == 0 {
			return nil, errors.New("redis: no addresses")
		}
		c, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress:      opts.Addrs,
			DisableCache:     true,
			ConnWriteTimeout: 200 * time.Millisecond,
			MaxFlushDelay:    opts.FlushDelay,
			Dialer:           net.Dialer{Timeout: 100 * time.Millisecond},
		})
		if err != nil {
			return nil, fmt.Errorf("%w: %v", store.ErrUnavailable, err)
		}
		s.client, s.own = c, true
	}
	if s.client.Mode() == rueidis.ClientModeCluster {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		s.refreshSlots(ctx) // if this fails, the store's own breaker guards every slot until a probe succeeds
		cancel()
	}
	return s, nil
}

// Close waits for a running probe and closes the client the store dialed.
func (s *Store) Close() {
	s.closeMu.Lock()
	s.closed = true
	s.closeMu.Unlock()
	s.probes.Wait()
	if s.own {
		s.client.Close()
	}
}

// Failures returns how many calls failed (timeouts included).
func (s *Store) Failures() int64 { return s.failures.Load() }

// key builds a hash-tagged key: every key of one limiter and one state key
// maps to one cluster slot.
func (s *Store) key(limiter, key string) string {
	return s.opts.Prefix + ":{" + limiter + ":" + key + "}"
}

// run executes a script under the timeout and the breaker. It returns the
// script's five integers.
func (s *Store) run(ctx context.Context, sc *rueidis.Lua, keys []string, args []string) ([5]int64, error) {
	var out [5]int64
	b := s.breakerFor(keys[0])
	if b.open.Load() {
		s.maybeProbe(b)
		return out, store.ErrUnavailable
	}
	cctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	vals, err := sc.Exec(cctx, s.client, keys, args).AsIntSlice()
	cancel()
	if err == nil && len(vals) != 5 {
		err = fmt.Errorf("script returned %d values", len(vals))
	}
	if err != nil {
		// The caller's own context ending, or an answer about the data
		// (WRONGTYPE on a foreign key), says nothing about Redis' health:
		// only this decision fails.
		if ctx.Err() == nil && !dataError(err) {
			s.trip(b)
		}
		return out, fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	copy(out[:], vals)
	return out, nil
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

// maybeProbe starts a background probe of b when it is open and its
// interval has passed. Open: every decision it guards fails fast; once per
// ProbeEvery a probe runs (with a generous timeout, since a fresh
// connection must be set up) and closes it when Redis answers.
func (s *Store) maybeProbe(b *breaker) {
	if s.opts.Clock.Now() >= clock.Instant(b.openUntil.Load()) && b.probing.CompareAndSwap(false, true) {
		s.closeMu.Lock()
		defer s.closeMu.Unlock()
		if s.closed {
			b.probing.Store(false)
			return
		}
		s.probes.Add(1)
		go s.probe(b)
	}
}

// trip counts a failed call and opens b for ProbeEvery.
func (s *Store) trip(b *breaker) {
	s.failures.Add(1)
	b.openUntil.Store(int64(s.opts.Clock.Now().Add(s.opts.ProbeEvery)))
	b.open.Store(true)
}

// probe checks whether the node(s) behind b answer again and closes b if
// so. It loads the scripts first: a restarted Redis has lost them, and a
// burst of decisions must not all fall back to EVAL at once. A node's
// probe first refreshes the slot map, so slots that failed over to another
// master leave the dead one's breaker.
func (s *Store) probe(b *breaker) {
	defer s.probes.Done()
	defer b.probing.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), max(s.opts.ProbeEvery, 100*time.Millisecond))
	defer cancel()
	nodes := s.client.Nodes()
	if b.addr != "" {
		s.refreshSlots(ctx)
		node, ok := nodes[b.addr]
		if !ok || !s.owns(b) {
			b.open.Store(false) // no longer a master of any slot
			return
		}
		nodes = map[string]rueidis.Client{b.addr: node}
	}
	var err error
	srcs := append(sources[:len(sources):len(sources)], batchSources...)
	for _, node := range nodes {
		cmds := make(rueidis.Commands, len(srcs))
		for i, src := range srcs {
			cmds[i] = node.B().ScriptLoad().Script(src).Build()
		}
		for _, r := range node.DoMulti(ctx, cmds...) {
			if err == nil {
				err = r.Error()
			}
		}
	}
	if err != nil {
		s.failures.Add(1)
		b.openUntil.Store(int64(s.opts.Clock.Now().Add(s.opts.ProbeEvery)))
		return
	}
	b.open.Store(false)
}
