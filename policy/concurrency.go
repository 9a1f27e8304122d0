package policy

import (
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/store"
)

var concurrencyKind = &kind{
	name:    "concurrency",
	example: `{name: worker-pool, kind: concurrency, limit: 8, queue: {max_wait: 100ms}}`,
	doc: "Concurrency limit (limit.Concurrency): at most limit requests in flight (or demand units, weighted), each holding " +
		"its slot until it ends. Rejects with reason concurrency: 429 per tenant, 503 at a shared scope, with retry_hint as retry-after.",
	scope:  sluice.ScopeService,
	stored: true,
	reason: always(sluice.ReasonConcurrency),
	new:    func() params { return &concurrencyParams{} },
}

type concurrencyParams struct {
	limit    int64
	ttl      time.Duration
	weighted bool
	queue    queueSettings
	lease    leaseSettings
}

func (p *concurrencyParams) fields() []field {
	return []field{
		intField("limit", "requests in flight at once (demand units, when weighted)", &p.limit, 1, 1<<40).must(),
		ttlField(&p.ttl),
		boolField("weighted", "each request holds as many slots as its cost", &p.weighted).dflt("false"),
		queueField(&p.queue),
		leaseField(&p.lease),
	}
}

// ttlField is the permit lifetime of the fleet concurrency kinds.
func ttlField(dst *time.Duration) field {
	return durationField("ttl", "redis: how long a permit lives, so the permits of a crashed holder heal", dst, time.Second).
		dflt("%v", defaultPermitTTL)
}

// permitTTL returns ttl or its default.
func permitTTL(ttl time.Duration) time.Duration {
	if ttl == 0 {
		return defaultPermitTTL
	}
	return ttl
}

// concurrency is the algorithm of a fleet concurrency count of n slots,
// whose permits live ttl on Redis (0: the default), under gate g.
func concurrency(n int64, ttl time.Duration, g func(string, store.Limiter, gate.Options) (sluice.Gate, error)) algorithmGate {
	return onAlgorithm("concurrency", algorithm.Settings{Limit: n, PermitTTL: permitTTL(ttl)}, g)
}

func (p *concurrencyParams) algorithm() algorithmGate {
	return concurrency(p.limit, p.ttl, func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error) {
		if p.weighted {
			return gate.NewWeightedInFlight(name, lim, o)
		}
		return gate.NewInFlight(name, lim, o)
	})
}

func (p *concurrencyParams) check(c *checker) {
	p.algorithm().check(c)
	p.lease.checkSlots(c, p.limit)
	p.queue.check(c, p.lease.set)
}

func (p *concurrencyParams) build(b *builder) (sluice.Gate, error) {
	var g sluice.Gate
	var err error
	if p.lease.set {
		g, err = p.lease.buildSlots(b, p.limit, p.weighted)
	} else {
		g, err = p.algorithm().build(b)
	}
	if err != nil {
		return nil, err
	}
	return p.queue.wrap(b, g)
}

func (p *concurrencyParams) stateKey() string { return strconv.FormatBool(p.weighted) }

// capacity: a weighted gate's request costing more than the limit is
// never admitted (an unweighted one takes one slot whatever its cost).
func (p *concurrencyParams) capacity() (int64, string) {
	if !p.weighted {
		return 0, ""
	}
	return p.limit, "limit"
}

func (p *concurrencyParams) describe(g *Gate) string {
	w := ""
	if p.weighted {
		w = " (weighted by cost)"
	}
	return fmt.Sprintf("at most %d in flight%s%s%s%s", p.limit, w, p.queue.describe(), scoped(g), p.lease.describeSlots(p.limit))
}

// afterWork: see workBound.
func (p *concurrencyParams) afterWork() string { return "holds a slot until the work ends" }

// leased: see leaser.
func (p *concurrencyParams) leased() bool { return p.lease.set }
