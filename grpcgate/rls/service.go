package rls

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/internal/wire"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// FailurePolicy is what a call answers when the store cannot decide
// (Redis unreachable, slow past its timeout).
type FailurePolicy uint8

const (
	// FailError returns an error wrapping ErrUnavailable, as
	// envoyproxy/ratelimit does on a Redis error: Envoy then applies its
	// own failure_mode_deny (default: allow). The default.
	FailError FailurePolicy = iota
	// FailOpen answers OK for the descriptors the store could not decide,
	// counted in sluice_rls_fail_open_total (a counted fail-open).
	FailOpen
	// FailClosed answers OVER_LIMIT for them, counted in
	// sluice_rls_fail_closed_total.
	FailClosed
)

// HeaderStyle selects the response headers a Response carries.
type HeaderStyle uint8

const (
	// HeadersOff: no headers (the peer's default).
	HeadersOff HeaderStyle = iota
	// HeadersDraft: RateLimit-Policy and RateLimit of the most constrained
	// descriptor, as package wire renders them (wire.Draft).
	HeadersDraft
	// HeadersPeer: RateLimit-Limit, RateLimit-Remaining and RateLimit-Reset
	// (names as Options.LimitHeader etc.), as envoyproxy/ratelimit's
	// LIMIT_RESPONSE_HEADERS_ENABLED.
	HeadersPeer
)

// Limits and defaults of Options.
const (
	// DefaultMaxDescriptors is the most descriptors a call may carry.
	DefaultMaxDescriptors = 64
	// DefaultMaxEntries is the most entries a descriptor may carry.
	DefaultMaxEntries = 32
	// MaxHits is the largest hits a descriptor may consume in one call
	// (hits_addend, per descriptor or per request): the largest limit a
	// rule can state (requests_per_unit is a uint32).
	MaxHits = math.MaxUint32
	// MaxNameBytes bounds a domain, an entry's key and an entry's value.
	MaxNameBytes = 4096
	// DefaultTimeout bounds the store work of one call (redis.DefaultTimeout).
	DefaultTimeout = 50 * time.Millisecond
	// DefaultNearLimitRatio is the peer's NEAR_LIMIT_RATIO.
	DefaultNearLimitRatio = 0.8
	// DefaultConcurrencyTTL is how long a concurrency permit is held at
	// most when its release never comes.
	DefaultConcurrencyTTL = time.Minute
	// DefaultMaxMetricKeys caps the (domain, key) label pairs.
	DefaultMaxMetricKeys = 1000
)

// counterCap is the limit of the fixed-window counters: far above any
// rule's requests_per_unit, so the store's window only counts, and the
// service compares the count with the rule as the peer compares INCRBY's
// answer. It is the largest count Redis keeps exact (redis.MaxCount).
const counterCap = sredis.MaxCount

// Options configures a Server. The zero value is valid: counters in
// memory, on the system's wall clock, failures returned as errors.
type Options struct {
	// Redis, if set, holds the counters, shared by every process using it
	// (Redis or Redis Cluster). Default nil: in process memory.
	Redis *sredis.Store
	// MaxKeys caps the keys each in-memory limiter holds (memory.Options).
	MaxKeys int
	// Clock is the wall clock windows align to: its readings are
	// nanoseconds since the Unix epoch. Default: the system's wall clock.
	// (On Redis the counters' windows follow Redis' clock unless the store
	// was built with a DecisionClock.)
	Clock clock.Clock
	// Timeout bounds the store work of one call: a call answers within
	// about this even when the store hangs. Default: the Redis store's
	// own bound (sredis.Store.Timeout: its timeout and its grace for a
	// reply Redis ran in time), or DefaultTimeout without Redis; set
	// lower, it adds a timer to every call and cuts the grace short.
	Timeout time.Duration
	// OnFailure is the failure policy (default FailError).
	OnFailure FailurePolicy
	// ShadowMode is the global shadow mode (the peer's SHADOW_MODE): every
	// call's overall verdict is OK, statuses and counters unchanged.
	ShadowMode bool
	// NearLimitRatio is where near_limit starts, in (0, 1]. Default 0.8.
	NearLimitRatio float64
	// Headers selects the response headers (default HeadersOff).
	Headers HeaderStyle
	// LimitHeader, RemainingHeader and ResetHeader name HeadersPeer's
	// fields. Defaults RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset.
	LimitHeader, RemainingHeader, ResetHeader string
	// MaxDescriptors and MaxEntries bound a call (defaults
	// DefaultMaxDescriptors, DefaultMaxEntries); larger calls are refused
	// with ErrInvalid before any work.
	MaxDescriptors, MaxEntries int
	// RejectUnknownDomain refuses calls for a domain no file names with
	// ErrInvalid. Default false: the peer's behaviour, every descriptor OK
	// without a limit (and sluice_rls_domain_not_found_total counts it).
	RejectUnknownDomain bool
	// ConcurrencyTTL is the longest a concurrency permit is held without
	// its release. Default DefaultConcurrencyTTL.
	ConcurrencyTTL time.Duration
	// Registry receives the metrics. Default: a new registry (Server.Registry).
	Registry prometheus.Registerer
	// MaxMetricKeys caps the (domain, key) label pairs; the rest count
	// under key OtherKey. Default DefaultMaxMetricKeys.
	MaxMetricKeys int
}

