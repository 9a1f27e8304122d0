package redis

import (
	_ "embed"
	"time"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.SlidingWindow: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/slidingwindow.lua
var slidingWindowLua string

var (
	slidingWindowScript = newScript(preludeLua + commonLua + slidingWindowLua)
	slidingWindowBatch  = newScript(batchSource(commonLua, slidingWindowLua))
)

func init() { registerTwin(twinOf(slidingWindowSpec)) }

// slidingWindowSpec returns the Spec of a keyed sliding window counter named
// name. The window must be whole microseconds and limit × window (µs) below
// 2^53.
func slidingWindowSpec(name string, w *limit.SlidingWindow) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	us := w.Window().Microseconds()
	if w.Window()%time.Microsecond != 0 {
		return nil, param.Errorf("window", "redis: sliding window %q: window %v is not whole microseconds", name, w.Window())
	}
	if w.Limit() > maxExact/us {
		return nil, param.Errorf("limit", "redis: sliding window %q: limit %d × window %v exceeds 2^53 µs", name, w.Limit(), w.Window())
	}
	return &Spec{name: name, layout: "sw:" + w.Window().String(), script: slidingWindowScript, batch: slidingWindowBatch, limit: w.Limit(), window: w.Window(), debits: true,
		fixed: []string{packDoubles(w.Limit(), us, ttlMs(2*w.Window()))}}, nil
}
