// Package algorithm is the one registry of sluice's limit algorithms: each
// entry names an algorithm, says which settings it reads and how its
// decisions behave, and builds it on either backend (in memory, or on Redis
// through its twin, store/redis.SpecOf), with one replica's share of it
// for a fleet's local fallback. The policy file's rate and concurrency
// kinds and the Envoy rate limit service's `algorithm:` build through it.
//
//	a, _ := algorithm.Lookup("token_bucket")
//	s := algorithm.Settings{Rate: limit.PerSecond(100), Burst: 500}
//	lim, err := a.Limiter(s, algorithm.Backend{Name: "request-rate"}) // in memory
//
// Adding an algorithm: its step function in package limit, its Lua twin in
// store/redis (the script and its line in that package's twins), and one
// line in registry below.
package algorithm

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// registry holds every algorithm, one line each.
var registry = []Algorithm{
	New("token_bucket", UsesRate|UsesBurst, Counts, func(s Settings) (*limit.TokenBucket, error) { return limit.NewTokenBucket(s.Rate, s.Burst) }),
	New("gcra", UsesRate|UsesBurst, Counts, func(s Settings) (*limit.GCRA, error) { return limit.NewGCRA(s.Rate, s.Burst) }),
	New("fixed_window", UsesLimit|UsesWindow, Counts, func(s Settings) (*limit.FixedWindow, error) { return limit.NewFixedWindow(s.Limit, s.Window) }),
	New("sliding_window", UsesLimit|UsesWindow, Counts, func(s Settings) (*limit.SlidingWindow, error) { return limit.NewSlidingWindow(s.Limit, s.Window) }),
	New("sliding_log", UsesLimit|UsesWindow, Counts, func(s Settings) (*limit.SlidingLog, error) { return limit.NewSlidingLog(s.Limit, s.Window) }),
	New("leaky_bucket", UsesRate|UsesQueue, Paces, func(s Settings) (*limit.LeakyBucket, error) { return limit.NewLeakyBucket(s.Rate, s.Queue) }),
	New("concurrency", UsesLimit, Slots, func(s Settings) (*limit.Concurrency, error) { return limit.NewConcurrency(s.Limit) }),
}

// Settings are what an algorithm is built from; each reads the fields its
// Uses names and ignores the others.
type Settings struct {
	// Rate is the sustained rate, tokens per period (UsesRate).
	Rate limit.Rate
	// Burst is a bucket's size in cost units (UsesBurst).
	Burst int64
	// Limit is a window's count or the slots held at once (UsesLimit).
	Limit int64
	// Window is a window's length (UsesWindow).
	Window time.Duration
	// Queue is how much cost a paced queue holds waiting (UsesQueue).
	Queue int64
	// PermitTTL is, for Slots on Redis, how long a permit lives when its
	// holder dies (0: store/redis.DefaultPermitTTL).
	PermitTTL time.Duration
}

// Share returns one of n replicas' share of s: the rate n times slower,
// the burst, limit and queue divided by n (a burst or limit at least 1).
// The window and the permits' TTL are the fleet's.
func (s Settings) Share(n int64) (Settings, error) {
	if n <= 1 {
		return s, nil
	}
	if s.Rate != (limit.Rate{}) {
		r, err := limit.NewRate(s.Rate.Tokens(), s.Rate.Per()*time.Duration(n))
		if err != nil {
			return s, err
		}
		s.Rate = r
	}
	if s.Burst > 0 {
		s.Burst = max(s.Burst/n, 1)
	}
	if s.Limit > 0 {
		s.Limit = max(s.Limit/n, 1)
	}
	s.Queue /= n
	return s, nil
}

// Uses is the set of Settings fields an algorithm reads.
type Uses uint8

// The settings.
const (
	UsesRate Uses = 1 << iota
	UsesBurst
	UsesLimit
	UsesWindow
	UsesQueue
)

// Behavior is how an algorithm's decisions behave.
type Behavior uint8

const (
	// Counts admits or refuses at once, and what it admits is spent.
	Counts Behavior = iota
	// Paces admits into a queue: an admitted request may have to wait.
	Paces
	// Slots holds what it admits until the request gives it back.
	Slots
)

