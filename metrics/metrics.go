// Package metrics exports what a sluice Chain decides as Prometheus metrics:
// offered, admitted, rejected (by reason, gate and mode, shadow included),
// completed by outcome, goodput, demand units by stage (offered, admitted,
// rejected, consumed), in-flight, and decision and work latency, per class
// and tenant with a cap on tenant cardinality: the noisy-neighbour view.
// For the admin page it also keeps, in bounded memory, the tenants
// rejected most and those consuming most (TopRejected, TopConsumed), and
// sums the counters by class (Classes).
//
//	m := metrics.New(metrics.Options{})
//	chain, _ := sluice.NewChain(sluice.ChainOptions{Observer: m}, gates...)
//	http.Handle("/metrics", m.Handler())
package metrics

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// otherTenant is the tenant label of tenants beyond Options.MaxTenants.
const otherTenant = "other"

// Options configures Metrics. The zero value is valid.
type Options struct {
	// Registry receives the metrics. Default: a new registry, with the Go
	// and process collectors, served by Handler.
	Registry *prometheus.Registry
	// MaxTenants caps the distinct tenant label values; other tenants are
	// counted as OtherTenant. A tenant takes a free label slot once it has
	// been admitted TenantAfter times, so a flood of one-shot or rejected
	// keys cannot crowd real tenants out, and a tenant idle for TenantIdle
	// gives its slot back (its series are removed). Default 100. Negative:
	// no tenant label values at all.
	MaxTenants int
	// TenantAfter is the admissions that earn a tenant a label slot.
	// Default 10.
	TenantAfter int
	// TenantIdle is how long a labelled tenant may stay unseen (no
	// decision; a completion does not count, and the last one is known to
	// a second or an eighth of TenantIdle) before its slot goes to
	// another. Default 10 minutes.
	TenantIdle time.Duration
	// Clock tells the time for TenantIdle. Default clock.System.
	Clock clock.Clock
	// TenantLabel turns a tenant (often a secret API key) into its label.
	// Default: "t-" and the first 12 hex digits of its SHA-256, so /metrics
	// never shows a key. Return the tenant itself only if it is not secret.
	TenantLabel func(tenant string) string
	// TopTenants is the tenants each of the live view's two sketches holds
	// (TopRejected, TopConsumed), whatever the number of tenants: memory
	// stays under 61 KiB for the default (both sketches together). Default DefaultTopTenants (64).
	// Negative: no sketches.
	TopTenants int
}

// HashTenant is the default TenantLabel.
func HashTenant(t string) string {
	if t == "" {
		return "anonymous"
	}
	h := sha256.Sum256([]byte(t))
	return "t-" + hex.EncodeToString(h[:6])
}

// Metrics is a sluice.Observer that records into Prometheus metrics. It is
// safe for concurrent use.
type Metrics struct {
	reg        *prometheus.Registry
	offered    *prometheus.CounterVec
	admitted   *prometheus.CounterVec
	rejected   *prometheus.CounterVec
	completed  *prometheus.CounterVec
	goodput    *prometheus.CounterVec
	units      *prometheus.CounterVec // demand units by stage: offered, admitted, rejected, consumed
	inflight   *prometheus.GaugeVec
	decision   prometheus.Histogram
	latency    *prometheus.HistogramVec
	maxTenants int64
	label      func(string) string
	tenants    sync.Map    // tenant → *tenantLabel
	other      tenantLabel // OtherTenant's
	nTenants   atomic.Int64
	after      int64
	idle       time.Duration
	clock      clock.Clock

	top *tenantSketches // nil: none

	mu         sync.Mutex       // guards candidates and reclaims
	candidates map[string]int64 // admissions of tenants without a label, bounded
	reclaimed  clock.Instant    // when idle labels were last reclaimed
}

// tenantLabel is a labelled tenant.
type tenantLabel struct {
	label  string
	seen   atomic.Int64                   // clock.Instant of the last event
	series sync.Map                       // seriesKey → *series: the tenant's resolved series
	last   [3]atomic.Pointer[keyedSeries] // by kind
}