// Server answers ShouldRateLimit from a Config, on a sluice store. It is
// safe for concurrent use; SetConfig swaps the configuration atomically.
type Server struct {
	opts     Options
	clock    clock.Clock
	reg      prometheus.Registerer
	m        *stats
	counters [8]store.Limiter // the fixed windows, by unit
	state    atomic.Pointer[state]
	mu       sync.Mutex // serializes SetConfig
	held     ledger
}

var _ Service = (*Server)(nil)

// state is a configuration with the limiters of its extension rules.
type state struct {
	cfg  *Config
	lims map[*Rule]*ruleLimiter
	byID map[string]*ruleLimiter // by identity, for reloads
}

// ruleLimiter is the limiter of one extension rule.
type ruleLimiter struct {
	id    string // names the rule's keys; stable across reloads
	limit int64  // a concurrency rule's slots (its id leaves them out)
	lim   store.Limiter
}

// wallClock reads the system's wall clock as Unix nanoseconds.
type wallClock struct{}

func (wallClock) Now() clock.Instant { return clock.Instant(time.Now().UnixNano()) }

// New returns a Server for cfg. It fails for options out of range and for
// rules the store cannot hold (a Redis limit beyond what its doubles keep
// exact), naming the rule's file and line.
func New(cfg *Config, opts Options) (*Server, error) {
	if cfg == nil {
		return nil, errors.New("rls: no configuration")
	}
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, clock: opts.Clock, reg: opts.Registry}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	var err error
	if s.m, err = newStats(s.reg, opts.MaxMetricKeys); err != nil {
		return nil, err
	}
	for u := Second; u <= Week; u++ {
		fw, err := limit.NewFixedWindow(counterCap, u.Duration())
		if err != nil {
			return nil, err
		}
		if opts.Redis != nil {
			// The store only counts (the rules' limits are compared with
			// the count here): a Counter's batches cost Redis half.
			sp, err := sredis.Counter("rls.window."+strings.ToLower(u.String()), fw)
			if err != nil {
				return nil, err
			}
			s.counters[u] = opts.Redis.Limiter(sp)
		} else {
			s.counters[u] = memory.NewKeyed(fw, memory.Options{MaxKeys: opts.MaxKeys})
		}
	}
	s.held.init(opts.MaxKeys)
	if err := s.SetConfig(cfg); err != nil {
		return nil, err
	}
	return s, nil
}

