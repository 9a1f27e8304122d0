package adaptive

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
)

// upstream is a deterministic model of a service behind an adaptive gate,
// on a virtual clock: open-loop Poisson arrivals, the gate deciding each
// one (a rejection ends it), a FIFO service of Workers workers with an
// unbounded queue that runs every request it gets to completion, and each
// completion released to the gate as useful or, past the caller's
// deadline, late, with its latency. It is what the controllers are judged
// against over long runs: nothing in it is tuned to a controller.
type upstream struct {
	Workers  int
	Service  func(r *rand.Rand) time.Duration // one request's worker time
	Deadline time.Duration                    // the caller's budget from arrival (0: none)
	Transit  time.Duration                    // the way to the service and back, outside it
	// MaxWait is how long a request that finds no slot waits for one, in
	// arrival order (as a queue in front of the gate); 0: rejected at once.
	MaxWait time.Duration
	Seed    uint64

	gate *Gate
	r    *rand.Rand
	now  clock.Instant
	ev   events
	seq  uint64
	idle int
	fifo []*job
	wait []clock.Instant // arrivals waiting for a slot
	slow float64         // service time multiplier
	rtt  float64         // mean latency of recent completions, ns (the queue's prediction)

	// per row
	rows []row
	cur  row
}

type job struct {
	arrived, admitted clock.Instant
	permit            sluice.Permit
}

// row is what one interval of the run showed.
type row struct {
	Offered, Admitted, Useful, Late int
	MinLimit, MaxLimit              int
	QueueMax                        int // most requests waiting at the service
	Probes                          int // windows at a limit below the row's median
	limits                          []int
}

type event struct {
	at   clock.Instant
	seq  uint64
	kind int // 0 arrival, 1 reaches the service, 2 service done, 3 answer back
	j    *job
}

type events []event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	if e[i].at != e[j].at {
		return e[i].at < e[j].at
	}
	return e[i].seq < e[j].seq
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(event)) }
func (e *events) Pop() any {
	old := *e
	x := old[len(old)-1]
	*e = old[:len(old)-1]
	return x
}

func (u *upstream) at(t clock.Instant, kind int, j *job) {
	u.seq++
	heap.Push(&u.ev, event{t, u.seq, kind, j})
}

// phase is a stretch of the run at one load (requests/s) and service
// speed (slow multiplies service times; 0 is 1).
type phase struct {
	For  time.Duration
	Load float64
	Slow float64
	// Workers, if set, changes the worker count at the phase's start.
	Workers int
	// Transit, if set, is the way to the service and back for the phase:
	// a host that stalls the proxy delays every answer outside the
	// service, whatever the limit.
	Transit time.Duration
}

// run drives the model through the phases, closing a row every interval.
func (u *upstream) run(g *Gate, interval time.Duration, phases ...phase) []row {
	u.gate = g
	u.r = rand.New(rand.NewPCG(u.Seed, 7))
	u.idle = u.Workers
	u.now = clock.Instant(time.Hour) // any epoch
	u.cur = row{MinLimit: 1 << 30}
	nextRow := u.now.Add(interval)
	transit := u.Transit
	for _, p := range phases {
		u.Transit = transit
		if p.Transit > 0 {
			u.Transit = p.Transit
		}
		u.slow = p.Slow
		if u.slow == 0 {
			u.slow = 1
		}
		if p.Workers > 0 {
			u.idle += p.Workers - u.Workers
			u.Workers = p.Workers
			u.dispatch()
		}
		end := u.now.Add(p.For)
		gap := func() time.Duration { return time.Duration(u.r.ExpFloat64() / p.Load * float64(time.Second)) }
		next := u.now.Add(gap())
		for {
			t := min(next, end, nextRow)
			if len(u.ev) > 0 && u.ev[0].at <= t {
				e := heap.Pop(&u.ev).(event)
				u.now = e.at
				u.handle(e)
				continue
			}
			u.now = t
			if t == nextRow {
				u.closeRow()
				nextRow = nextRow.Add(interval)
				continue
			}
			if t == end {
				break
			}
			u.arrive()
			next = next.Add(gap())
		}
	}
	return u.rows
}

