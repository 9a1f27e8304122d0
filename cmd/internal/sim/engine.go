package sim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/wire"
	"github.com/sluice-go/sluice/queue"
)

// vclock is the virtual clock the chain reads: the engine moves it from
// event to event. The engine runs on one goroutine.
type vclock struct{ now int64 }

func (c *vclock) Now() clock.Instant { return clock.Instant(c.now) }

// event kinds
const (
	evArrival uint8 = iota // a new operation's first attempt
	evEnqueue              // an admitted attempt reaches the queue after a paced wait
	evTimeout              // a caller stops waiting for an attempt
	evFree                 // a worker finishes (aux says how)
	evRetry                // a caller sends its next attempt
	evPhase                // a time-series phase begins
	evReady                // a request parked in a wait queue got a slot or was turned away (aux: the reason)
	evExpire               // a parked request's wait runs out
)

// how a worker's busy period ended
const (
	endDone    uint8 = iota // served to the end
	endAbandon              // gave up at the cancellation checkpoint
	endScan                 // skipped dead entries, took nothing
)

type event struct {
	at   int64
	seq  uint64
	ref  int32
	kind uint8
	aux  uint8
}

// heap is a 4-ary min-heap of events ordered by (at, seq): equal times
// run in scheduling order, so a run is reproducible. Four children per
// node halve the depth of a binary heap and keep siblings in one cache line
// or two, which matters: the heap is most of the simulator's time.
type heap []event

func (h heap) less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}

