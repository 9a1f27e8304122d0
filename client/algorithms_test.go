package client

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/clock"
)

// Full jitter: retry n waits in [0, min(cap, base·2^(n−1))).
func TestBackoffBounds(t *testing.T) {
	b := Backoff{Base: 100 * time.Millisecond, Cap: time.Second}
	for _, c := range []struct {
		n    int
		ceil time.Duration
	}{{0, 100 * time.Millisecond}, {1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{4, 800 * time.Millisecond}, {5, time.Second}, {64, time.Second}, {math.MaxInt, time.Second}} {
		if got := b.ceiling(c.n); got != c.ceil {
			t.Errorf("Ceiling(%d) = %v, want %v", c.n, got, c.ceil)
		}
		if d := b.Delay(c.n, 0); d != 0 {
			t.Errorf("Delay(%d, 0) = %v, want 0", c.n, d)
		}
		if d := b.Delay(c.n, 0.5); d != c.ceil/2 {
			t.Errorf("Delay(%d, 0.5) = %v, want %v", c.n, d, c.ceil/2)
		}
		if d := b.Delay(c.n, 1); d >= c.ceil || d < c.ceil-time.Microsecond {
			t.Errorf("Delay(%d, 1) = %v, want just under %v", c.n, d, c.ceil)
		}
	}
}

func TestBackoffProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		base := time.Duration(rapid.Int64Range(1, int64(time.Hour)).Draw(t, "base"))
		b := Backoff{Base: base, Cap: base * time.Duration(rapid.Int64Range(1, 1000).Draw(t, "capx"))}
		n := rapid.IntRange(-5, 200).Draw(t, "n")
		u := rapid.Float64().Draw(t, "u")
		c := b.ceiling(n)
		if c < base || c > b.Cap || b.ceiling(n+1) < c {
			t.Fatalf("Ceiling(%d) = %v (next %v) for %+v", n, c, b.ceiling(n+1), b)
		}
		if d := b.Delay(n, u); d < 0 || d >= c {
			t.Fatalf("Delay(%d, %v) = %v outside [0, %v)", n, u, d, c)
		}
		f := time.Duration(rapid.Int64Range(0, int64(24*time.Hour)).Draw(t, "floor"))
		spread := rapid.Float64Range(0, 10).Draw(t, "spread")
		w := Floor(f, spread, u)
		if f > 0 && (w < f || float64(w) > float64(f)*(1+spread)+1) {
			t.Fatalf("Floor(%v, %v, %v) = %v outside [f, f·(1+spread)]", f, spread, u, w)
		}
	})
}

// The budget under a 100% failure rate: retries ≤ ratio × requests + burst.
func TestBudgetRatio(t *testing.T) {
	b := NewBudget(0.1, 10)
	retries := 0
	for range 10_000 {
		b.Deposit()
		for b.Withdraw() { // every request fails and wants as many retries as allowed
			retries++
		}
	}
	if retries > 1000+10 || retries < 1000 {
		t.Fatalf("%d retries for 10,000 requests at ratio 0.1, burst 10", retries)
	}
	if b := NewBudget(0.1, 10); !b.Withdraw() || b.Tokens() != 9 {
		t.Fatal("a new budget starts full")
	}
}

// The throttle's local rejection probability is the book's formula on
// scripted counts, and the counts slide out of the window.
func TestThrottleFormula(t *testing.T) {
	for _, c := range []struct {
		requests, accepts int64
		k                 float64
		want              float64
	}{
		{0, 0, 2, 0}, {10, 10, 2, 0}, {10, 5, 2, 0}, {100, 40, 2, 20.0 / 101}, {100, 0, 2, 100.0 / 101},
		{1000, 100, 2, 800.0 / 1001}, {1000, 100, 1.5, 850.0 / 1001}, {7, 3, 2, 1.0 / 8},
	} {
		th := NewThrottle(c.k, time.Minute, 6, 0)
		now := clock.Instant(time.Hour)
		for i := range c.requests {
			th.Done(now, i < c.accepts)
		}
		if r, a := th.counts(now); r != c.requests || a != c.accepts {
			t.Fatalf("counts %d/%d, want %d/%d", r, a, c.requests, c.accepts)
		}
		if got := th.probability(now); math.Abs(got-c.want) > 1e-12 || got != probability(c.requests, c.accepts, c.k) {
			t.Errorf("%d requests, %d accepts, K %v: p = %v, want %v", c.requests, c.accepts, c.k, got, c.want)
		}
		// A draw below p is rejected, one at or above it is sent.
		if c.want > 0 {
			if th2 := clone(c.requests, c.accepts, c.k, now); th2.Allow(now, c.want*0.999) {
				t.Errorf("u just below p = %v was sent", c.want)
			}
			if th2 := clone(c.requests, c.accepts, c.k, now); !th2.Allow(now, c.want) {
				t.Errorf("u = p = %v was rejected", c.want)
			}
		}
		// A minute later (the window) nothing is remembered.
		if p := th.probability(now.Add(time.Minute)); p != 0 {
			t.Errorf("p = %v after the window", p)
		}
	}
}

func clone(requests, accepts int64, k float64, now clock.Instant) *Throttle {
	th := NewThrottle(k, time.Minute, 6, 0)
	for i := range requests {
		th.Done(now, i < accepts)
	}
	return th
}

