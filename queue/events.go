package queue

import (
	"context"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// Park is how an event loop that cannot block in Decide (a simulator on a
// virtual clock) waits in a queue built with Options.Events. The loop owns
// one Park and passes it with ContextWithPark; before each Decide it sets
// Tag and clears Queue, and after it reads Queue. A non-nil Queue means the
// request was admitted with its wait still ahead: the loop must not start
// the work until Ready reports a slot, must call Queue.Expire(ID) at Until
// and Queue.Cancel(ID) if the caller gives up first; the request's ticket
// is done as usual in every case. A request waits in at most one queue of a
// chain in this mode; a second queue turns it away (reason queue).
type Park struct {
	// Ready is called once for each parked request that got its slot
	// (d.Admitted) or was turned away while waiting (a CoDel drop: reason
	// queue; or the inner gate's own rejection), outside the queue's lock; it may schedule work but must not
	// call the queue.
	Ready func(tag uint64, d sluice.Decision)
	// Tag is the loop's name for the next request to Decide.
	Tag uint64

	// Queue, ID and Until are set by Decide when the request parked: the
	// queue, its name for the wait, and when the wait runs out.
	Queue *Queue
	ID    uint64
	Until clock.Instant
}

type parkKey struct{}

// ContextWithPark returns ctx carrying p for queues in event mode.
func ContextWithPark(ctx context.Context, p *Park) context.Context {
	return context.WithValue(ctx, parkKey{}, p)
}

func parkFrom(ctx context.Context) *Park {
	p, _ := ctx.Value(parkKey{}).(*Park)
	return p
}

// note tells a waiter its outcome once the lock is released.
type note struct {
	w *waiter
	d sluice.Decision
}

func deliver(notes []note) {
	for _, n := range notes {
		switch {
		case n.w.ready != nil:
			close(n.w.ready)
		case n.w.notify != nil:
			n.w.notify(n.w.tag, n.d)
		}
	}
}

// hold records w under a new id, the permit the caller holds.
// REQUIRES: q.mu held.
func (q *Queue) hold(w *waiter) sluice.Permit {
	q.nextID++
	q.held[q.nextID] = w
	return sluice.Permit(q.nextID)
}

// decideEvent is Decide in event mode: a request that must wait parks.
func (q *Queue) decideEvent(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	q.mu.Lock()
	c := q.classOf(r.Class)
	flow := q.flowOf(r, now)
	if q.ahead(c) == 0 {
		if q.tooLate(r, now) {
			q.mu.Unlock()
			*d = q.reject(sluice.ReasonDeadline)
			return 0
		}
		p := q.inner.Decide(ctx, r, now, d)
		if !noSlot(d) {
			id := sluice.Permit(0)
			if d.Admitted {
				id = q.hold(&waiter{granted: true, permit: p})
			}
			notes := q.grown(now)
			q.mu.Unlock()
			deliver(notes)
			return id
		}
		*d = sluice.Decision{} // the inner gate's "no slot": park
	}
	park := parkFrom(ctx)
	if park == nil || park.Queue != nil {
		q.mu.Unlock()
		*d = q.reject(sluice.ReasonQueue) // nowhere to wait
		return 0
	}
	w := &waiter{own: *r, since: now, class: c, tag: park.Tag, notify: park.Ready, flow: flow}
	w.req = &w.own
	wait, why, notes := q.admit(w, now)
	if why != sluice.ReasonNone {
		q.mu.Unlock()
		deliver(notes)
		*d = q.reject(why)
		return 0
	}
	w.until = now.Add(wait)
	q.push(w)
	id := q.hold(w)
	park.Queue, park.ID, park.Until = q, uint64(id), w.until
	notes = append(notes, q.grown(now)...)
	q.mu.Unlock()
	deliver(notes)
	*d = sluice.Decision{Admitted: true, Scope: sluice.ScopeService, Gate: q.name}
	return id
}

// releaseEvent is Release in event mode: p is an id of held. The latency
// the inner gate learns from excludes the wait (the chain started its
// clock at Decide).
func (q *Queue) releaseEvent(r *sluice.Request, p sluice.Permit, c sluice.Completion) {
	q.mu.Lock()
	w := q.held[uint64(p)]
	delete(q.held, uint64(p))
	if w == nil || !w.granted {
		if w != nil {
			q.remove(w, w.class) // done without Cancel: still waiting
		}
		q.mu.Unlock()
		return
	}
	q.mu.Unlock()
	c.Latency = max(c.Latency-w.waited, 0)
	q.inner.Release(r, w.permit, c)
	q.released(r, c)
}

// Expire ends the wait of parked request id when it runs out (Park.Until),
// reporting whether it was still waiting: then it is turned away with
// reason queue, and the caller treats it as such a rejection.
func (q *Queue) Expire(id uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.held[id]
	if w == nil || !q.remove(w, w.class) {
		return false
	}
	q.dropped++
	return true
}

// Cancel ends the wait of parked request id whose caller gave up,
// reporting whether it was still waiting.
func (q *Queue) Cancel(id uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.held[id]
	return w != nil && q.remove(w, w.class)
}