// defaults fills the zero fields of o and checks the others.
func (o *Options) defaults() error {
	if o.Clock == nil {
		o.Clock = wallClock{}
	}
	switch {
	case o.Timeout > 0:
	case o.Redis != nil:
		o.Timeout = o.Redis.Timeout() // its timeout and its grace for late replies
	default:
		o.Timeout = DefaultTimeout
	}
	if o.NearLimitRatio == 0 {
		o.NearLimitRatio = DefaultNearLimitRatio
	}
	if !(o.NearLimitRatio > 0 && o.NearLimitRatio <= 1) {
		return fmt.Errorf("rls: near-limit ratio %v: want (0, 1]", o.NearLimitRatio)
	}
	if o.MaxDescriptors <= 0 {
		o.MaxDescriptors = DefaultMaxDescriptors
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	if o.ConcurrencyTTL <= 0 {
		o.ConcurrencyTTL = DefaultConcurrencyTTL
	}
	if o.MaxMetricKeys <= 0 {
		o.MaxMetricKeys = DefaultMaxMetricKeys
	}
	if o.LimitHeader == "" {
		o.LimitHeader = "RateLimit-Limit"
	}
	if o.RemainingHeader == "" {
		o.RemainingHeader = "RateLimit-Remaining"
	}
	if o.ResetHeader == "" {
		o.ResetHeader = "RateLimit-Reset"
	}
	if o.OnFailure > FailClosed || o.Headers > HeadersPeer {
		return errors.New("rls: unknown failure policy or header style")
	}
	return nil
}

// Registry returns the registerer the metrics are on (Options.Registry or
// the Server's own *prometheus.Registry).
func (s *Server) Registry() prometheus.Registerer { return s.reg }

// Config returns the configuration in use.
func (s *Server) Config() *Config { return s.state.Load().cfg }

// SetConfig starts answering from cfg. The fixed windows' counts carry
// over (their keys name the descriptor, not the rule, as the peer's); an
// extension rule keeps its state when its algorithm and parameters are
// unchanged, and a concurrency rule keeps its permits in flight under a
// new limit. It fails, changing nothing, for rules the store cannot hold.
func (s *Server) SetConfig(cfg *Config) error {
	if cfg == nil {
		return errors.New("rls: no configuration")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.state.Load()
	st := &state{cfg: cfg, lims: map[*Rule]*ruleLimiter{}, byID: map[string]*ruleLimiter{}}
	for _, d := range cfg.domains {
		for _, r := range d.rules {
			if r.Unlimited || r.alg == nil {
				continue
			}
			id := ruleID(r)
			if rl := st.byID[id]; rl != nil {
				st.lims[r] = rl
				continue
			}
			var kept store.Limiter
			if prev != nil {
				if rl := prev.byID[id]; rl != nil {
					if rl.limit == r.Limit {
						st.lims[r], st.byID[id] = rl, rl
						continue
					}
					// A concurrency rule with new slots: the permits in
					// flight stay held (and their releases match).
					kept = rl.lim
				}
			}
			lim, err := s.buildRule(r, id, kept)
			if err != nil {
				return fmt.Errorf("rls: %s:%d: %s: %w", r.File, r.Line, r.Path, err)
			}
			rl := &ruleLimiter{id: id, limit: r.Limit, lim: lim}
			st.lims[r], st.byID[id] = rl, rl
		}
	}
	s.state.Store(st)
	return nil
}

// ruleID names an extension rule's state by its domain, path, algorithm
// and parameters: a reload that changes none of them keeps the state. A
// concurrency rule's slots are left out: its state (the permits held)
// means the same under any limit, so a new limit keeps it.
func ruleID(r *Rule) string {
	rpu, lim := r.RequestsPerUnit, r.Limit
	if r.slots() {
		rpu, lim = 0, 0 // (its RequestsPerUnit is its Limit)
	}
	h := sha256.Sum256([]byte(fmt.Sprintf("%s\x00%s\x00%s\x00%d\x00%d\x00%d\x00%d", r.Domain, r.Path, r.algorithmName(), rpu, r.Unit, r.Burst, lim)))
	return "rls." + r.algorithmName() + "." + hex.EncodeToString(h[:8])
}

// buildRule returns the limiter of an extension rule on the store, its
// algorithm from sluice's registry (internal/algorithm): the rule's
// requests_per_unit per unit is its rate and its window's count, burst its
// burst, limit its slots. kept, if set, is the limiter of the same
// concurrency rule before a reload that changed its slots: the new one
// shares its state (on Redis the state is the keys id names).
func (s *Server) buildRule(r *Rule, id string, kept store.Limiter) (store.Limiter, error) {
	set := algorithm.Settings{Burst: r.Burst, Limit: int64(r.RequestsPerUnit), Window: r.Unit.Duration(), PermitTTL: s.opts.ConcurrencyTTL}
	if r.slots() {
		set.Limit = r.Limit
	}
	if r.uses(algorithm.UsesRate) {
		rt, err := limit.NewRate(int64(r.RequestsPerUnit), r.Unit.Duration())
		if err != nil {
			return nil, err
		}
		set.Rate = rt
	}
	on := algorithm.Backend{Name: id, Memory: memory.Options{MaxKeys: s.opts.MaxKeys}, Previous: kept}
	if s.opts.Redis != nil {
		on.Redis, on.Previous = s.opts.Redis, nil
	}
	return r.alg.Limiter(set, on)
}

// Plan kinds: what a descriptor resolved to.
const (
	kindNone      = iota // no rule (or replaced): OK without a limit
	kindUnlimited        // OK, remaining MaxUint32
	kindWindow           // the peer's fixed window (a rule, or an override)
	kindRule             // an extension rule's limiter
)

// plan is one descriptor's work and verdict.
type plan struct {
	kind     uint8
	negative bool
	quota    bool
	shadow   bool
	rule     *Rule // nil for an override
	limit    Limit
	lim      store.Limiter
	rl       *ruleLimiter // kindRule
	key      string       // the counter key
	stats    string       // the peer's statistics key, without the domain
	hits     int64

	// the store's answer
	res    limit.Result
	h      store.Handle // what the take holds (an extension rule's)
	err    error
	before int64 // the window's count before and after this call (kindWindow)
	after  int64
}

// ShouldRateLimit answers one call, following envoyproxy/ratelimit's
// src/service/ratelimit.go (shouldRateLimitWorker) and
// src/limiter/base_limiter.go:
//
//   - each descriptor walks its domain's tree to a rule (Config.Lookup); a
//     descriptor's limit override replaces any rule with a fixed window of
//     its own (RequestsPerUnit hits per Unit), even where no rule matches;
//   - no rule: OK without a limit; an unlimited rule: OK with Remaining
//     MaxUint32; a rule named in another matched rule's replaces: as no rule;
//   - a descriptor consumes its Hits if set (0 checks without consuming),
//     else max(1, request Hits); Negative gives them back instead (for a
//     concurrency rule, the release of slots taken earlier);
//   - the fixed window counts every hit in the window aligned to the unit
//     (month 30 days, year 365 days) and is over when the count after the
//     call exceeds the limit; Remaining is limit − count, ResetIn the whole
//     seconds to the window's end (unit − now mod unit, in (0, unit]);
//   - the overall code is OVER_LIMIT when a descriptor that is not in
//     quota mode is over, or every quota-mode descriptor is; a shadow_mode
//     rule's OVER_LIMIT is reported as OK (and counted), and the global
//     shadow mode turns an overall OVER_LIMIT into OK.
//
// Errors: a malformed request wraps ErrInvalid (naming what is wrong); a
// store failure under FailError wraps ErrUnavailable; an ended ctx returns
// its error. The store work is bounded by Options.Timeout.
func (s *Server) ShouldRateLimit(ctx context.Context, r *Request) (*Response, error) {
	if err := s.validate(r); err != nil {
		s.m.callsInvalid.Inc()
		return nil, err
	}
	st := s.state.Load()
	now := s.clock.Now()
	dom := st.cfg.domains[r.Domain]
	resp := &Response{Overall: CodeOK, Statuses: make([]Status, len(r.Descriptors))}
	if dom == nil {
		s.m.domainNotFound(r.Domain)
		if s.opts.RejectUnknownDomain {
			s.m.callsInvalid.Inc()
			return nil, fmt.Errorf("%w: unknown domain %q", ErrInvalid, r.Domain)
		}
		for i := range resp.Statuses {
			resp.Statuses[i].Code = CodeOK
		}
		s.m.callsOK.Inc()
		return resp, nil
	}
	plans := make([]plan, len(r.Descriptors))
	var replacing map[string]bool
	for i := range r.Descriptors {
		p := &plans[i]
		s.resolve(st, dom, &r.Descriptors[i], r.Hits, p)
		if p.rule != nil && len(p.rule.Replaces) > 0 {
			if replacing == nil {
				replacing = map[string]bool{}
			}
			for _, n := range p.rule.Replaces {
				replacing[n] = true
			}
		}
	}
	if replacing != nil {
		for i := range plans {
			if p := &plans[i]; p.kind >= kindWindow && p.rule != nil && p.rule.Name != "" && replacing[p.rule.Name] {
				p.kind = kindNone
			}
		}
	}
	if err := s.execute(ctx, r.Domain, plans, now); err != nil {
		s.m.callsUnavailable.Inc()
		return nil, err
	}
	s.respond(r.Domain, plans, now, resp)
	if resp.Overall == CodeOverLimit {
		s.refundRefused(ctx, r.Domain, plans, resp, now)
	}
	if resp.Overall == CodeOverLimit {
		s.m.callsOver.Inc()
	} else {
		s.m.callsOK.Inc()
	}
	return resp, nil
}

// validate refuses malformed requests before any work, cheapest checks
// first, so a call of 10k descriptors costs one comparison.
func (s *Server) validate(r *Request) error {
	switch {
	case r == nil:
		return fmt.Errorf("%w: no request", ErrInvalid)
	case r.Domain == "":
		return fmt.Errorf("%w: rate limit domain must not be empty", ErrInvalid)
	case len(r.Domain) > MaxNameBytes:
		return fmt.Errorf("%w: domain of %d bytes, more than %d", ErrInvalid, len(r.Domain), MaxNameBytes)
	case !utf8.ValidString(r.Domain):
		return fmt.Errorf("%w: domain is not UTF-8", ErrInvalid)
	case len(r.Descriptors) == 0:
		return fmt.Errorf("%w: rate limit descriptor list must not be empty", ErrInvalid)
	case len(r.Descriptors) > s.opts.MaxDescriptors:
		return fmt.Errorf("%w: %d descriptors, more than the %d a call may carry", ErrInvalid, len(r.Descriptors), s.opts.MaxDescriptors)
	}
	for i := range r.Descriptors {
		if err := s.validateDescriptor(&r.Descriptors[i], i); err != nil {
			return err
		}
	}
	return nil
}

// validateDescriptor is validate's check of descriptor d, the i-th.
func (s *Server) validateDescriptor(d *Descriptor, i int) error {
	switch {
	case len(d.Entries) == 0:
		return fmt.Errorf("%w: descriptors[%d] has no entries", ErrInvalid, i)
	case len(d.Entries) > s.opts.MaxEntries:
		return fmt.Errorf("%w: descriptors[%d] has %d entries, more than %d", ErrInvalid, i, len(d.Entries), s.opts.MaxEntries)
	case d.Hits != nil && *d.Hits > MaxHits:
		return fmt.Errorf("%w: descriptors[%d].hits_addend %d is more than %d", ErrInvalid, i, *d.Hits, uint64(MaxHits))
	case d.Limit != nil && (d.Limit.Unit == UnitUnknown || d.Limit.Unit > Year):
		// envoy.type.v3.RateLimitUnit ends at YEAR; WEEK is the
		// response's unit only.
		return fmt.Errorf("%w: descriptors[%d].limit.unit %d is not a unit of requests (SECOND 1 … YEAR 6; WEEK 7 is a response's only)", ErrInvalid, i, d.Limit.Unit)
	}
	for j, e := range d.Entries {
		switch {
		case e.Key == "":
			return fmt.Errorf("%w: descriptors[%d].entries[%d].key is empty", ErrInvalid, i, j)
		case len(e.Key) > MaxNameBytes || len(e.Value) > MaxNameBytes:
			return fmt.Errorf("%w: descriptors[%d].entries[%d] is longer than %d bytes", ErrInvalid, i, j, MaxNameBytes)
		case !utf8.ValidString(e.Key) || !utf8.ValidString(e.Value):
			// proto3 strings are UTF-8 (gRPC refuses others), and the
			// metrics' labels are built from them.
			return fmt.Errorf("%w: descriptors[%d].entries[%d] is not UTF-8", ErrInvalid, i, j)
		}
	}
	return nil
}

// resolve fills p with what descriptor d of a call to dom must do.
func (s *Server) resolve(st *state, dom *domain, d *Descriptor, reqHits uint32, p *plan) {
	p.hits = int64(max(1, reqHits))
	if d.Hits != nil {
		p.hits = int64(*d.Hits)
	}
	p.negative = d.Negative
	if d.Limit != nil {
		// The override replaces the tree (src/config/config_impl.go: an
		// override is looked up before the descriptors; no shadow mode, no
		// name, no replaces).
		p.kind = kindWindow
		p.limit = Limit{RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: d.Limit.Unit}
		p.lim = s.counters[d.Limit.Unit]
		p.key = counterKey(dom.name, d.Entries, nil)
		p.stats = plainKey(d.Entries)
		return
	}
	m, ok := dom.lookup(d.Entries)
	if !ok {
		return
	}
	r := m.rule
	p.rule = r
	if r.Unlimited {
		p.kind = kindUnlimited
		return
	}
	p.shadow, p.quota = r.ShadowMode, r.QuotaMode
	p.limit = Limit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: r.Unit}
	p.key = counterKey(dom.name, d.Entries, m.shared)
	p.stats = m.stats
	if r.alg == nil {
		p.kind = kindWindow
		p.lim = s.counters[r.Unit]
		return
	}
	p.kind = kindRule
	p.rl = st.lims[r]
	p.lim = p.rl.lim
}

// maxCounterKey is the longest counter key used as it is: the stores' key
// bound (sluice.MaxKeyLen; a memory table slot holds 16 bits of length).
const maxCounterKey = sluice.MaxKeyLen

// counterKey names a descriptor's counter: the domain and the entries,
// with a shared wildcard value in place of the entry's where
// share_threshold applies, escaped so that distinct descriptors never
// meet (the peer's "domain_key_value_" keys can: ("a_b", "c") and ("a",
// "b_c")). A key longer than maxCounterKey is replaced by its SHA-256, as
// "%h" and 64 hex digits, which no escaped key spells (an escape is '%'
// and two uppercase hex digits).
func counterKey(domain string, entries []Entry, shared []string) string {
	var b strings.Builder
	n := len(domain)
	for _, e := range entries {
		n += len(e.Key) + len(e.Value) + 2
	}
	b.Grow(n)
	escape(&b, domain)
	for i, e := range entries {
		b.WriteByte('|')
		escape(&b, e.Key)
		b.WriteByte('=')
		if shared != nil && shared[i] != "" {
			escape(&b, shared[i])
		} else {
			escape(&b, e.Value)
		}
	}
	if b.Len() > maxCounterKey {
		sum := sha256.Sum256([]byte(b.String()))
		return "%h" + hex.EncodeToString(sum[:])
	}
	return b.String()
}

// escape writes s with the key syntax's bytes ('|', '=', '%') and Redis
// hash-tag braces percent-encoded.
func escape(b *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '|', '=', '%', '{', '}':
			b.WriteByte('%')
			b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c)>>4, 16)))
			b.WriteString(strings.ToUpper(strconv.FormatUint(uint64(c)&15, 16)))
		default:
			b.WriteByte(c)
		}
	}
}

