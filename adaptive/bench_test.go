package adaptive

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// admitRelease is the admitted path of a concurrency gate: one decision
// and its release with a useful completion.
func admitRelease(b *testing.B, g sluice.Gate) {
	r := &sluice.Request{}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	var d sluice.Decision // the gates write their verdicts here
	for i := 0; i < b.N; i++ {
		now := clock.Now()
		d = sluice.Decision{}
		p := g.Decide(ctx, r, now, &d)
		if !d.Admitted {
			b.Fatal(d)
		}
		g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Latency: time.Millisecond})
	}
}

// BenchmarkStaticConcurrency: the static service-wide concurrency gate
// (gate.NewInFlight on the memory store).
func BenchmarkStaticConcurrency(b *testing.B) {
	c, _ := limit.NewConcurrency(1000)
	g, _ := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	admitRelease(b, g)
}

// BenchmarkAdaptiveConcurrency: the adaptive gate with Gradient2, every
// completion a sample.
func BenchmarkAdaptiveConcurrency(b *testing.B) {
	ctrl, _ := newGradient2(Gradient2Config{Initial: 1000, Max: 2000})
	g, _ := NewGate("pool", ctrl, GateOptions{})
	admitRelease(b, g)
}

// BenchmarkAdaptiveConcurrencyBBR: the adaptive gate with BBR (the
// default), requests of three operations, whose samples the window keeps
// apart.
func BenchmarkAdaptiveConcurrencyBBR(b *testing.B) {
	ctrl, _ := newBBR(BBRConfig{Initial: 1000, Max: 2000})
	g, _ := NewGate("pool", ctrl, GateOptions{})
	ops := []*sluice.Request{{Operation: "GET /v1/routes/*"}, {Operation: "POST /v1/routes"}, {Operation: "GET /v1/analytics/*"}}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	var d sluice.Decision // the gates write their verdicts here
	for i := 0; i < b.N; i++ {
		r := ops[i%len(ops)]
		now := clock.Now()
		d = sluice.Decision{}
		p := g.Decide(ctx, r, now, &d)
		if !d.Admitted {
			b.Fatal(d)
		}
		g.Release(r, p, sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Latency: time.Millisecond})
	}
}
