package policy

import (
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// algorithm is how a kind whose gate runs one algorithm of package limit
// over the policy's store is checked and built, on each backend: the
// algorithm from the settings, its Redis form, its share for the local
// fallback, and the gate over the store. The kinds of rate limits and
// concurrency limits are one each of these.
type algorithm[S any, A limit.Algorithm[S]] struct {
	// alg builds the algorithm, which checks its parameters.
	alg func() (A, error)
	// redis is the algorithm on Redis under name, checked without a
	// connection.
	redis func(name string, a A) (*sredis.Spec, error)
	// share is one replica's share of a with n replicas: what
	// local_fallback decides on while Redis is unreachable.
	share func(a A, n int64) (A, error)
	// gate returns the gate over lim.
	gate func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error)
}

// check builds everything a build would build, without a store.
func (a algorithm[S, A]) check(c *checker) {
	alg, err := a.alg()
	if err != nil {
		c.fail(err)
		return
	}
	if !c.redis() {
		return
	}
	if _, err := a.redis(c.g.Name, alg); err != nil {
		c.fail(err)
	}
	if c.g.OnFailure == gate.LocalFallback {
		if _, err := a.share(alg, max(c.file.Store.Replicas, 1)); err != nil {
			c.fail(err)
		}
	}
}

// build returns the gate on the builder's backend. On memory it continues
// from the previous build's state when there is one.
func (a algorithm[S, A]) build(b *builder) (sluice.Gate, error) {
	alg, err := a.alg()
	if err != nil {
		return nil, err
	}
	opts := b.gateOptions()
	mopts := memory.Options{MaxKeys: b.store.MaxKeys}
	var lim store.Limiter
	switch prev, ok := b.prev.(*memory.Keyed[S, A]); {
	case b.redis != nil:
		sp, err := a.redis(b.g.Name, alg)
		if err != nil {
			return nil, err
		}
		lim = b.redis.Limiter(sp)
		switch opts.OnFailure {
		case gate.LocalFallback:
			fb, err := a.share(alg, max(b.store.Replicas, 1))
			if err != nil {
				return nil, err
			}
			opts.Fallback = memory.NewKeyed(fb, mopts)
		case gate.FailOpen:
			// Until Redis has answered once, the replica's share decides
			// (gate.Options.Fallback): a start-up under load does not
			// admit everything. A limit too small to divide has no guard.
			if fb, err := a.share(alg, max(b.store.Replicas, 1)); err == nil {
				opts.Fallback = memory.NewKeyed(fb, mopts)
			}
		}
	case ok:
		k := prev.WithAlgorithm(alg)
		k.SetMaxKeys(b.store.MaxKeys)
		lim, b.state = k, k
	default:
		k := memory.NewKeyed(alg, mopts)
		lim, b.state = k, k
	}
	return a.gate(b.g.Name, lim, opts)
}

// shareOf is v ÷ n, at least 1: one replica's share of a fleet limit.
func shareOf(v, n int64) int64 { return max(v/n, 1) }

// slower returns r with its period n times as long: one replica's share
// of a fleet rate.
func slower(r limit.Rate, n int64) (limit.Rate, error) {
	return limit.NewRate(r.Tokens(), r.Per()*time.Duration(n))
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
