package shed

import (
	"time"

	"github.com/sluice-go/sluice/clock"
)

// meter measures utilization from a gate's own accounting: the mean number
// of requests in flight per worker over each sample interval. With
// withDemand, a request the gate sheds adds the work it would have brought
// (the recent mean latency of admitted requests), so the reading is demand
// (offered work ÷ capacity, may exceed 1) rather than admitted work.
// REQUIRES: the owning gate's mutex around every method.
type meter struct {
	workers    float64
	every      time.Duration
	withDemand bool

	inflight   int64
	area       float64 // ∑ in flight × ns (+ shed demand) since the last sample
	lastChange clock.Instant
	lastSample clock.Instant
	started    bool
	meanLat    float64 // ns, exponentially weighted over admitted completions
	// classLat is meanLat per class, for the demand of shed requests: while
	// only protected (often costlier) classes are admitted, their latency
	// would overstate the work of the cheap requests being shed, and that
	// bias can hold SHED after the overload is gone.
	classLat map[string]float64
}

// maxClasses bounds classLat; requests of further classes use meanLat.
const maxClasses = 64

func newMeter(workers int64, every time.Duration, withDemand bool) meter {
	return meter{workers: float64(workers), every: every, withDemand: withDemand}
}

// update accrues the in-flight area up to now and, when a sample is due,
// returns the utilization of the interval that ended.
func (m *meter) update(now clock.Instant) (u float64, due bool) {
	if !m.started {
		m.started, m.lastChange, m.lastSample = true, now, now
		return 0, false
	}
	if now > m.lastChange {
		m.area += float64(m.inflight) * float64(now-m.lastChange)
		m.lastChange = now
	}
	elapsed := now.Sub(m.lastSample)
	if elapsed < m.every {
		return 0, false
	}
	u = m.area / (m.workers * float64(elapsed))
	m.area, m.lastSample = 0, now
	return u, true
}

func (m *meter) admit() { m.inflight++ }

func (m *meter) release(class string, latency time.Duration) {
	m.inflight = max(m.inflight-1, 0)
	if latency <= 0 {
		return
	}
	m.meanLat = ewma(m.meanLat, float64(latency))
	if !m.withDemand {
		return
	}
	if m.classLat == nil {
		m.classLat = map[string]float64{}
	}
	if cl, ok := m.classLat[class]; ok || len(m.classLat) < maxClasses {
		m.classLat[class] = ewma(cl, float64(latency))
	}
}

// ewma folds x into mean (weight 1/64); a zero mean starts at x.
func ewma(mean, x float64) float64 {
	if mean == 0 {
		return x
	}
	return mean + (x-mean)/64
}

// shed records the demand of a request of class that was not admitted:
// the mean latency of its class when admitted, or of all requests.
func (m *meter) shed(class string) {
	if !m.withDemand {
		return
	}
	if lat, ok := m.classLat[class]; ok {
		m.area += lat
		return
	}
	m.area += m.meanLat
}
