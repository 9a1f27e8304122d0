package queue

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// Fairness serves the waiters of each class's queue between tenants in
// weighted fair shares of work units: start-time fair queueing (Goyal,
// Vin and Cheng, "Start-time Fair Queueing", SIGCOMM 1996), the
// virtual-time scheme Aperture's and Kubernetes APF's fair queues are
// built on. Each tenant waits in a FIFO of its own; the next slot goes to
// the tenant with the smallest start tag S_t = max(V − Burst, F_t), ties
// to the earliest head; serving its request of cost c sets
// F_t = S_t + c/w_t (w_t is the tenant's weight, F_t its finish tag) and
// moves the class's virtual time V to max(min(V + c/W, F_min), S_t), W
// being the weight of the tenants active in the fluid system (waiting, or
// with a finish tag still above V: a closed-loop tenant between two
// requests keeps its place; W drops as V passes their tags) and F_min the
// smallest finish tag above V among the tenants waiting. V so advances with the work served whoever is served
// (as the virtual time of weighted fair queueing does), a stream of new
// tenants cannot hold it still, and it never passes a waiting tenant's
// tag (which would take that tenant's credit). A tenant is charged
// only for work it is served: requests that leave unserved (their wait ran
// out, their caller left) cost nothing. A tenant with twice the weight so
// gets twice the work units while both wait, whatever their request
// counts.
//
// Starvation bound: a tenant's head request has a tag at most V + C/w (C
// its cost, w its weight) above the virtual time, and every slot handed to
// another tenant advances V by that work ÷ W, so at most
// W·(C/w + Burst) work units of other tenants are served before it (W the
// most weight ever active), plus the higher classes' work and the
// requests in their slots. A closed-loop tenant (one request at a time)
// beside a backlog is served its whole demand, the release after each of
// its requests (TestFairQueueClosedLoopTenant).
//
// A full queue (MaxLen) makes room by turning away the newest waiter of
// the tenant with the most work waiting, in the lowest class at or below
// the newcomer's, if that tenant has more waiting than the newcomer's
// would: a tenant within its share is not refused for another's backlog.
// CoDel's drops take the same waiter, and while CoDel sees a standing
// queue a fair queue still serves in tag order (adaptive LIFO would undo
// it).
type Fairness struct {
	// Weights gives tenants their weight; tenants not listed have
	// Default. Weights are in [MinWeight, MaxWeight].
	Weights map[string]float64
	// Default is the weight of tenants not in Weights. Default 1.
	Default float64
	// Burst is the credit, in virtual time (work units at weight 1), a
	// tenant coming back from idle starts with: it may be served up to
	// Burst·w units ahead of its share. Default 0; at most MaxBurst.
	Burst float64
	// Standing, when set, is how long a tenant must have been coming (its
	// first request through the queue at least Standing ago, and one at
	// least every StandingIdle since) before it is a flow of its own;
	// until then it waits in one flow shared by every tenant without
	// standing, of weight Default, served first come, first served within.
	// A thousand new keys so take one tenant's share, not a thousand: an
	// attacker who mints keys gains a share only by using each of them for
	// Standing first. 0: off, every tenant is a flow from its first
	// request. At most MaxStanding.
	Standing time.Duration
	// StandingIdle is how long a tenant with standing may stay away and
	// keep it. Default 10·Standing.
	StandingIdle time.Duration
	// StandingTenants bounds the tenants the queue remembers for standing
	// (default 65,536): past it, new tenants stay without standing until
	// idle ones are forgotten, so a flood of keys cannot push established
	// tenants out.
	StandingTenants int
}

// MaxStanding is the longest Standing.
const MaxStanding = 24 * time.Hour

// newcomers names the flow of the tenants without standing.
const newcomers = "\x00newcomers"

// standing remembers when tenants first came and last came.
type standing struct {
	seen  map[string]seenAt
	swept clock.Instant
}

type seenAt struct{ first, last clock.Instant }

// flowOf records tenant's request at now and returns the flow it waits
// in: itself once it has standing, else Newcomers. REQUIRES: q.mu held.
func (f *Fairness) flowOf(st *standing, tenant string, now clock.Instant) string {
	if f.Standing <= 0 {
		return tenant
	}
	if now.Sub(st.swept) >= f.Standing {
		st.swept = now
		for t, s := range st.seen {
			if now.Sub(s.last) > f.StandingIdle {
				delete(st.seen, t)
			}
		}
	}
	s, ok := st.seen[tenant]
	switch {
	case ok && now.Sub(s.last) > f.StandingIdle:
		s = seenAt{first: now} // away too long: it starts over
	case !ok && len(st.seen) >= f.StandingTenants:
		return newcomers // the table is full of tenants seen lately
	case !ok:
		s.first = now
	}
	s.last = now
	st.seen[tenant] = s
	if now.Sub(s.first) >= f.Standing {
		return tenant
	}
	return newcomers
}

