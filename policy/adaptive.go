package policy

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/adaptive"
	"github.com/sluice-go/sluice/internal/param"
)

var adaptiveKind = &kind{
	name:    "adaptive_concurrency",
	example: `{name: adaptive, kind: adaptive_concurrency, queue: {max_wait: 200ms}}`,
	doc: "Adaptive concurrency limit (adaptive.Gate): a service-wide limit on requests in flight that a controller sets " +
		"from the service's own completions — bbr (the default: the service's bottleneck rate × its no-load RTT, " +
		"measured afresh by periodic probes, so that it holds through a long overload and for a service of one worker), " +
		"gradient2, vegas or aimd (Netflix concurrency-limits, as published) on response times, queue_delay (Breakwater) " +
		"on this process's goroutine scheduling delay. Useful and late completions feed it with their latency, failed " +
		"and cancelled work does not. Rejects with reason concurrency (503) and retry_hint as retry-after.",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonConcurrency),
	new:     func() params { return &adaptiveParams{controller: "bbr"} },
}

type adaptiveParams struct {
	controller      string
	initial, lo, hi int64
	target          time.Duration
	window          time.Duration
	minSamples      int64
	tolerance       float64
	smoothing       float64
	headroom        float64
	probeInterval   time.Duration
	queue           queueSettings
}

func (p *adaptiveParams) fields() []field {
	return []field{
		choiceField("controller", "what sets the limit", &p.controller, "bbr", "gradient2", "vegas", "aimd", "queue_delay").dflt("bbr"),
		intField("initial", "the limit before the first window", &p.initial, 1, 1<<20).dflt("the controller's (bbr: 1; the others: 20), within min and max"),
		intField("min", "the lowest limit", &p.lo, 1, 1<<20).dflt("the controller's (gradient2, aimd: 20; bbr, vegas, queue_delay: 1)"),
		intField("max", "the highest limit", &p.hi, 1, 1<<20).dflt("the controller's (gradient2, aimd: 200; vegas, queue_delay: 1000; bbr: 10000)"),
		durationField("target", "queue_delay: the scheduling delay to stay under", &p.target, time.Microsecond).dflt("required for queue_delay"),
		durationField("window", "the length of a controller window (twice the shortest RTT, within this)", &p.window, time.Millisecond).dflt("1s"),
		intField("min_samples", "completions a window needs to count", &p.minSamples, 1, 1<<20).dflt("10"),
		positiveShareField("tolerance", "gradient2: how much slower than the long-term RTT a window may be before the limit shrinks, ≥ 1", &p.tolerance).dflt("1.5"),
		positiveShareField("smoothing", "gradient2, vegas: how much of each window's new limit is taken, in (0, 1] (1: no smoothing)", &p.smoothing).dflt("gradient2 0.2, vegas 1"),
		positiveShareField("headroom", "bbr: how far above the estimated capacity (bottleneck rate × no-load RTT) the limit sits, in (0, 1]; the service queues about this share of its service time", &p.headroom).dflt("0.1"),
		durationField("probe_interval", "bbr: how often, while the service queues, the limit drops for a window so that the no-load RTT is measured again (on wall-clock multiples, the same in every process of a fleet)", &p.probeInterval, time.Second).dflt("10s"),
		queueField(&p.queue),
	}
}

// gate builds the gate (and checks the settings). virtual: the chain's
// clock is a simulator's, whose probes must not depend on the real time
// at which it runs.
func (p *adaptiveParams) gate(name string, retry time.Duration, virtual bool) (*adaptive.Gate, error) {
	initial, lo, hi := int(p.initial), int(p.lo), int(p.hi)
	var c adaptive.Controller
	var err error
	opts := adaptive.GateOptions{RetryHint: retry, Window: adaptive.WindowConfig{MinTime: p.window, MaxTime: p.window, MinSamples: int(p.minSamples)}}
	switch p.controller {
	case "bbr":
		cfg := adaptive.BBRConfig{Initial: initial, Min: lo, Max: hi, Headroom: p.headroom, ProbeInterval: p.probeInterval}
		if virtual {
			cfg.Epoch = time.Unix(0, 0)
		}
		c, err = adaptive.NewBBR(cfg)
	case "gradient2":
		c, err = adaptive.NewGradient2(adaptive.Gradient2Config{Initial: initial, Min: lo, Max: hi, Tolerance: p.tolerance, Smoothing: p.smoothing})
	case "vegas":
		c, err = adaptive.NewVegas(adaptive.VegasConfig{Initial: initial, Min: lo, Max: hi, Smoothing: p.smoothing})
	case "aimd":
		c, err = adaptive.NewAIMD(adaptive.AIMDConfig{Initial: initial, Min: lo, Max: hi})
	case "queue_delay":
		c, err = adaptive.NewQueueDelay(adaptive.QueueDelayConfig{Initial: initial, Min: lo, Max: hi, Target: p.target})
		opts.QueueDelay = adaptive.SchedulingDelay()
	}
	if err != nil {
		return nil, err
	}
	return adaptive.NewGate(name, c, opts)
}

func (p *adaptiveParams) check(c *checker) {
	if p.target != 0 && p.controller != "queue_delay" {
		c.failf("target", "applies to controller queue_delay only")
	}
	if p.tolerance != 0 && p.controller != "gradient2" {
		c.failf("tolerance", "applies to controller gradient2 only")
	}
	if p.smoothing != 0 && p.controller != "gradient2" && p.controller != "vegas" {
		c.failf("smoothing", "applies to controllers gradient2 and vegas only")
	}
	if p.headroom != 0 && p.controller != "bbr" {
		c.failf("headroom", "applies to controller bbr only")
	}
	if p.probeInterval != 0 && p.controller != "bbr" {
		c.failf("probe_interval", "applies to controller bbr only")
	}
	if _, err := p.gate(c.g.Name, c.g.RetryHint, false); err != nil {
		c.fail(err)
	}
	p.queue.check(c, false)
}

func (p *adaptiveParams) build(b *builder) (sluice.Gate, error) {
	if b.opts.Virtual && p.controller == "queue_delay" {
		return nil, param.Errorf("controller", "controller queue_delay reads this process's scheduler, which a simulated clock does not drive")
	}
	if b.opts.Upstream && p.controller == "queue_delay" {
		return nil, param.Errorf("controller", "controller queue_delay reads this process's goroutine scheduling delay, which in front of an upstream says nothing of the upstream's queue: use bbr (the default), whose RTTs against the upstream's no-load RTTs are that queue")
	}
	g, err := p.gate(b.g.Name, b.g.RetryHint, b.opts.Virtual)
	if err != nil {
		return nil, err
	}
	return p.queue.wrap(b, g)
}

func (p *adaptiveParams) stateKey() string { return "" }

func (p *adaptiveParams) describe(g *Gate) string {
	return fmt.Sprintf("adaptive concurrency limit (%s)%s%s", p.controller, p.queue.describe(), classesOnly(g))
}

// afterWork: see workBound.
func (p *adaptiveParams) afterWork() string {
	return "sizes its limit from the latencies of completed work and holds a slot until the work ends"
}
