package adaptive

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// BBR's guarantee, over an hour of a saturated service: in front of a FIFO
// service of N workers and service time S (any N, any S) offered three
// times its capacity, after the first minute, every minute keeps goodput
// at 90% of capacity or more, the limit's median stays within [N, 1.25·N
// + 1] (capacity × no-load latency is N, plus the transit's share), it
// never goes above 2·N + 1 (a step up that noise let through) and is below
// 0.75·N − 1 for at most 5% of the arrivals (probes), and the service
// never queues more than N + 1 requests. (The callers'
// deadlines are far, 100·S: what meets a tight one is the wait queue's and
// the deadline gate's business, tested with them. Under the race
// detector the run is 10 minutes.) Gradient2 under
// the same hour lets its limit climb until every answer is late (the
// known flaw its long-term average has).
func TestBBRHoldsAnHour(t *testing.T) {
	cases := []struct {
		n   int
		s   time.Duration
		svc string
	}{
		{1, 50 * time.Millisecond, "constant"},
		{2, 200 * time.Millisecond, "constant"},
		{4, 50 * time.Millisecond, "exponential"},
		{8, 40 * time.Millisecond, "constant"},
		{32, 200 * time.Millisecond, "constant"},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%dx%v-%s", c.n, c.s, c.svc), func(t *testing.T) {
			ctrl, err := newBBR(BBRConfig{Epoch: time.Unix(0, 0)})
			if err != nil {
				t.Fatal(err)
			}
			g, _ := NewGate("g", ctrl, GateOptions{})
			svc := constant(c.s)
			if c.svc == "exponential" {
				svc = exponential(c.s)
			}
			u := &upstream{Workers: c.n, Service: svc, Deadline: 100 * c.s, Transit: 200 * time.Microsecond, MaxWait: 200 * time.Millisecond, Seed: 1}
			capacity := float64(c.n) / c.s.Seconds()
			rows := u.run(g, time.Minute, phase{For: longRun, Load: 3 * capacity})
			n := float64(c.n)
			for i, r := range rows[1:] {
				slices.Sort(r.limits)
				med := r.limits[len(r.limits)/2]
				good := float64(r.Useful) / (capacity * 60)
				switch {
				case good < 0.9:
					t.Errorf("minute %d: goodput %.1f%% of capacity", i+2, 100*good)
				case float64(med) < n || float64(med) > 1.25*n+1:
					t.Errorf("minute %d: median limit %d for %d workers", i+2, med, c.n)
				case float64(r.MaxLimit) > 2*n+1:
					t.Errorf("minute %d: limit up to %d for %d workers", i+2, r.MaxLimit, c.n)
				case low(r.limits, 0.75*n-1) > 0.05:
					t.Errorf("minute %d: limit below 0.75·N − 1 for %.0f%% of the arrivals", i+2, 100*low(r.limits, 0.75*n-1))
				case float64(r.QueueMax) > n+1:
					t.Errorf("minute %d: %d requests queued at the service of %d workers", i+2, r.QueueMax, c.n)
				}
			}
		})
	}
}

// low returns the share of limits below x.
func low(limits []int, x float64) float64 {
	n := 0
	for _, l := range limits {
		if float64(l) < x {
			n++
		}
	}
	return float64(n) / float64(max(len(limits), 1))
}

