package policy

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/lease"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/shed"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// Options are the run-time parts of a build.
type Options struct {
	// Clock for the chain (nil: the real clock).
	Clock clock.Clock
	// Virtual says that Clock is not the real clock (a simulator): gates
	// that measure real resources of this process (source: cpu) are
	// refused, since their readings would not follow the clock.
	Virtual bool
	// Upstream says that the chain admits requests for a separate process
	// (sluice proxy): a controller that reads this process's own
	// scheduling delay as the protected service's queue (queue_delay) is
	// refused, since the upstream's queue is elsewhere.
	Upstream bool
	// Observer for the chain (metrics).
	Observer sluice.Observer
	// Rand is the uniform [0, 1) source of the probabilistic gates (the
	// utilization shedder, the ladder's recovery ramp); nil:
	// math/rand/v2. The simulator passes a seeded one so a run replays bit
	// for bit. Called from the decision path: it must be safe for the
	// chain's concurrency.
	Rand func() float64
	// LeaseClient names this process among the holders of the leases of
	// gates with lease: (default: host, process id and a random suffix).
	// Processes of one fleet must have different names.
	LeaseClient string
	// Leaser, when set, allocates the leases of gates with lease: in place
	// of the store's allocator: the simulator shares one lease.Local
	// between the runtimes of its simulated processes.
	Leaser lease.Leaser
}

// Runtime is a built policy: the chain and the identification rules.
type Runtime struct {
	File  *File
	Chain *sluice.Chain
	Rules identify.Rules
	gates map[string]builtGate
	// retired are gates of earlier builds that this one dropped, kept a
	// while (retireFor) so that a gate dropped and added again continues
	// from its state: the requests still in flight hold its permits.
	retired map[string]retiredGate
	redis   *redisConn // the Redis store, when the backend is redis
	// local allocates the leases on the memory backend; a reload keeps it,
	// so a rebuilt lease gate continues from its predecessor's holding.
	local *lease.Local
}

// retiredGate is a dropped gate and when it was dropped.
type retiredGate struct {
	builtGate
	at time.Time
}

// retireFor is how long a dropped gate's state is kept for its return:
// longer than any request may hold its permits (identity deadlines are
// capped at 5 minutes by default).
const retireFor = 10 * time.Minute

// redisConn is a Redis store and the settings it was opened with.
type redisConn struct {
	st   *sredis.Store
	cfg  string      // every setting of the store: equal, the store is kept
	conn string      // what the connection depends on: equal, it is shared
	tls  *tls.Config // the store's (Share compares it as a pointer)
}

// Close releases the runtime's connections (the Redis client). A runtime
// replaced by a reload keeps its connection for the next one when the store
// settings did not change.
func (rt *Runtime) Close() {
	for _, g := range rt.gates {
		if g.stop != nil {
			g.stop() // gives the leases back while the store still answers
		}
	}
	if rt.redis != nil {
		rt.redis.st.Close()
	}
}

// builtGate is a gate of a build, kept so that the next build (a reload)
// can reuse it or its state.
type builtGate struct {
	fp, sk string
	g      sluice.Gate
	state  any    // the in-memory state the gate decides on (*memory.Keyed), or nil
	stop   func() // ends the gate's background loop, and waits for it (nil: none)
	looped bool   // the gate has a background loop (stopped once stop is nil)
	// of a gate this build made: its loop, started once the build is
	// sure (after the gates it replaces stopped), and what makes it the
	// successor of the gate it replaces (lease.Gate.Continue)
	run      func(ctx context.Context)
	handover func()
}

// start runs fn until the returned stop is called; stop waits for fn.
func start(fn func(ctx context.Context)) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	return func() { cancel(); <-done }
}

// builder is what a kind's build gets: the gate's settings, the store, and
// the state of the previous build to continue from.
type builder struct {
	g     *Gate
	store Store
	redis *sredis.Store // nil: the memory backend
	prev  any           // the previous build's state with the same state key, or nil
	state any           // set by the kind: the state a later build may continue from
	opts  Options
	// run, set by the kind, is the gate's background loop (a lease's
	// refreshes): the runtime runs it while the gate serves.
	run func(ctx context.Context)
	// prevGate is the gate of the previous build with the same state key
	// that this one replaces while its loop still runs, or nil; handover,
	// set by the kind, makes the new gate its successor.
	prevGate sluice.Gate
	handover func()
	local    *lease.Local // the runtime's in-process allocator (memory backend)
	order    []string     // the policy's class order, most protected first (a copy)
}

