package whatif

import (
	"math"
	"slices"
	"time"
)

// The upstream the replay serves admitted requests with: a pool of
// workers, each serving one request at a time for its service time, and a
// first-come first-served line in front of them. Without it a replayed
// request would take its recorded duration however many others were
// admitted with it, and an adaptive gate, which sizes itself by the
// latency it sees, would find an upstream that never slows down. With it,
// admitting more than the recording did makes the latency grow as it would
// have, and the gates that measure it react as they did.

// pool is the modeled upstream.
type pool struct {
	workers int
	scale   float64 // service time = recorded duration × scale
	busy    int
	line    []int32 // requests waiting for a worker, first come first
	head    int
}

// take gives request i a worker if one is free; otherwise it joins the
// line.
func (p *pool) take(i int32) bool {
	if p.busy < p.workers {
		p.busy++
		return true
	}
	p.line = append(p.line, i)
	return false
}

// next frees a worker and hands it to the first in line, if any (-1: none).
func (p *pool) next() int32 {
	if p.head < len(p.line) {
		i := p.line[p.head]
		p.head++
		if p.head > 1024 && 2*p.head > len(p.line) { // reclaim the served front
			p.line = append(p.line[:0], p.line[p.head:]...)
			p.head = 0
		}
		return i
	}
	p.busy--
	return -1
}

// capacity is the recording's upstream as a worker pool: workers, and the
// factor its service times take so that, saturated, the pool completes what
// the recording's upstream did. The recording keeps q requests in flight on
// average over its busy seconds (those at 90% or more of its 99th
// percentile second), each for its recorded duration; by Little's law its
// upstream then completed q ÷ mean duration requests a second. A pool of
// c workers whose service times are the recorded durations times c ÷ q
// completes as many; capacity gives c = ceil(q). Workers is 0 when no admitted request has
// a duration, and -1 when q is below one (no model).
func capacity(recs []Record) (workers int, scale float64) {
	if len(recs) == 0 {
		return 0, 1
	}
	t0 := recs[0].At
	span := recs[len(recs)-1].At - t0
	step := max(int64(time.Second), span/1_000_000+1) // a coarser step for a log of decades
	// Request-nanoseconds per step: the partial steps at a request's ends
	// in busy, the whole steps between them as a difference in full (a
	// request of a day adds two entries, not 86,400).
	n := span/step + int64(MaxDuration)/step + 2
	busy, full := make([]float64, n), make([]float64, n+1)
	for i := range recs {
		r := &recs[i]
		if r.Decision == Rejected || r.Duration <= 0 {
			continue
		}
		from, to := r.At-t0, r.At-t0+int64(min(r.Duration, MaxDuration))
		a, b := from/step, (to-1)/step // the first and last steps it touches
		if a == b {
			busy[a] += float64(to - from)
			continue
		}
		busy[a] += float64((a+1)*step - from)
		busy[b] += float64(to - b*step)
		full[a+1] += float64(step)
		full[b] -= float64(step)
	}
	run := 0.0
	last := 0
	for i := range busy {
		run += full[i]
		busy[i] += run
		if busy[i] > 0 {
			last = i
		}
	}
	busy = busy[:last+1]
	if len(busy) > 2 {
		busy = busy[1 : len(busy)-1] // the first and last steps are partial
	}
	sorted := slices.Clone(busy)
	slices.Sort(sorted)
	if len(sorted) == 0 || sorted[len(sorted)-1] == 0 {
		return 0, 1
	}
	ref := 0.9 * sorted[len(sorted)*99/100]
	sum, k := 0.0, 0
	for _, b := range busy {
		if b >= ref {
			sum += b
			k++
		}
	}
	q := sum / float64(k) / float64(step)
	if q < 1 {
		// Not one request in flight on average even in its busiest
		// seconds: the recording says nothing of its upstream's capacity
		// (and the scale would shrink the durations towards nothing).
		return -1, 1
	}
	workers = int(math.Ceil(q - 1e-9))
	return workers, float64(workers) / q
}
