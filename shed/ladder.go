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
	"github.com/sluice-go/sluice/internal/param"
)

// LadderConfig configures a degradation Ladder. Thresholds compare with
// demand utilization: offered work ÷ capacity, measured by the gate (see
// Ladder). Zero values take the defaults.
type LadderConfig struct {
	// DegradeEnter and DegradeExit: NORMAL → DEGRADE at or above Enter,
	// back below Exit. Defaults 0.8 and 0.7.
	DegradeEnter, DegradeExit float64
	// ShedEnter and ShedExit: → SHED at or above Enter (from any state, at
	// once), SHED → RECOVER below Exit. Defaults 0.95 and 0.85.
	ShedEnter, ShedExit float64
	// MinDwell is the least time in a state before stepping down (escalation
	// to SHED never waits). Default 10 s.
	MinDwell time.Duration
	// RecoverSteps are the shares of non-protected load admitted in
	// RECOVER, one per StepEvery; after the last the ladder is NORMAL.
	// Default 0.25, 0.5, 0.75.
	RecoverSteps []float64
	// StepEvery is how long each recovery step lasts. Default 10 s.
	StepEvery time.Duration
	// SampleEvery is the utilization sample interval. Default 1 s.
	SampleEvery time.Duration
	// Protected classes are never shed by the ladder. Default: critical.
	Protected []string
	// Workers is the capacity the demand is divided by (concurrent
	// requests the service can run). Required.
	Workers int64
	// RetryHint is the Retry-After of a shed request. Default StepEvery.
	RetryHint time.Duration
	// Rand returns uniform numbers in [0, 1); default math/rand/v2.
	Rand func() float64
	// Cut, if set, decides which non-protected requests the recovery ramp
	// still sheds (the fraction 1 − the step's share), in place of a coin
	// per request: fair.Cohort sheds whole tenant cohorts, rotating, so a
	// tenant is either served or not for a period instead of losing a
	// random share of its requests.
	Cut Cut
}

func (c *LadderConfig) defaults() {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.DegradeEnter, 0.8)
	def(&c.DegradeExit, 0.7)
	def(&c.ShedEnter, 0.95)
	def(&c.ShedExit, 0.85)
	if c.MinDwell == 0 {
		c.MinDwell = 10 * time.Second
	}
	if c.RecoverSteps == nil {
		c.RecoverSteps = []float64{0.25, 0.5, 0.75}
	}
	if c.StepEvery == 0 {
		c.StepEvery = 10 * time.Second
	}
	if c.SampleEvery == 0 {
		c.SampleEvery = time.Second
	}
	if c.Protected == nil {
		c.Protected = []string{sluice.ClassCritical}
	}
	if c.RetryHint == 0 {
		c.RetryHint = c.StepEvery
	}
	if c.Rand == nil {
		c.Rand = rand.Float64
	}
}

// WithDefaults returns c with the defaults of the zero fields filled in.
func (c LadderConfig) WithDefaults() LadderConfig {
	c.defaults()
	return c
}

// Validate reports a configuration that cannot work; the error names the
// field at fault.
func (c LadderConfig) Validate() error {
	c.defaults()
	switch {
	case c.Workers < 1:
		return param.Errorf("Workers", "ladder: workers %d, want ≥ 1", c.Workers)
	case !(c.DegradeExit > 0):
		return param.Errorf("DegradeExit", "ladder: degrade exit %v, want > 0", c.DegradeExit)
	case !(c.DegradeExit < c.DegradeEnter):
		return param.Errorf("DegradeExit", "ladder: degrade exit %v must be below degrade enter %v (hysteresis)", c.DegradeExit, c.DegradeEnter)
	case !(c.ShedExit < c.ShedEnter):
		return param.Errorf("ShedExit", "ladder: shed exit %v must be below shed enter %v (hysteresis)", c.ShedExit, c.ShedEnter)
	case c.DegradeEnter > c.ShedEnter:
		return param.Errorf("ShedEnter", "ladder: shed enter %v must not be below degrade enter %v", c.ShedEnter, c.DegradeEnter)
	case c.MinDwell < 0:
		return param.Errorf("MinDwell", "ladder: min dwell %v must not be negative", c.MinDwell)
	case c.StepEvery <= 0:
		return param.Errorf("StepEvery", "ladder: step interval %v must be positive", c.StepEvery)
	case c.SampleEvery <= 0:
		return param.Errorf("SampleEvery", "ladder: sample interval %v must be positive", c.SampleEvery)
	}
	for _, s := range c.RecoverSteps {
		if !(s > 0 && s < 1) {
			return param.Errorf("RecoverSteps", "ladder: recover step %v, want a share in (0, 1)", s)
		}
	}
	if !slices.IsSorted(c.RecoverSteps) {
		return param.Errorf("RecoverSteps", "ladder: recover steps %v must increase", c.RecoverSteps)
	}
	return nil
}