// Below its minimum of requests the throttle rejects nothing.
func TestThrottleMinimum(t *testing.T) {
	th := NewThrottle(2, time.Minute, 6, 10)
	now := clock.Instant(time.Hour)
	for i := range 10 {
		if !th.Allow(now, 0) {
			t.Fatalf("request %d rejected below the minimum", i)
		}
		th.Done(now, false)
	}
	if th.Allow(now, 0) {
		t.Fatal("the 11th request, with 10 and no accepts in the window, was sent at u = 0")
	}
}

// The window slides bucket by bucket: counts 10 s apart leave it in turn.
func TestThrottleSlides(t *testing.T) {
	th := NewThrottle(2, time.Minute, 6, 0) // 10 s buckets
	t0 := clock.Instant(time.Hour)
	for i := range 6 {
		at := t0.Add(time.Duration(i) * 10 * time.Second)
		for range 10 {
			th.Done(at, false)
		}
	}
	last := t0.Add(50 * time.Second)
	if r, _ := th.counts(last); r != 60 {
		t.Fatalf("%d requests in the window, want 60", r)
	}
	if r, _ := th.counts(last.Add(10 * time.Second)); r != 50 {
		t.Fatalf("%d requests a bucket later, want 50", r)
	}
	if r, _ := th.counts(last.Add(time.Hour)); r != 0 {
		t.Fatalf("%d requests an hour later", r)
	}
}

// Pacing: above the threshold nothing waits; at r of q ≤ 10% the rest is
// spread over the reset time; at r = 0 nothing goes before the reset.
func TestPacer(t *testing.T) {
	now := clock.Instant(time.Hour)
	p := newPacer(0.1)
	q := []Quota{{Policy: "rate", Quota: 100, Window: 10 * time.Second}}
	p.Observe(now, []Limit{{Policy: "rate", Remaining: 50, Reset: 5 * time.Second}}, q)
	if w := p.Reserve(now); w != 0 {
		t.Fatalf("wait %v with half the quota left", w)
	}
	p.Observe(now, []Limit{{Policy: "rate", Remaining: 4, Reset: 5 * time.Second}}, q)
	for i, want := range []time.Duration{0, time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 5 * time.Second} {
		if w := p.Reserve(now); w != want {
			t.Fatalf("request %d waits %v, want %v", i, w, want)
		}
	}
	if w := p.Reserve(now.Add(5 * time.Second)); w != 0 {
		t.Fatalf("after the reset: wait %v", w)
	}
	p.Observe(now, []Limit{{Policy: "rate", Remaining: 0, Reset: 3 * time.Second}}, q)
	if w := p.Reserve(now); w != 3*time.Second {
		t.Fatalf("r=0: wait %v, want the reset (3s)", w)
	}
}

// A burst of concurrent requests to a healthy server is not refused by its
// own client: a request counts once its outcome is known, so requests in
// flight do not weigh as refusals (before, 10 in flight with no answer
// yet gave p = 10/11, and a burst of 200 lost most of itself).
func TestThrottleCountsOnCompletion(t *testing.T) {
	f := newFake()
	r := f.retrier(t, 3, Options{})
	calls := make([]*Call, 200)
	for i := range calls {
		calls[i] = r.Begin(context.Background(), true)
		if err := calls[i].Admit(); err != nil {
			t.Fatalf("request %d of a burst, none answered yet: %v", i, err)
		}
	}
	for _, c := range calls {
		c.Next(Result{OK: true})
		c.End(Result{Refused: true}) // counted already: no second count
	}
	th := NewThrottle(2, time.Minute, 6, 0)
	now := clock.Instant(time.Hour)
	th.Allow(now, 0)
	if r, _ := th.counts(now); r != 0 {
		t.Fatalf("Allow counted a request it let go: %d", r)
	}
	th.Done(now, false)
	if th.Allow(now, 0) {
		t.Fatal("1 request, 0 accepts: p = 1/2, u = 0 was sent")
	}
	if r, a := th.counts(now); r != 2 || a != 0 {
		t.Fatalf("a local rejection counts as a request at once: %d/%d, want 2/0", r, a)
	}
	if p := r.ThrottleProbability(); p != 0 {
		t.Fatalf("after 200 accepted: p = %v", p)
	}
}

// A request whose context ends while it waits for its pacing slot gives
// the slot back: the next request waits one interval, not two.
func TestPacerSlotGivenBackOnCancel(t *testing.T) {
	f := newFake()
	// A sleep that a cancelled context ends at once, before any time passes.
	r, err := New(Options{ThrottleK: -1, Clock: f.clk, Sleep: func(ctx context.Context, d time.Duration) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return f.sleep(ctx, d)
	}})
	if err != nil {
		t.Fatal(err)
	}
	r.Observe([]Limit{{Policy: "rate", Remaining: 1, Reset: 20 * time.Second}}, []Quota{{Policy: "rate", Quota: 100}})
	first := r.Begin(context.Background(), true)
	if err := first.Admit(); err != nil { // slot 0: at once
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for range 2 {
		if err := r.Begin(gone, true).Admit(); !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled request's Admit: %v", err)
		}
	}
	f.waits = nil
	if err := r.Begin(context.Background(), true).Admit(); err != nil {
		t.Fatal(err)
	}
	if len(f.waits) != 1 || f.waits[0] != 10*time.Second {
		t.Fatalf("waits %v, want one of 10s (the interval: 20 s over 2 slots)", f.waits)
	}
}
