// Package stall measures how late this process gets to run, so that a test
// holding a real-time bound (a decision answers within its timeout) can
// discount what a busy machine adds: a goroutine sleeps a millisecond at a
// time and records by how much it woke past its time.
//
//	m := stall.Start()
//	defer m.Stop()
//	m.Reset()
//	... // the phase measured
//	if took > bound+m.Max() { t.Errorf(...) }
package stall

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Meter records the longest scheduling delay since its last Reset, and
// every delay, for MaxIn.
type Meter struct {
	max  atomic.Int64
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	recent []sample // the delays since the last Reset, oldest first (at most keep)
}

// sample is one wake-up: when, and how late.
type sample struct {
	at   time.Time
	late time.Duration
}

// keep bounds the delays kept for MaxIn: a few seconds of ticks.
const keep = 8192

// Start starts a meter; Stop ends it.
func Start() *Meter {
	m := &Meter{stop: make(chan struct{}), done: make(chan struct{})}
	go m.run()
	return m
}

func (m *Meter) run() {
	defer close(m.done)
	const tick = time.Millisecond
	for {
		want := time.Now().Add(tick)
		select {
		case <-m.stop:
			return
		case <-time.After(tick):
		}
		now := time.Now()
		late := now.Sub(want)
		if int64(late) > m.max.Load() {
			m.max.Store(int64(late)) // one writer
		}
		if late > 0 {
			m.mu.Lock()
			if len(m.recent) == keep {
				m.recent = append(m.recent[:0], m.recent[keep/2:]...)
			}
			m.recent = append(m.recent, sample{at: now, late: late})
			m.mu.Unlock()
		}
	}
}

// Max returns the longest delay seen since the last Reset.
func (m *Meter) Max() time.Duration { return time.Duration(m.max.Load()) }

// MaxIn returns the most delay, summed, that the meter saw within any span
// of length w since the last Reset: what a busy machine took from an
// operation that lasted w. A wait of several hand-offs between goroutines
// (a Redis call: the caller, the client's writer and reader) can be late at
// each of them, and on a machine that runs this process in short turns,
// Max (the longest single delay) is less than their sum.
func (m *Meter) MaxIn(w time.Duration) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var best, sum time.Duration
	first := 0
	for _, s := range m.recent {
		sum += s.late
		for s.at.Sub(m.recent[first].at) > w {
			sum -= m.recent[first].late
			first++
		}
		best = max(best, sum)
	}
	return max(best, m.Max())
}

// Quantile returns the q-quantile (in [0, 1]) of the delays recorded
// since the last Reset (the last few seconds of them): how late this
// process usually got to run, where Max is its worst moment.
func (m *Meter) Quantile(q float64) time.Duration {
	m.mu.Lock()
	ds := make([]time.Duration, len(m.recent))
	for i, s := range m.recent {
		ds[i] = s.late
	}
	m.mu.Unlock()
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(int(q*float64(len(ds))), len(ds)-1)]
}

// Reset starts a new measurement.
func (m *Meter) Reset() {
	m.max.Store(0)
	m.mu.Lock()
	m.recent = m.recent[:0]
	m.mu.Unlock()
}

// Stop ends the meter's goroutine.
func (m *Meter) Stop() {
	close(m.stop)
	<-m.done
}
