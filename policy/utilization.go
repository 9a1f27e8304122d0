package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/fair"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/shed"
)

var utilizationKind = &kind{
	name:    "utilization",
	example: `{name: util, kind: utilization, workers: 8, tiers: [sheddable, default, critical]}`,
	doc: "Worker utilization shedder (shed.NewUtilization, after Stripe's \"Scaling your API with rate limiters\"): a slow " +
		"controller turns utilization into a shed fraction that grows above bad, decays below good and holds between, " +
		"and the fraction sheds the tiers in order, lowest first. Rejects with reason overload (503).",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonOverload),
	new:     func() params { return &utilizationParams{} },
}

// Sources of utilization.
const (
	sourceWorkers = "workers"
	sourceCPU     = "cpu"
)

type utilizationParams struct {
	ctrl        shed.ControllerConfig
	tiers       []string
	workers     int64
	sampleEvery time.Duration
	costAware   bool
	source      string
	cohorts     *fair.CohortOptions
}

func (p *utilizationParams) fields() []field {
	c := shed.ControllerConfig{}.WithDefaults()
	o := shed.UtilizationOptions{}.WithDefaults()
	return []field{
		shareField("good", "utilization below which shedding decays", &p.ctrl.Good).dflt("%v", c.Good).nonZero().feeds("Good"),
		shareField("bad", "utilization above which shedding grows (between good and bad nothing moves)", &p.ctrl.Bad).dflt("%v", c.Bad).nonZero().feeds("Bad"),
		durationField("delay", "how long utilization stays above bad before the first shed", &p.ctrl.Delay, 0).dflt("%v", c.Delay).nonZero().feeds("Delay"),
		durationField("shed_all_after", "time from the first shed to shedding everything at full pressure", &p.ctrl.ShedAllAfter, time.Second).
			dflt("%v", c.ShedAllAfter).feeds("ShedAllAfter"),
		classesField("tiers", "classes in shed order, first shed first; every class the routes assign, in the class order (see classes)", &p.tiers).dflt("the class order, least protected first"),
		intField("workers", "workers of the own accounting: utilization is requests in flight through the gate ÷ workers", &p.workers, 1, 1<<30),
		durationField("sample_every", "sample interval", &p.sampleEvery, time.Millisecond).dflt("%v", o.SampleEvery),
		boolField("cost_aware", "shed the costliest requests of a partly shed tier first", &p.costAware).dflt("false"),
		choiceField("source", "what utilization is measured on: the own accounting or this process's CPU", &p.source, sourceWorkers, sourceCPU).
			dflt(sourceWorkers),
		cohortsField("shed the fraction", &p.cohorts),
	}
}

func (p *utilizationParams) check(c *checker) {
	if err := p.ctrl.Validate(); err != nil {
		c.fail(err)
	}
	if p.source != sourceCPU && p.workers < 1 {
		c.failf("workers", "missing: the own accounting needs workers (or set source: cpu)")
	}
	c.known("tiers", p.tiers, "unknown tier or class %q (classes the routes assign: %s)")
	c.shedTiers("tiers", p.tiers)
	checkCut(c, p.cohorts)
}

func (p *utilizationParams) build(b *builder) (sluice.Gate, error) {
	tiers := p.tiers
	if len(tiers) == 0 {
		tiers = b.order
		slices.Reverse(tiers)
	}
	opts := shed.UtilizationOptions{Tiers: tiers, Workers: p.workers, SampleEvery: p.sampleEvery,
		CostAware: p.costAware, RetryHint: b.g.RetryHint, Rand: b.opts.Rand}
	if p.source == sourceCPU {
		if b.opts.Virtual {
			return nil, param.Errorf("source", "source cpu is this process's real CPU, which a virtual clock does not move: use source: workers")
		}
		opts.Source = shed.NewCPUSource()
	}
	c, err := cut(b.g.Name, p.cohorts, tiers, b)
	if err != nil {
		return nil, err
	}
	if c != nil {
		opts.Cut = c
	}
	return shed.NewUtilization(b.g.Name, p.ctrl, opts)
}

func (p *utilizationParams) stateKey() string { return "" }

func (p *utilizationParams) describe(g *Gate) string {
	c := p.ctrl.WithDefaults()
	src := fmt.Sprintf("in flight ÷ %d workers", p.workers)
	if p.source == sourceCPU {
		src = "process CPU"
	}
	tiers := strings.Join(p.tiers, " -> ")
	if len(p.tiers) == 0 {
		tiers = "in the class order, least protected first"
	}
	cut := "tiers shed in order " + tiers
	if p.cohorts != nil {
		co := p.cohorts
		n, period := co.Cohorts, co.Period
		if n == 0 {
			n = 128
		}
		if period == 0 {
			period = time.Minute
		}
		cut = fmt.Sprintf("an exact cut over (tier %s, tenant cohort of %d), the cohorts' order rotating every %v", tiers, n, period)
	}
	return fmt.Sprintf("utilization shedder on %s: good %v, bad %v, delay %v, everything shed %v after the first shed at full pressure; %s; 503 overload%s",
		src, c.Good, c.Bad, c.Delay, c.ShedAllAfter, cut, classesOnly(g))
}

// afterWork: see workBound.
func (p *utilizationParams) afterWork() string {
	if p.source == sourceCPU {
		return "measures this process's CPU, the decision service's and not the upstream's"
	}
	return "measures utilization from its count of requests in flight"
}
