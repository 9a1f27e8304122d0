package policy

import (
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

// algorithmGate is how a kind whose gate runs one registered algorithm
// (internal/algorithm) over the policy's store is checked and built, on
// each backend: the algorithm and its settings, and the gate over the
// store. The kinds of rate limits and concurrency limits are one each of
// these; local_fallback decides on one replica's share of the settings.
type algorithmGate struct {
	alg algorithm.Algorithm
	s   algorithm.Settings
	// gate returns the gate over lim.
	gate func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error)
}

// onAlgorithm is the gate g over the algorithm registered as name, built
// from s.
func onAlgorithm(name string, s algorithm.Settings, g func(string, store.Limiter, gate.Options) (sluice.Gate, error)) algorithmGate {
	return algorithmGate{alg: algorithm.MustLookup(name), s: s, gate: g}
}

// check builds everything a build would build, without a store.
func (a algorithmGate) check(c *checker) {
	if err := a.alg.Check(a.s, c.g.Name, c.redis()); err != nil {
		c.fail(err)
		return
	}
	if c.redis() && c.g.OnFailure == gate.LocalFallback {
		if _, err := a.share(max(c.file.Store.Replicas, 1), memory.Options{}, nil); err != nil {
			c.fail(err)
		}
	}
}

// share is the algorithm in memory on one of n replicas' share of the
// settings: what local_fallback decides on while Redis is unreachable.
func (a algorithmGate) share(n int64, mo memory.Options, prev store.Limiter) (store.Limiter, error) {
	s, err := a.s.Share(n)
	if err != nil {
		return nil, err
	}
	return a.alg.Limiter(s, algorithm.Backend{Memory: mo, Previous: prev})
}

// build returns the gate on the builder's backend. On memory it continues
// from the previous build's state when there is one.
func (a algorithmGate) build(b *builder) (sluice.Gate, error) {
	opts := b.gateOptions()
	mopts := memory.Options{MaxKeys: b.store.MaxKeys}
	if b.redis == nil {
		prev, _ := b.prev.(store.Limiter)
		lim, err := a.alg.Limiter(a.s, algorithm.Backend{Memory: mopts, Previous: prev})
		if err != nil {
			return nil, err
		}
		b.state = lim
		return a.gate(b.g.Name, lim, opts)
	}
	lim, err := a.alg.Limiter(a.s, algorithm.Backend{Redis: b.redis, Name: b.g.Name})
	if err != nil {
		return nil, err
	}
	// The fallback continues from the previous build's (a reload that
	// changed the gate or the store's settings): a fresh one, full, gave
	// the next outage a burst the previous one had spent.
	prev, _ := b.prev.(store.Limiter)
	switch opts.OnFailure {
	case gate.LocalFallback:
		if opts.Fallback, err = a.share(max(b.store.Replicas, 1), mopts, prev); err != nil {
			return nil, err
		}
	case gate.FailOpen:
		// Until Redis has answered once, the replica's share decides
		// (gate.Options.Fallback): a start-up under load does not admit
		// everything. A limit too small to divide has no guard.
		if fb, err := a.share(max(b.store.Replicas, 1), mopts, prev); err == nil {
			opts.Fallback = fb
		}
	}
	if opts.Fallback != nil {
		b.state = opts.Fallback
	}
	return a.gate(b.g.Name, lim, opts)
}

// defaultPermitTTL is how long a fleet concurrency permit lives on Redis
// when the file names no ttl: a crashed holder's permits heal after it.
const defaultPermitTTL = time.Minute

// rateGate returns the constructor of a rate kind's entitlement gate.
func rateGate(refund bool) func(string, store.Limiter, gate.Options) (sluice.Gate, error) {
	return func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error) {
		o.NoRefund = !refund
		return gate.NewRateLimit(name, lim, o)
	}
}

// refundField is the refund setting of the rate kinds.
func refundField(dst *bool) field {
	return boolField("refund", "give back the tokens of a request that a later gate rejected", dst).dflt("true")
}
