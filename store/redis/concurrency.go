package redis

import (
	_ "embed"
	"time"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.Concurrency: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/concurrency.lua
var concurrencyLua string

var (
	concurrencyScript = newScript(preludeLua + commonLua + concurrencyLua)
)

func init() {
	registerTwin(twinOf(func(name string, c *limit.Concurrency) (*Spec, error) {
		return concurrencySpec(name, c, defaultPermitTTL)
	}))
}

// concurrencySpec returns the Spec of a fleet-wide concurrency limit named
// name: permits are members of a sorted set scored by start time, and
// permits older than ttl (held by a process that died) are swept.
func concurrencySpec(name string, c *limit.Concurrency, ttl time.Duration) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if ttl <= 0 {
		return nil, param.Errorf("ttl", "redis: concurrency %q: ttl must be > 0", name)
	}
	if err := checkCount("concurrency", name, c.Limit()); err != nil {
		return nil, err
	}
	return &Spec{name: name, layout: "conc", script: concurrencyScript, limit: c.Limit(), permits: true, meta: true,
		fixed: []string{packDoubles(c.Limit(), ttl.Microseconds())}}, nil
}
