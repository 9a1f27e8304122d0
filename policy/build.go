package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// algorithm builds the gate's algorithm, which validates its parameters.
func (g *Gate) algorithm() (any, error) {
	switch g.Kind {
	case KindTokenBucket:
		return limit.NewTokenBucket(g.Rate, g.Burst)
	case KindGCRA:
		return limit.NewGCRA(g.Rate, g.Burst)
	case KindFixedWindow:
		return limit.NewFixedWindow(g.Limit, g.Window)
	case KindSlidingWindow:
		return limit.NewSlidingWindow(g.Limit, g.Window)
	case KindSlidingLog:
		if g.Limit > 1_000_000 {
			return nil, fmt.Errorf("sliding log keeps one entry per unit: limit %d is too large (use sliding_window)", g.Limit)
		}
		return limit.NewSlidingLog(g.Limit, g.Window)
	case KindLeakyBucket:
		return limit.NewLeakyBucket(g.Rate, g.Queue)
	case KindConcurrency:
		return limit.NewConcurrency(g.Limit)
	}
	return nil, errNoAlgorithm
}

// fingerprint identifies the gate's whole configuration: a reload reuses a
// gate whose fingerprint did not change as it is. The mode is not part of
// it (modes switch without a new gate).
func (g *Gate) fingerprint(st Store) string {
	c := *g
	c.Line, c.fields, c.Mode = 0, nil, ""
	return fmt.Sprintf("%+v|%d", c, st.MaxKeys)
}

// stateKey identifies what the gate's stored state means. A reload that
// changes a gate but not its stateKey (a new limit, burst or queue, a new
// retry hint or failure policy) builds the new gate over the old state: in
// flight counts and bucket levels carry over, so a reload never opens a
// fresh budget. Changing kind, scope, rate or window starts fresh state.
func (g *Gate) stateKey(st Store) string {
	return fmt.Sprintf("%s|%s|%s|%s|%v|%v|%d", g.Name, g.Kind, g.Scope, g.Rate, g.Window, g.Weighted, st.MaxKeys)
}

// Options are the run-time parts of a build.
type Options struct {
	// Clock for the chain (nil: the real clock).
	Clock clock.Clock
	// Observer for the chain (metrics).
	Observer sluice.Observer
	// Rand is the uniform [0, 1) source of the probabilistic gates (the
	// utilization shedder, the ladder's recovery ramp); nil:
	// math/rand/v2. The simulator passes a seeded one so a run replays bit
	// for bit. Called from the decision path: it must be safe for the
	// chain's concurrency.
	Rand func() float64
}

// Runtime is a built policy: the chain and the identification rules.
type Runtime struct {
	File  *File
	Chain *sluice.Chain
	Rules identify.Rules
	gates map[string]builtGate
	redis *redisConn // the Redis store, when the backend is redis
}

// redisConn is a Redis store and the settings it was opened with.
type redisConn struct {
	st  *sredis.Store
	cfg string
}

// Close releases the runtime's connections (the Redis client). A runtime
// replaced by a reload keeps its connection for the next one when the store
// settings did not change.
func (rt *Runtime) Close() {
	if rt.redis != nil {
		rt.redis.st.Close()
	}
}

type builtGate struct {
	fp, sk string
	g      sluice.Gate
	rebind func(alg any) store.Limiter // the same state under a new algorithm
}

