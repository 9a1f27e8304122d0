package fair

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/param"
)

// maxCohortTime is the longest Period or Window a Cohort takes.
const maxCohortTime = 24 * time.Hour

// CohortOptions configures a Cohort cut.
type CohortOptions struct {
	// Tiers lists the classes from the first shed to the last; a class not
	// listed is shed with ClassDefault's tier when that is listed, else in
	// a tier above every listed one (shed last): a class left out of the
	// list is never shed first (shed.Utilization places it the same way).
	Tiers []string
	// Cohorts is how many groups tenants are hashed into. Default 128 (as
	// DAGOR's user priorities).
	Cohorts int
	// Period is how often the cohorts' order rotates. Default 1 minute.
	Period time.Duration
	// Window is how far back the distribution of arrivals goes: the cut is
	// placed on the counts of the last full window and the current one.
	// Default 1 s.
	Window time.Duration
	// Fraction returns the shed fraction in [0, 1] at now (a controller's,
	// e.g. sluice.Shedder.ShedFraction). Required for Decide; a Cohort
	// used as a utilization shedder's cut (Shed) is given the fraction.
	Fraction func(now clock.Instant) float64
	// RetryHint is the Retry-After of a shed request. Default 1 s.
	RetryHint time.Duration
	// Seed salts the tenant hash (the same seed on every replica gives
	// every replica the same cohorts). Default 0.
	Seed uint64
}

// Cohort sheds an exact fraction of arrivals, lowest priority first, where
// a request's priority is (class tier, tenant cohort): the shape of
// DAGOR's admission level (Zhou et al., "Overload Control for Scaling
// WeChat Microservices", SoCC 2018: business priority × a user priority
// hashed from the user id, 128 levels) and Uber's Cinnamon (tier × cohort).
//
// The cut: with the recent counts of arrivals at every (tier, cohort)
// level, walked from the lowest, the levels below the one where the count
// reaches f of the total are shed entirely, and that boundary level in the
// exact share that makes the total f (error diffusion, not a coin: at a
// steady mix the shed share is f to within one request per recount).
//
// The rotation: a tenant's cohort is a fixed hash, and the order of the
// cohorts inside a tier changes every Period: the cohorts shed in the
// fewest periods so far rank lowest, ties broken by a rotating offset, so
// over any run of periods each cohort is shed in its share of them, to
// within one period (the same tenants are not always the ones dropped,
// and none is dropped more than its share). It is safe for concurrent use.
type Cohort struct {
	name string
	opts CohortOptions

	mu      sync.Mutex
	started bool
	window  clock.Instant // start of the current window
	period  int64         // index of the current period
	cur     []int64       // arrivals by tier·N + cohort, this window
	prev    []int64       // the last full window
	rank    []int         // cohort → its place in the shed order
	byRank  []int         // place → cohort
	shedIn  []int64       // cohort → periods it was shed in
	touched []bool        // cohort → shed in the current period
	// the cut, recomputed as counts and fraction move
	cutF     float64
	cutAt    clock.Instant
	cutLevel int     // walk position of the boundary level
	cutShare float64 // share of the boundary level to shed
	carry    float64 // error diffusion at the boundary
	offered  int64
	shed     int64
}

var (
	_ sluice.Shedder       = (*Cohort)(nil)
	_ sluice.StateReporter = (*Cohort)(nil)
)

// NewCohort returns a cohort cut named name.
func NewCohort(name string, opts CohortOptions) (*Cohort, error) {
	if name == "" {
		return nil, errors.New("cohort: empty name")
	}
	if opts.Cohorts == 0 {
		opts.Cohorts = 128
	}
	if opts.Period == 0 {
		opts.Period = time.Minute
	}
	if opts.Window == 0 {
		opts.Window = time.Second
	}
	if opts.RetryHint == 0 {
		opts.RetryHint = time.Second
	}
	switch {
	case opts.RetryHint < 0:
		return nil, param.Errorf("RetryHint", "cohort: negative retry hint %v", opts.RetryHint)
	case opts.Cohorts < 1 || opts.Cohorts > 1<<16:
		return nil, param.Errorf("Cohorts", "cohort: %d cohorts, want [1, 65536]", opts.Cohorts)
	case opts.Period < time.Millisecond || opts.Period > maxCohortTime:
		return nil, param.Errorf("Period", "cohort: period %v outside [1ms, %v]", opts.Period, maxCohortTime)
	case opts.Window < time.Millisecond || opts.Window > maxCohortTime:
		return nil, param.Errorf("Window", "cohort: window %v outside [1ms, %v]", opts.Window, maxCohortTime)
	}
	n := opts.Cohorts
	levels := (len(opts.Tiers) + 1) * n
	g := &Cohort{name: name, opts: opts, cur: make([]int64, levels), prev: make([]int64, levels),
		rank: make([]int, n), shedIn: make([]int64, n), touched: make([]bool, n), cutLevel: -1}
	g.byRank = make([]int, n)
	g.order(0)
	return g, nil
}

// Name returns the gate's name.
func (g *Cohort) Name() string { return g.name }

// cohortOf returns the cohort of tenant, in [0, Cohorts).
func (g *Cohort) cohortOf(tenant string) int {
	// FNV-1a, salted: stable across processes and runs.
	h := uint64(14695981039346656037) ^ g.opts.Seed
	for i := 0; i < len(tenant); i++ {
		h ^= uint64(tenant[i])
		h *= 1099511628211
	}
	h ^= h >> 33
	return int(h % uint64(g.opts.Cohorts))
}