func (u *upstream) closeRow() {
	u.rows = append(u.rows, u.cur)
	u.cur = row{MinLimit: 1 << 30}
}

func (u *upstream) arrive() {
	u.cur.Offered++
	l, _ := u.gate.ConcurrencyLimit()
	u.cur.MinLimit = min(u.cur.MinLimit, l)
	u.cur.MaxLimit = max(u.cur.MaxLimit, l)
	u.cur.limits = append(u.cur.limits, l)
	if len(u.wait) == 0 && u.admit(u.now) {
		return
	}
	if u.MaxWait > 0 && !u.tooLate(u.now, len(u.wait)+1) {
		u.wait = append(u.wait, u.now)
	}
}

// tooLate reports whether a request that arrived at t, with ahead requests
// to start before it, is predicted to finish past its deadline: the
// deadline test of a wait queue, with the mean latency of recent
// completions as the service time (ahead of it: that ÷ the limit each).
func (u *upstream) tooLate(t clock.Instant, ahead int) bool {
	if u.Deadline == 0 || u.rtt == 0 {
		return false
	}
	l, _ := u.gate.ConcurrencyLimit()
	wait := float64(ahead-1) * u.rtt / float64(max(l, 1))
	return float64(u.now.Sub(t))+wait+u.rtt >= float64(u.Deadline)
}

// admit asks the gate for a slot for a request that arrived at t.
func (u *upstream) admit(t clock.Instant) bool {
	d, p := gatetest.Decide(context.Background(), u.gate, &sluice.Request{}, u.now)
	if !d.Admitted {
		return false
	}
	u.cur.Admitted++
	u.at(u.now.Add(u.Transit/2), 1, &job{arrived: t, admitted: u.now, permit: p})
	return true
}

// unwait admits waiting requests while the gate has slots, dropping those
// whose wait ran out.
func (u *upstream) unwait() {
	for len(u.wait) > 0 {
		t := u.wait[0]
		if u.now.Sub(t) > u.MaxWait || u.tooLate(t, 1) {
			u.wait = u.wait[1:]
			continue
		}
		if !u.admit(t) {
			return
		}
		u.wait = u.wait[1:]
	}
}

func (u *upstream) handle(e event) {
	switch e.kind {
	case 1:
		u.fifo = append(u.fifo, e.j)
		u.cur.QueueMax = max(u.cur.QueueMax, len(u.fifo)-u.idle)
		u.dispatch()
	case 2:
		u.idle++
		u.at(u.now.Add(u.Transit/2), 3, e.j)
		u.dispatch()
	case 3:
		lat := u.now.Sub(e.j.arrived)
		o := sluice.OutcomeUseful
		if u.Deadline > 0 && lat > u.Deadline {
			o = sluice.OutcomeLate
			u.cur.Late++
		} else {
			u.cur.Useful++
		}
		rtt := float64(u.now.Sub(e.j.admitted))
		if u.rtt == 0 {
			u.rtt = rtt
		}
		u.rtt += (rtt - u.rtt) / 50
		u.gate.Release(&sluice.Request{}, e.j.permit, sluice.Completion{Outcome: o, Now: u.now, Latency: u.now.Sub(e.j.admitted)})
		u.unwait()
	}
}

func (u *upstream) dispatch() {
	for u.idle > 0 && len(u.fifo) > 0 {
		j := u.fifo[0]
		u.fifo = u.fifo[1:]
		u.idle--
		s := time.Duration(float64(u.Service(u.r)) * u.slow)
		u.at(u.now.Add(s), 2, j)
	}
}

func constant(d time.Duration) func(*rand.Rand) time.Duration {
	return func(*rand.Rand) time.Duration { return d }
}

func exponential(mean time.Duration) func(*rand.Rand) time.Duration {
	return func(r *rand.Rand) time.Duration { return time.Duration(r.ExpFloat64() * float64(mean)) }
}
