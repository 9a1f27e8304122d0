// Package servicetime estimates service times per class of work: decaying
// histograms on logarithmic buckets that the deadline test (package shed)
// and the wait queue (package queue) read percentiles from.
//
//	t := servicetime.NewDecaying(time.Second)
//	t.ObserveAt("default", 40*time.Millisecond, now)
//	p90, n := t.PercentileAt("default", 0.9, now)
package servicetime

import (
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Times keeps, per class, a histogram of recent service times on
// logarithmic buckets (8 per doubling, 9% wide, from 10 µs to about 3
// hours) whose counts halve whenever they pass 256, so estimates follow the
// last few hundred completions. With a half-life (NewDecaying)
// and the At methods, counts also halve with every half-life of time, so
// that estimates follow the last few seconds where completions are few: a
// class turned away on the strength of latencies from a passing overload
// (a limit's overshoot, which a deadline of twice the service time calls
// late) is estimated again from the few requests still let through within
// seconds, not after hundreds of them (and Scale weighs the past down at
// once). It is safe for concurrent use.
type Times struct {
	mu       sync.Mutex
	classes  map[string]*histogram
	halfLife time.Duration // 0: counts halve by number alone
}

// New returns empty estimates whose counts halve by number
// alone.
func New() *Times { return &Times{classes: map[string]*histogram{}} }

// NewDecaying returns empty estimates whose counts also halve
// with every halfLife of time (ObserveAt, PercentileAt).
func NewDecaying(halfLife time.Duration) *Times {
	return &Times{classes: map[string]*histogram{}, halfLife: halfLife}
}

// Observe records one service time of class.
func (s *Times) Observe(class string, d time.Duration) { s.ObserveAt(class, d, 0) }

// ObserveAt records one service time of class completed at now (0: no
// decay by time).
func (s *Times) ObserveAt(class string, d time.Duration, now clock.Instant) {
	s.mu.Lock()
	h := s.classes[class]
	if h == nil {
		if len(s.classes) >= MaxClasses {
			s.mu.Unlock()
			return
		}
		h = &histogram{}
		s.classes[class] = h
	}
	h.decay(now, s.halfLife)
	h.add(d)
	if h.sinceCut++; h.total >= cutWeight || h.sinceCut > cutWeight {
		h.cut = false // fresh samples enough, weighed or counted (a sparse class's weight stays under 3)
	}
	s.mu.Unlock()
}

// Scale multiplies class's counts by f in (0, 1]: what it learned weighs
// that much against what comes next.
func (s *Times) Scale(class string, f float64) {
	if !(f > 0 && f <= 1) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.classes[class]; h != nil {
		for i := range h.counts {
			h.counts[i] *= f
		}
		h.total *= f
		h.cut, h.sinceCut = f < 1, 0
	}
}

// MaxClasses bounds the classes kept: classes are few and server-defined.
const MaxClasses = 256

// Known weights: the least decayed weight of a class's counts that still
// knows it. Decayed by time alone, a sample within about a half-life
// (knownWeight): a class that completes once a half-life or less often,
// one worker of a second under the default half-life of 1 s, peaks at 2,
// and under a threshold of 3 was never known, so the deadline test never
// applied to it. Cut by Scale (a retest proved the counts stale),
// cutWeight, until fresh samples weigh that much again or more than that
// many came (a sparse class never weighs 3: it stayed unknown for good
// after one retest).
const (
	knownWeight = 1
	cutWeight   = 3
)

// Percentile returns the p-th percentile of class's recent service times
// (the upper edge of its bucket, so it errs long) and how many samples
// stand behind it.
func (s *Times) Percentile(class string, p float64) (time.Duration, int) {
	return s.PercentileAt(class, p, 0)
}

// PercentileAt is Percentile at now (0: no decay by time). When the counts
// left after decay weigh less than knownWeight (cutWeight after a Scale), it reports no samples: the
// class is not known now, whatever it once was.
func (s *Times) PercentileAt(class string, p float64, now clock.Instant) (time.Duration, int) {
	d, known, samples := s.EstimateAt(class, p, now)
	if !known {
		return 0, 0
	}
	return d, samples
}

// EstimateAt is PercentileAt that tells a class not known now (known
// false, d 0: its decayed counts weigh less than knownWeight, or
// cutWeight after a Scale) from one never
// seen: samples counts every sample the class ever had either way. A
// reader sharing these estimates can tell "forgotten on purpose" (a
// retest proved them stale) from "never learned".
func (s *Times) EstimateAt(class string, p float64, now clock.Instant) (d time.Duration, known bool, samples int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.classes[class]
	if h == nil {
		return 0, false, 0
	}
	h.decay(now, s.halfLife)
	if !h.known(s.halfLife) {
		return 0, false, h.samples
	}
	return h.percentile(p), true, h.samples
}

// ClassEstimate is one class's service-time estimate as a gate reads it
// (the state a gate reports, GET /v1/gates).
type ClassEstimate struct {
	Class string `json:"class"`
	// Ms is the estimate, ms: the gate's percentile of the recent service
	// times; 0 when the class is not known now.
	Ms float64 `json:"ms"`
	// Weight is how many samples the estimate stands on after decay (it
	// halves with every half-life and every 256 completions).
	Weight float64 `json:"weight"`
	// Samples is every sample the class ever had.
	Samples int `json:"samples"`
}

// Estimates returns every class's p-th percentile at now (0: no decay by
// time), sorted by class.
func (s *Times) Estimates(p float64, now clock.Instant) []ClassEstimate {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ClassEstimate, 0, len(s.classes))
	for class, h := range s.classes {
		h.decay(now, s.halfLife)
		e := ClassEstimate{Class: class, Weight: math.Round(h.total*10) / 10, Samples: h.samples}
		if h.known(s.halfLife) {
			e.Ms = float64(h.percentile(p)) / 1e6
		}
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b ClassEstimate) int { return strings.Compare(a.Class, b.Class) })
	return out
}

