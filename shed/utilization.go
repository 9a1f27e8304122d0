package shed

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Source reports utilization in [0, 1] (e.g. process CPU); sampled once per
// sample interval by a Utilization gate that has one.
type Source interface {
	Utilization(now clock.Instant) float64
}

// UtilizationOptions configures a Utilization gate.
type UtilizationOptions struct {
	// Tiers lists the classes from the first shed to the last, e.g.
	// sandbox, sheddable, default, critical. A class not listed is shed
	// with ClassDefault's tier when that is listed, else only when every
	// listed tier is (at a shed fraction of 1): never first. Required.
	Tiers []string
	// Workers is the worker count of the gate's own accounting: utilization
	// is the mean of (requests in flight through this gate ÷ Workers) over
	// each sample interval. Required unless Source is set.
	Workers int64
	// Source, if set, replaces the own accounting (e.g. process CPU).
	Source Source
	// SampleEvery is the sample interval. Default 8 s.
	SampleEvery time.Duration
	// CostAware sheds the costliest requests of a partly shed tier first:
	// a request's shed probability is scaled by its cost over the tier's
	// recent mean cost, which keeps the tier's expected shed share.
	CostAware bool
	// RetryHint is the Retry-After of a shed request. Default SampleEvery.
	RetryHint time.Duration
	// Rand returns uniform numbers in [0, 1); default math/rand/v2.
	Rand func() float64
	// Cut, if set, decides which requests the fraction sheds, in place of
	// the tiers' probabilities (fair.Cohort: an exact cut over class tier
	// and tenant cohort). Tiers and CostAware then do not apply.
	Cut Cut
}

// Cut decides whether the shed fraction f at now falls on r; it sees
// every request the shedder decides.
type Cut interface {
	Shed(r *sluice.Request, f float64, now clock.Instant) bool
}

// WithDefaults returns o with the defaults of the zero fields filled in:
// SampleEvery 8 s, RetryHint SampleEvery, Rand math/rand/v2.
func (o UtilizationOptions) WithDefaults() UtilizationOptions {
	if o.SampleEvery <= 0 {
		o.SampleEvery = 8 * time.Second
	}
	if o.RetryHint <= 0 {
		o.RetryHint = o.SampleEvery
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	return o
}

// utilization is the gate NewUtilization returns.
type utilization struct {
	name string
	opts UtilizationOptions
	mu   sync.Mutex
	ctrl *controller

	meter    meter
	meanCost []float64 // per tier, exponentially weighted
}

var (
	_ sluice.Shedder       = (*utilization)(nil)
	_ sluice.StateReporter = (*utilization)(nil)
)

// NewUtilization returns a utilization shedder named name whose slow
// controller runs with cfg (defaults filled in).
//
// The gate is the worker utilization load shedder: a controller turns
// utilization into a shed fraction, and the fraction sheds tiers in order
// (the tier closest to the fraction is shed partly), probabilistically, with reason overload (503). It is safe for
// concurrent use.
//
// ShedFraction returns the shed fraction at now.
//
// Decide sheds r with the probability of its tier at the current fraction.
//
// Release ends an admitted request's share of the accounting.
func NewUtilization(name string, cfg ControllerConfig, opts UtilizationOptions) (sluice.Gate, error) {
	ctrl, err := newController(cfg)
	if err != nil {
		return nil, err
	}
	u, err := newUtilization(name, ctrl, opts)
	if err != nil {
		return nil, err
	}
	return u, nil
}

// newUtilization is NewUtilization driven by ctrl, with the concrete type.
func newUtilization(name string, ctrl *controller, opts UtilizationOptions) (*utilization, error) {
	switch {
	case name == "":
		return nil, errors.New("utilization: empty name")
	case ctrl == nil:
		return nil, errors.New("utilization: nil controller")
	case len(opts.Tiers) == 0:
		return nil, errors.New("utilization: no tiers")
	case opts.Source == nil && opts.Workers < 1:
		return nil, errors.New("utilization: workers must be ≥ 1 (or give a source)")
	}
	opts = opts.WithDefaults()
	if opts.Workers < 1 {
		opts.Workers = 1 // only the own accounting reads it
	}
	return &utilization{name: name, opts: opts, ctrl: ctrl, meanCost: make([]float64, len(opts.Tiers)+1),
		meter: newMeter(opts.Workers, opts.SampleEvery, false)}, nil
}

// Name returns the gate's name.
func (u *utilization) Name() string { return u.name }

// tier returns the shed order of class: a class not listed is shed with
// ClassDefault's tier when that is listed, else in a tier above every
// listed one (len(Tiers): shed only when everything is), as fair.Cohort
// places it.
func (u *utilization) tier(class string) int {
	if i := slices.Index(u.opts.Tiers, class); i >= 0 {
		return i
	}
	if i := slices.Index(u.opts.Tiers, sluice.ClassDefault); i >= 0 {
		return i
	}
	return len(u.opts.Tiers)
}

// accountLocked brings the accounting up to now and feeds the controller a
// sample when one is due. REQUIRES: u.mu held.
func (u *utilization) accountLocked(now clock.Instant) {
	first := !u.meter.started
	util, due := u.meter.update(now)
	switch {
	case first:
		u.ctrl.Sample(now, 0)
	case due && u.opts.Source != nil:
		u.ctrl.Sample(now, u.opts.Source.Utilization(now))
	case due:
		u.ctrl.Sample(now, util)
	}
}

// ShedFraction returns the shed fraction at now.
func (u *utilization) ShedFraction(now clock.Instant) float64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.accountLocked(now)
	return u.ctrl.Fraction(now)
}

