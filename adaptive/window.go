package adaptive

import (
	"math"
	"time"

	"github.com/sluice-go/sluice/clock"
)

// sample is one completed request as a controller sees it.
type sample struct {
	// RTT is the time from its admission to its completion.
	RTT time.Duration
	// InFlight is the requests in flight at its admission, itself
	// included.
	InFlight int
	// Dropped reports that it ran past its deadline or was shed.
	Dropped bool
	// QueueDelay is how long it waited before it started.
	QueueDelay time.Duration
	// Key names the kind of work (the request's operation, or its class):
	// the window keeps each kind's RTTs apart (Window.Keys), so that a
	// controller can tell a queue from a mix that moved to costlier work.
	Key string
}

// maxKeys is how many kinds of work a window keeps apart; samples of
// further keys share the key "".
const maxKeys = 32

// keyStats is what a window saw of one kind of work.
type keyStats struct {
	Key string
	// Samples and Sum are its samples and the sum of their RTTs; SumSq is
	// the sum of their squares, in s².
	Samples int
	Sum     time.Duration
	SumSq   float64
	// FreshSamples and FreshSum are those of the samples admitted within
	// the window.
	FreshSamples int
	FreshSum     time.Duration
	// Late is how many of its samples ran past their deadline.
	Late int
}

// Mean returns the mean RTT of the key's samples.
func (k keyStats) Mean() time.Duration {
	if k.Samples == 0 {
		return 0
	}
	return k.Sum / time.Duration(k.Samples)
}

// Var returns the variance of the key's RTTs, in s² (0 below 2 samples).
func (k keyStats) Var() float64 {
	if k.Samples < 2 {
		return 0
	}
	n := float64(k.Samples)
	mean := k.Sum.Seconds() / n
	return max(k.SumSq/n-mean*mean, 0) * n / (n - 1)
}

// WindowConfig configures a Windower. Zero fields take the defaults of
// Netflix's WindowedLimit.
type WindowConfig struct {
	// MinTime and MaxTime bound a window's length, which is twice the
	// shortest RTT of the window before. Defaults 1 s and 1 s.
	MinTime, MaxTime time.Duration
	// MinSamples is the fewest samples a window needs: a window that
	// reaches its end time with fewer goes on until it has them, so that a
	// slow or small service (one worker of 200 ms gives 5 samples a
	// second) still closes windows. Default 10.
	MinSamples int
	// MinRTT is the shortest RTT that counts as a sample: faster ones (a
	// 404 or 401 answered at once, a cache hit) say nothing of the
	// service's queue, and a controller that took them for its no-load RTT
	// read every later window as a queue. Default 100 µs, Netflix's. A
	// service that answers everything faster has its own threshold: once
	// 10·MinSamples samples in a row were faster, none counted, and the
	// window's time is over, the threshold drops to half the fastest of
	// them (with a fixed 100 µs every sample of a 50 µs service was
	// dropped, no window closed, and the limit stayed at 1).
	MinRTT time.Duration
}

// windower gathers samples into windows for a Controller, as Netflix's
// WindowedLimit does: a window ends at the first sample after its end time
// once it has at least MinSamples samples (it runs on until then); its RTT
// is their mean. It is not safe for concurrent use.
type windower struct {
	cfg   WindowConfig
	next  clock.Instant // end of the current window
	start clock.Instant // its beginning: the previous window's end (0: at its first sample)
	cur   Window
	sum   time.Duration
	sumSq float64       // of the RTTs in seconds, for RTTDev
	fresh time.Duration // of the samples admitted since start
	keys  []keyStats
	index map[string]int // into keys
	// fastN counts the samples in a row faster than MinRTT, fastMin the
	// fastest of them (the threshold follows a service faster than it).
	fastN   int
	fastMin time.Duration
}

