package adaptive

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
)

// Whatever windows arrive (any RTT, in-flight count, drop, queueing delay,
// empty ones), every controller's limit stays within [Min, Max].
func TestLimitsStayWithinBounds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		lo := rapid.IntRange(1, 50).Draw(rt, "min")
		hi := rapid.IntRange(lo, 500).Draw(rt, "max")
		initial := rapid.IntRange(lo, hi).Draw(rt, "initial")
		u := rapid.Float64Range(0, 0.999).Draw(rt, "rand")
		g, err1 := newGradient2(Gradient2Config{Initial: initial, Min: lo, Max: hi})
		v, err2 := newVegas(VegasConfig{Initial: initial, Min: lo, Max: hi, Rand: func() float64 { return u }})
		a, err3 := newAIMD(AIMDConfig{Initial: initial, Min: lo, Max: hi})
		q, err4 := newQueueDelay(QueueDelayConfig{Initial: initial, Min: lo, Max: hi, Target: 5 * time.Millisecond})
		if err := errors.Join(err1, err2, err3, err4); err != nil {
			rt.Fatal(err)
		}
		for range rapid.IntRange(1, 200).Draw(rt, "windows") {
			w := Window{
				Samples:    rapid.IntRange(0, 100).Draw(rt, "samples"),
				RTT:        time.Duration(rapid.Int64Range(0, int64(10*time.Second)).Draw(rt, "rtt")),
				InFlight:   rapid.IntRange(0, 2*hi).Draw(rt, "inflight"),
				Dropped:    rapid.IntRange(0, 5).Draw(rt, "drop") == 0,
				QueueDelay: time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(rt, "delay")),
			}
			w.MinRTT = w.RTT
			for _, c := range []Controller{g, v, a, q} {
				if l := c.Update(w); l < lo || l > hi || l != c.Limit() {
					rt.Fatalf("%T: limit %d outside [%d, %d] (or Limit %d)", c, l, lo, hi, c.Limit())
				}
			}
		}
	})
}

// Configurations outside their ranges are refused with ErrInvalidConfig.
func TestInvalidConfigs(t *testing.T) {
	_, e1 := newGradient2(Gradient2Config{Min: 10, Max: 5})
	_, e2 := newGradient2(Gradient2Config{Tolerance: 0.5})
	_, e3 := newVegas(VegasConfig{Smoothing: 2})
	_, e4 := newAIMD(AIMDConfig{Backoff: 1})
	_, e5 := newQueueDelay(QueueDelayConfig{})
	_, e6 := newAIMD(AIMDConfig{Initial: 500})
	_, e7 := newWindower(WindowConfig{MinTime: 2 * time.Second, MaxTime: time.Second})
	for i, err := range []error{e1, e2, e3, e4, e5, e6, e7} {
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("config %d: %v", i+1, err)
		}
	}
}

// The Windower closes a window at the first sample after its end once it
// has enough samples (running on past its end until it has), drops samples
// faster than MinRTT, takes the next window's length from twice the
// shortest RTT, and tells apart the samples admitted within the window.
func TestWindower(t *testing.T) {
	w, err := newWindower(WindowConfig{MinTime: 100 * time.Millisecond, MaxTime: time.Second, MinSamples: 3})
	if err != nil {
		t.Fatal(err)
	}
	ms := func(n int) clock.Instant { return clock.Instant(time.Duration(n) * time.Millisecond) }
	// The first window begins at its first sample's admission (-59 ms)
	// and ends MinTime after its completion (101 ms).
	if _, ok := w.Add(ms(1), sample{RTT: 60 * time.Millisecond, InFlight: 3}); ok {
		t.Fatal("a one-sample window closed")
	}
	w.Add(ms(10), sample{RTT: 10 * time.Microsecond}) // too fast: ignored
	w.Add(ms(20), sample{RTT: 20 * time.Millisecond, InFlight: 5})
	w.Add(ms(60), sample{RTT: 40 * time.Millisecond, InFlight: 7, QueueDelay: 3 * time.Millisecond})
	if _, ok := w.Add(ms(101), sample{RTT: 30 * time.Millisecond, InFlight: 6, Dropped: true}); ok {
		t.Fatal("window closed early")
	}
	win, ok := w.Add(ms(102), sample{RTT: 50 * time.Millisecond, InFlight: 2})
	// The RTTs 60, 20, 40, 30 and 50 ms deviate by √(1000/4) ≈ 15.81 ms.
	if d := win.RTTDev - 15811388; d < -1000 || d > 1000 {
		t.Fatalf("RTT deviation %v, want 15.81ms", win.RTTDev)
	}
	win.RTTDev = 0
	if len(win.keys) != 1 || win.keys[0].Samples != 5 || win.keys[0].Sum != 200*time.Millisecond {
		t.Fatalf("keys %+v, want the 5 samples under one key", win.keys)
	}
	win.keys = nil
	want := Window{Samples: 5, RTT: 40 * time.Millisecond, MinRTT: 20 * time.Millisecond, InFlight: 7, Dropped: true,
		QueueDelay: 3 * time.Millisecond, Late: 1, Start: ms(-59), End: ms(102), FreshRTT: 40 * time.Millisecond, FreshSamples: 5}
	if !ok || !reflect.DeepEqual(win, want) {
		t.Fatalf("window %+v %v, want %+v", win, ok, want)
	}
	// The next window ends 100 ms later (twice its 20 ms minimum is less
	// than MinTime) but runs on until it has three samples; the one
	// admitted before it began (at 50 ms) is not fresh.
	w.Add(ms(250), sample{RTT: 10 * time.Millisecond})
	if _, ok := w.Add(ms(300), sample{RTT: 250 * time.Millisecond}); ok {
		t.Fatal("a two-sample window closed")
	}
	win, ok = w.Add(ms(310), sample{RTT: 30 * time.Millisecond})
	win.RTTDev, win.keys = 0, nil
	want = Window{Samples: 3, RTT: 96666666, MinRTT: 10 * time.Millisecond, Start: ms(102), End: ms(310),
		FreshRTT: 20 * time.Millisecond, FreshSamples: 2}
	if !ok || !reflect.DeepEqual(win, want) {
		t.Fatalf("window %+v %v, want %+v", win, ok, want)
	}
	if r := win.Rate(); r < 14.42 || r > 14.43 { // 3 in 208 ms
		t.Fatalf("rate %v, want 14.42/s", r)
	}
}