// Build turns a parsed file into a chain. Gates whose configuration is the
// same as in prev (a previous build, may be nil) are reused with their
// state, so a reload does not reset unchanged limits.
func Build(f *File, prev *Runtime, opts Options) (*Runtime, error) {
	rt := &Runtime{File: f, gates: map[string]builtGate{}}
	if f.Store.Backend == "redis" {
		cfg := fmt.Sprint(f.Store.Addrs, f.Store.Timeout, f.Store.ProbeEvery)
		if prev != nil && prev.redis != nil && prev.redis.cfg == cfg {
			rt.redis = prev.redis
		} else {
			st, err := sredis.New(sredis.Options{Addrs: f.Store.Addrs, Timeout: f.Store.Timeout, ProbeEvery: f.Store.ProbeEvery, Prefix: "sluice:" + f.Service})
			if err != nil {
				return nil, &Error{File: f.Path, Line: f.Store.Line, Field: "store", Msg: err.Error()}
			}
			rt.redis = &redisConn{st: st, cfg: cfg}
			if prev != nil && prev.redis != nil {
				old := prev.redis.st
				time.AfterFunc(2*time.Minute, old.Close) // let requests in flight release first
			}
		}
	}
	var gates []sluice.Gate
	modes := map[string]sluice.Mode{}
	for i := range f.Gates {
		g := &f.Gates[i]
		fp := g.fingerprint(f.Store)
		if prev != nil {
			if old, ok := prev.gates[g.Name]; ok && old.fp == fp {
				rt.gates[g.Name] = old
				gates = append(gates, old.g)
				modes[g.Name], _ = sluice.ParseMode(g.Mode)
				continue
			}
		}
		var same *builtGate
		if prev != nil {
			if old, ok := prev.gates[g.Name]; ok && old.sk == g.stateKey(f.Store) {
				same = &old
			}
		}
		built, rebind, err := g.build(f.Store, same, rt.redis, opts.Rand)
		if err != nil {
			return nil, &Error{File: f.Path, Line: g.Line, Field: fmt.Sprintf("gates[%d]", i), Msg: err.Error()}
		}
		if len(g.Classes) > 0 {
			built = gate.ForClasses(built, g.Classes)
		}
		rt.gates[g.Name] = builtGate{fp: fp, sk: g.stateKey(f.Store), g: built, rebind: rebind}
		gates = append(gates, built)
		modes[g.Name], _ = sluice.ParseMode(g.Mode)
	}
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: opts.Clock, Observer: opts.Observer, Modes: modes}, gates...)
	if err != nil {
		return nil, &Error{File: f.Path, Line: 1, Field: "gates", Msg: err.Error()}
	}
	rt.Chain = chain
	rt.Rules = f.rules()
	return rt, nil
}

// build makes the gate, over prev's state when prev is given (memory), or
// on Redis when rc is given.
func (g *Gate) build(st Store, prev *builtGate, rc *redisConn, rnd func() float64) (sluice.Gate, func(any) store.Limiter, error) {
	if protectionKinds[g.Kind] {
		return g.buildProtection(st, prev, rc, rnd)
	}
	alg, err := g.algorithm()
	if err != nil {
		return nil, nil, err
	}
	scope, _ := sluice.ParseScope(g.Scope)
	opts := gate.Options{Scope: scope, NoRefund: g.NoRefund, OnFailure: g.failure(), RetryHint: g.RetryHint}
	var lim store.Limiter
	var rebind func(any) store.Limiter
	switch {
	case rc != nil:
		if lim, err = g.redisLimiter(rc.st, alg); err != nil {
			return nil, nil, err
		}
		if opts.OnFailure == gate.LocalFallback {
			fb, err := g.fallback(alg, st)
			if err != nil {
				return nil, nil, err
			}
			opts.Fallback, _ = newKeyed(fb, memory.Options{MaxKeys: st.MaxKeys})
		}
	case prev != nil && prev.rebind != nil:
		lim, rebind = prev.rebind(alg), prev.rebind
	default:
		lim, rebind = newKeyed(alg, memory.Options{MaxKeys: st.MaxKeys})
	}
	var gt sluice.Gate
	switch alg.(type) {
	case *limit.LeakyBucket:
		gt, err = gate.NewPacer(g.Name, lim, opts)
	case *limit.Concurrency:
		if g.Weighted {
			gt, err = gate.NewWeightedConcurrency(g.Name, lim, opts)
		} else {
			gt, err = gate.NewConcurrency(g.Name, lim, opts)
		}
	default:
		gt, err = gate.NewRate(g.Name, lim, opts)
	}
	return gt, rebind, err
}