// ownState is the handle of a Take on a key's own state, on both stores
// (memory's and Redis' handle for every algorithm without permits): the
// handle a refund arriving in a later call uses.
const ownState store.Handle = 1

// execute runs the plans' store work, under Options.Timeout, concurrently
// on Redis. Store failures are left in the plans (the failure policy is
// respond's), except under FailError, which returns ErrUnavailable.
func (s *Server) execute(ctx context.Context, domain string, plans []plan, now clock.Instant) error {
	n := 0
	for i := range plans {
		if plans[i].kind >= kindWindow {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		// Ended before any store work: nothing is counted, on any
		// backend (the memory store counted the hits of a call whose
		// answer no one got, where Redis refused to send them).
		return err
	}
	if s.opts.Redis != nil {
		cctx := ctx
		if !s.storeBounds(plans) {
			var cancel context.CancelFunc
			cctx, cancel = context.WithTimeout(ctx, s.opts.Timeout)
			defer cancel()
		}
		if n == 1 {
			for i := range plans {
				if plans[i].kind >= kindWindow {
					s.step(cctx, &plans[i], now)
				}
			}
		} else {
			var wg sync.WaitGroup
			for i := range plans {
				if plans[i].kind >= kindWindow {
					wg.Add(1)
					go func(p *plan) {
						defer wg.Done()
						s.step(cctx, p, now)
					}(&plans[i])
				}
			}
			wg.Wait()
		}
	} else {
		for i := range plans {
			if plans[i].kind >= kindWindow {
				s.step(ctx, &plans[i], now)
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.opts.OnFailure == FailError {
		for i := range plans {
			if err := plans[i].err; err != nil {
				return fmt.Errorf("%w: domain %q, descriptors[%d]: %v", ErrUnavailable, domain, i, err)
			}
		}
	}
	return nil
}

// storeBounds reports whether the store's own timeout already bounds the
// plans' store work by Options.Timeout: each plan makes at most one call
// (no refund before its take, no concurrency permits), the plans' calls run
// side by side, and the store's timeout is at most Options.Timeout. Then
// execute needs no timer of its own, which would cost one per call (a tenth
// of the CPU of a call on Redis, in profiles of sluice serve under load).
func (s *Server) storeBounds(plans []plan) bool {
	if s.opts.Redis.Timeout() > s.opts.Timeout {
		return false
	}
	for i := range plans {
		p := &plans[i]
		if p.kind < kindWindow {
			continue
		}
		if p.negative || (p.kind == kindRule && p.rule.slots()) {
			return false
		}
	}
	return true
}

// step runs one plan's calls to its limiter.
func (s *Server) step(ctx context.Context, p *plan, now clock.Instant) {
	if p.kind == kindRule && p.rule.slots() {
		// Before the take: permits whose release never came free their
		// slots for this very call, even when they hold them all.
		s.expire(ctx, now)
	}
	cost := p.hits
	if p.negative {
		if p.hits > 0 {
			if p.kind == kindRule && p.rule.slots() {
				s.release(ctx, p, now)
			} else if err := p.lim.Refund(ctx, p.key, ownState, now, p.hits); err != nil {
				p.err = err
				return
			}
		}
		cost = 0 // then read what is left
	}
	res, h, err := p.lim.Take(ctx, p.key, now, cost, 0)
	if err != nil {
		p.err = err
		return
	}
	p.res, p.h = res, h
	if p.kind == kindWindow {
		count := counterCap - res.Remaining
		if res.Status == limit.Allowed {
			p.after, p.before = count, count-cost
		} else {
			p.before, p.after = count, count+cost
		}
		return
	}
	if _, shared := p.lim.(store.OldestReleaser); shared {
		return // the permit lives on the shared store, where any replica's release finds it
	}
	if p.rule.slots() && res.Status == limit.Allowed && cost > 0 {
		if !s.held.add(p.rl.id+"\x00"+p.key, permit{h: h, cost: cost, at: now, lim: p.lim, key: p.key}) {
			// No room to remember the permit: it could never be released.
			_ = p.lim.Refund(ctx, p.key, h, now, cost)
			p.res.Status = limit.Denied
		}
	}
}

// refundRefused gives back what a refused call took from the descriptors
// that allowed it: the request does not run, so its hits should not count
// against the other quotas (sluice's own chain refunds the gates before
// the one that refuses, likewise), and a concurrency slot it took would
// otherwise stay held until its TTL, since a refused request never sends
// its release. Only extension rules are refunded: the peer's fixed
// window counts every hit, refused or not (src/limiter/base_limiter.go
// increments before it compares), and a client written for it expects
// that count, so there compatibility wins. A refund that fails leaves the
// hits counted (the limit errs towards refusing).
func (s *Server) refundRefused(ctx context.Context, domain string, plans []plan, resp *Response, now clock.Instant) {
	if s.opts.Redis != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.opts.Timeout)
		defer cancel()
	}
	for i := range plans {
		p := &plans[i]
		if p.kind != kindRule || p.negative || p.err != nil || p.hits <= 0 || p.res.Status != limit.Allowed {
			continue
		}
		if _, shared := p.lim.(store.OldestReleaser); !shared && p.rule.slots() && !s.held.remove(p.rl.id+"\x00"+p.key, p.h) {
			continue // already released (or never recorded): nothing of ours to give back
		}
		if err := p.lim.Refund(ctx, p.key, p.h, now, p.hits); err != nil {
			continue
		}
		s.m.of(domain, p.stats).refunded.Add(float64(p.hits))
		if st := &resp.Statuses[i]; st.Code == CodeOK && !p.rule.slots() {
			st.Remaining = uint32(min(int64(st.Remaining)+p.hits, int64(math.MaxUint32)))
		}
	}
}

// release frees the oldest permits of p's key, whole, up to p.hits slots:
// on a shared store (Redis) the oldest any replica took, since a release
// may reach another replica than its take; in memory, the oldest this
// process holds.
func (s *Server) release(ctx context.Context, p *plan, now clock.Instant) {
	if r, ok := p.lim.(store.OldestReleaser); ok {
		freed, err := r.ReleaseOldest(ctx, p.key, p.hits)
		if err != nil {
			p.err = err
		} else if freed == 0 {
			s.m.releaseUnmatched.Inc()
		}
		return
	}
	ps := s.held.take(p.rl.id+"\x00"+p.key, p.hits)
	if len(ps) == 0 {
		s.m.releaseUnmatched.Inc()
		return
	}
	for _, pm := range ps {
		if err := p.lim.Refund(ctx, p.key, pm.h, now, pm.cost); err != nil {
			p.err = err
		}
	}
}

// expire forgets the permits held longer than the TTL and, on memory,
// releases them (Redis sweeps them itself).
func (s *Server) expire(ctx context.Context, now clock.Instant) {
	for _, old := range s.held.expired(now, s.opts.ConcurrencyTTL) {
		if s.opts.Redis == nil {
			_ = old.lim.Refund(ctx, old.key, old.h, now, old.cost)
		}
	}
}

// respond turns the plans into statuses, counts them, and sets the
// overall verdict and the headers.
func (s *Server) respond(domain string, plans []plan, now clock.Instant, resp *Response) {
	nowSec := int64(now) / int64(time.Second)
	if int64(now) < 0 && int64(now)%int64(time.Second) != 0 {
		nowSec--
	}
	failedRate, quotaTotal, quotaFailed := 0, 0, 0
	chosen, minRemaining := -1, uint32(math.MaxUint32)
	for i := range plans {
		p := &plans[i]
		st := &resp.Statuses[i]
		st.Code = CodeOK
		switch p.kind {
		case kindNone:
		case kindUnlimited:
			st.Remaining = math.MaxUint32
		default:
			s.decide(domain, p, st, nowSec)
		}
		if st.Limit != nil && st.Remaining < minRemaining && !p.negative {
			chosen, minRemaining = i, st.Remaining
		}
		if p.kind >= kindWindow {
			if st.Code == CodeOverLimit {
				if p.quota {
					quotaFailed++
				} else {
					failedRate++
					chosen, minRemaining = i, 0
				}
			}
			if p.quota {
				quotaTotal++
			}
		}
	}
	if failedRate > 0 || (quotaTotal > 0 && quotaTotal == quotaFailed) {
		resp.Overall = CodeOverLimit
	}
	if s.opts.Headers != HeadersOff && chosen >= 0 {
		resp.Headers = s.headers(&plans[chosen], &resp.Statuses[chosen])
	}
	if resp.Overall == CodeOverLimit && s.opts.ShadowMode {
		resp.Overall = CodeOK
		s.m.globalShadow.Inc()
	}
}

// decide sets the status of a plan with a limiter and counts it.
func (s *Server) decide(domain string, p *plan, st *Status, nowSec int64) {
	lim := p.limit
	st.Limit = &lim
	sr := s.m.of(domain, p.stats)
	if u := p.limit.Unit.Seconds(); u > 0 {
		st.ResetIn = time.Duration(u-mod(nowSec, u)) * time.Second
	}
	if p.err != nil {
		s.failed(p, st, sr)
		return
	}
	if p.negative {
		sr.refunded.Add(float64(p.hits))
		if p.kind == kindWindow {
			st.Remaining = uint32(max(int64(p.limit.RequestsPerUnit)-p.after, 0))
		} else {
			st.Remaining = uint32(min(p.res.Remaining, math.MaxUint32))
			st.ResetIn = 0 // the stores' checks do not all tell it
		}
		return
	}
	sr.hits.Add(float64(p.hits))
	var over bool
	if p.kind == kindWindow {
		over = s.decideWindow(p, st, sr)
	} else {
		over = s.decideLimiter(p, st, sr)
	}
	if over && !p.shadow {
		st.Code = CodeOverLimit
	}
}

// failed sets the status of a plan whose store call failed, by the
// failure policy. A refund that failed refuses nothing.
func (s *Server) failed(p *plan, st *Status, sr *series) {
	if p.negative {
		return
	}
	switch s.opts.OnFailure {
	case FailClosed:
		st.Code = CodeOverLimit
		sr.failClosed.Add(float64(p.hits))
		if p.shadow {
			st.Code = CodeOK
		}
	default: // FailOpen (FailError never gets here)
		st.Remaining = p.limit.RequestsPerUnit
		sr.failOpen.Add(float64(p.hits))
	}
}

// decideWindow judges a fixed window's count and counts it as
// src/limiter/base_limiter.go does: over when the count after the call
// exceeds the limit; near_limit counts the hits between ⌊limit·ratio⌋
// and the limit; over_limit and shadow_mode the hits beyond the limit.
func (s *Server) decideWindow(p *plan, st *Status, sr *series) (over bool) {
	hits := float64(p.hits)
	l := int64(p.limit.RequestsPerUnit)
	near := int64(math.Floor(float64(float32(l) * float32(s.opts.NearLimitRatio))))
	if p.after > l {
		beyond := hits
		if p.before < l {
			beyond = float64(p.after - l)
			sr.near.Add(float64(l - max(near, p.before)))
		}
		sr.over.Add(beyond)
		if p.shadow {
			sr.shadow.Add(beyond)
		}
		return true
	}
	st.Remaining = uint32(l - p.after)
	if p.after > near {
		if p.before >= near {
			sr.near.Add(hits)
		} else {
			sr.near.Add(float64(p.after - near))
		}
	}
	sr.within.Add(hits)
	return false
}

// decideLimiter judges a limiter's result (token bucket, GCRA, sliding
// windows, leaky bucket, concurrency) and counts it.
func (s *Server) decideLimiter(p *plan, st *Status, sr *series) (over bool) {
	hits := float64(p.hits)
	res := p.res
	switch res.Status {
	case limit.Allowed:
	case limit.Invalid: // a check without hits: over when nothing is left
		over = res.Remaining == 0
	default:
		over = true
	}
	if over {
		sr.over.Add(hits)
		if p.shadow {
			sr.shadow.Add(hits)
		}
	} else {
		st.Remaining = uint32(min(res.Remaining, math.MaxUint32))
		if used := res.Limit - res.Remaining; float64(used) > math.Floor(float64(res.Limit)*s.opts.NearLimitRatio) && p.hits > 0 {
			sr.near.Add(hits)
		}
		sr.within.Add(hits)
	}
	if p.rule.slots() || p.hits == 0 {
		st.ResetIn = 0 // no window; or a check, whose reset the stores do not all tell
	} else {
		st.ResetIn = res.ResetAfter
		if over && res.RetryAfter > 0 {
			st.ResetIn = max(res.RetryAfter, st.ResetIn)
		}
	}
	return over
}

func mod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// headers renders the most constrained descriptor's headers.
func (s *Server) headers(p *plan, st *Status) []Header {
	reset := wire.Seconds(st.ResetIn)
	if s.opts.Headers == HeadersPeer {
		return []Header{
			{Name: s.opts.LimitHeader, Value: strconv.FormatUint(uint64(st.Limit.RequestsPerUnit), 10)},
			{Name: s.opts.RemainingHeader, Value: strconv.FormatUint(uint64(st.Remaining), 10)},
			{Name: s.opts.ResetHeader, Value: strconv.FormatInt(reset, 10)},
		}
	}
	name := st.Limit.Name
	if name == "" {
		name = p.stats
	}
	pol := sluice.Policy{Name: name, Quota: int64(st.Limit.RequestsPerUnit), Window: st.Limit.Unit.Duration()}
	if p.rule != nil && p.rule.slots() {
		pol.Unit, pol.Window = sluice.UnitConcurrentRequests, 0
	}
	return []Header{
		{Name: "RateLimit-Policy", Value: string(wire.AppendPolicies(nil, []sluice.Policy{pol}))},
		{Name: "RateLimit", Value: string(wire.AppendRateLimit(nil, name, int64(st.Remaining), reset))},
	}
}

// permit is a concurrency permit this process took and has not released.
type permit struct {
	h    store.Handle
	cost int64
	at   clock.Instant
	lim  store.Limiter
	key  string
}

// ledger remembers the permits taken, so that a release, which the
// protocol sends as a later call without the permit, frees real ones. It
// holds at most cap permits.
type ledger struct {
	mu    sync.Mutex
	held  map[string][]permit
	n     int
	cap   int
	swept clock.Instant
}

func (l *ledger) init(cap int) {
	if cap <= 0 {
		cap = memory.DefaultMaxKeys
	}
	l.cap, l.held = cap, map[string][]permit{}
}

// add records p under k; false when the ledger is full.
func (l *ledger) add(k string, p permit) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n >= l.cap {
		return false
	}
	l.held[k] = append(l.held[k], p)
	l.n++
	return true
}

// remove forgets the permit of handle h under k; false when it is not
// there.
func (l *ledger) remove(k string, h store.Handle) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := l.held[k]
	for i := range list {
		if list[i].h == h {
			if len(list) == 1 {
				delete(l.held, k)
			} else {
				l.held[k] = append(list[:i:i], list[i+1:]...)
			}
			l.n--
			return true
		}
	}
	return false
}

