package queue

import (
	"math"
	"slices"
)

// The fair queue's bookkeeping as it was before its hand-off stopped
// looking tenants up in maps: the reference the differential test
// (TestFairClassMatchesTheReference) holds the current one to.

// refFairClass is one class's fair queue: a FIFO per tenant with waiters,
// the class's virtual time, and the finish tags of tenants that may still
// be ahead of it (a tag at or below V carries nothing and is pruned).
type refFairClass struct {
	v       float64
	last    map[string]float64
	lastW   map[string]float64 // the weight each tag in last was set with
	tenants map[string]*refTenantFIFO
	n       int
	gone    []finish // scratch: finish tags above V of tenants not waiting
}

type refTenantFIFO struct {
	name  string
	w     float64
	ws    []*waiter
	units int64 // work waiting
}

func newRefFairClass() refFairClass {
	return refFairClass{last: map[string]float64{}, lastW: map[string]float64{}, tenants: map[string]*refTenantFIFO{}}
}

// key is t's start tag now.
func (f *refFairClass) key(t *refTenantFIFO, burst float64) float64 {
	s := f.v - burst
	if last, ok := f.last[t.name]; ok && last > s {
		s = last
	}
	return s
}

// pick returns the tenant to serve next and its start tag: the smallest
// tag, ties to the tenant whose head came first (then by name).
func (f *refFairClass) pick(burst float64) (*refTenantFIFO, float64) {
	var best *refTenantFIFO
	bestKey := 0.0
	for _, t := range f.tenants {
		k := f.key(t, burst)
		if best == nil || k < bestKey || (k == bestKey && (t.ws[0].since < best.ws[0].since ||
			(t.ws[0].since == best.ws[0].since && t.name < best.name))) {
			best, bestKey = t, k
		}
	}
	return best, bestKey
}

func (f *refFairClass) push(w *waiter, weight float64) {
	t := f.tenants[w.flow]
	if t == nil {
		t = &refTenantFIFO{name: w.flow, w: weight}
		f.tenants[t.name] = t
	}
	t.ws = append(t.ws, w)
	t.units += max(w.req.Cost, 1)
	f.n++
}

// pushFront puts back a waiter taken from the head of its tenant.
func (f *refFairClass) pushFront(w *waiter, weight float64) {
	f.push(w, weight)
	t := f.tenants[w.flow]
	copy(t.ws[1:], t.ws[:len(t.ws)-1])
	t.ws[0] = w
}

// take removes w from its tenant's FIFO, reporting whether it was there.
func (f *refFairClass) take(w *waiter) bool {
	t := f.tenants[w.flow]
	if t == nil {
		return false
	}
	i := slices.Index(t.ws, w)
	if i < 0 {
		return false
	}
	t.ws = slices.Delete(t.ws, i, i+1)
	t.units -= max(w.req.Cost, 1)
	f.n--
	if len(t.ws) == 0 {
		delete(f.tenants, t.name)
	}
	return true
}

// served charges w's tenant for the work it was served at start tag
// w.start and advances V by that work as the fluid (GPS) system would:
// over the weight of the tenants active in it, those waiting and those
// whose finish tag is still above V (a tenant between two requests, its
// last one just ended, is active there until V reaches its tag), the
// weight dropping as V passes each such tag (Demers, Keshav and Shenker,
// "Analysis and Simulation of a Fair Queueing Algorithm", SIGCOMM 1989).
// Counting only the tenants waiting at the instant of a dispatch made V
// jump a whole cost whenever a closed-loop tenant (one request at a time)
// was between its requests, and it came back behind a backlogged tenant
// it should have alternated with. Tags are rebased to keep V small, where
// a float64 still resolves a cost of 1 at a weight of 1e6; finish tags at
// or below V − burst carry nothing and are pruned.
func (f *refFairClass) served(w *waiter, weight, burst float64) {
	cost := float64(max(w.req.Cost, 1))
	f.last[w.flow] = w.start + cost/weight
	f.lastW[w.flow] = weight
	active, ahead := 0.0, math.Inf(1)
	for _, t := range f.tenants {
		active += t.w
		if last, ok := f.last[t.name]; ok && last > f.v {
			ahead = min(ahead, last) // V stops there: passing it would take the tenant's credit
		}
	}
	gone := f.gone[:0]
	for name, last := range f.last {
		if _, waiting := f.tenants[name]; !waiting && last > f.v {
			gone = append(gone, finish{last, f.lastW[name]})
			active += f.lastW[name]
		}
	}
	slices.SortFunc(gone, func(a, b finish) int { return refCmpFloat(a.f, b.f) })
	v, work := f.v, cost
	for _, g := range gone {
		need := (g.f - v) * active
		if work < need {
			break
		}
		work -= need
		v, active = g.f, active-g.w
	}
	if active > 0 {
		v += work / active
	} else {
		v += work / weight
	}
	f.gone = gone[:0]
	f.v = max(min(v, ahead), w.start)
	if f.v > rebaseAt {
		for t := range f.last {
			f.last[t] -= f.v
		}
		f.v = 0
	}
	if len(f.last) > 2*len(f.tenants)+64 {
		for t, last := range f.last {
			if last <= f.v-burst {
				delete(f.last, t)
				delete(f.lastW, t)
			}
		}
	}
}

func refCmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