// Transition is one state change of a Ladder.
type Transition struct {
	At       clock.Instant
	From, To sluice.Level
	Pressure float64 // the demand utilization that caused it
}

// Ladder is a degradation state machine: NORMAL → DEGRADE → SHED →
// RECOVER → NORMAL, with hysteresis (each state is entered above a higher
// threshold than it is left), a minimum dwell before stepping down, and a
// staged recovery ramp of admitted non-protected load.
//
// Its input is demand utilization from its own accounting: requests in
// flight through the gate per worker, plus, for each request it sheds, the
// work that request would have brought (the mean latency of admitted
// requests of its class). Measuring demand rather than admitted work is what keeps the
// ladder from oscillating: shedding lowers the work admitted, not the
// demand, so SHED holds while the overload lasts and RECOVER advances only
// when the offered load would fit.
//
// Decisions: NORMAL admits everything; DEGRADE admits everything at level
// degrade (handlers serve cheaper results, see sluice.LevelFrom); SHED
// rejects non-protected requests with reason overload (503) and admits
// protected ones at level shed; RECOVER admits the current step's share of
// non-protected requests. It is safe for concurrent use.
type Ladder struct {
	name  string
	cfg   LadderConfig
	mu    sync.Mutex
	meter meter

	state     sluice.Level
	since     clock.Instant // when the state was entered
	step      int
	stepSince clock.Instant
	pressure  float64
	spent     [sluice.LevelRecover + 1]time.Duration // time spent in each level
	lastSpent clock.Instant
	history   []Transition
}

var (
	_ sluice.Leveler       = (*Ladder)(nil)
	_ sluice.StateReporter = (*Ladder)(nil)
)

