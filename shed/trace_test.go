package shed

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/tracefile"
)

// The utilization controller's trace: samples in, shed fraction out.
func TestControllerTrace(t *testing.T) {
	var c *controller
	tracefile.Run(t, "testdata/controller.trace", func(t *testing.T, cmd *tracefile.Cmd) string {
		switch cmd.Name {
		case "controller":
			var err error
			c, err = newController(ControllerConfig{Good: cmd.Float(t, "good", 0), Bad: cmd.Float(t, "bad", 0),
				Delay: cmd.Duration(t, "delay", 0), ShedAllAfter: cmd.Duration(t, "shed_all_after", 0)})
			if err != nil {
				return err.Error()
			}
			cfg := c.Config()
			return fmt.Sprintf("good %v, bad %v, delay %v, shed all after %v", cfg.Good, cfg.Bad, cfg.Delay, cfg.ShedAllAfter)
		case "samples":
			// Feed u every interval from..to (inclusive), printing each
			// sample where the fraction changed since the one before.
			var b strings.Builder
			from, to, every := cmd.Duration(t, "from", 0), cmd.Duration(t, "to", 0), cmd.Duration(t, "every", 8*time.Second)
			u := cmd.Float(t, "u", 0)
			prev := -1.0
			for at := from; at <= to; at += every {
				now := clock.Instant(at)
				c.Sample(now, u)
				if f := c.Fraction(now); f != prev {
					fmt.Fprintf(&b, "t=%v fraction=%.4f\n", at, f)
					prev = f
				}
			}
			return b.String()
		case "fraction":
			at := cmd.Duration(t, "t", 0)
			return fmt.Sprintf("t=%v fraction=%.6f", at, c.Fraction(clock.Instant(at)))
		}
		t.Fatalf("%s: unknown command %q", cmd.Pos, cmd.Name)
		return ""
	})
}

// ladderDriver drives a Ladder through its public API: every tick it
// offers the load of the demand asked for (demand × workers requests of a
// class, each in flight for the whole tick) and ends them at the tick's
// end, so the ladder measures exactly that demand whether it admits or
// sheds them.
type ladderDriver struct {
	l       *Ladder
	workers int64
	now     clock.Instant
	seen    int // transitions printed
}

const tick = 100 * time.Millisecond

// run offers the demands in turn, each for a second, for dur.
func (d *ladderDriver) run(demands []float64, class string, dur time.Duration) (admitted, shed int) {
	ctx := context.Background()
	start := d.now
	for end := d.now.Add(dur); d.now < end; d.now = d.now.Add(tick) {
		demand := demands[int(d.now.Sub(start)/time.Second)%len(demands)]
		n := int(demand*float64(d.workers) + 0.5)
		var held []sluice.Permit
		req := &sluice.Request{Class: class, Cost: 1}
		for range n {
			dec, p := gatetest.Decide(ctx, d.l, req, d.now)
			if dec.Admitted {
				held = append(held, p)
				admitted++
			} else {
				shed++
			}
		}
		for _, p := range held {
			d.l.Release(req, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: d.now.Add(tick), Latency: tick})
		}
	}
	return admitted, shed
}

// transitions prints the ladder's transitions since the last call.
func (d *ladderDriver) transitions(b *strings.Builder) {
	st := d.l.State(d.now)
	for _, tr := range st.History[d.seen:] {
		fmt.Fprintf(b, "t=%v demand=%.2f %s -> %s\n", time.Duration(tr.At), tr.Pressure, tr.From, tr.To)
	}
	d.seen = len(st.History)
}

// The degradation ladder's trace: a load step NORMAL → DEGRADE → SHED →
// RECOVER → NORMAL, with the recovery ramp's shares, driven by requests.
func TestLadderTrace(t *testing.T) {
	var d *ladderDriver
	tracefile.Run(t, "testdata/ladder.trace", func(t *testing.T, cmd *tracefile.Cmd) string {
		switch cmd.Name {
		case "ladder":
			rnd := rand.New(rand.NewPCG(1, 2))
			l, err := NewLadder("ladder", LadderConfig{Workers: cmd.Int(t, "workers", 100), Rand: rnd.Float64})
			if err != nil {
				return err.Error()
			}
			d = &ladderDriver{l: l, workers: cmd.Int(t, "workers", 100)}
			c := LadderConfig{}.WithDefaults()
			return fmt.Sprintf("degrade %v/%v, shed %v/%v, dwell %v, recover %v every %v", c.DegradeEnter, c.DegradeExit,
				c.ShedEnter, c.ShedExit, c.MinDwell, c.RecoverSteps, c.StepEvery)
		case "demand":
			var demands []float64
			for _, f := range strings.Split(cmd.Str("p", "0"), ",") {
				var p float64
				fmt.Sscan(f, &p)
				demands = append(demands, p)
			}
			admitted, shed := d.run(demands, cmd.Str("class", sluice.ClassDefault), cmd.Duration(t, "for", 0))
			var b strings.Builder
			d.transitions(&b)
			st := d.l.State(d.now)
			step := ""
			if st.Level == sluice.LevelRecover {
				step = fmt.Sprintf(" (step %d)", st.Step)
			}
			fmt.Fprintf(&b, "t=%v level=%s%s admitted=%d shed=%d", time.Duration(d.now), st.Level, step, admitted, shed)
			return b.String()
		}
		t.Fatalf("%s: unknown command %q", cmd.Pos, cmd.Name)
		return ""
	})
}