// take removes k's oldest permits, whole, while their slots fit in cost.
func (l *ledger) take(k string, cost int64) []permit {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := l.held[k]
	i := 0
	for i < len(list) && list[i].cost <= cost {
		cost -= list[i].cost
		i++
	}
	if i == 0 {
		return nil
	}
	out := append([]permit(nil), list[:i]...)
	if i == len(list) {
		delete(l.held, k)
	} else {
		l.held[k] = append([]permit(nil), list[i:]...)
	}
	l.n -= i
	return out
}

// expired removes and returns the permits older than ttl; it sweeps at
// most once per ttl/4, so its cost per call stays small.
func (l *ledger) expired(now clock.Instant, ttl time.Duration) []permit {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := now.Sub(l.swept); d >= 0 && d < ttl/4 {
		return nil // (a sweep "in the future" is from before a clock step back)
	}
	l.swept = now
	var out []permit
	for k, list := range l.held {
		i := 0
		for i < len(list) && now.Sub(list[i].at) > ttl {
			i++
		}
		if i == 0 {
			continue
		}
		out = append(out, list[:i]...)
		if i == len(list) {
			delete(l.held, k)
		} else {
			l.held[k] = append([]permit(nil), list[i:]...)
		}
		l.n -= i
	}
	return out
}