// keyedSeries is the last series a tenant label used, with its key: the
// same event repeats most of the time (a tenant's class, its gate).
type keyedSeries struct {
	k  seriesKey
	sr *series
}

// seriesKey names the series one kind of event of a tenant label updates.
type seriesKey struct {
	kind  uint8 // seriesAdmitted, seriesRejected, seriesDone
	code  uint8 // the reason (rejected) or outcome (done)
	class string
	gate  string // rejected only
}

const (
	seriesAdmitted = iota
	seriesRejected
	seriesDone
)

// series are the counters and gauges one event updates, resolved once
// per tenant label and key (WithLabelValues hashes every label each
// time: it was most of a decision's cost on the proxy's rejection path).
type series struct {
	offered, unitsOffered prometheus.Counter
	counted, units        prometheus.Counter // admitted/rejected/completed, and units of that stage
	inflight              prometheus.Gauge
	goodput               prometheus.Counter
	latency               prometheus.Observer
}

// seriesOf returns tl's series for k, resolving them the first time.
func (m *Metrics) seriesOf(tl *tenantLabel, k seriesKey) *series {
	last := &tl.last[k.kind]
	if ks := last.Load(); ks != nil && ks.k == k {
		return ks.sr
	}
	if v, ok := tl.series.Load(k); ok {
		sr := v.(*series)
		last.Store(&keyedSeries{k: k, sr: sr})
		return sr
	}
	t := tl.label
	sr := &series{}
	if k.kind != seriesRejected {
		sr.inflight = m.inflight.WithLabelValues(k.class)
	}
	switch k.kind {
	case seriesAdmitted, seriesRejected:
		sr.offered = m.offered.WithLabelValues(k.class, t)
		sr.unitsOffered = m.units.WithLabelValues("offered", k.class, t)
		if k.kind == seriesAdmitted {
			sr.counted = m.admitted.WithLabelValues(k.class, t)
			sr.units = m.units.WithLabelValues("admitted", k.class, t)
		} else {
			sr.counted = m.rejected.WithLabelValues(sluice.Reason(k.code).String(), k.gate, "enforce", k.class, t)
			sr.units = m.units.WithLabelValues("rejected", k.class, t)
		}
	case seriesDone:
		o := sluice.Outcome(k.code).String()
		sr.counted = m.completed.WithLabelValues(o, k.class, t)
		sr.units = m.units.WithLabelValues("consumed", k.class, t)
		sr.latency = m.latency.WithLabelValues(o, k.class)
		if sluice.Outcome(k.code) == sluice.OutcomeUseful {
			sr.goodput = m.goodput.WithLabelValues(k.class, t)
		}
	}
	v, _ := tl.series.LoadOrStore(k, sr)
	return v.(*series)
}

var _ sluice.Observer = (*Metrics)(nil)

