package redis

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
)

// maxExact is the largest integer Lua (IEEE doubles) keeps exact.
const maxExact = 1 << 53

// MaxCount is the largest limit of a counting algorithm (fixed window,
// sliding log, concurrency) on Redis: a count plus a cost, each up to the
// limit, must stay exact in a double.
const MaxCount = maxExact / 2

// checkCount refuses a limit beyond MaxCount.
func checkCount(kind, name string, limit int64) error {
	if limit > MaxCount {
		return param.Errorf("limit", "redis: %s %q: limit %d exceeds 2^52, the largest count Redis' doubles keep exact", kind, name, limit)
	}
	return nil
}

// Spec is one algorithm of package limit in the form Redis runs it: its
// script, its fixed parameters, its quota and window. SpecOf (and Counter)
// check the name and what Redis' doubles hold exactly, without a
// connection, so a policy can be validated anywhere; Store.Limiter binds a
// Spec to a store. A Spec is immutable.
//
// Every script takes ARGV = now override (µs, 0: Redis TIME), op ("take" |
// "refund", and "debit" for those that charge after the fact), cost, extra (the permit id for concurrency, the deadline
// budget in ns for the leaky bucket), then its fixed parameters, and
// answers {status, remaining, retry_after_ns, reset_after_ns, wait_ns}.
type Spec struct {
	name    string
	layout  string // what the state under the keys means: the algorithm and its units (see keys)
	script  *rueidis.Lua
	batch   *rueidis.Lua // the batched form (batch.go); nil: never batched
	fixed   []string
	limit   int64
	window  time.Duration
	permits bool // concurrency: every take gets a fresh permit id
	paced   bool // leaky bucket: extra is the deadline budget
	meta    bool // sliding log, concurrency: a second key (same slot) holds the sum
	counter bool // a count (Counter): its batch answers {status, count} per step
	debits  bool // its script has the "debit" op (store.Debiter)
	refills bool // a token bucket or GCRA (store.Refiller)
}

// width is how many integers the batch script answers per step.
func (sp *Spec) width() int {
	if sp.counter {
		return 2
	}
	return 5
}

// Limiter returns the limiter sp describes, with its state on s.
func (s *Store) Limiter(sp *Spec) store.Limiter {
	l := &limiter{s: s, Spec: sp}
	if dc := s.opts.DecisionClock; dc != nil {
		l.now = func() int64 { return int64(dc.Now()) / 1000 }
	}
	if sp.batch != nil {
		l.batcher = newBatcher(l, sp.batch)
	}
	return l
}

// limiter is one keyed limiter on the store.
type limiter struct {
	*Spec
	s       *Store
	now     func() int64 // test hook: now in µs (nil: Redis TIME)
	batcher *batcher     // single-key algorithms: concurrent steps share script calls
}

var _ store.Limiter = (*limiter)(nil)

// args returns a script's arguments; the sixth, the expiry, is filled in
// by Store.run ("0": none).
func (l *limiter) args(op string, cost int64, extra string) []string {
	now := "0"
	if l.now != nil {
		now = strconv.FormatInt(l.now(), 10)
	}
	a := make([]string, 0, 6+len(l.fixed))
	a = append(a, now, op, strconv.FormatInt(cost, 10), extra)
	a = append(a, l.fixed...)
	return append(a, "0")
}

// Take runs one step on Redis. now is ignored: Redis time decides.
func (l *limiter) Take(ctx context.Context, key string, now clock.Instant, cost int64, deadline clock.Instant) (limit.Result, store.Handle, error) {
	h, extra, budget := store.Handle(1), "0", int64(0)
	switch {
	case l.permits:
		h = newPermit()
		extra = strconv.FormatUint(uint64(h), 16)
	case l.paced && deadline != 0:
		budget = max(int64(deadline-now), 1) // budget left, on the caller's clock
		extra = strconv.FormatInt(budget, 10)
	}
	var v [5]int64
	var err error
	if l.batcher != nil {
		v, err = l.batcher.do(ctx, l.stateKey(key), "take", cost, extra, budget)
	} else {
		var sent bool
		v, sent, err = l.s.run(ctx, l.script, l.keys(key), l.args("take", cost, extra), true)
		if err != nil && sent && l.permits {
			// Redis may have granted the permit after all: give it back.
			l.s.journal.add(release{l: l, key: key, h: h, cost: cost})
		}
	}
	if err != nil {
		return limit.Result{}, 0, err
	}
	return limit.Result{
		Status:     limit.Status(v[0]),
		Limit:      l.limit,
		Remaining:  v[1],
		RetryAfter: time.Duration(v[2]),
		ResetAfter: time.Duration(v[3]),
		Wait:       time.Duration(v[4]),
	}, h, nil
}