// redisLimiter returns the Redis limiter running alg.
func (g *Gate) redisLimiter(st *sredis.Store, alg any) (store.Limiter, error) {
	switch a := alg.(type) {
	case *limit.TokenBucket:
		return st.TokenBucket(g.Name, a)
	case *limit.GCRA:
		return st.GCRA(g.Name, a)
	case *limit.FixedWindow:
		return st.FixedWindow(g.Name, a)
	case *limit.SlidingWindow:
		return st.SlidingWindow(g.Name, a)
	case *limit.SlidingLog:
		return st.SlidingLog(g.Name, a)
	case *limit.LeakyBucket:
		return st.LeakyBucket(g.Name, a)
	case *limit.Concurrency:
		ttl := g.TTL
		if ttl == 0 {
			ttl = time.Minute
		}
		return st.Concurrency(g.Name, a, ttl)
	}
	return nil, fmt.Errorf("kind %s has no Redis script", g.Kind)
}

// fallback returns alg scaled to one replica's share (limit ÷ replicas, at
// least 1): the conservative in-process budget local_fallback decides on
// while Redis is unreachable.
func (g *Gate) fallback(alg any, st Store) (any, error) {
	n := max(st.Replicas, 1)
	share := func(v int64) int64 { return max(v/n, 1) }
	switch a := alg.(type) {
	case *limit.TokenBucket:
		r, err := limit.NewRate(a.Rate().Tokens(), a.Rate().Per()*time.Duration(n))
		if err != nil {
			return nil, err
		}
		return limit.NewTokenBucket(r, share(a.Limit()))
	case *limit.GCRA:
		r, err := limit.NewRate(a.Rate().Tokens(), a.Rate().Per()*time.Duration(n))
		if err != nil {
			return nil, err
		}
		return limit.NewGCRA(r, share(a.Limit()))
	case *limit.FixedWindow:
		return limit.NewFixedWindow(share(a.Limit()), a.Window())
	case *limit.SlidingWindow:
		return limit.NewSlidingWindow(share(a.Limit()), a.Window())
	case *limit.SlidingLog:
		return limit.NewSlidingLog(share(a.Limit()), a.Window())
	case *limit.LeakyBucket:
		r, err := limit.NewRate(a.Rate().Tokens(), a.Rate().Per()*time.Duration(n))
		if err != nil {
			return nil, err
		}
		return limit.NewLeakyBucket(r, a.Queue()/n)
	case *limit.Concurrency:
		return limit.NewConcurrency(share(a.Limit()))
	}
	return nil, fmt.Errorf("kind %s has no local fallback", g.Kind)
}

// newKeyed returns an in-memory keyed limiter for alg and a function that
// builds another limiter of the same kind over the same state.
func newKeyed(alg any, mopts memory.Options) (store.Limiter, func(any) store.Limiter) {
	switch a := alg.(type) {
	case *limit.TokenBucket:
		return keyed(a, mopts)
	case *limit.GCRA:
		return keyed(a, mopts)
	case *limit.FixedWindow:
		return keyed(a, mopts)
	case *limit.SlidingWindow:
		return keyed(a, mopts)
	case *limit.SlidingLog:
		return keyed(a, mopts)
	case *limit.LeakyBucket:
		return keyed(a, mopts)
	case *limit.Concurrency:
		return keyed(a, mopts)
	}
	panic(fmt.Sprintf("policy: no store for %T", alg))
}

func keyed[S any, A limit.Algorithm[S]](alg A, mopts memory.Options) (store.Limiter, func(any) store.Limiter) {
	k := memory.NewKeyed(alg, mopts)
	var rebind func(any) store.Limiter
	rebind = func(next any) store.Limiter { return k.WithAlgorithm(next.(A)) }
	return k, rebind
}