// MinWeight and MaxWeight bound a tenant's weight: within them a cost of
// 1 at the largest weight still moves a tag a float64 resolves.
const (
	MinWeight = 1e-3
	MaxWeight = 1e6
)

// MaxBurst is the largest Burst, in work units.
const MaxBurst = 1 << 30

func (f *Fairness) validate() error {
	if f.Default == 0 {
		f.Default = 1
	}
	if !(f.Default >= MinWeight && f.Default <= MaxWeight) || !(f.Burst >= 0 && f.Burst <= MaxBurst) {
		return fmt.Errorf("queue: fairness default weight %v outside [%v, %v] or burst %v outside [0, %d]", f.Default, MinWeight, MaxWeight, f.Burst, MaxBurst)
	}
	if f.Standing < 0 || f.Standing > MaxStanding || f.StandingIdle < 0 || f.StandingTenants < 0 {
		return fmt.Errorf("queue: fairness standing %v outside [0, %v], or a negative idle time or tenant bound", f.Standing, MaxStanding)
	}
	if f.StandingIdle == 0 {
		f.StandingIdle = 10 * f.Standing
	}
	if f.StandingTenants == 0 {
		f.StandingTenants = 1 << 16
	}
	for t, w := range f.Weights {
		if !(w >= MinWeight && w <= MaxWeight) {
			return fmt.Errorf("queue: fairness weight %v of tenant %q outside [%v, %v]", w, t, MinWeight, MaxWeight)
		}
	}
	return nil
}

func (f *Fairness) weight(tenant string) float64 {
	if tenant == newcomers {
		return f.Default
	}
	if w, ok := f.Weights[tenant]; ok {
		return w
	}
	return f.Default
}

// fairClass is one class's fair queue: a FIFO per tenant with waiters,
// the class's virtual time, and the finish tags of tenants that may still
// be ahead of it (a tag at or below V − burst carries nothing and is
// pruned). A waiting tenant's tag lives in its FIFO and the tenants are
// walked in a slice: a hand-off looked every tenant up in two maps, 124 µs
// with 1,000 tenants waiting (the default MaxLen) and 3 ms with 10,000,
// under the queue's lock. The tags of tenants not waiting are few (those
// between two requests).
type fairClass struct {
	v       float64
	tenants map[string]*tenantFIFO
	list    []*tenantFIFO     // the tenants waiting, in no order (tenantFIFO.idx)
	idle    map[string]finish // the tags of tenants not waiting
	n       int
	gone    []finish // scratch: finish tags above V of tenants not waiting
}

// finish is a tenant's finish tag and weight.
type finish struct{ f, w float64 }

type tenantFIFO struct {
	name  string
	w     float64
	ws    []*waiter
	units int64 // work waiting
	idx   int   // in fairClass.list
	// tag is the tenant's finish tag and the weight it was set with, when
	// hasTag.
	tag    finish
	hasTag bool
}

func newFairClass() fairClass {
	return fairClass{tenants: map[string]*tenantFIFO{}, idle: map[string]finish{}}
}

// key is t's start tag now.
func (f *fairClass) key(t *tenantFIFO, burst float64) float64 {
	s := f.v - burst
	if t.hasTag && t.tag.f > s {
		s = t.tag.f
	}
	return s
}

// pick returns the tenant to serve next and its start tag: the smallest
// tag, ties to the tenant whose head came first (then by name).
func (f *fairClass) pick(burst float64) (*tenantFIFO, float64) {
	var best *tenantFIFO
	bestKey := 0.0
	for _, t := range f.list {
		k := f.key(t, burst)
		if best == nil || k < bestKey || (k == bestKey && (t.ws[0].since < best.ws[0].since ||
			(t.ws[0].since == best.ws[0].since && t.name < best.name))) {
			best, bestKey = t, k
		}
	}
	return best, bestKey
}

func (f *fairClass) push(w *waiter, weight float64) {
	t := f.tenants[w.flow]
	if t == nil {
		t = &tenantFIFO{name: w.flow, w: weight, idx: len(f.list)}
		if tag, ok := f.idle[w.flow]; ok {
			t.tag, t.hasTag = tag, true
			delete(f.idle, w.flow)
		}
		f.tenants[t.name] = t
		f.list = append(f.list, t)
	}
	t.ws = append(t.ws, w)
	t.units += max(w.req.Cost, 1)
	f.n++
}

// pushFront puts back a waiter taken from the head of its tenant.
func (f *fairClass) pushFront(w *waiter, weight float64) {
	f.push(w, weight)
	t := f.tenants[w.flow]
	copy(t.ws[1:], t.ws[:len(t.ws)-1])
	t.ws[0] = w
}

