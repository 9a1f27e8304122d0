package rls

import (
	"errors"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// OtherKey is the key label of descriptors beyond Options.MaxMetricKeys
// (and the domain label of unknown domains beyond it).
const OtherKey = "_other"

// MaxMetricKeyBytes bounds the key label: a descriptor whose statistics
// key is longer counts under OtherKey (so that Options.MaxMetricKeys
// bounds the metrics' size, not only their number).
const MaxMetricKeyBytes = 1024

// stats are the service's Prometheus counters. The per-rule ones mirror
// envoyproxy/ratelimit's statistics (its README, "Statistics":
// ratelimit.service.rate_limit.DOMAIN.KEY_VALUE.STAT), labelled by domain
// and by the peer's KEY_VALUE path; all count hits (units), not calls.
type stats struct {
	hits, over, near, within, shadow, failOpen, failClosed, refunded *prometheus.CounterVec
	notFound                                                         *prometheus.CounterVec
	globalShadow, releaseUnmatched                                   prometheus.Counter
	calls                                                            *prometheus.CounterVec
	// calls' series by result, resolved once: a call is counted without
	// hashing its label.
	callsOK, callsOver, callsInvalid, callsUnavailable prometheus.Counter

	max     int
	mu      sync.Mutex
	series  map[[2]string]*series // by domain and key, at most max
	unknown map[string]prometheus.Counter
}

// series are one (domain, key) label pair's counters.
type series struct {
	hits, over, near, within, shadow, failOpen, failClosed, refunded prometheus.Counter
}

func newStats(reg prometheus.Registerer, maxKeys int) (*stats, error) {
	vec := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	dk := []string{"domain", "key"}
	s := &stats{
		hits:       vec("sluice_rls_total_hits_total", "Hits on a rule (the peer's total_hits); hits_addend units.", dk...),
		over:       vec("sluice_rls_over_limit_total", "Hits over the limit (the peer's over_limit), shadow mode included.", dk...),
		near:       vec("sluice_rls_near_limit_total", "Hits between the near-limit ratio (0.8) and the limit (the peer's near_limit).", dk...),
		within:     vec("sluice_rls_within_limit_total", "Hits within the limit (the peer's within_limit).", dk...),
		shadow:     vec("sluice_rls_shadow_mode_total", "Over-limit hits a shadow_mode rule let through (the peer's shadow_mode).", dk...),
		failOpen:   vec("sluice_rls_fail_open_total", "Hits answered OK because the store failed (failure policy open).", dk...),
		failClosed: vec("sluice_rls_fail_closed_total", "Hits answered OVER_LIMIT because the store failed (failure policy closed).", dk...),
		refunded:   vec("sluice_rls_refunded_total", "Hits given back: by is_negative_hits (refunds, concurrency releases), and an extension rule's hits of a call another descriptor refused.", dk...),
		notFound:   vec("sluice_rls_domain_not_found_total", "Calls for a domain no configuration names (the peer's domain_not_found).", "domain"),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rls_global_shadow_mode_total",
			Help: "Calls whose OVER_LIMIT the global shadow mode turned into OK (the peer's global_shadow_mode)."}),
		releaseUnmatched: prometheus.NewCounter(prometheus.CounterOpts{Name: "sluice_rls_release_unmatched_total",
			Help: "Concurrency releases that found no permit to free (in memory: none this process holds; on Redis: none the fleet holds)."}),
		calls:   vec("sluice_rls_calls_total", "ShouldRateLimit calls by result: ok, over_limit, invalid, unavailable.", "result"),
		max:     maxKeys,
		series:  map[[2]string]*series{},
		unknown: map[string]prometheus.Counter{},
	}
	cs := []prometheus.Collector{s.hits, s.over, s.near, s.within, s.shadow, s.failOpen, s.failClosed, s.refunded,
		s.notFound, s.globalShadow, s.releaseUnmatched, s.calls}
	for i, c := range cs {
		got, err := register(reg, c)
		if err != nil {
			return nil, err
		}
		cs[i] = got
	}
	// A second Server on one registry (a reload) shares the first one's
	// collectors.
	s.hits, s.over, s.near, s.within = cs[0].(*prometheus.CounterVec), cs[1].(*prometheus.CounterVec), cs[2].(*prometheus.CounterVec), cs[3].(*prometheus.CounterVec)
	s.shadow, s.failOpen, s.failClosed, s.refunded = cs[4].(*prometheus.CounterVec), cs[5].(*prometheus.CounterVec), cs[6].(*prometheus.CounterVec), cs[7].(*prometheus.CounterVec)
	s.notFound, s.globalShadow, s.releaseUnmatched, s.calls = cs[8].(*prometheus.CounterVec), cs[9].(prometheus.Counter), cs[10].(prometheus.Counter), cs[11].(*prometheus.CounterVec)
	s.callsOK, s.callsOver = s.calls.WithLabelValues("ok"), s.calls.WithLabelValues("over_limit")
	s.callsInvalid, s.callsUnavailable = s.calls.WithLabelValues("invalid"), s.calls.WithLabelValues("unavailable")
	return s, nil
}

// register registers c, or returns the collector already registered under
// its descriptors.
func register(reg prometheus.Registerer, c prometheus.Collector) (prometheus.Collector, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		return are.ExistingCollector, nil
	}
	return c, err
}

// of returns the counters of (domain, key), or of (domain, OtherKey) once
// max pairs have their own or for a key longer than MaxMetricKeyBytes.
func (s *stats) of(domain, key string) *series {
	if len(key) > MaxMetricKeyBytes {
		key = OtherKey
	}
	k := [2]string{domain, key}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sr := s.series[k]; sr != nil {
		return sr
	}
	if len(s.series) >= s.max {
		k[1] = OtherKey
		if sr := s.series[k]; sr != nil {
			return sr
		}
	}
	l := prometheus.Labels{"domain": k[0], "key": k[1]}
	sr := &series{
		hits: s.hits.With(l), over: s.over.With(l), near: s.near.With(l), within: s.within.With(l),
		shadow: s.shadow.With(l), failOpen: s.failOpen.With(l), failClosed: s.failClosed.With(l), refunded: s.refunded.With(l),
	}
	s.series[k] = sr
	return sr
}

// domainNotFound counts a call for an unknown domain, labelled by it while
// fewer than max unknown domains were seen.
func (s *stats) domainNotFound(domain string) {
	s.mu.Lock()
	defer s.mu.Unlock() // With panics on a bad label: never leave the mutex held
	c := s.unknown[domain]
	if c == nil {
		if len(s.unknown) >= s.max {
			domain = OtherKey
		}
		c = s.notFound.WithLabelValues(domain)
		s.unknown[domain] = c
	}
	c.Inc()
}