// tier returns class's tier, 0 shed first: its place in Tiers, else
// ClassDefault's, else len(Tiers), above every listed tier.
func (g *Cohort) tier(class string) int {
	if i := slices.Index(g.opts.Tiers, class); i >= 0 {
		return i
	}
	if i := slices.Index(g.opts.Tiers, sluice.ClassDefault); i >= 0 {
		return i
	}
	return len(g.opts.Tiers)
}

// order ranks the cohorts for period p: fewest periods shed first, then a
// rotating offset. REQUIRES: g.mu held (or construction).
func (g *Cohort) order(p int64) {
	n := g.opts.Cohorts
	stride := oddNear(n * 5 / 8) // any stride coprime with n visits every cohort
	byRank := g.byRank
	for c := range byRank {
		byRank[c] = c
	}
	off := func(c int) int { return int((int64(c)*int64(stride) + p) % int64(n)) }
	slices.SortFunc(byRank, func(a, b int) int {
		if g.shedIn[a] != g.shedIn[b] {
			return int(g.shedIn[a] - g.shedIn[b])
		}
		return off(a) - off(b)
	})
	for r, c := range byRank {
		g.rank[c] = r
	}
}

func oddNear(k int) int {
	if k < 1 {
		return 1
	}
	return k | 1
}

// advanceLocked rolls windows and periods up to now. REQUIRES: g.mu held.
func (g *Cohort) advanceLocked(now clock.Instant) {
	if !g.started {
		g.started, g.window, g.period = true, now, int64(now)/int64(g.opts.Period)
		return
	}
	if d := now.Sub(g.window); d >= g.opts.Window {
		if d >= 2*g.opts.Window {
			clear(g.prev)
		} else {
			copy(g.prev, g.cur)
		}
		clear(g.cur)
		g.window = now
		g.cutLevel = -1
	}
	if p := int64(now) / int64(g.opts.Period); p > g.period {
		for c, t := range g.touched {
			if t {
				g.shedIn[c]++
				g.touched[c] = false
			}
		}
		g.period = p
		g.order(p)
		g.cutLevel = -1
	}
}

// cutLocked places the cut for fraction f on the recent counts.
// REQUIRES: g.mu held.
func (g *Cohort) cutLocked(f float64, now clock.Instant) {
	if g.cutLevel >= 0 && f == g.cutF && now.Sub(g.cutAt) < g.opts.Window/16 {
		return
	}
	g.cutF, g.cutAt = f, now
	n := g.opts.Cohorts
	total := int64(0)
	for i := range g.cur {
		total += g.cur[i] + g.prev[i]
	}
	byRank := g.byRank
	target := f * float64(total)
	cum := 0.0
	for t := 0; t <= len(g.opts.Tiers); t++ {
		for r, c := range byRank {
			k := float64(g.cur[t*n+c] + g.prev[t*n+c])
			if k > 0 && cum+k >= target {
				g.cutLevel, g.cutShare = t*n+r, (target-cum)/k
				return
			}
			cum += k
		}
	}
	g.cutLevel, g.cutShare = len(g.cur), 0 // everything below: f ≥ 1 or no counts
}

// Shed records r's arrival and reports whether the cut at fraction f sheds
// it. It is the cut a utilization shedder delegates to.
func (g *Cohort) Shed(r *sluice.Request, f float64, now clock.Instant) bool {
	n := g.opts.Cohorts
	cohort := g.cohortOf(r.Tenant)
	t := g.tier(r.Class)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.advanceLocked(now)
	g.cur[t*n+cohort]++
	g.offered++
	if !(f > 0) { // 0, negative or NaN: shed nothing
		return false
	}
	g.cutLocked(min(f, 1), now)
	pos := t*n + g.rank[cohort]
	shed := pos < g.cutLevel
	if pos == g.cutLevel {
		g.carry += g.cutShare
		if g.carry >= 1 {
			g.carry--
			shed = true
		}
	}
	if shed {
		g.shed++
		g.touched[cohort] = true
	}
	return shed
}

// Decide sheds r when the cut at the current fraction falls on it, with
// reason overload (503), retryable after RetryHint.
func (g *Cohort) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

// decide returns Decide's verdict and permit.
func (g *Cohort) decide(_ context.Context, r *sluice.Request, now clock.Instant) (sluice.Decision, sluice.Permit) {
	f := 0.0
	if g.opts.Fraction != nil {
		f = g.opts.Fraction(now)
	}
	if g.Shed(r, f, now) {
		return sluice.Decision{Reason: sluice.ReasonOverload, Scope: sluice.ScopeService, Gate: g.name,
			Retryable: true, RetryAfter: g.opts.RetryHint}, 0
	}
	return sluice.Decision{Admitted: true}, 0
}

// Release does nothing: the cut holds nothing.
func (g *Cohort) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// ShedFraction returns the fraction the cut sheds at now.
func (g *Cohort) ShedFraction(now clock.Instant) float64 {
	if g.opts.Fraction == nil {
		return 0
	}
	return g.opts.Fraction(now)
}

// cohortState is what the admin API shows of a Cohort cut.
type cohortState struct {
	Fraction float64 `json:"shed_fraction"`
	Offered  int64   `json:"offered"`
	Shed     int64   `json:"shed"`
	Period   int64   `json:"period"`
}

// ReportState returns the fraction, the counts since start and the
// rotation period's index.
func (g *Cohort) ReportState(now clock.Instant) any {
	f := g.ShedFraction(now)
	g.mu.Lock()
	defer g.mu.Unlock()
	return cohortState{Fraction: f, Offered: g.offered, Shed: g.shed, Period: g.period}
}