// gateOptions returns the options of the gate package's gates. The memory
// store cannot fail, so a failure policy matters on Redis only.
func (b *builder) gateOptions() gate.Options {
	o := gate.Options{Scope: b.g.Scope, OnFailure: b.g.OnFailure, RetryHint: b.g.RetryHint}
	if b.redis == nil {
		o.OnFailure = gate.FailOpen
	}
	return o
}

// Build turns a parsed file into a chain. It validates f (Validate) and
// opens the store, which does not need Redis to be up: until Redis answers,
// the gates on it decide by their failure policies. A store the options
// refuse is an Error on store that wraps the store's error. Gates whose
// configuration is the same as in prev (a previous build, may be nil) are
// reused with their state, so a reload does not reset unchanged limits;
// gates whose state means the same (see the kinds) continue from it.
func Build(f *File, prev *Runtime, opts Options) (*Runtime, error) {
	rt, err := Prepare(f, prev, opts)
	if err != nil {
		return nil, err
	}
	rt.Start(prev)
	return rt, nil
}

// Prepare is the first half of Build: it builds f's chain, reusing prev's
// gates and state as Build does, but changes nothing of prev and starts
// nothing, so that a reload can still be refused after it. Then either
// Start makes the runtime live (prev's replaced gates stop, the new loops
// start), or Discard drops it (prev serves on, untouched).
func Prepare(f *File, prev *Runtime, opts Options) (_ *Runtime, err error) {
	if err := Validate(f); err != nil {
		return nil, err
	}
	rt := &Runtime{File: f, gates: map[string]builtGate{}, retired: map[string]retiredGate{}}
	if err := rt.openStore(prev); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			rt.Discard(prev)
		}
	}()
	if prev != nil && prev.local != nil {
		rt.local = prev.local
	} else {
		rt.local = &lease.Local{Clock: opts.Clock}
	}
	gates := make([]sluice.Gate, 0, len(f.Gates))
	modes := map[string]sluice.Mode{}
	for i := range f.Gates {
		g := &f.Gates[i]
		bg, err := rt.build(g, prev, opts)
		if err != nil { // no loop of this build has started, no gate of prev was touched
			c := &checker{file: f, g: g, path: fmt.Sprintf("gates[%d]", i)}
			c.fail(err)
			return nil, c.errs
		}
		rt.gates[g.Name] = bg
		gates = append(gates, bg.g)
		modes[g.Name] = g.Mode
	}
	bindQueue(gates)
	chain, err := sluice.NewChain(sluice.ChainOptions{Clock: opts.Clock, Observer: opts.Observer, Modes: modes}, gates...)
	if err != nil {
		return nil, &Error{File: f.Path, Line: 1, Field: "gates", Msg: err.Error(), Err: err}
	}
	rt.Chain = chain
	rt.Rules = f.rules()
	return rt, nil
}

// Start makes a prepared runtime live in place of prev (may be nil): the
// new lease gates succeed the ones they replace, whose loops then stop
// (handing their leases over, or giving them back) before the new loops
// start, so that the holdings of one client name never have two gates
// refreshing them. Call it once, before the runtime's chain serves.
func (rt *Runtime) Start(prev *Runtime) {
	if prev != nil && prev.redis != nil && prev.redis != rt.redis {
		// prev's store (other settings, or none now) closes once its
		// requests in flight are done; only now, when nothing can refuse
		// rt any more
		time.AfterFunc(retireStoreAfter, prev.redis.st.Close)
	}
	for _, bg := range rt.gates {
		if bg.handover != nil && bg.stop == nil {
			bg.handover()
		}
	}
	rt.retire(prev)
	for name, bg := range rt.gates {
		if bg.run != nil && bg.stop == nil {
			bg.stop, bg.looped = start(bg.run), true
			rt.gates[name] = bg
		}
	}
}

// Discard drops a prepared runtime that never started: it closes the
// Redis store it opened (not one it shares with prev). prev is untouched.
func (rt *Runtime) Discard(prev *Runtime) {
	if rt.redis != nil && (prev == nil || prev.redis != rt.redis) {
		rt.redis.st.Close()
	}
	rt.redis = nil
}

