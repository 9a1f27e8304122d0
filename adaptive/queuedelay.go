package adaptive

import (
	"math"
	"time"
)

// QueueDelayConfig configures a QueueDelay controller.
type QueueDelayConfig struct {
	// Initial, Min and Max bound the limit. Defaults 20, 1, 1000.
	Initial, Min, Max int
	// Target is the queueing delay the controller keeps the service under
	// (required). Breakwater suggests several times the mean service time;
	// its gRPC port takes 0.4 × the latency objective.
	Target time.Duration
	// Increase is what a window under Target adds, given the limit.
	// Default √L: quick to grow from small limits, gentle at large ones.
	Increase func(limit float64) float64
	// Decrease is the multiplicative decrease β of a window over Target: the
	// limit is multiplied by max(1 − β·(d − Target)/d, 0.5). Default 0.5.
	Decrease float64
}

// queueDelay is the state of the QueueDelay controller (NewQueueDelay).
type queueDelay struct {
	cfg QueueDelayConfig
	est float64
}

var _ Controller = (*queueDelay)(nil)

// NewQueueDelay returns the QueueDelay controller, at cfg.Initial; an invalid
// configuration is an error that wraps ErrInvalidConfig.
//
// QueueDelay sizes a concurrency limit from queueing delay rather than
// response time, the overload signal of DAGOR (SoCC 2018) and Breakwater
// (OSDI 2020): a service slow because of its work has long response times
// but short queues, an overloaded one long queues. Its update is
// Breakwater's credit rule with the window's longest queueing delay d:
//
//	d ≤ Target:  L ← L + Increase(L)
//	d > Target:  L ← L · max(1 − Decrease·(d − Target)/d, 0.5)
//
// For an in-process Go service one cheap source of d is the runtime's
// goroutine scheduling latency (runtime/metrics "/sched/latencies:seconds",
// which Breakwater's and Rajomon's Go ports read); in front of a service,
// the age of the gate's own wait queue. A window that saw fewer than half
// the limit in flight does not grow it (nothing showed the limit was too
// small), and a drop counts as a delay of twice Target.
func NewQueueDelay(cfg QueueDelayConfig) (Controller, error) { return controller(newQueueDelay(cfg)) }

// newQueueDelay is NewQueueDelay with the concrete type (for the package's tests).
func newQueueDelay(cfg QueueDelayConfig) (*queueDelay, error) {
	if err := bounds(&cfg.Initial, &cfg.Min, &cfg.Max, 20, 1, 1000); err != nil {
		return nil, err
	}
	if cfg.Target <= 0 {
		return nil, paramErr("target", "queue delay: target %v, want > 0", cfg.Target)
	}
	if cfg.Increase == nil {
		cfg.Increase = math.Sqrt
	}
	if cfg.Decrease == 0 {
		cfg.Decrease = 0.5
	}
	if !(cfg.Decrease > 0 && cfg.Decrease <= 1) {
		return nil, configErr("queue delay: decrease %v, want (0, 1]", cfg.Decrease)
	}
	return &queueDelay{cfg: cfg, est: float64(cfg.Initial)}, nil
}

// Update applies one window.
func (q *queueDelay) Update(w Window) int {
	if w.Samples == 0 {
		return q.Limit()
	}
	d := w.QueueDelay
	if w.Dropped {
		d = max(d, 2*q.cfg.Target)
	}
	var next float64
	switch {
	case d > q.cfg.Target:
		over := float64(d-q.cfg.Target) / float64(d)
		next = q.est * max(1-q.cfg.Decrease*over, 0.5)
	case float64(w.InFlight)*2 < q.est:
		return q.Limit()
	default:
		next = q.est + q.cfg.Increase(q.est)
	}
	q.est = clamp(next, q.cfg.Min, q.cfg.Max)
	return q.Limit()
}

// Limit returns the current limit.
func (q *queueDelay) Limit() int { return int(q.est) }

// Estimate returns the limit before truncation.
func (q *queueDelay) Estimate() float64 { return q.est }
