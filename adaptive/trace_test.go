package adaptive

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/tracefile"
)

// traced is a controller under a trace, with what the trace prints of it.
type traced struct {
	c     Controller
	state func() string
}

// newTraced builds the controller a trace's "controller" command names.
func newTraced(t *testing.T, cmd *tracefile.Cmd) (traced, error) {
	initial, lo, hi := int(cmd.Int(t, "initial", 0)), int(cmd.Int(t, "min", 0)), int(cmd.Int(t, "max", 0))
	fixed := func(key string) func(int) int {
		if n := cmd.Int(t, key, -1); n >= 0 {
			return func(int) int { return int(n) }
		}
		return nil
	}
	switch kind := cmd.Words[0]; kind {
	case "gradient2":
		g, err := newGradient2(Gradient2Config{Initial: initial, Min: lo, Max: hi,
			Tolerance: cmd.Float(t, "tolerance", 0), Smoothing: cmd.Float(t, "smoothing", 0), Queue: fixed("queue")})
		if err != nil {
			return traced{}, err
		}
		return traced{g, func() string {
			return fmt.Sprintf("estimate=%.4f long=%v", g.Estimate(), g.LongRTT().Round(100*time.Nanosecond))
		}}, nil
	case "vegas":
		cfg := VegasConfig{Initial: initial, Min: lo, Max: hi, Smoothing: cmd.Float(t, "smoothing", 0),
			Alpha: fixed("alpha"), Beta: fixed("beta"), Rand: func() float64 { return 0.999 }}
		if cmd.Str("decrease", "") == "half" {
			cfg.Decrease = func(l float64) float64 { return l / 2 }
		}
		v, err := newVegas(cfg)
		if err != nil {
			return traced{}, err
		}
		return traced{v, func() string { return fmt.Sprintf("estimate=%.4f noload=%v", v.Estimate(), v.NoLoadRTT()) }}, nil
	case "aimd":
		a, err := newAIMD(AIMDConfig{Initial: initial, Min: lo, Max: hi})
		return traced{a, func() string { return "" }}, err
	case "queuedelay":
		q, err := newQueueDelay(QueueDelayConfig{Initial: initial, Min: lo, Max: hi, Target: cmd.Duration(t, "target", 0)})
		if err != nil {
			return traced{}, err
		}
		return traced{q, func() string { return fmt.Sprintf("estimate=%.4f", q.Estimate()) }}, nil
	case "bbr":
		b, err := newBBR(BBRConfig{Initial: initial, Min: lo, Max: hi, Epoch: time.Unix(0, 0)})
		if err != nil {
			return traced{}, err
		}
		return traced{b, func() string {
			probe := ""
			if b.Probing() {
				probe = " probing"
			}
			return fmt.Sprintf("estimate=%.4f noload=%v%s", b.Estimate(), b.NoLoadRTT(), probe)
		}}, nil
	default:
		return traced{}, fmt.Errorf("unknown controller %q", kind)
	}
}

// The controllers as data-driven traces: windows in, limits out
// (testdata/*.trace; go test -run TestControllerTraces -rewrite to accept
// new output after reading it).
func TestControllerTraces(t *testing.T) {
	for _, name := range []string{"gradient2", "vegas", "aimd", "queuedelay", "bbr"} {
		t.Run(name, func(t *testing.T) {
			var c traced
			var now clock.Instant
			tracefile.Run(t, "testdata/"+name+".trace", func(t *testing.T, cmd *tracefile.Cmd) string {
				switch cmd.Name {
				case "controller":
					var err error
					if c, err = newTraced(t, cmd); err != nil {
						return err.Error()
					}
					return fmt.Sprintf("limit=%d", c.c.Limit())
				case "window":
					w := Window{Samples: 10, RTT: cmd.Duration(t, "rtt", 0), InFlight: int(cmd.Int(t, "inflight", 0)),
						Dropped: slices.Contains(cmd.Words, "drop"), QueueDelay: cmd.Duration(t, "delay", 0)}
					w.MinRTT = w.RTT
					// rate=R: a window of a second (each one after the
					// last) with R samples, late=L of them late, and those
					// admitted within it taking fresh= (default rtt).
					rate := cmd.Int(t, "rate", 0)
					var limit int
					for range cmd.Int(t, "n", 1) {
						if rate > 0 {
							w.Samples, w.Late = int(rate), int(cmd.Int(t, "late", 0))
							w.Dropped = w.Late > 0
							w.Start, w.End = now, now.Add(time.Second)
							w.FreshRTT, w.FreshSamples = cmd.Duration(t, "fresh", w.RTT), w.Samples
							now = w.End
						}
						limit = c.c.Update(w)
					}
					if s := c.state(); s != "" {
						return fmt.Sprintf("limit=%d %s", limit, s)
					}
					return fmt.Sprintf("limit=%d", limit)
				}
				t.Fatalf("%s: unknown command %q", cmd.Pos, cmd.Name)
				return ""
			})
		})
	}
}