// bindQueue gives every deadline gate its Q: the predicted wait of the
// policy's wait queue (the first gate with a queue), none without one; and
// that queue the first deadline gate's service-time estimates, which the
// deadline gate's retests keep current.
func bindQueue(gates []sluice.Gate) {
	var delay func(class string) time.Duration
	var wq *queue.Queue
	for _, g := range gates {
		if q, ok := sluice.As[*queue.Queue](g); ok {
			delay, wq = q.QueueDelay, q
			break
		}
	}
	shared := false
	for _, g := range gates {
		if d, ok := sluice.As[*shed.Deadline](g); ok {
			d.UseQueue(delay)
			if wq != nil && !shared {
				wq.ShareServiceTimes(d.ServiceTimes())
				shared = true
			}
		}
	}
}

// openStore dials Redis, or keeps prev's connection when its settings are
// the same.
func (rt *Runtime) openStore(prev *Runtime) error {
	s := rt.File.Store
	if s.Backend != BackendRedis {
		return nil
	}
	// The connection's identity; the password enters as a digest, the TLS
	// settings as theirs (files' contents included).
	pw := sha256.Sum256([]byte(s.password))
	var tlsDigest string
	var tlsConfig *tls.Config
	if s.tls != nil {
		tlsDigest, tlsConfig = s.tls.digest, s.tls.config
	}
	conn := fmt.Sprintf("%q %q %x %t %s", s.Addrs, s.Username, pw[:8], s.tls != nil, tlsDigest)
	cfg := fmt.Sprint(conn, s.Timeout, s.ProbeEvery, rt.File.Service) // the service names the keys (Prefix)
	if prev != nil && prev.redis != nil && prev.redis.cfg == cfg {
		rt.redis = prev.redis
		return nil
	}
	if prev != nil && prev.redis != nil && prev.redis.conn == conn {
		tlsConfig = prev.redis.tls // the same settings: Share keeps the connection
	}
	o := sredis.Options{Addrs: s.Addrs, Timeout: s.Timeout, ProbeEvery: s.ProbeEvery, Prefix: "sluice:" + rt.File.Service,
		Username: s.Username, Password: s.password, TLS: tlsConfig}
	var st *sredis.Store
	var err error
	if prev != nil && prev.redis != nil {
		st, err = prev.redis.st.Share(o) // the same connection settings: no new connection
	} else {
		st, err = sredis.New(o)
	}
	if err != nil {
		return rt.storeRefused(err)
	}
	rt.redis = &redisConn{st: st, cfg: cfg, conn: conn, tls: tlsConfig}
	return nil
}

// storeRefused is the policy error for a store Redis refused, at the
// field it refused: the TLS settings, the user's rights, or the password
// (with a hint when the file gives none).
func (rt *Runtime) storeRefused(err error) error {
	s := rt.File.Store
	field, line, msg := "store", s.Line, err.Error()
	switch sredis.RefusalOf(err) {
	case sredis.TLS:
		if s.tls != nil {
			field, line = "store.tls", s.tls.Line
		}
		if strings.Contains(msg, "certificate required") && (s.tls == nil || s.tls.CertFile == "") {
			msg += " (give the store a client certificate: tls.cert_file and tls.key_file)"
		}
	case sredis.Permissions:
		if s.usernameLine != 0 {
			field, line = "store.username", s.usernameLine
		}
		msg += " (the ACL of the store's user must allow its scripts on the keys under sluice:" + rt.File.Service + ")"
	case sredis.Credentials:
		if s.passwordField != "" {
			field, line = s.passwordField, s.passwordLine
		} else if strings.Contains(msg, "NOAUTH") {
			msg += " (the server wants a password: set store.password_env or store.password_file)"
		}
	}
	return &Error{File: rt.File.Path, Line: line, Field: field, Msg: msg, Err: err}
}

// retireStoreAfter is how long a replaced runtime's Redis store stays open
// once its successor starts: requests in flight release their permits
// first.
var retireStoreAfter = 2 * time.Minute

