package redis

import (
	_ "embed"
	"time"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.SlidingLog: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/slidinglog.lua
var slidingLogLua string

var (
	slidingLogScript = newScript(preludeLua + commonLua + slidingLogLua)
)

func init() { registerTwin(twinOf(slidingLogSpec)) }

// slidingLogSpec returns the Spec of a keyed exact sliding log named name: a
// sorted set of up to limit entries per key. The window must be whole
// microseconds.
func slidingLogSpec(name string, w *limit.SlidingLog) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if w.Window()%time.Microsecond != 0 {
		return nil, param.Errorf("window", "redis: sliding log %q: window %v is not whole microseconds", name, w.Window())
	}
	if err := checkCount("sliding log", name, w.Limit()); err != nil {
		return nil, err
	}
	return &Spec{name: name, layout: "slog:" + w.Window().String(), script: slidingLogScript, limit: w.Limit(), window: w.Window(), meta: true,
		fixed: []string{packDoubles(w.Limit(), w.Window().Microseconds(), ttlMs(w.Window()))}}, nil
}
