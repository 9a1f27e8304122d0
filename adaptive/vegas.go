package adaptive

import (
	"math"
	"math/rand/v2"
	"time"
)

// VegasConfig configures a Vegas controller. Zero fields take the
// defaults of Netflix's VegasLimit.
type VegasConfig struct {
	// Initial, Min and Max bound the limit. Defaults 20, 1, 1000.
	Initial, Min, Max int
	// Smoothing is how much of each new limit is taken, in (0, 1].
	// Default 1.
	Smoothing float64
	// Alpha, Beta and Threshold are, for a limit L, the queue sizes (in
	// requests) below which the limit grows, above which it shrinks, and
	// below which it grows fast. Defaults 3·log10root(L), 6·log10root(L)
	// and log10root(L), where log10root(L) = max(1, ⌊log10 L⌋).
	Alpha, Beta, Threshold func(limit int) int
	// Increase and Decrease step the limit. Defaults L + log10root(L) and
	// L − log10root(L).
	Increase, Decrease func(limit float64) float64
	// ProbeMultiplier sets how often the no-load RTT is measured afresh:
	// after about ProbeMultiplier·L windows (jittered by a factor in
	// [0.5, 1)). Default 30.
	ProbeMultiplier int
	// Rand is the uniform [0, 1) source of the probe's jitter. Default
	// math/rand/v2.
	Rand func() float64
}

// vegas is the state of the Vegas controller (NewVegas).
type vegas struct {
	cfg        VegasConfig
	est        float64
	noLoad     float64 // ns; 0: unknown
	probeCount int
	jitter     float64
}

var _ Controller = (*vegas)(nil)

// log10root is max(1, ⌊log10 n⌋).
func log10root(n int) int {
	if n < 1 {
		return 1
	}
	return max(1, int(math.Log10(float64(n))))
}

// NewVegas returns the Vegas controller, at cfg.Initial; an invalid
// configuration is an error that wraps ErrInvalidConfig.
//
// Vegas is Netflix's Vegas limit (concurrency-limits, limit/VegasLimit.java),
// TCP Vegas' delay-based congestion avoidance applied to concurrency: with
// the no-load RTT as the shortest seen, a window of RTT r at limit L has
// about queue = ⌈L·(1 − noLoad/r)⌉ requests waiting. Below Threshold the
// limit grows by Beta, below Alpha by Increase, above Beta it shrinks by
// Decrease, and in [Alpha, Beta] it stays. A dropped request shrinks it; a
// window that saw fewer than half the limit in flight, or a new shortest
// RTT, changes nothing. Every ~ProbeMultiplier·L windows the no-load RTT is
// taken afresh from the window, so it follows a service that got slower.
func NewVegas(cfg VegasConfig) (Controller, error) { return controller(newVegas(cfg)) }

// newVegas is NewVegas with the concrete type (for the package's tests).
func newVegas(cfg VegasConfig) (*vegas, error) {
	if err := bounds(&cfg.Initial, &cfg.Min, &cfg.Max, 20, 1, 1000); err != nil {
		return nil, err
	}
	if cfg.Smoothing == 0 {
		cfg.Smoothing = 1
	}
	if !(cfg.Smoothing > 0 && cfg.Smoothing <= 1) {
		return nil, paramErr("smoothing", "vegas: smoothing %v, want (0, 1]", cfg.Smoothing)
	}
	if cfg.Alpha == nil {
		cfg.Alpha = func(l int) int { return 3 * log10root(l) }
	}
	if cfg.Beta == nil {
		cfg.Beta = func(l int) int { return 6 * log10root(l) }
	}
	if cfg.Threshold == nil {
		cfg.Threshold = log10root
	}
	if cfg.Increase == nil {
		cfg.Increase = func(l float64) float64 { return l + float64(log10root(int(l))) }
	}
	if cfg.Decrease == nil {
		cfg.Decrease = func(l float64) float64 { return l - float64(log10root(int(l))) }
	}
	if cfg.ProbeMultiplier == 0 {
		cfg.ProbeMultiplier = 30
	}
	if cfg.ProbeMultiplier < 1 {
		return nil, configErr("vegas: probe multiplier %d, want ≥ 1", cfg.ProbeMultiplier)
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	v := &vegas{cfg: cfg, est: float64(cfg.Initial)}
	v.resetJitter()
	return v, nil
}

func (v *vegas) resetJitter() { v.jitter = 0.5 + v.cfg.Rand()/2 }

// Update applies one window.
func (v *vegas) Update(w Window) int {
	if w.Samples == 0 || w.RTT <= 0 {
		return v.Limit()
	}
	rtt := float64(w.RTT)
	v.probeCount++
	if v.jitter*float64(v.cfg.ProbeMultiplier)*v.est <= float64(v.probeCount) {
		v.resetJitter()
		v.probeCount = 0
		v.noLoad = rtt // measure the no-load RTT afresh
		return v.Limit()
	}
	if v.noLoad == 0 || rtt < v.noLoad {
		v.noLoad = rtt // a new shortest RTT never moves the limit
		return v.Limit()
	}
	l := int(v.est)
	queue := int(math.Ceil(v.est * (1 - v.noLoad/rtt)))
	var next float64
	switch {
	case w.Dropped:
		next = v.cfg.Decrease(v.est)
	case float64(w.InFlight)*2 < v.est:
		return v.Limit() // the service was not using the limit
	case queue <= v.cfg.Threshold(l):
		next = v.est + float64(v.cfg.Beta(l))
	case queue < v.cfg.Alpha(l):
		next = v.cfg.Increase(v.est)
	case queue > v.cfg.Beta(l):
		next = v.cfg.Decrease(v.est)
	default:
		return v.Limit() // within [Alpha, Beta]
	}
	next = clamp(next, v.cfg.Min, v.cfg.Max)
	v.est = clamp((1-v.cfg.Smoothing)*v.est+v.cfg.Smoothing*next, v.cfg.Min, v.cfg.Max)
	return v.Limit()
}

// Limit returns the current limit.
func (v *vegas) Limit() int { return int(v.est) }

// Estimate returns the limit before truncation.
func (v *vegas) Estimate() float64 { return v.est }

// NoLoadRTT returns the no-load RTT the controller measures queues against.
func (v *vegas) NoLoadRTT() time.Duration { return time.Duration(v.noLoad) }
