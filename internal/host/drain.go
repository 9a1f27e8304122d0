package host

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDrainGrace is how long requests in flight get to finish once a
// server stops (SIGTERM), unless told otherwise.
const DefaultDrainGrace = 10 * time.Second

// Tracker knows the requests a server is serving, so that a drain that
// runs out of its grace can say which it cuts. Its methods are safe for
// concurrent use.
type Tracker struct {
	mu   sync.Mutex
	reqs map[*tracked]struct{}
	idle []chan struct{} // Wait's, closed when reqs empties
	now  func() time.Time
}

type tracked struct {
	method, path string
	start        time.Time
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker { return &Tracker{reqs: map[*tracked]struct{}{}, now: time.Now} }

// Wrap returns h with every request registered while it runs.
func (t *Tracker) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e := &tracked{method: r.Method, path: r.URL.Path, start: t.now()}
		t.mu.Lock()
		t.reqs[e] = struct{}{}
		t.mu.Unlock()
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
	t.mu.Lock()
	t.reqs[e] = struct{}{}
	t.mu.Unlock()
	return e
}

// Untrack forgets a request Track registered.
func (t *Tracker) Untrack(e *Tracked) {
	t.mu.Lock()
	delete(t.reqs, e)
	if len(t.reqs) == 0 {
		for _, c := range t.idle {
			close(c)
		}
		t.idle = nil
	}
	t.mu.Unlock()
}

// Wait returns nil once no request is in flight, or ctx's error.
func (t *Tracker) Wait(ctx context.Context) error {
	t.mu.Lock()
	if len(t.reqs) == 0 {
		t.mu.Unlock()
		return nil
	}
	c := make(chan struct{})
	t.idle = append(t.idle, c)
	t.mu.Unlock()
	select {
	case <-c:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Len returns the number of requests in flight.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reqs)
}

// logCut logs every request in flight as cut by the drain and returns how
// many there were.
func (t *Tracker) logCut(log *slog.Logger, server string, grace time.Duration) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	for e := range t.reqs {
		log.Warn("request cut: still in flight when the drain grace ran out", "server", server,
			"method", e.method, "path", e.path, "age", now.Sub(e.start).Round(time.Millisecond), "drain_grace", grace)
	}
	return len(t.reqs)
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
