package redis

import (
	_ "embed"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.GCRA: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/gcra.lua
var gcraLua string

var (
	gcraScript = newScript(preludeLua + commonLua + gcraLua)
	gcraBatch  = newScript(batchSource(commonLua, gcraLua))
)

func init() { registerTwin(twinOf(gcraSpec)) }

// gcraSpec returns the Spec of a keyed GCRA named name; burst × period must
// stay below 2^53.
func gcraSpec(name string, g *limit.GCRA) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	r := g.Rate()
	per, n, burst := int64(r.Per()), r.Tokens(), g.Limit()
	if burst > maxExact/max(per, 1000*n) {
		return nil, param.Errorf("burst", "redis: gcra %q: burst %d too large for rate %v in Redis' doubles", name, burst, r)
	}
	return &Spec{name: name, layout: "gcra:" + r.String(), script: gcraScript, batch: gcraBatch, limit: burst, window: g.Window(), debits: true, refills: true,
		fixed: []string{packDoubles(n, per, burst, ttlMs(g.Window()))}}, nil
}
