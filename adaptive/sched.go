package adaptive

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"
)

// SchedulingDelay returns a source of queueing delay for an in-process Go
// service: the 99th percentile of goroutine scheduling latency (the time
// a runnable goroutine waited for a processor) since the source's last
// call, from runtime/metrics "/sched/latencies:seconds" — the signal the
// Go ports of Breakwater and Rajomon read. A service whose goroutines wait
// to run is past its CPU; one whose requests are merely slow is not. Each
// call reads the runtime's histogram once (microseconds); it is safe for
// concurrent use.
func SchedulingDelay() func() time.Duration {
	var mu sync.Mutex
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	var last []uint64
	return func() time.Duration {
		mu.Lock()
		defer mu.Unlock()
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
			return 0
		}
		h := sample[0].Value.Float64Histogram()
		if len(last) != len(h.Counts) {
			last = make([]uint64, len(h.Counts))
		}
		var total uint64
		diff := make([]uint64, len(h.Counts))
		for i, c := range h.Counts {
			diff[i] = c - last[i]
			total += diff[i]
			last[i] = c
		}
		if total == 0 {
			return 0
		}
		want := uint64(math.Ceil(0.99 * float64(total)))
		var sum uint64
		for i, c := range diff {
			sum += c
			if sum >= want {
				hi := h.Buckets[i+1] // bucket i is [Buckets[i], Buckets[i+1])
				if math.IsInf(hi, 1) {
					hi = h.Buckets[i]
				}
				return time.Duration(hi * float64(time.Second))
			}
		}
		return 0
	}
}