// New creates and registers the metrics.
func New(opts Options) *Metrics {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if opts.MaxTenants == 0 {
		opts.MaxTenants = 100
	}
	if opts.TenantAfter <= 0 {
		opts.TenantAfter = 10
	}
	if opts.TenantIdle <= 0 {
		opts.TenantIdle = 10 * time.Minute
	}
	if opts.Clock == nil {
		opts.Clock = clock.System
	}
	ct := []string{"class", "tenant"}
	if opts.TenantLabel == nil {
		opts.TenantLabel = HashTenant
	}
	m := &Metrics{
		other:      tenantLabel{label: otherTenant},
		reg:        reg,
		label:      opts.TenantLabel,
		maxTenants: int64(max(opts.MaxTenants, 0)),
		after:      int64(opts.TenantAfter),
		idle:       opts.TenantIdle,
		clock:      opts.Clock,
		candidates: map[string]int64{},
		top:        newTenantSketches(opts.TopTenants),
		offered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_offered_total", Help: "Requests offered to the admission chain.",
		}, ct),
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_admitted_total", Help: "Requests admitted.",
		}, ct),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_rejected_total",
			Help: "Rejections by reason and gate; mode=shadow counts would-be rejections of gates in shadow mode (the request passed).",
		}, []string{"reason", "gate", "mode", "class", "tenant"}),
		completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_completed_total", Help: "Admitted requests by outcome: useful (goodput), late, errored, cancelled.",
		}, []string{"outcome", "class", "tenant"}),
		goodput: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_goodput_units_total", Help: "Demand units of useful completions (correct and before the deadline).",
		}, ct),
		units: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_demand_units_total", Help: "Demand units (request cost) by stage: offered to the chain, admitted, " +
				"rejected, and consumed (admitted work that finished, whatever its outcome; useful units are sluice_goodput_units_total).",
		}, []string{"stage", "class", "tenant"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_requests_inflight", Help: "Admitted requests not yet done.",
		}, []string{"class"}),
		decision: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sluice_decision_duration_seconds", Help: "Time the admission chain took to decide.",
			Buckets: prometheus.ExponentialBuckets(1e-7, 4, 10), // 100 ns .. 26 ms
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "sluice_request_duration_seconds", Help: "Time from admission to completion of admitted work.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16), // 1 ms .. 33 s
		}, []string{"outcome", "class"}),
	}
	reg.MustRegister(m.offered, m.admitted, m.rejected, m.completed, m.goodput, m.units, m.inflight, m.decision, m.latency)
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// tenant returns the label for t. An admitted tenant without one counts
// towards a slot: after TenantAfter admissions it takes a free one, or one
// given back by a tenant idle for TenantIdle.
func (m *Metrics) tenant(t string, admit bool) string { return m.tenantOf(t, admit).label }

// tenantOf is tenant's label with its resolved series.
func (m *Metrics) tenantOf(t string, admit bool) *tenantLabel {
	if v, ok := m.tenants.Load(t); ok {
		tl := v.(*tenantLabel)
		// Written at most once a second (an eighth of TenantIdle when
		// that is shorter): a hot tenant's label is read on every core,
		// and a write on each decision would move its cache line between
		// them.
		if now := int64(m.clock.Now()); now-tl.seen.Load() >= int64(min(time.Second, m.idle/8)) {
			tl.seen.Store(now)
		}
		return tl
	}
	if !admit || m.maxTenants == 0 {
		return &m.other
	}
	return m.promote(t)
}

// maxCandidates bounds the tenants counted towards a slot; when full, the
// counts start over (a flood of distinct keys then earns nothing).
const maxCandidates = 4096

// promote counts one admission of t, which has no label, and gives it one
// when it has earned it and a slot is free (reclaiming idle ones).
func (m *Metrics) promote(t string) *tenantLabel {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := m.candidates[t] + 1
	if n < m.after {
		if len(m.candidates) >= maxCandidates {
			clear(m.candidates)
		}
		m.candidates[t] = n
		return &m.other
	}
	now := m.clock.Now()
	if m.nTenants.Load() >= m.maxTenants && now.Sub(m.reclaimed) >= time.Minute {
		m.reclaimed = now
		m.reclaimLocked(now)
	}
	if m.nTenants.Load() >= m.maxTenants {
		m.candidates[t] = n
		return &m.other
	}
	delete(m.candidates, t)
	tl := &tenantLabel{label: m.label(t)}
	tl.seen.Store(int64(now))
	if v, loaded := m.tenants.LoadOrStore(t, tl); loaded {
		return v.(*tenantLabel)
	}
	m.nTenants.Add(1)
	return tl
}

// reclaimLocked removes the labels (and series) of tenants idle for
// TenantIdle. REQUIRES: m.mu held.
func (m *Metrics) reclaimLocked(now clock.Instant) {
	m.tenants.Range(func(k, v any) bool {
		tl := v.(*tenantLabel)
		if now.Sub(clock.Instant(tl.seen.Load())) < m.idle {
			return true
		}
		m.tenants.Delete(k)
		m.nTenants.Add(-1)
		match := prometheus.Labels{"tenant": tl.label}
		for _, vec := range []*prometheus.CounterVec{m.offered, m.admitted, m.rejected, m.completed, m.goodput, m.units} {
			vec.DeletePartialMatch(match)
		}
		return true
	})
}

