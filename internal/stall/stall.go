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
	"sync/atomic"
	"time"
)

// Meter records the longest scheduling delay since its last Reset.
type Meter struct {
	max  atomic.Int64
	stop chan struct{}
	done chan struct{}
}

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
		if late := int64(time.Since(want)); late > m.max.Load() {
			m.max.Store(late) // one writer
		}
	}
}

// Max returns the longest delay seen since the last Reset.
func (m *Meter) Max() time.Duration { return time.Duration(m.max.Load()) }

// Reset starts a new measurement.
func (m *Meter) Reset() { m.max.Store(0) }

// Stop ends the meter's goroutine.
func (m *Meter) Stop() {
	close(m.stop)
	<-m.done
}