// NewLadder returns a ladder named name.
func NewLadder(name string, cfg LadderConfig) (*Ladder, error) {
	if name == "" {
		return nil, errors.New("ladder: empty name")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.defaults()
	return &Ladder{name: name, cfg: cfg, meter: newMeter(cfg.Workers, cfg.SampleEvery, true), since: -1}, nil
}

// Name returns the gate's name.
func (l *Ladder) Name() string { return l.name }

func (l *Ladder) toLocked(now clock.Instant, to sluice.Level) {
	l.history = append(l.history, Transition{At: now, From: l.state, To: to, Pressure: l.pressure})
	if len(l.history) > 256 {
		l.history = slices.Delete(l.history, 0, len(l.history)-256)
	}
	l.state, l.since = to, now
	if to == sluice.LevelRecover {
		l.step, l.stepSince = 0, now
	}
}

// sampleLocked moves the state machine on one demand sample. REQUIRES: l.mu held.
func (l *Ladder) sampleLocked(now clock.Instant, p float64) {
	l.pressure = p
	c := &l.cfg
	dwelt := now.Sub(l.since) >= c.MinDwell
	switch l.state {
	case sluice.LevelNormal:
		switch {
		case p >= c.ShedEnter:
			l.toLocked(now, sluice.LevelShed)
		case p >= c.DegradeEnter:
			l.toLocked(now, sluice.LevelDegrade)
		}
	case sluice.LevelDegrade:
		switch {
		case p >= c.ShedEnter:
			l.toLocked(now, sluice.LevelShed)
		case p < c.DegradeExit && dwelt:
			l.toLocked(now, sluice.LevelNormal)
		}
	case sluice.LevelShed:
		if p < c.ShedExit && dwelt {
			l.toLocked(now, sluice.LevelRecover)
		}
	case sluice.LevelRecover:
		switch {
		case p >= c.ShedEnter:
			l.toLocked(now, sluice.LevelShed)
		case p >= c.DegradeEnter:
			l.toLocked(now, sluice.LevelDegrade)
		case now.Sub(l.stepSince) >= c.StepEvery:
			l.step++
			l.stepSince = now
			if l.step >= len(c.RecoverSteps) {
				l.toLocked(now, sluice.LevelNormal)
			}
		}
	}
}

// updateLocked accounts time and samples. REQUIRES: l.mu held.
func (l *Ladder) updateLocked(now clock.Instant) {
	if l.since < 0 {
		l.since, l.lastSpent = now, now
	}
	if now > l.lastSpent {
		l.spent[l.state] += now.Sub(l.lastSpent)
		l.lastSpent = now
	}
	if p, due := l.meter.update(now); due {
		l.sampleLocked(now, p)
	}
}

// Decide admits, degrades or sheds r according to the state.
func (l *Ladder) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = l.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (l *Ladder) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	protected := slices.Contains(l.cfg.Protected, r.Class)
	l.mu.Lock()
	l.updateLocked(now)
	state := l.state
	shed := false
	if !protected {
		switch state {
		case sluice.LevelShed:
			shed = true
		case sluice.LevelRecover:
			if l.cfg.Cut != nil {
				shed = l.cfg.Cut.Shed(r, 1-l.cfg.RecoverSteps[l.step], now)
			} else {
				shed = l.cfg.Rand() >= l.cfg.RecoverSteps[l.step]
			}
		}
	}
	if shed {
		l.meter.shed(r.Class)
		l.mu.Unlock()
		return sluice.Decision{Reason: sluice.ReasonOverload, Scope: sluice.ScopeService, Gate: l.name,
			Retryable: true, RetryAfter: l.cfg.RetryHint, Level: state}, 0
	}
	l.meter.admit()
	l.mu.Unlock()
	return sluice.Decision{Admitted: true, Level: state}, 1
}

// Release ends an admitted request's share of the accounting.
func (l *Ladder) Release(r *sluice.Request, _ sluice.Permit, c sluice.Completion) {
	l.mu.Lock()
	l.updateLocked(c.Now)
	lat := c.Latency
	if c.Outcome == sluice.OutcomeRejected {
		lat = 0 // a later gate rejected it: no service time to learn from
	}
	l.meter.release(r.Class, lat)
	l.mu.Unlock()
}

// LadderState is a snapshot of a Ladder.
type LadderState struct {
	Level    sluice.Level
	Pressure float64                                // the last demand sample
	Step     int                                    // the recovery step, in RECOVER
	Spent    [sluice.LevelRecover + 1]time.Duration // time spent in each level
	History  []Transition                           // recent transitions, oldest first
}

// State returns a snapshot at now.
func (l *Ladder) State(now clock.Instant) LadderState {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.updateLocked(now)
	st := LadderState{Level: l.state, Pressure: l.pressure, Step: l.step, History: slices.Clone(l.history)}
	st.Spent = l.spent
	return st
}

// Levels returns the level at now and the time spent in each level.
func (l *Ladder) Levels(now clock.Instant) (sluice.Level, [sluice.LevelRecover + 1]time.Duration) {
	st := l.State(now)
	return st.Level, st.Spent
}

// ReportState is the ladder's state for the admin API: level, demand,
// seconds in each level, the recovery step and the time since the last
// transition.
func (l *Ladder) ReportState(now clock.Instant) any {
	st := l.State(now)
	seconds := map[string]float64{}
	for lv, d := range st.Spent {
		seconds[sluice.Level(lv).String()] = d.Seconds()
	}
	var last *Transition
	if n := len(st.History); n > 0 {
		last = &st.History[n-1]
	}
	out := map[string]any{"level": st.Level.String(), "demand": st.Pressure, "seconds_in": seconds}
	if st.Level == sluice.LevelRecover {
		out["recover_step"] = st.Step
	}
	if last != nil {
		out["last_change_ago_seconds"] = now.Sub(last.At).Seconds()
	}
	return out
}
