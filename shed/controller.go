package shed

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// ControllerConfig configures the slow controller of a utilization shedder
// (NewUtilization): it turns utilization samples into a shed fraction. The
// defaults follow the worker utilization load shedder of Paul Tarjan's
// "Scaling your API with rate limiters" (Stripe, 2017): a dead zone
// between 0.7 and 0.8, three 8-second samples of pressure before the first
// shed, two minutes from nothing shed to everything.
type ControllerConfig struct {
	// Good is the utilization below which shedding decays. Default 0.7.
	Good float64
	// Bad is the utilization above which shedding grows. Default 0.8.
	// Between Good and Bad nothing moves (the dead zone).
	Bad float64
	// Delay is how long utilization must stay at or above Bad before the
	// first request is shed. Default 28 s (three samples at 8 s).
	Delay time.Duration
	// ShedAllAfter is how long full pressure (utilization 1) takes to go
	// from shedding nothing to shedding everything. Default 120 s.
	ShedAllAfter time.Duration
}

func (c *ControllerConfig) defaults() {
	if c.Good == 0 {
		c.Good = 0.7
	}
	if c.Bad == 0 {
		c.Bad = 0.8
	}
	if c.Delay == 0 {
		c.Delay = 28 * time.Second
	}
	if c.ShedAllAfter == 0 {
		c.ShedAllAfter = 120 * time.Second
	}
}

// WithDefaults returns c with the defaults of the zero fields filled in.
func (c ControllerConfig) WithDefaults() ControllerConfig {
	c.defaults()
	return c
}

// Validate reports a configuration that cannot work; the error names the
// field at fault.
func (c ControllerConfig) Validate() error {
	c.defaults()
	switch {
	case !(c.Good > 0 && c.Good < 1):
		return param.Errorf("Good", "controller: good %v, want a utilization in (0, 1)", c.Good)
	case !(c.Bad > 0 && c.Bad < 1):
		return param.Errorf("Bad", "controller: bad %v, want a utilization in (0, 1)", c.Bad)
	case c.Good >= c.Bad:
		return param.Errorf("Good", "controller: good %v must be below bad %v (the dead zone lies between them)", c.Good, c.Bad)
	case c.Delay < 0:
		return param.Errorf("Delay", "controller: delay %v must not be negative", c.Delay)
	case c.ShedAllAfter <= 0:
		return param.Errorf("ShedAllAfter", "controller: shed-all-after %v must be positive", c.ShedAllAfter)
	}
	return nil
}

// controller turns utilization samples into a shed fraction in [0, 1]. It
// is a controller on the rate of change, not a threshold: each sample sets
// the derivative of the fraction, and the fraction integrates it over time.
//
//	utilization < Good:        derivative = (u/Good − 1) / ShedAllAfter  (decay)
//	Good ≤ utilization < Bad:  derivative = 0                            (dead zone)
//	utilization ≥ Bad:         derivative = (u − Bad)/(1 − Bad) / ShedAllAfter
//
// Growth starts only after utilization has stayed at or above Bad for Delay.
// So pinned at 1.0 the first shed comes Delay after pressure began and the
// fraction reaches 1 exactly ShedAllAfter later; after recovery to u it
// decays at (1 − u/Good)/ShedAllAfter per second; a signal that stays in
// the dead zone never moves it. Source: the worker utilization load shedder
// of Paul Tarjan's "Scaling your API with rate limiters" (Stripe, 2017).
//
// Times are monotonic ns. controller is not safe for concurrent use; the
// Utilization gate serializes it.
type controller struct {
	cfg ControllerConfig

	level      float64       // shed fraction × ShedAllAfter (ns): full pressure adds exactly 1 per ns
	last       clock.Instant // when level was last brought up to date
	slope      float64       // d level / d ns set by the last sample, in [-1, 1]
	pressure   bool          // the last sample was at or above Bad
	since      clock.Instant // start of the current pressure episode
	hasSamples bool
}

// newController returns a controller with cfg (defaults filled in).
func newController(cfg ControllerConfig) (*controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	return &controller{cfg: cfg}, nil
}

// Config returns the configuration in use.
func (c *controller) Config() ControllerConfig { return c.cfg }

// advance brings level up to now along the current slope, holding growth
// until the pressure episode is Delay old.
func (c *controller) advance(now clock.Instant) {
	if !c.hasSamples || now <= c.last {
		return
	}
	from := c.last
	if c.slope > 0 {
		from = max(from, c.since.Add(c.cfg.Delay))
	}
	if now > from {
		full := float64(c.cfg.ShedAllAfter)
		c.level = min(max(c.level+c.slope*float64(now-from), 0), full)
		// Snap a rounding residue below one nanosecond of full pressure.
		if c.level < 1 {
			c.level = 0
		} else if c.level > full-1 {
			c.level = full
		}
	}
	c.last = now
}

// Sample records utilization u (0 = idle, 1 = every worker busy; values
// outside [0, 1] are clamped) observed at now. NaN is no reading: the
// shedding winds down as at idle, so that a source that breaks (a NaN
// from then on) cannot hold the last slope, and shed everything, for good.
func (c *controller) Sample(now clock.Instant, u float64) {
	if math.IsNaN(u) {
		if c.hasSamples {
			// The episode goes on (pressure and its start stay): a
			// reading lost now and then does not restart the Delay, which
			// would keep shedding from ever starting.
			c.advance(now)
			c.slope = -1
		}
		return
	}
	u = min(max(u, 0), 1)
	if !c.hasSamples {
		c.hasSamples, c.last = true, now
	}
	c.advance(now)
	var amount float64
	switch {
	case u < c.cfg.Good:
		amount = u/c.cfg.Good - 1
	case u < c.cfg.Bad:
		amount = 0
	default:
		amount = (u - c.cfg.Bad) / (1 - c.cfg.Bad)
	}
	pressure := u >= c.cfg.Bad
	if pressure && !c.pressure {
		c.since = now
	}
	c.pressure = pressure
	c.slope = min(max(amount, -1), 1)
}

// Fraction returns the shed fraction at now, in [0, 1].
func (c *controller) Fraction(now clock.Instant) float64 {
	c.advance(now)
	return c.level / float64(c.cfg.ShedAllAfter)
}