// Decided records a final verdict.
func (m *Metrics) Decided(r *sluice.Request, d *sluice.Decision, took time.Duration) {
	tl := m.tenantOf(r.Tenant, d.Admitted)
	m.decision.Observe(took.Seconds())
	cost := float64(max(r.Cost, 1))
	if d.Admitted {
		sr := m.seriesOf(tl, seriesKey{kind: seriesAdmitted, class: r.Class})
		sr.offered.Inc()
		sr.unitsOffered.Add(cost)
		sr.counted.Inc()
		sr.units.Add(cost)
		sr.inflight.Inc()
		return
	}
	sr := m.seriesOf(tl, seriesKey{kind: seriesRejected, code: uint8(d.Reason), class: r.Class, gate: d.Gate})
	sr.offered.Inc()
	sr.unitsOffered.Add(cost)
	sr.counted.Inc()
	sr.units.Add(cost)
	if m.top != nil {
		m.top.rejected.Add(m.sketchKey(r.Tenant), 1, int(d.Reason))
	}
}

// ShadowRejected records a would-be rejection of a gate in shadow mode.
func (m *Metrics) ShadowRejected(r *sluice.Request, d *sluice.Decision) {
	m.rejected.WithLabelValues(d.Reason.String(), d.Gate, "shadow", r.Class, m.tenant(r.Tenant, false)).Inc()
}

// Done records a completion.
func (m *Metrics) Done(r *sluice.Request, c sluice.Completion) {
	tl := &m.other
	if v, ok := m.tenants.Load(r.Tenant); ok { // a completion leaves the label's idleness to the decisions: no clock read
		tl = v.(*tenantLabel)
	}
	sr := m.seriesOf(tl, seriesKey{kind: seriesDone, code: uint8(c.Outcome), class: r.Class})
	sr.inflight.Dec()
	sr.counted.Inc()
	sr.latency.Observe(c.Latency.Seconds())
	sr.units.Add(float64(max(r.Cost, 1)))
	if m.top != nil {
		m.top.consumed.Add(m.sketchKey(r.Tenant), max(r.Cost, 1), int(c.Outcome))
	}
	if c.Outcome == sluice.OutcomeUseful {
		sr.goodput.Add(float64(r.Cost))
	}
}

