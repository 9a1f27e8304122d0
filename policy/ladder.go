package policy

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/shed"
)

var ladderKind = &kind{
	name:    "ladder",
	example: `{name: ladder, kind: ladder, workers: 8, degrade: {enter: 0.8, exit: 0.6}}`,
	doc: "Degradation ladder (shed.Ladder): NORMAL → DEGRADE → SHED → RECOVER on demand (offered work ÷ workers), with " +
		"hysteresis, a minimum dwell and a staged recovery ramp. DEGRADE admits everything at level degrade (handlers " +
		"serve the cheaper result); SHED admits only the protected classes. Rejects with reason overload (503).",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonOverload),
	new:     func() params { return &ladderParams{} },
}

type ladderParams struct {
	cfg     shed.LadderConfig
	cohorts *fair.CohortOptions
}

func (p *ladderParams) fields() []field {
	d := shed.LadderConfig{}.WithDefaults()
	return []field{
		thresholdsField("degrade", "demand at or above enter: NORMAL → DEGRADE; back below exit", &p.cfg.DegradeEnter, &p.cfg.DegradeExit).
			dflt("{enter: %v, exit: %v}", d.DegradeEnter, d.DegradeExit).feeds("DegradeEnter", "DegradeExit"),
		thresholdsField("shed", "demand at or above enter: → SHED from any state; SHED → RECOVER below exit", &p.cfg.ShedEnter, &p.cfg.ShedExit).
			dflt("{enter: %v, exit: %v}", d.ShedEnter, d.ShedExit).feeds("ShedEnter", "ShedExit"),
		durationField("min_dwell", "least time in a state before stepping down", &p.cfg.MinDwell, 0).dflt("%v", d.MinDwell).nonZero().feeds("MinDwell"),
		sharesField("recover", "shares of non-protected load admitted in RECOVER, one step each", &p.cfg.RecoverSteps).
			dflt("%s", percents(d.RecoverSteps)).feeds("RecoverSteps"),
		durationField("step_every", "length of each recovery step", &p.cfg.StepEvery, time.Millisecond).dflt("%v", d.StepEvery).feeds("StepEvery"),
		durationField("sample_every", "demand sample interval", &p.cfg.SampleEvery, time.Millisecond).dflt("%v", d.SampleEvery).feeds("SampleEvery"),
		classesField("protected", "classes never shed", &p.cfg.Protected).dflt("[%s]", strings.Join(d.Protected, ", ")).feeds("Protected"),
		intField("workers", "capacity the demand is divided by (requests the service runs at once)", &p.cfg.Workers, 1, 1<<30).must().feeds("Workers"),
		cohortsField("in RECOVER, shed what the step does not admit", &p.cohorts),
	}
}

func (p *ladderParams) check(c *checker) {
	if err := p.cfg.Validate(); err != nil {
		c.fail(err)
	}
	c.known("protected", p.cfg.Protected, "unknown tier or class %q (classes the routes assign: %s)")
	c.protectedUpward("protected", p.cfg.Protected)
	checkCut(c, p.cohorts)
}

func (p *ladderParams) build(b *builder) (sluice.Gate, error) {
	cfg := p.cfg
	cfg.RetryHint, cfg.Rand = b.g.RetryHint, b.opts.Rand
	c, err := cut(b.g.Name, p.cohorts, nil, b)
	if err != nil {
		return nil, err
	}
	if c != nil {
		cfg.Cut = c
	}
	return shed.NewLadder(b.g.Name, cfg)
}

func (p *ladderParams) stateKey() string { return "" }

func (p *ladderParams) describe(g *Gate) string {
	return fmt.Sprintf("degradation ladder on demand ÷ %d workers (see STATE MACHINE)%s", p.cfg.Workers, classesOnly(g))
}

// stateMachine is the ladder's part of the spec: one line per state.
func (p *ladderParams) stateMachine() [][2]string {
	c := p.cfg.WithDefaults()
	return [][2]string{
		{"NORMAL entry/exit and full behavior", fmt.Sprintf("entered when demand (offered work ÷ %d workers) falls below %v in DEGRADE for %v, or after the last recovery step; admits everything", c.Workers, c.DegradeExit, c.MinDwell)},
		{"DEGRADE entry/exit and quality contract", fmt.Sprintf("demand at or above %v; left below %v after %v; admits everything with level degrade in the request context and a Sluice-Level header, so handlers serve the cheaper result", c.DegradeEnter, c.DegradeExit, c.MinDwell)},
		{"SHED entry/exit and surviving classes", fmt.Sprintf("demand at or above %v from any state, at once; left below %v after %v; only %s are admitted, others get 503 overload", c.ShedEnter, c.ShedExit, c.MinDwell, strings.Join(c.Protected, ", "))},
		{"RECOVER ramp, warm-up, and backlog gates", fmt.Sprintf("admits %s of non-protected load, one step every %v, then NORMAL; back to DEGRADE or SHED if demand rises again", percents(c.RecoverSteps), c.StepEvery)},
	}
}

// percents renders shares as "25%, 50%, 75%".
func percents(shares []float64) string {
	parts := make([]string, len(shares))
	for i, s := range shares {
		parts[i] = fmt.Sprintf("%.0f%%", 100*s)
	}
	return strings.Join(parts, ", ")
}

// afterWork: see workBound.
func (p *ladderParams) afterWork() string {
	return "measures demand from its count of requests in flight"
}