// Algorithm is one registered algorithm. It is immutable and safe for
// concurrent use.
type Algorithm interface {
	// Name is the algorithm's name in configuration files, e.g.
	// "token_bucket".
	Name() string
	// Uses is the settings the algorithm reads.
	Uses() Uses
	// Behavior is how its decisions behave.
	Behavior() Behavior
	// Check builds what Limiter builds, without a store: the algorithm from
	// s, and its Redis form named name when redis is set. The error names
	// the setting at fault (internal/param).
	Check(s Settings, name string, redis bool) error
	// Limiter returns the algorithm built from s on the backend.
	Limiter(s Settings, on Backend) (store.Limiter, error)
}

// Backend says where an algorithm keeps its state.
type Backend struct {
	// Redis is the store; nil keeps the state in memory.
	Redis *sredis.Store
	// Name names the state on Redis (its keys): two limiters of one name
	// and algorithm share it.
	Name string
	// Memory are the in-memory table's options.
	Memory memory.Options
	// Previous, in memory, is a limiter this one continues from: when it is
	// the same algorithm's table, the new limiter keeps its keys' state
	// under the new settings.
	Previous store.Limiter
}

// Lookup returns the algorithm named name.
func Lookup(name string) (Algorithm, bool) {
	i := slices.IndexFunc(registry, func(a Algorithm) bool { return a.Name() == name })
	if i < 0 {
		return nil, false
	}
	return registry[i], true
}

// Names returns the registered algorithms' names, in registry order.
func Names() []string {
	names := make([]string, len(registry))
	for i, a := range registry {
		names[i] = a.Name()
	}
	return names
}

// MustLookup is Lookup for names fixed in the code: it panics on a name
// that is not registered, which a test of every caller finds.
func MustLookup(name string) Algorithm {
	a, ok := Lookup(name)
	if !ok {
		panic(fmt.Sprintf("algorithm: %q is not registered (have %s)", name, strings.Join(Names(), ", ")))
	}
	return a
}

// Register adds an algorithm to the registry, for tests that show what
// one registration line makes available; it returns a function that
// removes it. Not safe for concurrent use with lookups.
func Register(a Algorithm) (remove func()) {
	registry = append(registry, a)
	return func() {
		registry = slices.DeleteFunc(registry, func(b Algorithm) bool { return b == a })
	}
}

// New returns the algorithm named name whose step function, of package
// limit's type A over state S, build makes from the settings uses names:
// what a registration line calls.
func New[S any, A limit.Algorithm[S]](name string, uses Uses, b Behavior, build func(Settings) (A, error)) Algorithm {
	return &entry[S, A]{name: name, uses: uses, behavior: b, build: build}
}

// entry is one algorithm of state S and type A.
type entry[S any, A limit.Algorithm[S]] struct {
	name     string
	uses     Uses
	behavior Behavior
	build    func(Settings) (A, error)
}

func (e *entry[S, A]) Name() string       { return e.name }
func (e *entry[S, A]) Uses() Uses         { return e.uses }
func (e *entry[S, A]) Behavior() Behavior { return e.behavior }

func (e *entry[S, A]) Check(s Settings, name string, redis bool) error {
	a, err := e.build(s)
	if err != nil || !redis {
		return err
	}
	_, err = e.spec(name, a, s)
	return err
}

// spec is a's Redis form named name.
func (e *entry[S, A]) spec(name string, a A, s Settings) (*sredis.Spec, error) {
	sp, err := sredis.SpecOf(name, a)
	if err == nil && e.behavior == Slots && s.PermitTTL > 0 {
		sp, err = sp.WithPermitTTL(s.PermitTTL)
	}
	return sp, err
}

func (e *entry[S, A]) Limiter(s Settings, on Backend) (store.Limiter, error) {
	a, err := e.build(s)
	if err != nil {
		return nil, err
	}
	if on.Redis != nil {
		sp, err := e.spec(on.Name, a, s)
		if err != nil {
			return nil, err
		}
		return on.Redis.Limiter(sp), nil
	}
	if prev, ok := on.Previous.(*memory.Keyed[S, A]); ok {
		k := prev.WithAlgorithm(a)
		k.SetMaxKeys(on.Memory.MaxKeys)
		return k, nil
	}
	return memory.NewKeyed(a, on.Memory), nil
}
