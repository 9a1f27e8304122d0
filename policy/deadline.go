package policy

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/shed"
)

var deadlineKind = &kind{
	name:    "deadline",
	example: `{name: deadline, kind: deadline, percentile: 90%}`,
	doc: "Deadline test (shed.Deadline): admit only when the predicted wait in the policy's wait queue (Q: the first " +
		"gate with queue:, 0 without one), plus a percentile of the class's recent service times (S), plus reserve and " +
		"margin, is less than the time the request has left (Q + S + R + U < D). Place it before the gates it protects. " +
		"Rejects with reason deadline (503), not retryable as sent; requests without a deadline, classes with too " +
		"few completions yet, and one request a retest of a class that fails the test, pass. Late completions teach it " +
		"as useful ones do.",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonDeadline),
	new:     func() params { return &deadlineParams{} },
}

type deadlineParams struct {
	percentile float64
	reserve    time.Duration
	margin     time.Duration
	minSamples int64
	retest     time.Duration
	halfLife   time.Duration
}

func (p *deadlineParams) fields() []field {
	return []field{
		shareField("percentile", "the percentile of recent service times a request is predicted to take, e.g. 90%", &p.percentile).dflt("90%%").nonZero(),
		durationField("reserve", "time a response still needs after the work (R)", &p.reserve, 0).dflt("0s"),
		durationField("margin", "safety margin (U)", &p.margin, 0).dflt("0s"),
		intField("min_samples", "completions of a class before its estimate is trusted", &p.minSamples, 1, 1<<20).dflt("20").feeds("MinSamples"),
		durationField("retest", "how often a class that fails the test on its service time alone still lets one request through, so that its estimate follows a service that got faster (one that comes back in time cuts what the class learned before to a quarter and lets the next through at once; one that comes back late is followed by the next after twice its latency, doubling up to this)", &p.retest, time.Millisecond).dflt("1s"),
		durationField("half_life", "how fast the service-time estimates forget by time (they also forget by number: the last few hundred completions)", &p.halfLife, time.Millisecond).dflt("1s"),
	}
}

func (p *deadlineParams) options() shed.DeadlineOptions {
	return shed.DeadlineOptions{Percentile: p.percentile, Reserve: p.reserve, Margin: p.margin, MinSamples: int(p.minSamples), Retest: p.retest, HalfLife: p.halfLife}
}

func (p *deadlineParams) check(c *checker) {
	if _, err := shed.NewDeadline(c.g.Name, p.options()); err != nil {
		c.fail(err)
	}
}

func (p *deadlineParams) build(b *builder) (sluice.Gate, error) {
	return shed.NewDeadline(b.g.Name, p.options())
}

func (p *deadlineParams) stateKey() string { return "" }

func (p *deadlineParams) describe(g *Gate) string {
	pct := p.percentile
	if pct == 0 {
		pct = 0.9
	}
	return fmt.Sprintf("deadline test: p%.0f of recent service times + reserve %v + margin %v < the time left%s", 100*pct, p.reserve, p.margin, classesOnly(g))
}

// afterWork: see workBound.
func (p *deadlineParams) afterWork() string {
	return "predicts from the service times of completed work"
}
