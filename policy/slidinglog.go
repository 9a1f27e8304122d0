package policy

import (
	"fmt"
	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/algorithm"
)

var slidingLogKind = &kind{
	name:    "sliding_log",
	example: `{name: per-minute, kind: sliding_log, limit: 60, window: 1m}`,
	doc: "Sliding log (limit.SlidingLog): one entry per admitted unit, exact over any window of the given length. " +
		"Memory grows with the limit, so the limit is at most 1,000,000 (use sliding_window above). Rejects with reason policy_rate (429).",
	scope:  sluice.ScopeTenant,
	stored: true,
	reason: always(sluice.ReasonPolicyRate),
	new:    func() params { return &slidingLogParams{newWindowParams()} },
}

type slidingLogParams struct{ windowParams }

// maxSlidingLog is the largest sliding log limit a policy accepts: the log
// keeps one entry per unit.
const maxSlidingLog = 1_000_000

func (p *slidingLogParams) algorithm() algorithmGate {
	return onAlgorithm("sliding_log", algorithm.Settings{Limit: p.limit, Window: p.window}, rateGate(p.refund))
}

func (p *slidingLogParams) check(c *checker) {
	if p.limit > maxSlidingLog {
		c.failf("limit", "sliding log keeps one entry per unit: limit %d is too large (at most %d; use sliding_window)", p.limit, maxSlidingLog)
		return
	}
	p.algorithm().check(c)
}

func (p *slidingLogParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *slidingLogParams) describe(g *Gate) string {
	// The memory estimate of the store counts a key's fixed part: a log
	// keeps an entry per request in its window on top.
	return p.text("sliding log", g) + fmt.Sprintf(" (exact; each key keeps 16 bytes per request in its window, up to %s a key)", bytesText(16*p.limit))
}

// bytesText writes n bytes in the largest unit that keeps it at 1 or more.
func bytesText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d bytes", n)
}
