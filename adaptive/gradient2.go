package adaptive

import (
	"math"
	"time"
)

// Gradient2Config configures a Gradient2 controller. Zero fields take the
// defaults of Netflix's Gradient2Limit.
type Gradient2Config struct {
	// Initial, Min and Max bound the limit. Defaults 20, 20, 200.
	Initial, Min, Max int
	// Smoothing is how much of each new estimate is taken, in (0, 1].
	// Default 0.2.
	Smoothing float64
	// Queue is the headroom added to the limit each window, given the
	// current limit: the requests allowed to queue. Default 4.
	Queue func(limit int) int
	// LongWindow is the window count of the long-term RTT average (an
	// exponential average with factor 2/(LongWindow+1), after a plain mean
	// of its first 10 samples). Default 600.
	LongWindow int
	// Tolerance is how much longer than the long-term RTT a window may take
	// before the limit shrinks, ≥ 1. Default 1.5.
	Tolerance float64
}

// gradient2 is the state of the Gradient2 controller (NewGradient2).
type gradient2 struct {
	cfg  Gradient2Config
	est  float64
	long expAvg
}

var _ Controller = (*gradient2)(nil)

// NewGradient2 returns the Gradient2 controller, at cfg.Initial; an invalid
// configuration is an error that wraps ErrInvalidConfig.
//
// Gradient2 is Netflix's Gradient2 limit (concurrency-limits,
// limit/Gradient2Limit.java): it compares each window's RTT with a
// long-term average and shrinks the limit by their ratio when the window
// is slower, then adds a small queue allowance:
//
//	gradient = max(0.5, min(1, Tolerance·long/short))
//	limit    = (1−Smoothing)·limit + Smoothing·(limit·gradient + Queue(limit))
//
// A window that saw fewer than half the limit in flight changes nothing
// (the service was not limited by it). When the long average is more than
// twice the window's RTT (recovery from an overload), the average decays
// by 5% a window. Dropped requests count only through their RTT, as in the
// original. With a long RTT of 20 ms, a window of 50 ms at a limit of 100,
// Tolerance 1 and a queue of 10, the limit goes to 0.8·100 + 0.2·(0.5·100
// + 10) = 92.
func NewGradient2(cfg Gradient2Config) (Controller, error) { return controller(newGradient2(cfg)) }

// newGradient2 is NewGradient2 with the concrete type (for the package's tests).
func newGradient2(cfg Gradient2Config) (*gradient2, error) {
	if err := bounds(&cfg.Initial, &cfg.Min, &cfg.Max, 20, 20, 200); err != nil {
		return nil, err
	}
	if cfg.Smoothing == 0 {
		cfg.Smoothing = 0.2
	}
	if cfg.Queue == nil {
		cfg.Queue = func(int) int { return 4 }
	}
	if cfg.LongWindow == 0 {
		cfg.LongWindow = 600
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = 1.5
	}
	switch {
	case !(cfg.Smoothing > 0 && cfg.Smoothing <= 1):
		return nil, paramErr("smoothing", "gradient2: smoothing %v, want (0, 1]", cfg.Smoothing)
	case cfg.LongWindow < 1:
		return nil, configErr("gradient2: long window %d, want ≥ 1", cfg.LongWindow)
	case !(cfg.Tolerance >= 1) || math.IsInf(cfg.Tolerance, 0):
		return nil, paramErr("tolerance", "gradient2: tolerance %v, want ≥ 1", cfg.Tolerance)
	}
	return &gradient2{cfg: cfg, est: float64(cfg.Initial), long: newExpAvg(cfg.LongWindow, 10)}, nil
}

// Update applies one window.
func (g *gradient2) Update(w Window) int {
	if w.Samples == 0 || w.RTT <= 0 {
		return g.Limit() // nothing learned
	}
	queue := float64(g.cfg.Queue(int(g.est)))
	short := float64(w.RTT)
	long := g.long.add(short)
	if long/short > 2 {
		g.long.scale(0.95) // recovering from an overload: let the average come down
	}
	if float64(w.InFlight) < g.est/2 {
		return g.Limit() // the service was not using the limit
	}
	gradient := max(0.5, min(1, g.cfg.Tolerance*long/short))
	next := g.est*gradient + queue
	next = g.est*(1-g.cfg.Smoothing) + next*g.cfg.Smoothing
	g.est = clamp(next, g.cfg.Min, g.cfg.Max)
	return g.Limit()
}

// Limit returns the current limit (the estimate, truncated).
func (g *gradient2) Limit() int { return int(g.est) }

// Estimate returns the limit before truncation.
func (g *gradient2) Estimate() float64 { return g.est }

// LongRTT returns the long-term RTT average.
func (g *gradient2) LongRTT() time.Duration { return time.Duration(g.long.value) }

// expAvg is Netflix's ExpAvgMeasurement: a plain mean of the first warmup
// samples, then an exponential average with factor 2/(window+1).
type expAvg struct {
	value  float64
	sum    float64 // of the warmup samples
	count  int
	warmup int
	factor float64
}

func newExpAvg(window, warmup int) expAvg {
	return expAvg{warmup: warmup, factor: 2 / float64(window+1)}
}

// add takes a sample and returns the new average.
func (e *expAvg) add(x float64) float64 {
	if e.count < e.warmup {
		e.count++
		e.sum += x
		e.value = e.sum / float64(e.count)
	} else {
		e.value = e.value*(1-e.factor) + x*e.factor
	}
	return e.value
}

func (e *expAvg) scale(f float64) { e.value *= f }