// Refund gives back cost units, or releases permit h of a concurrency
// limit. A permit whose release fails is released again once Redis
// answers (journal.go).
func (l *limiter) Refund(ctx context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if l.permits {
		err := l.release(ctx, key, h, cost, 0)
		if err != nil && ctx.Err() == nil {
			l.s.journal.add(release{l: l, key: key, h: h, cost: cost})
		}
		return err
	}
	if l.counter && cost <= 0 {
		return nil // nothing to give back (a batched counter's refund is a negative cost)
	}
	extra := strconv.FormatUint(uint64(h), 16)
	if l.batcher != nil {
		_, err := l.batcher.do(ctx, l.stateKey(key), "refund", cost, extra, 0)
		return err
	}
	_, _, err := l.s.run(ctx, l.script, l.keys(key), l.args("refund", cost, extra), false)
	return err
}

// Debit charges cost more units after the fact (store.Debiter): the token
// bucket, GCRA, fixed and sliding windows' "debit" step, never past an
// empty state. Other algorithms charge nothing.
func (l *limiter) Debit(ctx context.Context, key string, h store.Handle, now clock.Instant, cost int64) error {
	if !l.debits || cost <= 0 {
		return nil
	}
	if l.batcher != nil {
		_, err := l.batcher.do(ctx, l.stateKey(key), "debit", cost, "0", 0)
		return err
	}
	_, _, err := l.s.run(ctx, l.script, l.keys(key), l.args("debit", cost, "0"), false)
	return err
}

// ReleaseOldest frees the oldest live permits of a concurrency limit's
// key, whole, whose slots fit in slots, whichever process took them, and
// returns the slots freed (at most 64 permits a call). It is for a
// protocol whose release comes without its permit and may reach any
// process of a fleet (the Envoy rate limit service's is_negative_hits):
// the release frees a slot held on the shared store, not only one this
// process remembers. It is not retried: a release lost to a failure is
// freed by the permit's TTL.
func (l *limiter) ReleaseOldest(ctx context.Context, key string, slots int64) (int64, error) {
	if !l.permits {
		return 0, errors.New("redis: ReleaseOldest applies to a concurrency limit")
	}
	if slots <= 0 {
		return 0, nil
	}
	v, _, err := l.s.run(ctx, l.script, l.keys(key), l.args("oldest", slots, "0"), false)
	if err != nil {
		return 0, err
	}
	return v[1], nil
}

// release frees permit h (cost slots) once. It is idempotent, so it never
// expires: a release that reaches Redis late still frees what it should.
// timeout, if set, replaces the store's.
func (l *limiter) release(ctx context.Context, key string, h store.Handle, cost int64, timeout time.Duration) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	_, _, err := l.s.run(ctx, l.script, l.keys(key), l.args("refund", cost, strconv.FormatUint(uint64(h), 16)), false)
	return err
}

// keys returns the script's keys for a state key, all in one slot.
func (l *limiter) keys(key string) []string {
	k := l.stateKey(key)
	switch {
	case l.permits:
		return []string{k + ":permits", k + ":held", k + ":run"}
	case l.meta:
		return []string{k, k + ":meta"}
	}
	return []string{k}
}

// stateKey is the Redis key of key's state: the store's hash-tagged key
// of the limiter's name and key, then the Spec's layout. Two limiters
// under one name whose states mean different things (another algorithm,
// whose script would meet a value of the wrong type, WRONGTYPE, for as
// long as the old key lives; or the same one with other units: a rate of
// another period, another window) keep apart, as a process running one
// policy and a process running the next do during a rolling deploy. A
// Spec's limit, burst or queue is not part of it: a state carries over a
// new one.
func (l *limiter) stateKey(key string) string { return l.s.key(l.name, key) + ":" + l.layout }

// Limit returns the quota.
func (l *limiter) Limit() int64 { return l.limit }

// Window returns the quota's window.
func (l *limiter) Window() time.Duration { return l.window }

