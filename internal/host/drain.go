package host

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-go/sluice/clock"
)

// DefaultDrainGrace is how long requests in flight get to finish once a
// server stops (SIGTERM), unless told otherwise.
const DefaultDrainGrace = 10 * time.Second

// Tracker knows the requests a server is serving, so that a drain that
// runs out of its grace can say which it cuts. Its methods are safe for
// concurrent use. Requests are kept in trackShards lists, each under its
// own lock and with its own count, chosen by the request's record's
// address (allocated from the running processor's own memory), so that a
// server on many cores writes no memory shared by all of them per request.
type Tracker struct {
	waiting atomic.Bool     // idle is not empty: Untrack looks whether it may wake
	mu      sync.Mutex      // idle
	idle    []chan struct{} // Wait's, closed when every shard is empty
	shards  [trackShards]trackShard
	now     func() clock.Instant
}

// trackShards is the number of Tracker's lists (a power of two).
const trackShards = 16

type trackShard struct {
	mu   sync.Mutex
	head *tracked     // a doubly linked list, newest first
	n    atomic.Int64 // its length (written under mu)
	_    [40]byte     // a cache line of its own
}

type tracked struct {
	method, path string
	start        clock.Instant
	prev, next   *tracked
	gone         bool // untracked
}

// shardOf is e's shard: by address, past the bits a record's size fixes.
func (t *Tracker) shardOf(e *tracked) *trackShard {
	return &t.shards[(uintptr(unsafe.Pointer(e))>>7)&(trackShards-1)]
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{now: clock.Now} }

// Wrap returns h with every request registered while it runs.
func (t *Tracker) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := t.Track(r.Method, r.URL.Path)
		defer t.Untrack(e)
		h.ServeHTTP(w, r)
	})
}

// Tracked is one request a Tracker knows, from Track to Untrack.
type Tracked = tracked

// Track registers a request while it runs, for servers other than
// net/http's: Untrack it when it ends. method and path must stay valid
// until then.
func (t *Tracker) Track(method, path string) *Tracked {
	e := &tracked{method: method, path: path, start: t.now()}
	sh := t.shardOf(e)
	sh.mu.Lock()
	e.next = sh.head
	if sh.head != nil {
		sh.head.prev = e
	}
	sh.head = e
	sh.n.Add(1)
	sh.mu.Unlock()
	return e
}

// Untrack forgets a request Track registered; once more is a no-op.
func (t *Tracker) Untrack(e *Tracked) {
	sh := t.shardOf(e)
	sh.mu.Lock()
	if e.gone {
		sh.mu.Unlock()
		return
	}
	e.gone = true
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	}
	e.prev, e.next = nil, nil
	empty := sh.n.Add(-1) == 0
	sh.mu.Unlock()
	// Wait stores waiting before it loads the counts, Untrack the other
	// way round: one of the two sees the other's store, so no waiter is
	// missed.
	if empty && t.waiting.Load() {
		t.wake()
	}
}

// wake closes Wait's channels if no request is in flight.
func (t *Tracker) wake() {
	t.mu.Lock()
	if t.count() == 0 {
		for _, c := range t.idle {
			close(c)
		}
		t.idle = nil
		t.waiting.Store(false)
	}
	t.mu.Unlock()
}

// Wait returns nil once no request is in flight, or ctx's error.
func (t *Tracker) Wait(ctx context.Context) error {
	if t.count() == 0 {
		return nil
	}
	c := make(chan struct{})
	t.mu.Lock()
	t.idle = append(t.idle, c)
	t.waiting.Store(true)
	t.mu.Unlock()
	t.wake()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Len returns the number of requests in flight.
func (t *Tracker) Len() int { return t.count() }

// count is the number of requests in flight at one instant: the shards'
// counts summed with every shard locked (summed one by one, a request
// tracked in a shard already counted while an older one leaves a shard
// not yet counted would go unseen, and the total read 0 with one in
// flight). Wait and the drain's log are its only callers.
func (t *Tracker) count() int {
	for i := range t.shards {
		t.shards[i].mu.Lock()
	}
	n := int64(0)
	for i := range t.shards {
		n += t.shards[i].n.Load()
	}
	for i := range t.shards {
		t.shards[i].mu.Unlock()
	}
	return int(n)
}

// logCut logs every request in flight as cut by the drain and returns how
// many there were.
func (t *Tracker) logCut(log *slog.Logger, server string, grace time.Duration) int {
	now := t.now()
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for e := sh.head; e != nil; e = e.next {
			log.Warn("request cut: still in flight when the drain grace ran out", "server", server,
				"method", e.method, "path", e.path, "age", now.Sub(e.start).Round(time.Millisecond), "drain_grace", grace)
			n++
		}
		sh.mu.Unlock()
	}
	return n
}

