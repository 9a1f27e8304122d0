package shed

import (
	"runtime"
	"sync"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// cpuSource reads this process's CPU utilization: CPU time (user + system)
// used since the previous reading, divided by the wall time elapsed times
// GOMAXPROCS. It is safe for concurrent use.
type cpuSource struct {
	mu       sync.Mutex
	lastCPU  time.Duration
	lastWall time.Time
}

var _ Source = (*cpuSource)(nil)

// NewCPUSource returns a CPU source; its first reading covers the time
// since it was created.
func NewCPUSource() Source {
	s := &cpuSource{lastWall: time.Now()}
	s.lastCPU = processCPU()
	return s
}

// Utilization returns the CPU share used since the previous call, in [0, 1].
func (s *cpuSource) Utilization(clock.Instant) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	cpu, wall := processCPU(), time.Now()
	elapsed := wall.Sub(s.lastWall)
	used := cpu - s.lastCPU
	s.lastCPU, s.lastWall = cpu, wall
	if elapsed <= 0 {
		return 0
	}
	return min(max(float64(used)/(float64(elapsed)*float64(runtime.GOMAXPROCS(0))), 0), 1)
}