// Gates exports, at scrape time, what the gates of chain() report about
// themselves (read through wrappers with sluice.As, and from the chain
// serving at that moment, so it follows reloads):
//
//	sluice_gate_store_failures_total{gate,policy}  decisions a gate's store could not make, each decided by its failure policy (FailureCounter)
//	sluice_ladder_level{gate}               degradation level: 0 normal, 1 degrade, 2 shed, 3 recover (Leveler)
//	sluice_ladder_seconds_total{gate,level} time spent in each level (Leveler)
//	sluice_shed_fraction{gate}              fraction of load shed (Shedder)
//	sluice_concurrency_limit{gate}          the limit an adaptive gate set (Sizer)
//	sluice_concurrency_inflight{gate}       requests in flight under it (Sizer)
//	sluice_queue_waiting{gate}              requests waiting in a wait queue (Queuer)
//	sluice_queue_oldest_seconds{gate}       the age of the oldest of them (Queuer)
//	sluice_queue_waits_total{gate}          requests that waited (Queuer)
//	sluice_queue_dropped_total{gate}        of those, turned away after waiting (Queuer)
//	sluice_lease_capacity{gate}             a lease's fleet-wide budget (Leaseholder)
//	sluice_lease_granted{gate}              this process's share of it (Leaseholder)
//	sluice_lease_live{gate}                 1 while the lease is live, 0 after it lapsed (Leaseholder)
//	sluice_lease_spending{gate}             what it spends now: the grant, or its failure mode's (-1: unlimited)
//	sluice_lease_overshoot_bound{gate}      the most the fleet admits above the budget (units in any window, or slots)
//	sluice_lease_unused_bound{gate}         the most of the budget left unused until a refresh (units, or slots)
//	sluice_queue_class_waiting{gate,class}  requests waiting in each class queue (ClassQueuer)
//	sluice_queue_class_oldest_seconds{gate,class} the age of the oldest of them (ClassQueuer)
func (m *Metrics) Gates(chain func() *sluice.Chain) {
	m.reg.MustRegister(&gateCollector{chain: chain,
		failures: prometheus.NewDesc("sluice_gate_store_failures_total",
			"Decisions a gate's state store could not make, each decided by the gate's failure policy (fail_open admits: watch its rate).", []string{"gate", "policy"}, nil),
		level:         prometheus.NewDesc("sluice_ladder_level", "Degradation level: 0 normal, 1 degrade, 2 shed, 3 recover.", []string{"gate"}, nil),
		seconds:       prometheus.NewDesc("sluice_ladder_seconds_total", "Time spent in each degradation level.", []string{"gate", "level"}, nil),
		fraction:      prometheus.NewDesc("sluice_shed_fraction", "Fraction of load a shedder sheds.", []string{"gate"}, nil),
		limit:         prometheus.NewDesc("sluice_concurrency_limit", "The concurrency limit an adaptive gate set.", []string{"gate"}, nil),
		inflight:      prometheus.NewDesc("sluice_concurrency_inflight", "Requests in flight under an adaptive gate's limit.", []string{"gate"}, nil),
		waiting:       prometheus.NewDesc("sluice_queue_waiting", "Requests waiting in a wait queue.", []string{"gate"}, nil),
		oldest:        prometheus.NewDesc("sluice_queue_oldest_seconds", "Age of the oldest request in a wait queue.", []string{"gate"}, nil),
		waits:         prometheus.NewDesc("sluice_queue_waits_total", "Requests that waited in a wait queue.", []string{"gate"}, nil),
		dropped:       prometheus.NewDesc("sluice_queue_dropped_total", "Requests a wait queue turned away after they waited.", []string{"gate"}, nil),
		leaseCap:      prometheus.NewDesc("sluice_lease_capacity", "A lease gate's fleet-wide budget.", []string{"gate"}, nil),
		leaseGranted:  prometheus.NewDesc("sluice_lease_granted", "This process's share of a lease gate's budget.", []string{"gate"}, nil),
		leaseLive:     prometheus.NewDesc("sluice_lease_live", "1 while a lease gate's lease is live, 0 after it lapsed (the gate then follows its failure mode).", []string{"gate"}, nil),
		leaseSpending: prometheus.NewDesc("sluice_lease_spending", "What a lease gate spends now: its grant while live, else its failure mode's (-1: unlimited).", []string{"gate"}, nil),
		leaseOver:     prometheus.NewDesc("sluice_lease_overshoot_bound", "The most a lease gate's fleet admits above its budget while the allocator keeps its state: units in any window for a rate, slots for a concurrency budget.", []string{"gate"}, nil),
		leaseUnused:   prometheus.NewDesc("sluice_lease_unused_bound", "The most of a lease gate's budget left unused until the next refresh: units for a rate, slots for a concurrency budget.", []string{"gate"}, nil),
		classWaiting:  prometheus.NewDesc("sluice_queue_class_waiting", "Requests waiting in a wait queue's class queue.", []string{"gate", "class"}, nil),
		classOldest:   prometheus.NewDesc("sluice_queue_class_oldest_seconds", "Age of the oldest request in a wait queue's class queue.", []string{"gate", "class"}, nil)})
}

type gateCollector struct {
	chain                                 func() *sluice.Chain
	failures, level, seconds, fraction    *prometheus.Desc
	limit, inflight                       *prometheus.Desc
	waiting, oldest, waits, dropped       *prometheus.Desc
	classWaiting, classOldest             *prometheus.Desc
	leaseCap, leaseGranted, leaseLive     *prometheus.Desc
	leaseSpending, leaseOver, leaseUnused *prometheus.Desc
}

