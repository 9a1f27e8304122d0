package redis

import (
	_ "embed"
	"time"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.LeakyBucket: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/leakybucket.lua
var leakyBucketLua string

var (
	leakyBucketScript = newScript(preludeLua + commonLua + leakyBucketLua)
	leakyBucketBatch  = newScript(batchSource(commonLua, leakyBucketLua))
)

func init() { registerTwin(twinOf(leakyBucketSpec)) }

// leakyBucketSpec returns the Spec of a keyed paced queue named name;
// (queue+1) × period must stay below 2^53.
func leakyBucketSpec(name string, lb *limit.LeakyBucket) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	r := lb.Rate()
	per, n := int64(r.Per()), r.Tokens()
	if lb.Queue()+1 > maxExact/max(per, 1000*n) {
		return nil, param.Errorf("queue", "redis: leaky bucket %q: queue %d too large for rate %v in Redis' doubles", name, lb.Queue(), r)
	}
	// The schedule runs at most (queue+1)·T ahead of now: the last admitted
	// request's slot, which Window (the longest wait, queue·T) leaves out.
	ahead := time.Duration(ceilDiv((lb.Queue()+1)*per, n))
	return &Spec{name: name, layout: "lb:" + r.String(), script: leakyBucketScript, batch: leakyBucketBatch, limit: lb.Limit(), window: lb.Window(), paced: true,
		fixed: []string{packDoubles(n, per, lb.Queue(), ttlMs(ahead))}}, nil
}