// rules returns the file's identification rules.
func (f *File) rules() identify.Rules {
	r := identify.Rules{
		TenantHeader:    f.Identity.TenantHeader,
		RequireTenant:   f.Identity.TenantRequired,
		DeadlineHeader:  f.Identity.DeadlineHeader,
		MaxDeadline:     f.Identity.MaxDeadline,
		DefaultDeadline: f.Identity.DefaultDeadline,
		RequestIDHeader: f.Identity.RequestIDHeader,
	}
	for _, rt := range f.Routes {
		r.Routes = append(r.Routes, identify.Route{
			Method: rt.Method, Path: rt.Path, Class: rt.Class,
			Cost: identify.Cost{Fixed: rt.Cost.Fixed, Header: rt.Cost.Header, Per: rt.Cost.Per, Min: rt.Cost.Min, Max: rt.Cost.Max},
		})
	}
	return r
}

// Classes returns the classes the routes name, in first-seen order, with
// the default class last if some request can fall through to it.
func (f *File) Classes() []string {
	var cs []string
	seen := map[string]bool{}
	for _, r := range f.Routes {
		c := r.Class
		if c == "" {
			c = sluice.ClassDefault
		}
		if !seen[c] {
			seen[c] = true
			cs = append(cs, c)
		}
	}
	if !seen[sluice.ClassDefault] {
		cs = append(cs, sluice.ClassDefault)
	}
	return cs
}

// entitlement reports whether a gate's rejections answer 429.
func (g *Gate) entitlement() bool {
	switch {
	case protectionKinds[g.Kind]:
		return false
	case g.Kind == KindConcurrency || g.Kind == KindLeakyBucket:
		return g.Scope == "tenant" || g.Scope == "tenant_operation"
	}
	return true
}

func (g *Gate) describe() string {
	var b strings.Builder
	switch g.Kind {
	case KindTokenBucket:
		fmt.Fprintf(&b, "token bucket %s, burst %d", g.RateText, g.Burst)
	case KindGCRA:
		fmt.Fprintf(&b, "GCRA %s, burst %d", g.RateText, g.Burst)
	case KindFixedWindow:
		fmt.Fprintf(&b, "fixed window %d per %v", g.Limit, g.Window)
	case KindSlidingWindow:
		fmt.Fprintf(&b, "sliding window counter %d per %v (bound < 2x in the worst case)", g.Limit, g.Window)
	case KindSlidingLog:
		fmt.Fprintf(&b, "sliding log %d per %v (exact)", g.Limit, g.Window)
	case KindLeakyBucket:
		fmt.Fprintf(&b, "paced queue at %s, queue %d", g.RateText, g.Queue)
	case KindConcurrency:
		fmt.Fprintf(&b, "at most %d in flight", g.Limit)
		if g.Weighted {
			b.WriteString(" (weighted by cost)")
		}
	case KindFleetUsage:
		n, _ := gate.FleetUsageLimit(g.Limit, g.Reserve)
		fmt.Fprintf(&b, "fleet usage: %d slots, non-reserved classes hold at most %d (reserved: %s); 503 overload", g.Limit, n, reserveText(g.Reserve))
		return b.String()
	case KindUtilization:
		c := g.controllerConfig()
		src := fmt.Sprintf("in flight ÷ %d workers", g.Workers)
		if g.Source == "cpu" {
			src = "process CPU"
		}
		fmt.Fprintf(&b, "utilization shedder on %s: good %v, bad %v, delay %v, everything shed %v after the first shed at full pressure; tiers shed in order %s; 503 overload",
			src, or(c.Good, 0.7), or(c.Bad, 0.8), durOr(c.Delay, 28*time.Second), durOr(c.ShedAllAfter, 120*time.Second), strings.Join(g.Tiers, " -> "))
		return b.String()
	case KindLadder:
		fmt.Fprintf(&b, "degradation ladder on demand ÷ %d workers (see STATE MACHINE)", g.Workers)
		return b.String()
	}
	fmt.Fprintf(&b, " per %s", g.Scope)
	if len(g.Classes) > 0 {
		fmt.Fprintf(&b, ", for class %s only", strings.Join(g.Classes, ", "))
	}
	return b.String()
}

func reserveText(r map[string]float64) string {
	var parts []string
	for c, v := range r {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", c, 100*v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func or(v, d float64) float64 {
	if v == 0 {
		return d
	}
	return v
}

func durOr(v, d time.Duration) time.Duration {
	if v == 0 {
		return d
	}
	return v
}
