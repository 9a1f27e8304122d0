package redis

import (
	_ "embed"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.TokenBucket: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/tokenbucket.lua
var tokenBucketLua string

var (
	tokenBucketScript = newScript(preludeLua + tokenBucketLua)
	tokenBucketBatch  = newScript(batchSource("", tokenBucketLua))
)

func init() { registerTwin(twinOf(tokenBucketSpec)) }

// tokenBucketSpec returns the Spec of a keyed token bucket named name (the name
// scopes the keys). Redis keeps the state exact in doubles, so burst ×
// period must stay below 2^53 ns (per-second rates: bursts up to 9e6 at 1/s).
func tokenBucketSpec(name string, tb *limit.TokenBucket) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	r := tb.Rate()
	per, tokens, burst := int64(r.Per()), r.Tokens(), tb.Limit()
	if burst > maxExact/per {
		return nil, param.Errorf("burst", "redis: token bucket %q: burst %d × period %v exceeds 2^53", name, burst, r.Per())
	}
	fill := int64(tb.Window())
	return &Spec{name: name, layout: "tb:" + r.String(), script: tokenBucketScript, batch: tokenBucketBatch, limit: burst, window: tb.Window(), debits: true, refills: true,
		fixed: []string{packDoubles(per, tokens, burst*per, burst, fill, ttlMs(tb.Window()))}}, nil
}
