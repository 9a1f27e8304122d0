package adaptive

import "time"

// AIMDConfig configures an AIMD controller. Zero fields take the defaults
// of Netflix's AIMDLimit.
type AIMDConfig struct {
	// Initial, Min and Max bound the limit. Defaults 20, 20, 200.
	Initial, Min, Max int
	// Backoff multiplies the limit after a drop, in [0.5, 1). Default 0.9.
	Backoff float64
	// Timeout is the RTT beyond which a window counts as a drop. Default
	// 5 s.
	Timeout time.Duration
}

// aimd is the state of the AIMD controller (NewAIMD).
type aimd struct {
	cfg   AIMDConfig
	limit int
}

var _ Controller = (*aimd)(nil)

// NewAIMD returns the AIMD controller, at cfg.Initial; an invalid
// configuration is an error that wraps ErrInvalidConfig.
//
// AIMD is additive increase, multiplicative decrease (concurrency-limits,
// limit/AIMDLimit.java): a window with a drop, or slower than Timeout,
// multiplies the limit by Backoff (truncated); any other window that saw
// at least half the limit in flight adds one.
func NewAIMD(cfg AIMDConfig) (Controller, error) { return controller(newAIMD(cfg)) }

// newAIMD is NewAIMD with the concrete type (for the package's tests).
func newAIMD(cfg AIMDConfig) (*aimd, error) {
	if err := bounds(&cfg.Initial, &cfg.Min, &cfg.Max, 20, 20, 200); err != nil {
		return nil, err
	}
	if cfg.Backoff == 0 {
		cfg.Backoff = 0.9
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	switch {
	case !(cfg.Backoff >= 0.5 && cfg.Backoff < 1):
		return nil, configErr("aimd: backoff %v, want [0.5, 1)", cfg.Backoff)
	case cfg.Timeout < 0:
		return nil, configErr("aimd: negative timeout")
	}
	return &aimd{cfg: cfg, limit: cfg.Initial}, nil
}

// Update applies one window.
func (a *aimd) Update(w Window) int {
	if w.Samples == 0 {
		return a.limit
	}
	l := a.limit
	switch {
	case w.Dropped || w.RTT > a.cfg.Timeout:
		l = int(float64(l) * a.cfg.Backoff)
	case w.InFlight*2 >= l:
		l++
	}
	a.limit = min(a.cfg.Max, max(a.cfg.Min, l))
	return a.limit
}

// Limit returns the current limit.
func (a *aimd) Limit() int { return a.limit }