// take removes w from its tenant's FIFO, reporting whether it was there.
func (f *fairClass) take(w *waiter) bool {
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
		last := f.list[len(f.list)-1]
		f.list[t.idx], last.idx = last, t.idx
		f.list = f.list[:len(f.list)-1]
		if t.hasTag {
			f.idle[t.name] = t.tag
		}
	}
	return true
}

// heaviest is the tenant with the most work waiting (ties by name).
func (f *fairClass) heaviest() *tenantFIFO {
	var h *tenantFIFO
	for _, t := range f.list {
		if h == nil || t.units > h.units || (t.units == h.units && t.name > h.name) {
			h = t
		}
	}
	return h
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
func (f *fairClass) served(w *waiter, weight, burst float64) {
	cost := float64(max(w.req.Cost, 1))
	tag := finish{w.start + cost/weight, weight}
	if t := f.tenants[w.flow]; t != nil {
		t.tag, t.hasTag = tag, true
	} else {
		f.idle[w.flow] = tag
	}
	active, ahead := 0.0, math.Inf(1)
	for _, t := range f.list {
		active += t.w
		if t.hasTag && t.tag.f > f.v {
			ahead = min(ahead, t.tag.f) // V stops there: passing it would take the tenant's credit
		}
	}
	gone := f.gone[:0]
	for _, g := range f.idle {
		if g.f > f.v {
			gone = append(gone, g)
			active += g.w
		}
	}
	// In order of tag, as far as the work goes, which is seldom far: a
	// heap, not a sort of every tag above V (a thousand tenants between
	// requests, a Sybil client's keys, made the sort most of a hand-off).
	h := finishHeap(gone)
	heap.Init(&h)
	v, work := f.v, cost
	for h.Len() > 0 {
		g := heap.Pop(&h).(finish)
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
		for _, t := range f.list {
			t.tag.f -= f.v
		}
		for name, g := range f.idle {
			g.f -= f.v
			f.idle[name] = g
		}
		f.v = 0
	}
	if len(f.idle) > len(f.list)+64 {
		for name, g := range f.idle {
			if g.f <= f.v-burst {
				delete(f.idle, name)
			}
		}
	}
}

// finishHeap is finish tags, the lowest first (container/heap).
type finishHeap []finish

func (h finishHeap) Len() int           { return len(h) }
func (h finishHeap) Less(i, j int) bool { return h[i].f < h[j].f }
func (h finishHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *finishHeap) Push(x any)        { *h = append(*h, x.(finish)) }
func (h *finishHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// rebaseAt is the virtual time past which tags are moved back to 0.
var rebaseAt float64 = 1 << 30 // a variable for the tests

// ahead estimates how many waiters of class c a new request of tenant
// (with weight w) is served after: its tenant's own, and of every other
// tenant as many as its share lets go first. REQUIRES: q.mu held.
func (q *Queue) aheadFair(c int, tenant string) int {
	f := &q.fair[c]
	w := q.opts.Fair.weight(tenant)
	own := 0
	if t := f.tenants[tenant]; t != nil {
		own = len(t.ws)
	}
	n := own
	for _, t := range f.list {
		if t.name != tenant {
			n += min(len(t.ws), int(math.Ceil(float64(own+1)*t.w/w)))
		}
	}
	return n
}

// evictable returns the class whose heaviest tenant's newest waiter
// makes room for a newcomer of tenant in class c: the lowest class at or
// below c with waiters, if it is below c or its heaviest tenant is not the
// newcomer's and has more work waiting than the newcomer's tenant would
// have; -1: none. REQUIRES: q.mu held.
func (q *Queue) evictable(c int, tenant string, cost int64) int {
	for k := len(q.fair) - 1; k >= c; k-- {
		f := &q.fair[k]
		if f.n == 0 {
			continue
		}
		if k > c {
			return k
		}
		h := f.heaviest()
		mine := max(cost, 1)
		if t := f.tenants[tenant]; t != nil {
			mine += t.units
		}
		if h.name == tenant || h.units <= mine {
			return -1
		}
		return k
	}
	return -1
}

// evict takes the newest waiter of class k's heaviest tenant out and
// returns it. REQUIRES: q.mu held, a waiter in class k.
func (q *Queue) evict(k int) *waiter {
	f := &q.fair[k]
	t := f.heaviest()
	w := t.ws[len(t.ws)-1]
	f.take(w)
	q.n--
	w.waiting = false
	return w
}

// oldestFair is the age of class c's oldest waiter. REQUIRES: q.mu held.
func (q *Queue) oldestFair(c int, now clock.Instant) (age time.Duration) {
	for _, t := range q.fair[c].list {
		age = max(age, now.Sub(t.ws[0].since))
	}
	return age
}
