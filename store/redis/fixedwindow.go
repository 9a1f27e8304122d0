package redis

import (
	_ "embed"
	"time"

	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/limit"
)

// The Lua twin of *limit.FixedWindow: its script, the function that checks its
// parameters and packs them, and its registration (SpecOf finds it).

//go:embed lua/fixedwindow.lua
var fixedWindowLua string

var (
	fixedWindowScript = newScript(preludeLua + commonLua + fixedWindowLua)
	fixedWindowBatch  = newScript(batchSource(commonLua, fixedWindowLua))
	// a count (Counter): the batched form answers {status, count}
	counterBatch = newScript(counterBatchSource(commonLua))
)

func init() { registerTwin(twinOf(fixedWindowSpec)) }

// fixedWindowSpec returns the Spec of a keyed fixed window named name. Windows
// are aligned on Redis time and must be whole microseconds.
func fixedWindowSpec(name string, w *limit.FixedWindow) (*Spec, error) {
	if err := checkName(name); err != nil {
		return nil, err
	}
	if w.Window()%time.Microsecond != 0 {
		return nil, param.Errorf("window", "redis: fixed window %q: window %v is not whole microseconds", name, w.Window())
	}
	if err := checkCount("fixed window", name, w.Limit()); err != nil {
		return nil, err
	}
	return &Spec{name: name, layout: "fw:" + w.Window().String(), script: fixedWindowScript, batch: fixedWindowBatch, limit: w.Limit(), window: w.Window(), debits: true,
		fixed: []string{packDoubles(w.Limit(), w.Window().Microseconds())}}, nil
}

// Counter returns the Spec of a keyed count of every unit taken in fixed
// windows of w, aligned on Redis time (or the DecisionClock): a fixed window
// whose limit no count reaches (MaxCount), so that a take always counts and
// its answer is the count (MaxCount − Remaining). It is the window counter
// of envoyproxy/ratelimit (whose caller compares the count with its rules'
// limits), and keeps FixedWindow's state and semantics exactly, but its
// batched steps cost Redis half as much (counterBatchSource): a batched
// answer carries only Status and Remaining.
func Counter(name string, w *limit.FixedWindow) (*Spec, error) {
	sp, err := fixedWindowSpec(name, w)
	if err != nil {
		return nil, err
	}
	if w.Limit() != MaxCount {
		return nil, param.Errorf("limit", "redis: counter %q: limit %d: a counter's is MaxCount (%d)", name, w.Limit(), int64(MaxCount))
	}
	sp.batch, sp.counter, sp.debits = counterBatch, true, false
	return sp, nil
}