// Decide sheds r with the probability of its tier at the current fraction.
func (u *utilization) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = u.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (u *utilization) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	t := u.tier(r.Class)
	u.mu.Lock()
	u.accountLocked(now)
	if u.opts.Cut != nil {
		if u.opts.Cut.Shed(r, u.ctrl.Fraction(now), now) {
			u.mu.Unlock()
			return u.reject(), 0
		}
		u.meter.admit()
		u.mu.Unlock()
		return sluice.Decision{Admitted: true}, 1
	}
	f := u.ctrl.Fraction(now)
	p := tierShed(f, t, len(u.opts.Tiers))
	if t == len(u.opts.Tiers) && f >= 1 { // above every listed tier: shed with everything
		p = 1
	}
	if u.opts.CostAware {
		m := &u.meanCost[t]
		if *m == 0 {
			*m = float64(r.Cost)
		}
		*m += (float64(r.Cost) - *m) / 32
		if p > 0 && p < 1 {
			p = min(p*float64(r.Cost) / *m, 1)
		}
	}
	if p > 0 && u.opts.Rand() < p {
		u.mu.Unlock()
		return u.reject(), 0
	}
	u.meter.admit()
	u.mu.Unlock()
	return sluice.Decision{Admitted: true}, 1
}

// reject is the shedder's rejection: overload, retryable after RetryHint.
func (u *utilization) reject() sluice.Decision {
	return sluice.Decision{Reason: sluice.ReasonOverload, Scope: sluice.ScopeService, Gate: u.name,
		Retryable: true, RetryAfter: u.opts.RetryHint}
}

// Release ends an admitted request's share of the accounting.
func (u *utilization) Release(r *sluice.Request, _ sluice.Permit, c sluice.Completion) {
	u.mu.Lock()
	u.accountLocked(c.Now)
	u.meter.release(r.Class, c.Latency)
	u.mu.Unlock()
}

// ReportState is the shedder's state for the admin API: the shed fraction
// and the resulting shed probability of each tier.
func (u *utilization) ReportState(now clock.Instant) any {
	f := u.ShedFraction(now)
	shed := map[string]float64{}
	for i, t := range u.opts.Tiers {
		shed[t] = tierShed(f, i, len(u.opts.Tiers))
	}
	return map[string]any{"shed_fraction": f, "shed_by_tier": shed}
}