const (
	bucketsPerDoubling = 8
	histBuckets        = 8 * 30 // 10 µs · 2^30 ≈ 3 h
	histBase           = 10 * time.Microsecond
	histHalveAt        = 256
)

// histogram is decaying counts on logarithmic buckets.
type histogram struct {
	counts   [histBuckets]float64
	total    float64
	samples  int           // every sample ever, for MinSamples
	at       clock.Instant // when the counts were last decayed by time
	cut      bool          // Scale cut the counts, and fresh ones weigh less than cutWeight
	sinceCut int           // samples since the last cut
}

// known reports whether the counts still know the class (knownWeight,
// cutWeight).
func (h *histogram) known(halfLife time.Duration) bool {
	return halfLife <= 0 || h.total >= knownWeight && !(h.cut && h.total < cutWeight)
}

// decay scales the counts down by 2^(−elapsed/halfLife) since the last
// decay (in steps of at least an eighth of halfLife).
func (h *histogram) decay(now clock.Instant, halfLife time.Duration) {
	if halfLife <= 0 || now == 0 {
		return
	}
	if h.at == 0 || now < h.at {
		h.at = now
		return
	}
	dt := now.Sub(h.at)
	if dt < halfLife/8 {
		return
	}
	f := math.Exp2(-float64(dt) / float64(halfLife))
	for i := range h.counts {
		h.counts[i] *= f
	}
	h.total *= f
	h.at = now
}

func bucketOf(d time.Duration) int {
	if d <= histBase {
		return 0
	}
	i := int(math.Ceil(math.Log2(float64(d)/float64(histBase)) * bucketsPerDoubling))
	return min(max(i, 0), histBuckets-1)
}

// upper returns bucket i's upper edge.
func upper(i int) time.Duration {
	return time.Duration(math.Ceil(float64(histBase) * math.Exp2(float64(i)/bucketsPerDoubling)))
}

func (h *histogram) add(d time.Duration) {
	h.counts[bucketOf(d)]++
	h.total++
	h.samples++
	if h.total > histHalveAt {
		for i := range h.counts {
			h.counts[i] /= 2
		}
		h.total /= 2
	}
}

func (h *histogram) percentile(p float64) time.Duration {
	want, sum := p*h.total, 0.0
	for i, c := range h.counts {
		sum += c
		if sum >= want && c > 0 {
			return upper(i)
		}
	}
	return upper(histBuckets - 1)
}