// newWindower returns an empty Windower.
func newWindower(cfg WindowConfig) (*windower, error) {
	if cfg.MinTime == 0 {
		cfg.MinTime = time.Second
	}
	if cfg.MaxTime == 0 {
		cfg.MaxTime = max(time.Second, cfg.MinTime)
	}
	if cfg.MinSamples == 0 {
		cfg.MinSamples = 10
	}
	if cfg.MinRTT == 0 {
		cfg.MinRTT = 100 * time.Microsecond
	}
	switch {
	case cfg.MinTime < 0 || cfg.MaxTime < cfg.MinTime:
		return nil, configErr("window: times [%v, %v]", cfg.MinTime, cfg.MaxTime)
	case cfg.MinSamples < 1:
		return nil, configErr("window: min samples %d, want ≥ 1", cfg.MinSamples)
	}
	return &windower{cfg: cfg}, nil
}

// Add takes a sample completed at now. When it ends a window, it returns
// that window and true.
func (w *windower) Add(now clock.Instant, s sample) (Window, bool) {
	c := &w.cur
	if s.RTT < w.cfg.MinRTT {
		w.fastN++
		if w.fastN == 1 || s.RTT < w.fastMin {
			w.fastMin = s.RTT
		}
		if c.Samples == 0 && w.fastN >= 10*w.cfg.MinSamples && (w.next == 0 || now > w.next) {
			w.cfg.MinRTT = max(w.fastMin/2, time.Microsecond)
			w.fastN = 0
		}
		return Window{}, false
	}
	w.fastN = 0
	if c.Samples == 0 && w.start == 0 && w.next == 0 {
		// The first window of all begins with its first sample's
		// admission.
		w.start = now.Add(-s.RTT)
		w.next = now.Add(w.cfg.MinTime)
	}
	if c.Samples == 0 || s.RTT < c.MinRTT {
		c.MinRTT = s.RTT
	}
	c.Samples++
	w.sum += s.RTT
	w.sumSq += s.RTT.Seconds() * s.RTT.Seconds()
	fresh := now.Add(-s.RTT) >= w.start
	if fresh {
		c.FreshSamples++
		w.fresh += s.RTT
	}
	w.addKey(s, fresh)
	c.InFlight = max(c.InFlight, s.InFlight)
	c.Dropped = c.Dropped || s.Dropped
	if s.Dropped {
		c.Late++
	}
	c.QueueDelay = max(c.QueueDelay, s.QueueDelay)
	if now <= w.next || c.Samples < w.cfg.MinSamples {
		return Window{}, false
	}
	win := *c
	win.RTT = w.sum / time.Duration(c.Samples)
	if n := float64(c.Samples); n > 1 {
		mean := w.sum.Seconds() / n
		win.RTTDev = time.Duration(math.Sqrt(max(w.sumSq/n-mean*mean, 0)*n/(n-1)) * float64(time.Second))
	}
	if c.FreshSamples > 0 {
		win.FreshRTT = w.fresh / time.Duration(c.FreshSamples)
	}
	win.Start, win.End = w.start, now
	win.keys = w.keys
	w.start = now
	w.next = now.Add(min(max(2*c.MinRTT, w.cfg.MinTime), w.cfg.MaxTime))
	*c, w.sum, w.sumSq, w.fresh = Window{}, 0, 0, 0
	w.keys = make([]keyStats, 0, len(win.keys))
	clear(w.index)
	return win, true
}

// EndAt moves the end of the window in progress to at (the window still
// runs on until it has MinSamples samples): a controller that has just
// lowered its limit to measure the service (BBR's probe) needs a few
// round trips, not a whole window of lost work.
func (w *windower) EndAt(at clock.Instant) {
	if w.next != 0 {
		w.next = at
	}
}

// addKey adds s to its key's stats.
func (w *windower) addKey(s sample, fresh bool) {
	if w.index == nil {
		w.index = map[string]int{}
	}
	i, ok := w.index[s.Key]
	if !ok {
		key := s.Key
		if len(w.keys) >= maxKeys-1 && key != "" {
			key = ""
		}
		if i, ok = w.index[key]; !ok {
			i = len(w.keys)
			w.keys = append(w.keys, keyStats{Key: key})
			w.index[key] = i
		}
	}
	k := &w.keys[i]
	k.Samples++
	k.Sum += s.RTT
	k.SumSq += s.RTT.Seconds() * s.RTT.Seconds()
	if fresh {
		k.FreshSamples++
		k.FreshSum += s.RTT
	}
	if s.Dropped {
		k.Late++
	}
}
