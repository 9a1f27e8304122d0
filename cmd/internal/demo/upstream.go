package demo

import (
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Upstream models routes-api as a naive service: a fixed pool of workers,
// each serving one request at a time for a modeled service time, behind an
// unbounded FIFO queue. It never drops queued work, even when the caller has
// given up, so its capacity is fixed and known whatever else the machine is
// doing, and its collapse under overload is the real thing.
//
// Service times: GET /v1/routes/{id} 10 ms; POST /v1/routes 20 ms plus
// 0.2 ms per stop (X-Stops); GET /v1/analytics/* 150 ms; /premium/* 30 ms;
// anything else 10 ms.
type Upstream struct {
	slow    atomic.Uint64 // math.Float64bits of the service times' multiplier; 0: 1 (SetSlowdown)
	fixed   atomic.Int64  // if > 0: every request's mean service time, ns (SetServiceTime)
	exact   atomic.Bool   // fixed is every request's service time, not a mean
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*job
	closed  bool
	workers sync.WaitGroup
}

type job struct {
	service time.Duration
	done    chan struct{}
}

// WorkHeader is the response header in which the upstream reports the
// worker time it spent on the request, in µs: the load generator adds up
// the useful work (answers in time), which, unlike a count of requests,
// does not change with the mix of cheap and costly requests admitted.
const WorkHeader = "X-Work-Us"

// ServiceTime returns the modeled service time of a request.
func ServiceTime(method, path string, stops int) time.Duration {
	switch {
	case method == http.MethodPost && path == "/v1/routes":
		return 20*time.Millisecond + time.Duration(min(max(stops, 0), 10_000))*200*time.Microsecond
	case strings.HasPrefix(path, "/v1/analytics/"):
		return 150 * time.Millisecond
	case strings.HasPrefix(path, "/premium/"): // the reservation scenario: 3 work units
		return 30 * time.Millisecond
	}
	return 10 * time.Millisecond
}

// NewUpstream starts a pool of n workers.
func NewUpstream(n int) *Upstream {
	u := &Upstream{}
	u.cond = sync.NewCond(&u.mu)
	for range n {
		u.workers.Add(1)
		go u.work()
	}
	return u
}

func (u *Upstream) work() {
	defer u.workers.Done()
	for {
		u.mu.Lock()
		for len(u.queue) == 0 && !u.closed {
			u.cond.Wait()
		}
		if u.closed {
			u.mu.Unlock()
			return
		}
		j := u.queue[0]
		u.queue[0] = nil
		u.queue = u.queue[1:]
		u.mu.Unlock()
		time.Sleep(j.service) // the modeled scarce resource: a busy worker
		close(j.done)
	}
}

// Queued returns the number of requests waiting for a worker.
func (u *Upstream) Queued() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.queue)
}

// SetServiceTime makes every request take a service time drawn around
// mean (lognormal, coefficient of variation 0.5, as the simulator's
// service-step scenario), whatever its route; 0 returns to the modeled
// routes. It applies to requests that arrive after it.
func (u *Upstream) SetServiceTime(mean time.Duration) {
	u.exact.Store(false)
	u.fixed.Store(int64(mean))
}

// SetSlowdown multiplies the service times of requests that arrive after
// it by f (1: as modeled), as a slow dependency or a slower machine would.
func (u *Upstream) SetSlowdown(f float64) { u.slow.Store(math.Float64bits(f)) }

// SetConstantServiceTime makes every request take exactly d of a worker
// (0 returns to the modeled routes), for requests that arrive after it.
func (u *Upstream) SetConstantServiceTime(d time.Duration) {
	u.exact.Store(true)
	u.fixed.Store(int64(d))
}

// lognormal draws a duration of the given mean and a coefficient of
// variation of 0.5.
func lognormal(mean time.Duration) time.Duration {
	const cv = 0.5
	s2 := math.Log1p(cv * cv)
	return time.Duration(float64(mean) * math.Exp(rand.NormFloat64()*math.Sqrt(s2)-s2/2))
}

// Close stops the workers; queued work is abandoned.
func (u *Upstream) Close() {
	u.mu.Lock()
	u.closed = true
	for _, j := range u.queue {
		close(j.done)
	}
	u.queue = nil
	u.cond.Broadcast()
	u.mu.Unlock()
	u.workers.Wait()
}

// ServeHTTP queues the request and answers when a worker has served it.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	stops, _ := strconv.Atoi(r.Header.Get("X-Stops"))
	svc := ServiceTime(r.Method, r.URL.Path, stops)
	if m := u.fixed.Load(); m > 0 {
		svc = time.Duration(m)
		if !u.exact.Load() {
			svc = lognormal(svc)
		}
	}
	if f := math.Float64frombits(u.slow.Load()); f > 0 {
		svc = time.Duration(float64(svc) * f)
	}
	j := &job{service: svc, done: make(chan struct{})}
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		http.Error(w, "closed", http.StatusServiceUnavailable)
		return
	}
	u.queue = append(u.queue, j)
	u.cond.Signal()
	u.mu.Unlock()
	<-j.done // a naive service waits even if the client is gone
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(WorkHeader, strconv.FormatInt(j.service.Microseconds(), 10))
	w.Write([]byte(`{"ok":true}` + "\n"))
}