// Drain is how a server stops: it turns unready, lets requests in flight
// finish within a grace, and cuts, logs and counts those that do not.
type Drain struct {
	// Delay is how long the server goes on accepting and serving, with
	// /readyz answering 503 already, before it stops accepting: the time a
	// load balancer (Kubernetes endpoints, a readiness probe's period times
	// its failure threshold) takes to stop sending new connections. 0:
	// none, the listener stops at once.
	Delay time.Duration
	// Grace is how long requests in flight get. Default DefaultDrainGrace.
	Grace time.Duration
	// After, if set, replaces time.After for the grace (tests fire it by
	// hand).
	After func(time.Duration) <-chan time.Time
}

// Stopper is a server Shutdown can drain: *http.Server, or sluice
// proxy's own. Shutdown stops accepting and returns once every connection
// is idle and closed, or with ctx's error; Close closes every connection.
type Stopper interface {
	Shutdown(ctx context.Context) error
	Close() error
}

// Shutdown shuts srv down within the grace: after the delay, it stops accepting, waits for
// the requests in flight (those tr tracks too, upgraded connections the
// server no longer counts among its own), and when the grace runs out closes the
// connections left, logging each request tr still tracks and adding their
// number to the cut counter. It returns the number cut.
func (h *Host) Shutdown(srv Stopper, tr *Tracker, server string, d Drain) int {
	if d.Grace <= 0 {
		d.Grace = DefaultDrainGrace
	}
	after := d.After
	if after == nil {
		after = time.After
	}
	if d.Delay > 0 {
		// Answers close their connections from now on: a client's pooled
		// connection goes to another server after its next answer, not cut
		// with the others when the delay ends.
		if ka, ok := srv.(interface{ SetKeepAlivesEnabled(bool) }); ok {
			ka.SetKeepAlivesEnabled(false)
		}
		h.log.Info("drain: still accepting while load balancers see /readyz 503; answers close their connections", "server", server, "drain_delay", d.Delay)
		<-after(d.Delay)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	expired := after(d.Grace)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-expired:
			cancel()
		case <-stop:
		}
	}()
	err := srv.Shutdown(ctx)
	if err == nil && tr != nil {
		// Servers do not wait for the connections they handed over
		// (hijacked: upgrades, WebSockets), which tr still tracks.
		err = tr.Wait(ctx)
	}
	if err == nil {
		return 0
	}
	n := 0
	if tr != nil {
		n = tr.logCut(h.log, server, d.Grace)
	}
	h.log.Warn("drain grace ran out: closing the connections left", "server", server, "requests_cut", n, "drain_grace", d.Grace)
	h.drainCut.WithLabelValues(server).Add(float64(n))
	srv.Close()
	if tr != nil {
		// The handlers of the requests cut end soon after their
		// connections closed (their upstream calls are cut with them):
		// wait a moment for them, so that the runtime the caller closes
		// next still takes what they give back (a permit's release, which
		// a closed Redis store would leave held until its TTL).
		wctx, wcancel := context.WithTimeout(context.Background(), time.Second)
		tr.Wait(wctx)
		wcancel()
	}
	return n
}

// SetReady sets what /readyz answers: 200 when ready, 503 when not (a
// server turns unready when it starts to drain, before it stops
// accepting, while /healthz answers 200 until the process exits).
func (h *Host) SetReady(ready bool) { h.ready.Store(ready) }

// Ready reports what /readyz answers.
func (h *Host) Ready() bool { return h.ready.Load() }

func newDrainCut() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_drain_requests_cut_total",
		Help: "Requests still in flight when the drain grace ran out at shutdown, whose connections were closed, by server.",
	}, []string{"server"})
}

// DrainCut returns the counter of requests cut by the drain grace, by
// server (tests).
func (h *Host) DrainCut() *prometheus.CounterVec { return h.drainCut }