// Refills reports whether the quota refills continuously (store.Refiller).
func (l *limiter) Refills() bool { return l.refills }

func newPermit() store.Handle {
	var b [8]byte
	rand.Read(b[:])
	return store.Handle(binary.LittleEndian.Uint64(b[:])&(1<<63-1) | 1) // bit 63 is the caller's
}

// checkName refuses limiter names that could make two limiters share keys
// or move a key's hash tag: keys are prefix:{name:key}, so a name must not
// contain ':' (limiter "a" with tenant "b:c" and limiter "a:b" with tenant
// "c" would meet) or braces.
func checkName(name string) error {
	if name == "" || strings.ContainsAny(name, ":{}") {
		return param.Errorf("name", "redis: limiter name %q: want a non-empty name without ':', '{' or '}'", name)
	}
	return nil
}

// packDoubles encodes integers below 2^53 as little-endian doubles: one
// argument the script unpacks with struct.unpack instead of many it parses.
func packDoubles(vs ...int64) string {
	b := make([]byte, 8*len(vs))
	for i, v := range vs {
		binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(float64(v)))
	}
	return string(b)
}

// ttlMs is the key TTL (ms) for state that is back to fresh at most d after
// the step that writes it: twice d, and at least d plus the clock tolerance
// (a state may run that far ahead of a stale now). TTL only collects
// garbage; it never limits.
func ttlMs(d time.Duration) int64 {
	return max(2*d, d+limit.ClockTolerance).Milliseconds() + 1
}

// twins are the Redis forms of package limit's algorithms. Each twin's
// file (tokenbucket.go, gcra.go, ...) holds its script, the function that
// checks and packs its parameters, and its registerTwin: an algorithm added
// to package limit adds its script under lua/ and one such file here.
var twins []twin

// registerTwin adds a twin; the twins' files call it from init.
func registerTwin(tw twin) { twins = append(twins, tw) }

// defaultPermitTTL is how long a concurrency permit lives on Redis unless
// Spec.WithPermitTTL says otherwise: the permits of a holder that died
// free themselves after it.
const defaultPermitTTL = time.Minute

// twin is the Redis form of one algorithm type: ok is false when alg is
// of another type.
type twin func(name string, alg any) (sp *Spec, ok bool, err error)

func twinOf[A any](spec func(name string, a A) (*Spec, error)) twin {
	return func(name string, alg any) (*Spec, bool, error) {
		a, ok := alg.(A)
		if !ok {
			return nil, false, nil
		}
		sp, err := spec(name, a)
		return sp, true, err
	}
}

// SpecOf returns the Spec of alg, one of package limit's algorithms
// (*limit.TokenBucket, *limit.GCRA, *limit.FixedWindow,
// *limit.SlidingWindow, *limit.SlidingLog, *limit.LeakyBucket,
// *limit.Concurrency), named name: the name scopes its keys on Redis, and
// two limiters of one name and algorithm share their state. It checks,
// without a connection, what Redis' doubles hold exactly: a token bucket's
// or GCRA's burst × period and a leaky bucket's (queue+1) × period below
// 2^53 ns, a sliding window's limit × window below 2^53 µs, counts below
// MaxCount, windows in whole microseconds. The error names the setting
// (param.Name finds it); an algorithm with no Redis form is an error too.
// A concurrency Spec's permits live DefaultPermitTTL (see WithPermitTTL).
func SpecOf(name string, alg any) (*Spec, error) {
	for _, tw := range twins {
		if sp, ok, err := tw(name, alg); ok {
			return sp, err
		}
	}
	return nil, fmt.Errorf("redis: %q: no Redis form for algorithm %T", name, alg)
}

// WithPermitTTL returns a copy of a concurrency Spec whose permits live
// ttl: a holder that dies without releasing its permits frees them after
// ttl. It returns an error for a ttl ≤ 0 or a Spec that holds no permits.
func (sp *Spec) WithPermitTTL(ttl time.Duration) (*Spec, error) {
	if !sp.permits {
		return nil, fmt.Errorf("redis: %q: only a concurrency limit holds permits", sp.name)
	}
	c, err := limit.NewConcurrency(sp.limit)
	if err != nil {
		return nil, err
	}
	return concurrencySpec(sp.name, c, ttl)
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return a/b + min(a%b, 1) }