// stalledRun runs a new BBR controller's gate in front of u at load
// (requests/s) for before, then for stallFor with every answer stall more
// on its way (a host that stalls the proxy), then for after, and returns
// the rows of each interval.
func stalledRun(t *testing.T, u *upstream, load float64, before, stall, stallFor, after, interval time.Duration) []row {
	t.Helper()
	ctrl, err := newBBR(BBRConfig{Epoch: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := NewGate("g", ctrl, GateOptions{})
	var phases []phase
	if before > 0 {
		phases = append(phases, phase{For: before, Load: load})
	}
	phases = append(phases, phase{For: stallFor, Load: load, Transit: stall}, phase{For: after, Load: load})
	return u.run(g, interval, phases...)
}

// A stall of the host (the proxy's own CPU taken, so that every answer
// comes back late whatever the limit) says nothing of the service's size:
// once it ends, the limit is back where the service needs it within
// seconds, not held low for the minute a queue that made answers late
// would hold it. Modelled on the capacity matrix's 32 workers × 5 ms with a
// 50 ms deadline on a host whose cores were taken: 3 s in which every
// answer took 60 ms more, from the load's start and in the middle of a
// run, at half the service's capacity.
func TestBBRAfterAHostStall(t *testing.T) {
	const n, s = 32, 5 * time.Millisecond
	capacity := float64(n) / s.Seconds()
	for _, c := range []struct {
		name   string
		before time.Duration
	}{{"at-start", 50 * time.Millisecond}, {"mid-run", 30 * time.Second}} {
		t.Run(c.name, func(t *testing.T) {
			u := &upstream{Workers: n, Service: constant(s), Deadline: 10 * s, Transit: 200 * time.Microsecond, Seed: 1}
			load := capacity / 2
			rows := stalledRun(t, u, load, c.before, 60*time.Millisecond, 3*time.Second, time.Minute, time.Second)
			after := int((c.before + 3*time.Second + time.Second - 1) / time.Second)
			for i, r := range rows[after+5:] {
				if good := float64(r.Useful) / load; good < 0.95 {
					t.Errorf("second %d after the stall: goodput %.0f%% of the offered load (limit %d..%d)", i+6, 100*good, r.MinLimit, r.MaxLimit)
				}
			}
		})
	}
}

// A stall while the startup doubles the limit: the doubling's window got
// less work done than the one before it, which no queue at the service
// does. The startup goes back a step and doubles again once the stall
// ends, instead of ending at the limit the stall met with a ceiling above
// it. Modelled on the capacity matrix's 8 workers × 5 ms with a 500 ms
// deadline at 10× on a host whose two cores were taken: 10 ms more on
// every answer for 2 s, from 80 ms after the load's start.
func TestBBRStartupThroughAHostStall(t *testing.T) {
	const n, s = 8, 5 * time.Millisecond
	capacity := float64(n) / s.Seconds()
	u := &upstream{Workers: n, Service: constant(s), Deadline: 100 * s, Transit: 200 * time.Microsecond, MaxWait: 200 * time.Millisecond, Seed: 1}
	rows := stalledRun(t, u, 10*capacity, 80*time.Millisecond, 10*time.Millisecond, 2*time.Second, 20*time.Second, time.Second)
	for i, r := range rows[4:] {
		if good := float64(r.Useful) / capacity; good < 0.9 {
			t.Errorf("second %d: goodput %.0f%% of capacity (limit %d..%d)", i+5, 100*good, r.MinLimit, r.MaxLimit)
		}
	}
}

// A stall in the controller's first milliseconds (40 ms more on every
// answer for 2 s, 10 ms after the load's start) makes the first no-load
// RTTs too long, and the queue a limit sized from them lets in reads as no
// queue at all. A probe that reads a quarter faster than the no-load RTT
// probes again at half its limit, and the work done is measured afresh:
// 30 s in, the limit is back near the service's size (before, it stood at
// 43 to 68 in front of 8 workers after 30 s and took minutes to come
// down).
func TestBBRAfterAStallInItsFirstMilliseconds(t *testing.T) {
	const n, s = 8, 5 * time.Millisecond
	capacity := float64(n) / s.Seconds()
	u := &upstream{Workers: n, Service: constant(s), Deadline: 100 * s, Transit: 200 * time.Microsecond, MaxWait: 200 * time.Millisecond, Seed: 1}
	rows := stalledRun(t, u, 10*capacity, 10*time.Millisecond, 40*time.Millisecond, 2*time.Second, 2*time.Minute, 10*time.Second)
	for i, r := range rows[3:] {
		if r.MaxLimit > 2*n+1 || r.QueueMax > n+1 {
			t.Errorf("%d–%d s: limit up to %d, %d queued at the service of %d workers", 10*(i+3), 10*(i+4), r.MaxLimit, r.QueueMax, n)
		}
	}
}

// A service that answers in under 100 µs (Netflix's threshold for a
// sample, which was the default) sized its limit as any other: every
// sample was dropped, no window closed, and the limit stayed at its start,
// 1, for good (1.6% of the capacity of 64 workers of 50 µs; here 16).
func TestBBRSizesAServiceFasterThan100us(t *testing.T) {
	for _, s := range []time.Duration{50 * time.Microsecond, 90 * time.Microsecond} {
		const n = 16
		g := newBBRGate(t)
		u := &upstream{Workers: n, Service: constant(s), Deadline: 100 * s, Seed: 1}
		capacity := float64(n) / s.Seconds()
		rows := u.run(g, time.Second, phase{For: 3 * time.Second, Load: 2 * capacity})
		for i, r := range rows[1:] {
			if good := float64(r.Useful) / capacity; good < 0.95 || r.MaxLimit > 2*n+1 {
				t.Errorf("%v × %d at 2×, second %d: goodput %.1f%% of capacity, limit %d..%d", s, n, i+2, 100*good, r.MinLimit, r.MaxLimit)
			}
		}
	}
}

// After a slowdown of 30 or 100 times ends, the no-load RTT learned while
// it lasted is measured again: it hid the queue its own limit let in (RTT
// over no-load RTT read 1), no queue asked for a probe, and the limit
// stood at 2.5 times the service's size for good (30 minutes checked).
// A limit used whole with no probe for 6 ProbeIntervals probes.
func TestBBRForgetsASlowdown(t *testing.T) {
	const n, s = 8, 5 * time.Millisecond
	for _, f := range []float64{30, 100} {
		g := newBBRGate(t)
		u := &upstream{Workers: n, Service: constant(s), Deadline: 100 * s, Transit: 200 * time.Microsecond, MaxWait: 200 * time.Millisecond, Seed: 1}
		capacity := float64(n) / s.Seconds()
		rows := u.run(g, time.Minute, phase{For: time.Minute, Load: 3 * capacity}, phase{For: 2 * time.Minute, Load: 3 * capacity, Slow: f},
			phase{For: 6 * time.Minute, Load: 3 * capacity})
		for i, r := range rows[5:] { // from the third minute after
			if m := medianInt(r.limits); m > int(1.25*n+1) || r.MaxLimit > 2*n+1 || r.QueueMax > n+1 {
				t.Errorf("%v× for 2 min, minute %d after: limit median %d max %d, queue %d at the service (bounds %d, %d, %d)",
					f, i+3, m, r.MaxLimit, r.QueueMax, int(1.25*n+1), 2*n+1, n+1)
			}
		}
	}
}

// Workers that come back are used within a minute and a half: a ceiling
// learned while the service was smaller, its backoff doubled by each
// failed step up while it lasted, held the limit below the service for up
// to 5 minutes (62% of capacity for 3 minutes after 8 → 4 → 8 workers).
// The longest backoff is a minute.
func TestBBRUsesWorkersThatComeBack(t *testing.T) {
	const n, s = 8, 20 * time.Millisecond
	for _, low := range []int{1, 2, 4} {
		g := newBBRGate(t)
		u := &upstream{Workers: n, Service: constant(s), Deadline: 100 * s, Transit: 200 * time.Microsecond, MaxWait: 200 * time.Millisecond, Seed: 1}
		capacity := float64(n) / s.Seconds()
		rows := u.run(g, 10*time.Second, phase{For: time.Minute, Load: 3 * capacity}, phase{For: 3 * time.Minute, Load: 3 * capacity, Workers: low},
			phase{For: 5 * time.Minute, Load: 3 * capacity, Workers: n})
		for i, r := range rows[24+9:] { // from 90 s after the workers return
			if float64(r.Useful) < 0.9*capacity*10 {
				t.Errorf("%d → %d → %d workers, %d s after: goodput %.0f%% of capacity", n, low, n, 100+10*i, 100*float64(r.Useful)/(capacity*10))
			}
		}
	}
}

// medianInt returns the median of xs (-1 for none), leaving xs as it was.
func medianInt(xs []int) int {
	if len(xs) == 0 {
		return -1
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// newBBRGate returns a gate over a new BBR controller with the defaults,
// its probe slots on the model's clock.
func newBBRGate(t *testing.T) *Gate {
	t.Helper()
	ctrl, err := newBBR(BBRConfig{Epoch: time.Unix(0, 0)})
	if err != nil {
		t.Fatal(err)
	}
	g, _ := NewGate("g", ctrl, GateOptions{})
	return g
}

// Answers given at once (a 404 or 401 in 20 µs: useful, under the same
// key) are no samples: a controller that took them for its no-load RTT
// read every later window as a queue. With a threshold of 1 µs Vegas
// fell from a limit of 24 to 6 and 68% of its goodput after a 10 s burst
// of them; the threshold stays 100 µs while the service's own answers are
// slower (a service that answers everything faster gets its own).
func TestFastAnswersAreNoNoLoadRTT(t *testing.T) {
	const n, s = 8, 20 * time.Millisecond
	capacity := float64(n) / s.Seconds()
	ctrl, _ := newVegas(VegasConfig{Rand: func() float64 { return 0.5 }})
	g, _ := NewGate("g", ctrl, GateOptions{})
	u := &upstream{Workers: n, Deadline: 10 * s, Seed: 1}
	burstFrom, burstTo := clock.Instant(time.Hour+60*time.Second), clock.Instant(time.Hour+70*time.Second)
	u.Service = func(r *rand.Rand) time.Duration {
		p := 0.05
		if u.now >= burstFrom && u.now < burstTo {
			p = 0.97
		}
		if r.Float64() < p {
			return 20 * time.Microsecond
		}
		return s
	}
	rows := u.run(g, 10*time.Second, phase{For: 3 * time.Minute, Load: 2 * capacity})
	for i, r := range rows[8:] {
		if float64(r.Useful) < 0.95*capacity*10 {
			t.Errorf("%d s after the burst of fast answers: %d useful in 10 s, want about %.0f; limit %d..%d", 10*(i+1), r.Useful, capacity*10, r.MinLimit, r.MaxLimit)
		}
	}
}
