// Package metrics exports what a sluice Chain decides as Prometheus metrics:
// offered, admitted, rejected (by reason, gate and mode, shadow included),
// completed by outcome, goodput, in-flight, and decision and work latency,
// per class and tenant with a cap on tenant cardinality.
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
)

// OtherTenant is the tenant label of tenants beyond Options.MaxTenants.
const OtherTenant = "other"

// Options configures Metrics. The zero value is valid.
type Options struct {
	// Registry receives the metrics. Default: a new registry, with the Go
	// and process collectors, served by Handler.
	Registry *prometheus.Registry
	// MaxTenants caps the distinct tenant label values; later tenants are
	// counted as OtherTenant. Only admitted tenants take a label slot, so
	// junk keys that are rejected cannot crowd real tenants out. Default
	// 100. Negative: no tenant label values at all.
	MaxTenants int
	// TenantLabel turns a tenant (often a secret API key) into its label.
	// Default: "t-" and the first 12 hex digits of its SHA-256, so /metrics
	// never shows a key. Return the tenant itself only if it is not secret.
	TenantLabel func(tenant string) string
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
	inflight   *prometheus.GaugeVec
	decision   prometheus.Histogram
	latency    *prometheus.HistogramVec
	maxTenants int64
	label      func(string) string
	tenants    sync.Map // tenant → label
	nTenants   atomic.Int64
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
	ct := []string{"class", "tenant"}
	if opts.TenantLabel == nil {
		opts.TenantLabel = HashTenant
	}
	m := &Metrics{
		reg:        reg,
		label:      opts.TenantLabel,
		maxTenants: int64(max(opts.MaxTenants, 0)),
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
	reg.MustRegister(m.offered, m.admitted, m.rejected, m.completed, m.goodput, m.inflight, m.decision, m.latency)
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// tenant returns the label for t; with admit, a new tenant takes a label
// slot while there is one.
func (m *Metrics) tenant(t string, admit bool) string {
	if l, ok := m.tenants.Load(t); ok {
		return l.(string)
	}
	if !admit || m.nTenants.Load() >= m.maxTenants {
		return OtherTenant
	}
	l, loaded := m.tenants.LoadOrStore(t, m.label(t))
	if !loaded && m.nTenants.Add(1) > m.maxTenants {
		m.tenants.Delete(t)
		return OtherTenant
	}
	return l.(string)
}

// Decided records a final verdict.
func (m *Metrics) Decided(r *sluice.Request, d *sluice.Decision, took time.Duration) {
	t := m.tenant(r.Tenant, d.Admitted)
	m.offered.WithLabelValues(r.Class, t).Inc()
	m.decision.Observe(took.Seconds())
	if d.Admitted {
		m.admitted.WithLabelValues(r.Class, t).Inc()
		m.inflight.WithLabelValues(r.Class).Inc()
		return
	}
	m.rejected.WithLabelValues(d.Reason.String(), d.Gate, "enforce", r.Class, t).Inc()
}

// ShadowRejected records a would-be rejection of a gate in shadow mode.
func (m *Metrics) ShadowRejected(r *sluice.Request, d *sluice.Decision) {
	m.rejected.WithLabelValues(d.Reason.String(), d.Gate, "shadow", r.Class, m.tenant(r.Tenant, false)).Inc()
}

// Done records a completion.
func (m *Metrics) Done(r *sluice.Request, c sluice.Completion) {
	t := m.tenant(r.Tenant, false)
	m.inflight.WithLabelValues(r.Class).Dec()
	m.completed.WithLabelValues(c.Outcome.String(), r.Class, t).Inc()
	m.latency.WithLabelValues(c.Outcome.String(), r.Class).Observe(c.Latency.Seconds())
	if c.Outcome == sluice.OutcomeUseful {
		m.goodput.WithLabelValues(r.Class, t).Add(float64(r.Cost))
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
func (m *Metrics) Gates(chain func() *sluice.Chain) {
	m.reg.MustRegister(&gateCollector{chain: chain,
		failures: prometheus.NewDesc("sluice_gate_store_failures_total",
			"Decisions a gate's state store could not make, each decided by the gate's failure policy (fail_open admits: watch its rate).", []string{"gate", "policy"}, nil),
		level:    prometheus.NewDesc("sluice_ladder_level", "Degradation level: 0 normal, 1 degrade, 2 shed, 3 recover.", []string{"gate"}, nil),
		seconds:  prometheus.NewDesc("sluice_ladder_seconds_total", "Time spent in each degradation level.", []string{"gate", "level"}, nil),
		fraction: prometheus.NewDesc("sluice_shed_fraction", "Fraction of load a shedder sheds.", []string{"gate"}, nil)})
}

type gateCollector struct {
	chain                              func() *sluice.Chain
	failures, level, seconds, fraction *prometheus.Desc
}

func (g *gateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.failures
	ch <- g.level
	ch <- g.seconds
	ch <- g.fraction
}

func (g *gateCollector) Collect(ch chan<- prometheus.Metric) {
	c := g.chain()
	now := c.Clock().Now()
	for _, gt := range c.Gates() {
		name := gt.Name()
		if f, ok := sluice.As[sluice.FailureCounter](gt); ok {
			ch <- prometheus.MustNewConstMetric(g.failures, prometheus.CounterValue, float64(f.Failures()), name, f.FailurePolicy())
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
