package whatif

import (
	"cmp"
	"container/heap"
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
//
// A recorded duration is the request's wait for a worker plus its service.
// Given the number of workers k, the two come apart exactly (the queueing
// recursion of a first-come first-served k-server line, Kiefer and
// Wolfowitz 1955): request i can start when it has arrived, when the
// request before it has started, and when at most k−1 of those before it
// are still being served, that is at the k-th latest departure among
// them; its service is its departure less that start. k is the smallest
// number of workers for which the recording is possible, every request
// leaving after it could have started: with fewer, a short request that
// left early behind a long one would have had to leave before it began.
// A pool of k workers serving each request for its service then
// completes what the recording's upstream could (not merely what it was
// asked), and a request that waited in the recording's upstream waits in
// the model only as long as the candidate's admissions make it.

// pool is the modeled upstream.
type pool struct {
	workers int
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

// fit is the recording's upstream as a pool.
type fit struct {
	workers int             // 0: no admitted request has a duration
	service []time.Duration // per record: its service time; -1 none (refused, or no duration)
	served  int             // records with a service time
	queued  int             // of them, those that waited for a worker
	late    int             // of them, those that could not have been served so (service 0)
	most    int             // the most served requests in flight at once
	visits  []visit         // the served requests in the order they reached the upstream
}

// visit is a served request's stay at the upstream: it reached it after
// its decision (its arrival plus its wait in a gate's queue) and left it a
// recorded duration later.
type visit struct {
	reach, leave int64
	i            int32 // its record
}

// lateShare is the share of the served requests that may leave before
// they could start at the fitted size: the log's clocks and a host's
// stalls reorder a few requests by some milliseconds (up to 0.4% of them
// in the demo's recordings, at the right size).
const lateShare = 0.01

// fitUpstream sizes the recording's upstream: with workers > 0 as given,
// else the fewest workers for which at most lateShare of the served
// requests leave before they could start. That is the size of an upstream
// that was often full (TestFitFindsTheWorkers); of one that seldom was, it
// can be fewer workers, each serving faster: the recording cannot show
// workers it never kept busy.
func fitUpstream(recs []Record, workers int) fit {
	f := fit{workers: workers, service: make([]time.Duration, len(recs))}
	for i := range recs {
		r := &recs[i]
		f.service[i] = -1
		if r.Decision == Rejected || r.Duration < 0 {
			continue
		}
		reach := r.At + int64(r.Wait)
		f.visits = append(f.visits, visit{reach: reach, leave: reach + int64(r.Duration), i: int32(i)})
	}
	slices.SortStableFunc(f.visits, func(a, b visit) int { return cmp.Compare(a.reach, b.reach) })
	f.served = len(f.visits)
	f.most = f.mostInFlight()
	hi := f.most
	if hi == 0 {
		f.workers = 0
		return f
	}
	if workers <= 0 {
		// The late count falls as workers are added (each request starts
		// no later with one more), and hi has none (no request waits), so
		// the fewest that fit are found by bisection.
		lo := 1
		for lo < hi {
			mid := lo + (hi-lo)/2
			f.deconvolve(mid)
			if float64(f.late) <= lateShare*float64(f.served) {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		f.workers = lo
	}
	f.deconvolve(f.workers)
	f.visits = nil // the service times hold what the replay needs
	return f
}

// mostInFlight is the most served requests in flight at once.
func (f *fit) mostInFlight() int {
	var ends departures
	most := 0
	for _, v := range f.visits {
		for len(ends) > 0 && ends[0] <= v.reach {
			heap.Pop(&ends)
		}
		heap.Push(&ends, v.leave)
		most = max(most, len(ends))
	}
	return most
}

// deconvolve splits each served request's duration into its wait for one
// of k workers and its service, in the order the requests reached the
// upstream. A request that could only have started after it left, or that
// waited and then took no time at all, is late (service 0).
func (f *fit) deconvolve(k int) {
	f.queued, f.late = 0, 0
	latest := make(departures, 0, min(k, len(f.visits))) // the k latest departures so far, the earliest of them first
	var prev int64                                       // the start of the request before
	for _, v := range f.visits {
		start := max(v.reach, prev)
		if len(latest) == k && latest[0] > start {
			start = latest[0]
		}
		prev = start
		waited := start > v.reach
		if v.leave < start || (waited && v.leave == start) {
			f.late++
			f.service[v.i] = 0
		} else {
			f.service[v.i] = time.Duration(v.leave - start)
		}
		if waited {
			f.queued++
		}
		if len(latest) < k {
			heap.Push(&latest, v.leave)
		} else if v.leave > latest[0] {
			latest[0] = v.leave
			heap.Fix(&latest, 0)
		}
	}
}

// departures is a min-heap of instants.
type departures []int64

func (h departures) Len() int           { return len(h) }
func (h departures) Less(i, j int) bool { return h[i] < h[j] }
func (h departures) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *departures) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *departures) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// sortedByArrival reports whether recs are in arrival order.
func sortedByArrival(recs []Record) bool {
	return slices.IsSortedFunc(recs, func(a, b Record) int { return cmp.Compare(a.At, b.At) })
}