func (g *gateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.failures
	ch <- g.level
	ch <- g.seconds
	ch <- g.fraction
	ch <- g.limit
	ch <- g.inflight
	ch <- g.waiting
	ch <- g.oldest
	ch <- g.waits
	ch <- g.dropped
	ch <- g.classWaiting
	ch <- g.classOldest
	ch <- g.leaseCap
	ch <- g.leaseGranted
	ch <- g.leaseLive
	ch <- g.leaseSpending
	ch <- g.leaseOver
	ch <- g.leaseUnused
}

func (g *gateCollector) Collect(ch chan<- prometheus.Metric) {
	c := g.chain()
	now := c.Clock().Now()
	for _, gt := range c.Gates() {
		name := gt.Name()
		if f, ok := sluice.As[sluice.FailureCounter](gt); ok {
			ch <- prometheus.MustNewConstMetric(g.failures, prometheus.CounterValue, float64(f.Failures()), name, f.FailurePolicy())
		}
		if qu, ok := sluice.As[sluice.Queuer](gt); ok {
			n, oldest, waits, dropped := qu.QueueStats(now)
			ch <- prometheus.MustNewConstMetric(g.waiting, prometheus.GaugeValue, float64(n), name)
			ch <- prometheus.MustNewConstMetric(g.oldest, prometheus.GaugeValue, oldest.Seconds(), name)
			ch <- prometheus.MustNewConstMetric(g.waits, prometheus.CounterValue, float64(waits), name)
			ch <- prometheus.MustNewConstMetric(g.dropped, prometheus.CounterValue, float64(dropped), name)
		}
		if l, ok := sluice.As[sluice.Leaseholder](gt); ok {
			st := l.Lease(now)
			ch <- prometheus.MustNewConstMetric(g.leaseCap, prometheus.GaugeValue, float64(st.Capacity), name)
			ch <- prometheus.MustNewConstMetric(g.leaseGranted, prometheus.GaugeValue, float64(st.Granted), name)
			ch <- prometheus.MustNewConstMetric(g.leaseLive, prometheus.GaugeValue, map[bool]float64{true: 1}[st.Live], name)
			ch <- prometheus.MustNewConstMetric(g.leaseSpending, prometheus.GaugeValue, float64(st.Spending), name)
			ch <- prometheus.MustNewConstMetric(g.leaseOver, prometheus.GaugeValue, st.Overshoot, name)
			ch <- prometheus.MustNewConstMetric(g.leaseUnused, prometheus.GaugeValue, st.Unused, name)
		}
		if cq, ok := sluice.As[sluice.ClassQueuer](gt); ok {
			for _, q := range cq.ClassQueues(now) {
				ch <- prometheus.MustNewConstMetric(g.classWaiting, prometheus.GaugeValue, float64(q.Waiting), name, q.Class)
				ch <- prometheus.MustNewConstMetric(g.classOldest, prometheus.GaugeValue, q.Oldest.Seconds(), name, q.Class)
			}
		}
		if sz, ok := sluice.As[sluice.Sizer](gt); ok {
			l, n := sz.ConcurrencyLimit()
			ch <- prometheus.MustNewConstMetric(g.limit, prometheus.GaugeValue, float64(l), name)
			ch <- prometheus.MustNewConstMetric(g.inflight, prometheus.GaugeValue, float64(n), name)
		}
		if l, ok := sluice.As[sluice.Leveler](gt); ok {
			lv, spent := l.Levels(now)
			ch <- prometheus.MustNewConstMetric(g.level, prometheus.GaugeValue, float64(lv), name)
			for i, d := range spent {
				ch <- prometheus.MustNewConstMetric(g.seconds, prometheus.CounterValue, d.Seconds(), name, sluice.Level(i).String())
			}
		}
		if s, ok := sluice.As[sluice.Shedder](gt); ok {
			ch <- prometheus.MustNewConstMetric(g.fraction, prometheus.GaugeValue, s.ShedFraction(now), name)
		}
	}
}