// build returns g built, or prev's gate when nothing changed.
func (rt *Runtime) build(g *Gate, prev *Runtime, opts Options) (builtGate, error) {
	fp, sk := g.fingerprint(rt.File.Store), g.stateKey(rt.File.Store)
	if rt.redis != nil {
		// A gate on Redis is bound to its store: a new store (other
		// addresses, credentials, TLS or timing) builds the gate anew on it
		// (its state is in Redis), or it would decide on the old store,
		// closed retireStoreAfter later, on its failure policy for good.
		fp += "|" + rt.redis.cfg
	}
	var old *builtGate
	if prev != nil {
		if o, ok := prev.gates[g.Name]; ok {
			old = &o
		} else if r, ok := prev.retired[g.Name]; ok {
			old = &r.builtGate
		}
	}
	if old != nil && old.fp == fp && !(old.looped && old.stop == nil) {
		return *old, nil // (a retired gate whose loop ended is built anew)
	}
	b := &builder{g: g, store: rt.File.Store, opts: opts, local: rt.local, order: rt.File.orderOfClasses()}
	if rt.redis != nil {
		b.redis = rt.redis.st
	}
	if old != nil && old.sk == sk {
		b.prev = old.state
		if old.stop != nil {
			b.prevGate = old.g
		}
	}
	built, err := g.params.build(b)
	if err != nil {
		return builtGate{}, err
	}
	if len(g.Classes) > 0 {
		built = gate.ForClasses(built, g.Classes)
	}
	return builtGate{fp: fp, sk: sk, g: built, state: b.state, run: b.run, handover: b.handover}, nil
}

// retire keeps the gates of prev that rt dropped, and prev's own retired
// gates not yet too old.
func (rt *Runtime) retire(prev *Runtime) {
	if prev == nil {
		return
	}
	now := time.Now()
	for name, r := range prev.retired {
		if _, back := rt.gates[name]; !back && now.Sub(r.at) < retireFor {
			rt.retired[name] = r
		}
	}
	for name, g := range prev.gates {
		if cur, kept := rt.gates[name]; !kept || cur.g != g.g {
			if g.stop != nil { // a loop (a lease) ends with its gate: give the lease back
				g.stop()
				g.stop = nil
			}
		}
		if _, kept := rt.gates[name]; !kept {
			rt.retired[name] = retiredGate{builtGate: g, at: now}
		}
	}
}

// fingerprint identifies the gate's whole configuration: a reload reuses a
// gate whose fingerprint did not change as it is. The mode is not part of
// it (modes switch without a new gate).
func (g *Gate) fingerprint(st Store) string {
	return fmt.Sprintf("%s|%s|%v|%v|%v|%v|%+v|%d|%s", g.Name, g.Kind, g.Scope, g.OnFailure, g.RetryHint, g.Classes, g.params, st.MaxKeys, st.Backend)
}

// stateKey identifies what the gate's stored state means. A reload that
// changes a gate but not its stateKey (a new limit, burst or queue, a new
// retry hint or failure policy, the store's key cap) builds the new gate
// over the old state: in
// flight counts and bucket levels carry over, so a reload never opens a
// fresh budget. What else is part of it is the kind's to say.
func (g *Gate) stateKey(st Store) string {
	return fmt.Sprintf("%s|%s|%v|%s|%s", g.Name, g.Kind, g.Scope, st.Backend, g.params.stateKey())
}

// rules returns the file's identification rules.
func (f *File) rules() identify.Rules {
	r := identify.Rules{
		RequireTenant:   f.identity.TenantRequired,
		DeadlineHeader:  f.identity.DeadlineHeader,
		MaxDeadline:     f.identity.MaxDeadline,
		DefaultDeadline: f.identity.DefaultDeadline,
		RequestIDHeader: f.identity.RequestIDHeader,
		PathMatch:       f.identity.PathMatch,
	}
	if f.countsPerClient() {
		r.ClientKey, r.Client = true, f.identity.ClientIP
	}
	if len(f.identity.TrustedPeers) > 0 {
		r.Peers = identify.Peers{Trusted: f.identity.TrustedPeers, Order: f.orderOfClasses()}
	}
	// One header is the TenantHeader shorthand, which the gRPC
	// interceptors and the simulator read.
	if parts := f.identity.tenantParts(); len(parts) == 1 && parts[0].Source == identify.SourceHeader {
		r.TenantHeader = parts[0].Name
	} else if len(parts) > 0 {
		r.Tenant = identify.KeyRules{Parts: parts, ClientIP: f.identity.ClientIP, Token: identify.Token{Header: f.identity.TokenHeader}}
	}
	for _, rt := range f.routes {
		r.Routes = append(r.Routes, identify.Route{
			Method: rt.Method, Path: rt.Path, Class: rt.Class,
			Cost: identify.Cost{Fixed: rt.Cost.Fixed, Header: rt.Cost.Header, Per: rt.Cost.Per, Min: rt.Cost.Min, Max: rt.Cost.Max, ResponseHeader: rt.Cost.ResponseHeader},
		})
	}
	return r
}

// sortedKeys returns the keys of m in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
