package shed

import (
	"math"
	"testing"
	"time"

	"github.com/sluice-go/sluice/clock"
)

const sec = clock.Instant(time.Second)

func ctrl(t *testing.T) *controller {
	t.Helper()
	c, err := newController(ControllerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// samples feeds u every 8 s from `from` up to `to` (inclusive).
func samples(c *controller, from, to clock.Instant, u float64) {
	for now := from; now <= to; now += 8 * sec {
		c.Sample(now, u)
	}
}

func TestControllerPinnedAtFullPressure(t *testing.T) {
	c := ctrl(t)
	samples(c, 0, 200*sec, 1.0)
	// No shed during the delay, then growth at 1/120 per second.
	for _, st := range []struct {
		at   clock.Instant
		want float64
	}{
		{0, 0}, {27 * sec, 0}, {28 * sec, 0}, {29 * sec, 1.0 / 120}, {88 * sec, 0.5},
		{148*sec - 1, 1 - 1.0/120e9}, {148 * sec, 1}, {200 * sec, 1},
	} {
		c2 := ctrl(t)
		samples(c2, 0, st.at, 1.0)
		if got := c2.Fraction(st.at); math.Abs(got-st.want) > 1e-12 {
			t.Fatalf("at %v: fraction %v, want %v", time.Duration(st.at), got, st.want)
		}
	}
	if got := c.Fraction(148 * sec); got != 1 {
		t.Fatalf("shed_all_after after the first shed the fraction is %v, want exactly 1", got)
	}
}

func TestControllerDeadZoneMovesNothing(t *testing.T) {
	c := ctrl(t)
	samples(c, 0, 88*sec, 1.0) // shed half; the 88 s sample keeps growing it until the next
	c.Sample(96*sec, 0.75)
	f := c.Fraction(96 * sec)
	for now := 104 * sec; now <= 1000*sec; now += 8 * sec {
		c.Sample(now, 0.75)
		if got := c.Fraction(now); got != f {
			t.Fatalf("pinned at 0.75 the fraction moved from %v to %v", f, got)
		}
	}
}

func TestControllerDecaysAtTheDocumentedRate(t *testing.T) {
	c := ctrl(t)
	samples(c, 0, 148*sec, 1.0) // fully shed at 148 s
	c.Sample(152*sec, 0.5)
	// Decay rate (1 − 0.5/0.7)/120 per second, from the 152 s sample on.
	rate := (1 - 0.5/0.7) / 120
	for _, dt := range []clock.Instant{8, 104, 304} {
		samples(c, 160*sec, 152*sec+dt*sec, 0.5)
		want := max(1-rate*float64(dt), 0)
		if got := c.Fraction(152*sec + dt*sec); math.Abs(got-want) > 1e-9 {
			t.Fatalf("%d s into recovery: %v, want %v", dt, got, want)
		}
	}
	zero := 152*sec + clock.Instant(math.Ceil(1/rate))*sec
	samples(c, 464*sec, zero, 0.5)
	if got := c.Fraction(zero); got != 0 {
		t.Fatalf("not back to 0 after %v: %v", time.Duration(zero), got)
	}
}

func TestControllerNoFlappingOnNoise(t *testing.T) {
	c := ctrl(t)
	changes := 0
	prev := c.Fraction(0)
	for i := clock.Instant(0); i < 500; i++ {
		u := 0.72
		if i%2 == 1 {
			u = 0.78
		}
		c.Sample(i*8*sec, u)
		if f := c.Fraction(i * 8 * sec); f != prev {
			changes++
			prev = f
		}
	}
	if changes != 0 {
		t.Fatalf("%d state changes on a signal inside the dead zone", changes)
	}
	// Shedding already under way does not move either.
	c = ctrl(t)
	samples(c, 0, 88*sec, 1.0)
	c.Sample(96*sec, 0.72)
	f := c.Fraction(96 * sec)
	for i := clock.Instant(13); i < 500; i++ {
		c.Sample(i*8*sec, 0.72+0.06*float64(i%2))
		if c.Fraction(i*8*sec) != f {
			t.Fatal("noise in the dead zone moved an active shed")
		}
	}
}

func TestControllerShortSpikeShedsNothing(t *testing.T) {
	c := ctrl(t)
	c.Sample(0, 0.5)
	c.Sample(8*sec, 1.0) // one slow query
	c.Sample(16*sec, 1.0)
	c.Sample(24*sec, 0.5)
	if f := c.Fraction(300 * sec); f != 0 {
		t.Fatalf("a 16 s spike shed %v", f)
	}
}

func TestTiersShedStrictlyInOrder(t *testing.T) {
	for f := 0.0; f <= 1.0; f += 0.01 {
		for i := 1; i < 4; i++ {
			if tierShed(f, i, 4) > 0 && tierShed(f, i-1, 4) < 1 {
				t.Fatalf("f=%v: tier %d sheds while tier %d is not fully shed", f, i, i-1)
			}
		}
	}
	if math.Abs(tierShed(0.6, 2, 4)-0.4) > 1e-12 || tierShed(1, 3, 4) != 1 || tierShed(0.75, 3, 4) != 0 {
		t.Fatal("tier probabilities")
	}
}

func TestControllerConfigErrors(t *testing.T) {
	for _, c := range []ControllerConfig{
		{Good: 0.8, Bad: 0.7}, {Good: 0.8, Bad: 0.8}, {Delay: -time.Second}, {ShedAllAfter: -1}, {Bad: 1.2}, {Good: math.NaN()},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
}

// A source that breaks (NaN from then on) is no reading: the shedding
// winds down as at idle, over ShedAllAfter (120 s). The last slope held,
// and a source that broke during overload shed everything for good.
func TestControllerWindsDownWithoutReadings(t *testing.T) {
	c := ctrl(t)
	samples(c, 0, 200*sec, 1.0)
	if got := c.Fraction(200 * sec); got != 1 {
		t.Fatalf("under full pressure: %v", got)
	}
	samples(c, 208*sec, 264*sec, math.NaN()) // from the first, 56 s
	if got, want := c.Fraction(264*sec), 1-56.0/120; math.Abs(got-want) > 1e-9 {
		t.Errorf("56 s into the NaN readings: %v shed, want %v (winding down over 120 s)", got, want)
	}
	samples(c, 272*sec, 400*sec, math.NaN())
	if got := c.Fraction(400 * sec); got != 0 {
		t.Errorf("minutes of NaN readings: %v shed, want 0", got)
	}
	// A NaN before any reading sets nothing.
	c2 := ctrl(t)
	c2.Sample(0, math.NaN())
	if got := c2.Fraction(100 * sec); got != 0 {
		t.Errorf("only NaN: %v", got)
	}
}

// A reading lost now and then (every fourth NaN) slows the growth but does
// not restart the Delay at each real reading: shedding reaches full
// pressure. Clearing the episode on NaN kept shedding at 0 for good.
func TestControllerThroughIntermittentNaN(t *testing.T) {
	c := ctrl(t)
	i := 0
	for now := clock.Instant(0); now <= 600*sec; now += 8 * sec {
		u := 1.0
		if i%4 == 3 {
			u = math.NaN()
		}
		c.Sample(now, u)
		i++
	}
	if got := c.Fraction(600 * sec); got < 0.99 {
		t.Errorf("10 minutes at full pressure, a reading in four lost: %v shed, want full", got)
	}
}
