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
// ceil(q) workers whose service times are the recorded durations times
// q ÷ ceil(q) completes as many. Workers is 0 when no admitted request has
// a duration.
func capacity(recs []Record) (workers int, scale float64) {
	if len(recs) == 0 {
		return 0, 1
	}
	t0 := recs[0].At
	span := recs[len(recs)-1].At - t0
	step := max(int64(time.Second), span/1_000_000+1) // a coarser step for a log of decades
	var busy []float64                                // request-nanoseconds per step
	for i := range recs {
		r := &recs[i]
		if r.Decision == Rejected || r.Duration <= 0 {
			continue
		}
		from, to := r.At-t0, r.At-t0+int64(r.Duration)
		for s := from / step; s*step < to; s++ {
			for int64(len(busy)) <= s {
				busy = append(busy, 0)
			}
			busy[s] += float64(min(to, (s+1)*step) - max(from, s*step))
		}
	}
	if len(busy) > 2 {
		busy = busy[1 : len(busy)-1] // the first and last steps are partial
	}
	sorted := slices.Clone(busy)
	slices.Sort(sorted)
	if len(sorted) == 0 || sorted[len(sorted)-1] == 0 {
		return 0, 1
	}
	ref := 0.9 * sorted[len(sorted)*99/100]
	sum, n := 0.0, 0
	for _, b := range busy {
		if b >= ref {
			sum += b
			n++
		}
	}
	q := sum / float64(n) / float64(step)
	workers = max(int(math.Ceil(q-1e-9)), 1)
	return workers, q / float64(workers)
}
