package client

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Observer receives what a Retrier does, for metrics. Every retry is
// offered load: attempts count them all. Implementations must be safe for
// concurrent use and fast (they run on every attempt).
type Observer interface {
	// Request: a logical request began.
	Request()
	// Attempt: an attempt is being sent (retry: not the first).
	Attempt(retry bool)
	// Retry: a retry was decided after a failure of the given cause.
	Retry(cause string)
	// LocalReject: the client refused to send ("throttle" or "pace").
	LocalReject(reason string)
	// BudgetExhausted: a retry was wanted but the retry budget was empty.
	BudgetExhausted()
	// Paced: an attempt waited d to keep an advertised quota.
	Paced(d time.Duration)
}

type nopObserver struct{}

func (nopObserver) Request()            {}
func (nopObserver) Attempt(bool)        {}
func (nopObserver) Retry(string)        {}
func (nopObserver) LocalReject(string)  {}
func (nopObserver) BudgetExhausted()    {}
func (nopObserver) Paced(time.Duration) {}

// MetricsOptions configures Metrics. The zero value is valid.
type MetricsOptions struct {
	// Registry receives the metrics. Default: a new registry, served by
	// Handler.
	Registry *prometheus.Registry
	// Client is the value of the client label, naming the service the
	// client calls (default "default"), so that several clients can
	// share a registry.
	Client string
}

// Metrics is an Observer that records into Prometheus counters:
//
//	sluice_client_requests_total{client}               logical requests
//	sluice_client_attempts_total{client,attempt}       attempts sent, attempt="first" or "retry"
//	sluice_client_retries_total{client,cause}          retries decided, by the failure retried
//	sluice_client_local_rejections_total{client,reason} requests refused locally: throttle, pace
//	sluice_client_budget_exhausted_total{client}       retries the budget refused
//	sluice_client_paced_seconds_total{client}          time spent waiting to keep a quota
//
// It is safe for concurrent use.
type Metrics struct {
	reg      *prometheus.Registry
	requests prometheus.Counter
	first    prometheus.Counter
	retry    prometheus.Counter
	retries  *prometheus.CounterVec
	local    *prometheus.CounterVec
	budget   prometheus.Counter
	paced    prometheus.Counter
}

var _ Observer = (*Metrics)(nil)

// NewMetrics creates and registers the metrics. It panics, as
// prometheus.MustRegister does, if the registry already holds them for the
// same client label.
func NewMetrics(opts MetricsOptions) *Metrics {
	reg := opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if opts.Client == "" {
		opts.Client = "default"
	}
	cl := prometheus.Labels{"client": opts.Client}
	m := &Metrics{reg: reg}
	m.requests = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_client_requests_total",
		Help: "Logical requests the client was asked to send.", ConstLabels: cl})
	attempts := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_client_attempts_total",
		Help: "Attempts sent (offered load), first attempts and retries.", ConstLabels: cl}, []string{"attempt"})
	m.first, m.retry = attempts.WithLabelValues("first"), attempts.WithLabelValues("retry")
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_client_retries_total",
		Help: "Retries decided, by the cause of the failure retried.", ConstLabels: cl}, []string{"cause"})
	m.local = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_client_local_rejections_total",
		Help: "Requests the client refused to send: adaptive throttle, or quota pacing past the deadline.", ConstLabels: cl}, []string{"reason"})
	m.budget = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_client_budget_exhausted_total",
		Help: "Retries not sent because the retry budget was empty.", ConstLabels: cl})
	m.paced = prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_client_paced_seconds_total",
		Help: "Time attempts waited to keep the quota the server advertised.", ConstLabels: cl})
	reg.MustRegister(m.requests, attempts, m.retries, m.local, m.budget, m.paced)
	return m
}

// Handler serves the registry in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler { return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}) }

// Request counts a logical request.
func (m *Metrics) Request() { m.requests.Inc() }

// Attempt counts an attempt sent, first or retry.
func (m *Metrics) Attempt(retry bool) {
	if retry {
		m.retry.Inc()
	} else {
		m.first.Inc()
	}
}

// Retry counts a retry decided after a failure of cause.
func (m *Metrics) Retry(cause string) {
	if cause == "" {
		cause = "other"
	}
	m.retries.WithLabelValues(cause).Inc()
}

// LocalReject counts a request refused locally for reason.
func (m *Metrics) LocalReject(reason string) { m.local.WithLabelValues(reason).Inc() }

// BudgetExhausted counts a retry the budget refused.
func (m *Metrics) BudgetExhausted() { m.budget.Inc() }

// Paced adds the time an attempt waited to keep a quota.
func (m *Metrics) Paced(d time.Duration) { m.paced.Add(d.Seconds()) }