func (h *heap) push(e event) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 4
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *heap) pop() event {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for k := c + 1; k < c+4 && k < n; k++ {
			if s.less(k, m) {
				m = k
			}
		}
		if !s.less(m, i) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// attempt is one try of an operation. It lives in a slab and is recycled
// when neither the caller (its timeout event) nor the service holds it.
type attempt struct {
	class     int32
	tenant    int32
	n         int32 // 1 for the first attempt
	refs      int8
	answered  bool  // the caller got an answer or stopped waiting
	measured  bool  // issued inside the measured window
	proc      uint8 // the process that decides it (index into engine.procs)
	issued    int64 // when this attempt was sent
	giveUp    int64 // when its caller stops waiting
	deadline  int64 // the operation's deadline (Client.Deadline; 0: none)
	header    int64 // the budget a naive caller resends (ns; 0: not yet set)
	units     int64
	ticket    sluice.Ticket
	admission bool // holds a ticket
	parked    bool // waiting in a wait queue (pq, pid) for a slot
	pq        *queue.Queue
	pid       uint64
}

// class is a scenario class prepared for the engine.
type class struct {
	Class
	slow    float64        // current slowdown of its service times
	share   float64        // current share of the load (the phase's or Share)
	req     sluice.Request // class, operation and cost from the policy's route rules
	tenants []string
	timeout Dist
	rate    float64 // requests/s at the current load
}

// process is one simulated gateway process: its chain (nil without
// admission) and the gates whose state the report reads.
type process struct {
	name   string
	chain  *sluice.Chain
	sizer  sluice.Sizer       // the chain's first gate with a moving limit, if any
	queuer sluice.Queuer      // and its first wait queue
	lease  sluice.Leaseholder // and its first gate spending a lease
}

// engine is one simulated run: one sweep step or one time series.
type engine struct {
	// full is set when the attempts alive at once reached maxAlive: run
	// stops there, and the step or series reports it (errFull).
	full    bool
	fullAt  int64 // when
	s       *Scenario
	chain   *sluice.Chain // the first process's, for the common case of one
	procs   []process
	pcum    []float64      // cumulative weights of the processes, at the current phase
	rPrc    *rand.Rand     // draws each attempt's process (with more than one)
	rules   identify.Rules // with defaults filled in
	clk     *vclock
	ctx     context.Context
	wait    time.Duration // paced wait reported by gates (sluice.ContextWithWait)
	park    queue.Park    // where a request waits in a wait queue
	classes []class
	// unmatched lists the scenario classes no route of the policy matches
	unmatched []string
	events    heap
	timers    wheel // the callers' timeouts
	seq       uint64
	slab      []attempt
	free      []int32
	queue     ring
	idle      int    // free workers (below 0 while a shrunk pool's busy workers finish)
	workers   int    // the pool's size now
	down      []bool // by process: cannot reach the service in this phase
	busy      int64  // worker-ns spent in the measured window
	last      int64  // time up to which busy is integrated
	load      float64
	budget    float64

	cum    []float64
	rate   float64 // total first-attempt requests/s
	arrGen int32   // invalidates a pending arrival when the load changes

	rArr, rSvc, rCli *rand.Rand

	clients []simClient // with client retry "sluice": one per client process

	from, to int64 // measured window
	m        *Row  // counters of the current window
	hist     hist
	level    sluice.Level
}

// simClient is one client process's retry state under client retry
// "sluice": package client's budget and throttle, on the virtual clock.
type simClient struct {
	budget   *client.Budget
	throttle *client.Throttle
}

// sluiceClient returns the client process of attempt a, or nil under
// client retry "naive".
func (e *engine) sluiceClient(a *attempt) *simClient {
	if len(e.clients) == 0 {
		return nil
	}
	i := (int(a.tenant)*31 + int(a.class)) % len(e.clients)
	return &e.clients[i]
}

// ring is a growable FIFO of attempt indexes.
type ring struct {
	buf        []int32
	head, size int
}

func (q *ring) push(v int32) {
	if q.size == len(q.buf) {
		nb := make([]int32, max(16, 2*len(q.buf)))
		for i := 0; i < q.size; i++ {
			nb[i] = q.buf[(q.head+i)%len(q.buf)]
		}
		q.buf, q.head = nb, 0
	}
	q.buf[(q.head+q.size)%len(q.buf)] = v
	q.size++
}

func (q *ring) pop() int32 {
	v := q.buf[q.head]
	q.head = (q.head + 1) % len(q.buf)
	q.size--
	return v
}

// newEngine prepares a run of s (already defaulted) with one chain per
// process (nil: no admission; all nil or none). seed picks the random
// streams; runs with and without admission of the same step share them,
// so both see the same arrivals.
func newEngine(s *Scenario, clk *vclock, chains []*sluice.Chain, rules identify.Rules, seed uint64) (*engine, error) {
	id, err := identify.New(rules)
	if err != nil {
		return nil, err
	}
	if len(rules.Tenant.Parts) > 0 {
		// Simulated tenants are told apart by one header; a key of
		// another kind would make them all one tenant without a word.
		return nil, ferr("policy", "the simulator identifies tenants by one header (identity.tenant: {header: ...}); this policy keys them by %s", tenantSources(rules.Tenant.Parts))
	}
	e := &engine{s: s, clk: clk, chain: chains[0], rules: id.Rules(), idle: s.Workers, workers: s.Workers}
	e.ctx = queue.ContextWithPark(sluice.ContextWithWait(context.Background(), &e.wait), &e.park)
	e.park.Ready = e.ready
	e.processes(chains, seed)
	e.rArr = rand.New(rand.NewPCG(seed, 0x61727269))
	e.rSvc = rand.New(rand.NewPCG(seed, 0x73766321))
	e.rCli = rand.New(rand.NewPCG(seed, 0x636c6921))
	for _, c := range s.Classes {
		pc := class{Class: c, timeout: s.Client.Timeout, slow: 1, share: c.Share}
		if !c.Timeout.isZero() {
			pc.timeout = c.Timeout
		}
		pc.req = sluice.Request{Class: sluice.ClassDefault, Operation: c.Method + " " + c.Path, Cost: c.Units}
		if e.chain != nil {
			h := http.Header{}
			if rules.TenantHeader != "" {
				h.Set(rules.TenantHeader, c.Name) // the tenant is set per attempt
			}
			for k, v := range c.Headers {
				h.Set(k, v)
			}
			var req sluice.Request
			if _, detail := id.Identify(c.Method, c.Path, h, &req); detail != "" {
				return nil, ferr("classes."+c.Name, "the policy cannot classify %s %s: %s", c.Method, c.Path, detail)
			}
			pc.req = req
			if req.Operation == "other" && len(rules.Routes) > 0 {
				e.unmatched = append(e.unmatched, c.Name+" ("+c.Method+" "+c.Path+")")
			}
		}
		pc.tenants = make([]string, c.Tenants)
		for i := range pc.tenants {
			pc.tenants[i] = c.Name + "-" + itoa(i)
		}
		e.classes = append(e.classes, pc)
	}
	e.cum = make([]float64, len(e.classes))
	if s.Client.Retry == RetrySluice {
		ratio := s.Client.Budget
		if ratio == 0 {
			ratio = 0.1
		}
		e.clients = make([]simClient, s.Client.Clients)
		for i := range e.clients {
			e.clients[i] = simClient{budget: client.NewBudget(ratio, 10), throttle: client.NewThrottle(2, 2*time.Minute, 24, 10)}
		}
	}
	return e, nil
}

// processes prepares a process per chain and their balance.
func (e *engine) processes(chains []*sluice.Chain, seed uint64) {
	e.procs = make([]process, len(chains))
	for i, chain := range chains {
		p := &e.procs[i]
		p.name, p.chain = processName(i), chain
		if chain == nil {
			continue
		}
		for _, g := range chain.Gates() {
			if sz, ok := sluice.As[sluice.Sizer](g); ok && p.sizer == nil {
				p.sizer = sz
			}
			if q, ok := sluice.As[sluice.Queuer](g); ok && p.queuer == nil {
				p.queuer = q
			}
			if l, ok := sluice.As[sluice.Leaseholder](g); ok && p.lease == nil {
				p.lease = l
			}
		}
	}
	e.pcum = make([]float64, len(chains))
	e.setBalance(e.s.Balance)
	if len(chains) > 1 {
		// Its own stream, so that the arrivals, classes and tenants are
		// the same whatever the number of processes.
		e.rPrc = rand.New(rand.NewPCG(seed, 0x70726f63))
	}
}

// processName names process i (from 0) in reports and to the lease
// allocator: process-1, process-2, ...
func processName(i int) string { return "process-" + itoa(i+1) }

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

func (e *engine) at(t int64, kind, aux uint8, ref int32) {
	e.seq++
	ev := event{at: t, seq: e.seq, kind: kind, aux: aux, ref: ref}
	if kind == evTimeout && e.timers.add(ev) {
		return
	}
	e.events.push(ev)
}

// next removes and returns the earliest pending event before end.
func (e *engine) next(end int64) (event, bool) {
	slot, idx, ok := e.timers.next()
	if ok {
		t := e.timers.slots[slot][idx]
		if len(e.events) == 0 || t.at < e.events[0].at || t.at == e.events[0].at && t.seq < e.events[0].seq {
			if t.at >= end {
				return event{}, false
			}
			return e.timers.take(slot, idx), true
		}
	}
	if len(e.events) == 0 || e.events[0].at >= end {
		return event{}, false
	}
	return e.events.pop(), true
}

// setLoad sets the offered load (units/s of first attempts) from now on.
func (e *engine) setLoad(load float64) {
	e.load = load
	e.rate = 0
	for i := range e.classes {
		c := &e.classes[i]
		c.rate = load * c.share / float64(c.Units)
		e.rate += c.rate
		e.cum[i] = e.rate
	}
	e.arrGen++
	if e.rate > 0 {
		e.at(e.clk.now+e.interarrival(), evArrival, 0, e.arrGen)
	}
}

// setShares applies phase p's shares of the load (the scenario's when it
// names none).
func (e *engine) setShares(p *Phase) {
	total := 0.0
	for _, v := range p.Shares {
		total += v
	}
	for i := range e.classes {
		c := &e.classes[i]
		c.share = c.Share
		if len(p.Shares) > 0 {
			c.share = p.Shares[c.Name] / total
		}
	}
}

// setBalance sets the processes' weights (nil: even) from now on.
func (e *engine) setBalance(w []float64) {
	total := 0.0
	for i := range e.pcum {
		if len(w) > 0 {
			total += w[i]
		} else {
			total++
		}
		e.pcum[i] = total
	}
}

// pick draws the process of an attempt by the weights.
func (e *engine) pick() uint8 {
	u := e.rPrc.Float64() * e.pcum[len(e.pcum)-1]
	p := 0
	for p < len(e.pcum)-1 && u >= e.pcum[p] {
		p++
	}
	return uint8(p)
}

// setSlowdown applies phase p's slowdown to its classes, and none to the
// others.
func (e *engine) setSlowdown(p *Phase) {
	for i := range e.classes {
		c := &e.classes[i]
		c.slow = 1
		if len(p.Classes) == 0 || slices.Contains(p.Classes, c.Name) {
			c.slow = p.Slowdown
		}
	}
}

func (e *engine) interarrival() int64 {
	if e.s.Client.Arrivals == "uniform" {
		return toNs(1e9 / e.rate)
	}
	return toNs(e.rArr.ExpFloat64() / e.rate * 1e9)
}

// maxDelay caps every drawn delay (about 1.1 years of simulated time), so
// that adding one to the present cannot overflow.
const maxDelay = 1 << 55

// toNs converts a drawn delay in ns to an event offset in [1, maxDelay].
// Go's float-to-int conversion of an out-of-range value is undefined, so
// clamp first: a tiny load means rare arrivals, never a storm of them.
func toNs(v float64) int64 {
	if !(v >= 1) { // also NaN
		return 1
	}
	if v >= maxDelay {
		return maxDelay
	}
	return int64(v)
}

func (e *engine) inWindow() bool { return e.clk.now >= e.from && e.clk.now < e.to }

// sample draws a duration from d.
func sample(r *rand.Rand, d Dist) int64 {
	var v float64
	switch d.Kind {
	case "constant":
		return toNs(float64(d.Mean))
	case "exponential":
		v = r.ExpFloat64() * float64(d.Mean)
	case "lognormal":
		s2 := math.Log1p(d.CV * d.CV)
		v = float64(d.Mean) * math.Exp(r.NormFloat64()*math.Sqrt(s2)-s2/2)
	case "uniform":
		v = float64(d.Min) + r.Float64()*float64(d.Max-d.Min)
	case "loguniform":
		v = float64(d.Min) * math.Pow(float64(d.Max)/float64(d.Min), r.Float64())
	}
	return toNs(v)
}

func (e *engine) alloc() int32 {
	if n := len(e.free); n > 0 {
		i := e.free[n-1]
		e.free = e.free[:n-1]
		return i
	}
	e.slab = append(e.slab, attempt{})
	return int32(len(e.slab) - 1)
}

func (e *engine) unref(i int32) {
	a := &e.slab[i]
	if a.refs--; a.refs == 0 {
		*a = attempt{}
		e.free = append(e.free, i)
	}
}

// retryAfterNs is a Retry-After of secs seconds in nanoseconds, at most
// maxDelay: a policy's retry_hint of centuries is a Retry-After of
// 999,999,999,999,999 s, and secs·10⁹ wrapped negative, so its callers
// retried at once.
func retryAfterNs(secs int64) int64 {
	return min(secs, maxDelay/int64(time.Second)) * int64(time.Second)
}

// maxAlive bounds the attempts alive at once (queued at the service,
// waited for by a caller, or due for a retry): each costs the simulator
// about 400 bytes with its events and queue entries, so this keeps a run
// within about 3 GB. (The incident library's runs without admission, an
// hour of 10× or of a retry storm at a naive service, peak at 6.5
// million.) The first attempts are bounded by the scenario
// (maxRequests); this bounds what retries add, which the scenario cannot
// know: a naive service that keeps every abandoned attempt queued, and
// callers that retry each timeout, grow its queue by every retry.
var maxAlive = 8_000_000 // a variable for the tests

// errFull reports a run that stopped at maxAlive.
func (e *engine) errFull() error {
	return fmt.Errorf("at %.1f s, %d attempts were alive at once (queued at the service, awaited, or due for a retry), the most the simulator holds: lower the load, the step or length, or client.attempts, or give the client a retry budget",
		time.Duration(e.fullAt).Seconds(), maxAlive)
}

// run processes events until the clock reaches end, or until the
// attempts alive reach maxAlive (e.full).
func (e *engine) run(end int64) {
	for !e.full {
		ev, ok := e.next(end)
		if !ok {
			break
		}
		if len(e.slab)-len(e.free) >= maxAlive {
			e.full, e.fullAt = true, ev.at
			return
		}
		e.advance(ev.at)
		e.clk.now = ev.at
		e.timers.advance(ev.at)
		switch ev.kind {
		case evArrival:
			if ev.ref != e.arrGen {
				continue // the load changed since this arrival was drawn
			}
			e.arrive()
			e.at(e.clk.now+e.interarrival(), evArrival, 0, e.arrGen)
		case evEnqueue:
			e.enqueue(ev.ref)
		case evTimeout:
			e.timeout(ev.ref)
		case evFree:
			e.finish(ev.ref, ev.aux)
		case evRetry:
			e.send(ev.ref)
		case evPhase:
			p := &e.s.Phases[ev.ref]
			e.setSlowdown(p)
			e.setShares(p)
			if len(p.Balance) > 0 {
				e.setBalance(p.Balance)
			} else {
				e.setBalance(e.s.Balance)
			}
			e.setLoad(p.Load)
			e.setPool(p)
		case evReady:
			e.unpark(ev.ref, sluice.Reason(ev.aux))
		case evExpire:
			e.expire(ev.ref)
		}
	}
	e.advance(end)
	e.clk.now = end
	e.timers.advance(end)
}

// setPool applies phase p's worker count and unreachable processes.
func (e *engine) setPool(p *Phase) {
	n := p.Workers
	if n == 0 {
		n = e.s.Workers
	}
	e.idle += n - e.workers
	e.workers = n
	e.down = e.down[:0]
	for _, d := range p.Down {
		for len(e.down) < d {
			e.down = append(e.down, false)
		}
		e.down[d-1] = true
	}
	e.dispatch()
}

// unreachable reports whether attempt a's process cannot reach the
// service now.
func (e *engine) unreachable(a *attempt) bool {
	return int(a.proc) < len(e.down) && e.down[a.proc]
}

// advance integrates the busy workers up to t over the measured window.
func (e *engine) advance(t int64) {
	lo, hi := max(e.last, e.from), min(t, e.to)
	if hi > lo {
		e.busy += int64(e.workers-e.idle) * (hi - lo)
	}
	e.last = t
}

// byClass returns the current window's counters of a's class.
func (e *engine) byClass(a *attempt) *ClassRow {
	if e.m.Classes == nil {
		e.m.Classes = make([]ClassRow, len(e.classes))
		for i := range e.classes {
			e.m.Classes[i].Name = e.classes[i].Name
		}
	}
	return &e.m.Classes[a.class]
}

// byProc returns the current window's counters of a's process; only with
// more than one process.
func (e *engine) byProc(a *attempt) *ProcessRow {
	e.procRows()
	return &e.m.Processes[a.proc]
}

// procRows makes the current window's rows of the processes.
func (e *engine) procRows() {
	if e.m.Processes == nil {
		e.m.Processes = make([]ProcessRow, len(e.procs))
		for i := range e.procs {
			e.m.Processes[i].Name = e.procs[i].name
		}
	}
}

// arrive starts a new operation.
func (e *engine) arrive() {
	u := e.rArr.Float64() * e.rate
	ci := 0
	for ci < len(e.cum)-1 && u >= e.cum[ci] {
		ci++
	}
	c := &e.classes[ci]
	i := e.alloc()
	a := &e.slab[i]
	a.class, a.tenant, a.n, a.units = int32(ci), int32(e.rArr.IntN(len(c.tenants))), 1, c.Units
	if sc := e.sluiceClient(a); sc != nil {
		sc.budget.Deposit()
	} else if e.s.Client.Budget > 0 {
		e.budget = min(e.budget+e.s.Client.Budget, 100)
	}
	if e.inWindow() {
		e.m.Offered += float64(a.units)
		e.byClass(a).Offered += float64(a.units)
	}
	e.send(i)
}

// giveUp sets when attempt a's caller gives up (its timeout, or the
// operation's deadline) and returns the budget the request carries: the
// time left, or a naive client's first attempt's budget, resent.
func (e *engine) giveUp(a *attempt, c *class, now int64) int64 {
	a.giveUp = now + sample(e.rCli, c.timeout)
	told := a.giveUp - now
	if d := int64(e.s.Client.Deadline); d > 0 {
		if a.deadline == 0 {
			a.deadline = now + d
		}
		a.giveUp = min(a.giveUp, a.deadline)
		told = a.giveUp - now
		if e.sluiceClient(a) == nil { // naive: the first attempt's budget, resent
			if a.header == 0 {
				a.header = told
			}
			told = a.header
		}
	}
	return told
}

// countAttempt books attempt a, if measured, as sent (by process, too).
func (e *engine) countAttempt(a *attempt) {
	if !a.measured {
		return
	}
	if len(e.procs) > 1 {
		pr := e.byProc(a)
		pr.Attempts += float64(a.units)
		if a.n == 1 {
			pr.Offered += float64(a.units)
		}
	}
	e.m.Attempts += float64(a.units)
	if a.n > 1 {
		e.m.Retried += float64(a.units)
	}
}

// send issues attempt i: the caller starts its timer and the request meets
// the admission chain, if any, then the queue.
func (e *engine) send(i int32) {
	a := &e.slab[i]
	c := &e.classes[a.class]
	now := e.clk.now
	if sc := e.sluiceClient(a); sc != nil && !sc.throttle.Allow(clock.Instant(now), e.rCli.Float64()) {
		if e.inWindow() {
			e.m.Throttled += float64(a.units)
		}
		*a = attempt{} // refused locally: never sent, the operation ends
		e.free = append(e.free, i)
		return
	}
	a.issued = now
	told := e.giveUp(a, c, now)
	a.measured = e.inWindow()
	chain := e.chain
	if len(e.procs) > 1 {
		a.proc = e.pick()
		chain = e.procs[a.proc].chain
	}
	e.countAttempt(a)
	a.refs = 1 // the caller, until its timeout event
	wait := int64(0)
	if chain != nil {
		req := c.req
		req.Tenant = c.tenants[a.tenant]
		budget := time.Duration(told)
		if e.rules.DeadlineHeader != "" {
			budget = min(budget, e.rules.MaxDeadline)
		} else {
			budget = e.rules.DefaultDeadline
		}
		if budget > 0 {
			req.Deadline = clock.Instant(now).Add(budget)
		}
		e.wait = 0
		e.park.Tag, e.park.Queue = uint64(i), nil
		d, t := chain.Decide(e.ctx, &req)
		e.level = max(e.level, d.Level)
		if !d.Admitted {
			if a.measured {
				e.m.reject(d.Reason, float64(a.units))
			}
			e.answer(a, false)
			e.retry(i, d.Reason, d.Retryable, d.RetryAfter)
			e.unref(i)
			return
		}
		a.ticket, a.admission = t, true
		wait = int64(e.wait)
	}
	if a.measured {
		// A request parked in a wait queue counts as admitted until the
		// queue turns it away (unadmit).
		e.m.Admitted += float64(a.units)
		e.byClass(a).Admitted += float64(a.units)
		if len(e.procs) > 1 {
			e.byProc(a).Admitted += float64(a.units)
		}
	}
	a.refs++ // the service
	e.at(a.giveUp, evTimeout, 0, i)
	if e.park.Queue != nil && chain != nil {
		a.parked, a.pq, a.pid = true, e.park.Queue, e.park.ID
		a.refs++ // the expiry
		e.at(max(int64(e.park.Until), now), evExpire, 0, i)
		return
	}
	e.admit(i, wait)
}

// admit sends admitted attempt i on to the service after a paced wait.
func (e *engine) admit(i int32, wait int64) {
	now := e.clk.now
	if wait > 0 {
		e.at(now+wait, evEnqueue, 0, i)
		return
	}
	e.enqueue(i)
}

// ready is the wait queues' Park.Ready: attempt tag got a slot (d
// admitted) or was turned away. It runs inside a release, so it only
// schedules the outcome.
func (e *engine) ready(tag uint64, d sluice.Decision) {
	e.at(e.clk.now, evReady, uint8(d.Reason), int32(tag))
}

// unpark ends parked attempt i's wait: admitted (ReasonNone) or turned
// away for reason.
func (e *engine) unpark(i int32, reason sluice.Reason) {
	a := &e.slab[i]
	if !a.parked {
		return
	}
	a.parked = false
	switch {
	case reason == sluice.ReasonNone && a.answered: // its caller left before the slot came
		e.drop(i, sluice.OutcomeCancelled)
	case reason == sluice.ReasonNone:
		e.admit(i, 0)
	default:
		e.turnAway(i, reason)
	}
}

// expire ends parked attempt i's wait when it runs out.
func (e *engine) expire(i int32) {
	if a := &e.slab[i]; a.parked && a.pq.Expire(a.pid) {
		a.parked = false
		e.turnAway(i, sluice.ReasonQueue)
	}
	e.unref(i)
}

// unadmit counts parked attempt i as turned away for reason instead of
// admitted.
func (e *engine) unadmit(a *attempt, reason sluice.Reason) {
	if a.measured {
		e.m.Admitted -= float64(a.units)
		e.byClass(a).Admitted -= float64(a.units)
		if len(e.procs) > 1 {
			e.byProc(a).Admitted -= float64(a.units)
		}
		e.m.reject(reason, float64(a.units))
	}
}

// turnAway answers parked attempt i with a rejection for reason, as the
// queue would have from Decide.
func (e *engine) turnAway(i int32, reason sluice.Reason) {
	a := &e.slab[i]
	if !a.answered {
		e.answer(a, false)
		e.unadmit(a, reason)
		retryAfter := time.Duration(0)
		if reason == sluice.ReasonQueue {
			retryAfter = time.Second
		}
		e.retry(i, reason, reason == sluice.ReasonQueue, retryAfter)
		a = &e.slab[i]
	}
	e.done(a, sluice.OutcomeRejected)
	e.unref(i)
}

// retry schedules the operation's next attempt after a failed attempt i,
// if the caller's policy allows one. retryAfter is the server's exact hint
// (0: none).
func (e *engine) retry(i int32, reason sluice.Reason, retryable bool, retryAfter time.Duration) {
	a := &e.slab[i]
	cl := &e.s.Client
	if int(a.n) >= cl.Attempts || !retryable || !e.retries(reason) {
		return
	}
	if sc := e.sluiceClient(a); sc != nil {
		e.retrySluice(i, sc, reason, retryAfter)
		return
	}
	if cl.Budget > 0 {
		if e.budget < 1 {
			return
		}
		e.budget--
	}
	ceil := min(float64(cl.Backoff)*math.Pow(2, float64(a.n-1)), float64(cl.BackoffMax))
	delay := toNs(e.rCli.Float64() * ceil)
	if retryAfter > 0 && !cl.IgnoreRetryAfter {
		secs := wire.RetryAfter(retryAfter, sluice.DefaultJitter, e.rCli.Uint64())
		delay = max(delay, retryAfterNs(secs))
	}
	if a.deadline > 0 && e.clk.now+max(delay, 1) >= a.deadline {
		return // the operation's deadline comes first
	}
	j := e.alloc()
	a = &e.slab[i] // alloc may move the slab
	// The retry's process is drawn when it is sent, as a load balancer
	// would send a new request.
	e.slab[j] = attempt{class: a.class, tenant: a.tenant, n: a.n + 1, units: a.units, deadline: a.deadline, header: a.header}
	e.at(e.clk.now+max(delay, 1), evRetry, 0, j)
}

// retrySluice schedules the next attempt after failed attempt i under
// client retry "sluice": timeouts (reason none: the work may have begun)
// only for idempotent methods, then the client's budget, then the larger
// of the full-jitter backoff and the Retry-After floor jittered upward.
func (e *engine) retrySluice(i int32, sc *simClient, reason sluice.Reason, retryAfter time.Duration) {
	a := &e.slab[i]
	cl := &e.s.Client
	if reason == sluice.ReasonNone && !idempotent(e.classes[a.class].Method) {
		return
	}
	if !sc.budget.Withdraw() {
		return
	}
	b := client.Backoff{Base: cl.Backoff, Cap: cl.BackoffMax}
	delay := b.Delay(int(a.n), e.rCli.Float64())
	if retryAfter > 0 && !cl.IgnoreRetryAfter {
		secs := wire.RetryAfter(retryAfter, sluice.DefaultJitter, e.rCli.Uint64())
		delay = max(delay, client.Floor(time.Duration(retryAfterNs(secs)), 1, e.rCli.Float64()))
	}
	if a.deadline > 0 && e.clk.now+max(int64(delay), 1) >= a.deadline {
		return // bounded by the request's deadline
	}
	j := e.alloc()
	a = &e.slab[i]
	e.slab[j] = attempt{class: a.class, tenant: a.tenant, n: a.n + 1, units: a.units, deadline: a.deadline}
	e.at(e.clk.now+max(int64(delay), 1), evRetry, 0, j)
}

// idempotent reports whether an HTTP method is idempotent (RFC 9110 §9.2.2).
func idempotent(method string) bool {
	switch method {
	case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE":
		return true
	}
	return false
}

func (e *engine) retries(reason sluice.Reason) bool {
	want := "timeout"
	switch reason {
	case sluice.ReasonNone:
	case sluice.ReasonPolicyRate:
		want = "policy"
	default:
		want = "overload"
	}
	for _, r := range e.s.Client.RetryOn {
		if r == want {
			return true
		}
	}
	return false
}

func (e *engine) enqueue(i int32) {
	if a := &e.slab[i]; e.unreachable(a) {
		e.fail(i)
		return
	}
	e.queue.push(i)
	e.dispatch()
}

// fail ends admitted attempt i at once, as a proxy that cannot reach the
// service answers 502: its caller retries it as an overload refusal, and
// the gates see errored work.
func (e *engine) fail(i int32) {
	a := &e.slab[i]
	if a.measured {
		e.m.Failed += float64(a.units)
	}
	if !a.answered {
		e.answer(a, false)
		e.retry(i, sluice.ReasonOverload, true, 0)
	}
	e.drop(i, sluice.OutcomeErrored)
}

// dispatch gives queued work to idle workers.
func (e *engine) dispatch() {
	srv := &e.s.Server
	for e.idle > 0 && e.queue.size > 0 {
		now := e.clk.now
		var scanned int64
		i := int32(-1)
		for e.queue.size > 0 {
			j := e.queue.pop()
			if srv.CheckQueue && e.slab[j].answered {
				scanned = toNs(float64(scanned) + float64(srv.ScanCost))
				e.drop(j, sluice.OutcomeCancelled)
				continue
			}
			i = j
			break
		}
		e.idle--
		if i < 0 {
			e.at(now+scanned, evFree, endScan, -1)
			continue
		}
		a := &e.slab[i]
		c := &e.classes[a.class]
		svc := toNs(float64(sample(e.rSvc, c.Service)) * c.slow)
		start := now + scanned
		if e.inWindow() {
			e.m.Started += float64(a.units)
		}
		if cp := srv.CancelPoint; cp > 0 && cp < 1 {
			check := start + int64(cp*float64(svc))
			if a.giveUp < check {
				e.at(check, evFree, endAbandon, i)
				continue
			}
		}
		e.at(start+svc, evFree, endDone, i)
	}
}

// finish ends a worker's busy period.
func (e *engine) finish(i int32, how uint8) {
	e.idle++
	if i >= 0 {
		a := &e.slab[i]
		now := e.clk.now
		win := e.inWindow()
		switch {
		case how == endAbandon:
			if win {
				e.m.Abandoned += float64(a.units)
			}
			e.drop(i, sluice.OutcomeCancelled)
		case now <= a.giveUp && !a.answered:
			e.answer(a, true)
			if win {
				e.m.Goodput += float64(a.units)
				e.byClass(a).Goodput += float64(a.units)
				if len(e.procs) > 1 {
					e.byProc(a).Goodput += float64(a.units)
				}
				e.hist.add(now - a.issued)
			}
			e.done(a, sluice.OutcomeUseful)
			e.unref(i)
		default:
			if win {
				e.m.Late += float64(a.units)
			}
			e.done(a, sluice.OutcomeLate)
			e.unref(i)
		}
	}
	e.dispatch()
}

// answer marks attempt a answered (or given up on by its caller): the
// caller knows its outcome, which a sluice client's throttle counts, as
// package client counts it (accepted: a useful answer in time).
func (e *engine) answer(a *attempt, accepted bool) {
	a.answered = true
	if sc := e.sluiceClient(a); sc != nil {
		sc.throttle.Done(clock.Instant(e.clk.now), accepted)
	}
}

// drop releases attempt i from the service without an answer.
func (e *engine) drop(i int32, o sluice.Outcome) {
	e.done(&e.slab[i], o)
	e.unref(i)
}

func (e *engine) done(a *attempt, o sluice.Outcome) {
	if a.admission {
		a.ticket.Done(o)
		a.admission = false
	}
}

// timeout: the caller stops waiting for attempt i.
func (e *engine) timeout(i int32) {
	a := &e.slab[i]
	if a.parked && a.pq.Cancel(a.pid) {
		// Still waiting for a slot: the queue turns it away as its caller
		// leaves (reason queue, never admitted), which counts as that
		// rejection rather than as a timeout of admitted work.
		a.parked = false
		e.answer(a, false)
		e.unadmit(a, sluice.ReasonQueue)
		e.done(a, sluice.OutcomeCancelled)
		a.refs-- // the service's; the caller's goes below
		e.retry(i, sluice.ReasonNone, true, 0)
	}
	if a = &e.slab[i]; !a.answered {
		e.answer(a, false)
		if e.s.Server.ReleaseAtDeadline {
			e.done(a, sluice.OutcomeErrored) // the slot goes; the work goes on
		}
		if e.inWindow() {
			e.m.TimedOut += float64(a.units)
		}
		e.retry(i, sluice.ReasonNone, true, 0)
	}
	e.unref(i)
}

// tenantSources names the sources of a tenant key.
func tenantSources(ps []identify.Part) string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Source.String()
	}
	return strings.Join(names, " + ")
}
