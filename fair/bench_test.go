package fair

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/queue"
	"github.com/sluice-go/sluice/store/memory"
)

// admitted runs the admitted path of gates in order (each decision, then
// the releases in reverse), over 64 tenants of two classes.
func admitted(b *testing.B, gates ...sluice.Gate) {
	reqs := make([]sluice.Request, 64)
	for i := range reqs {
		reqs[i] = sluice.Request{Tenant: fmt.Sprint("tenant-", i), Class: []string{"critical", "sheddable"}[i%2], Cost: 1}
	}
	ctx := context.Background()
	permits := make([]sluice.Permit, len(gates))
	b.ReportAllocs()
	b.ResetTimer()
	var d sluice.Decision // the gates write their verdicts here
	for i := 0; i < b.N; i++ {
		r := &reqs[i%len(reqs)]
		now := clock.Now()
		for k, g := range gates {
			d = sluice.Decision{}
			p := g.Decide(ctx, r, now, &d)
			if !d.Admitted {
				b.Fatal(d)
			}
			permits[k] = p
		}
		for k := len(gates) - 1; k >= 0; k-- {
			gates[k].Release(r, permits[k], sluice.Completion{Outcome: sluice.OutcomeUseful, Now: now, Latency: time.Millisecond})
		}
	}
}

func pool(b *testing.B) sluice.Gate {
	c, _ := limit.NewConcurrency(1000)
	g, err := gate.NewInFlight("pool", memory.NewKeyed(c, memory.Options{}), gate.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkAllocation: the admitted path of the plain service-wide
// concurrency gate, and of the same gate behind a reservation over two
// classes, in a fair wait queue (per-class queues, weights), and both.
func BenchmarkAllocation(b *testing.B) {
	b.Run("concurrency", func(b *testing.B) { admitted(b, pool(b)) })
	b.Run("reservation+concurrency", func(b *testing.B) { admitted(b, reservation(b), pool(b)) })
	b.Run("fair-queue", func(b *testing.B) { admitted(b, fairQueue(b)) })
	b.Run("reservation+fair-queue", func(b *testing.B) { admitted(b, reservation(b), fairQueue(b)) })
}

func reservation(b *testing.B) sluice.Gate {
	res, err := newReservation("units", ReservationOptions{Capacity: MaxRate, Recovery: 1,
		Classes: []ClassShare{{Class: "critical", Reserve: MaxRate / 2}, {Class: "sheddable", Reserve: MaxRate / 4}}})
	if err != nil {
		b.Fatal(err)
	}
	return res
}

func fairQueue(b *testing.B) sluice.Gate {
	q, err := queue.New("pool", pool(b), queue.Options{Classes: []string{"critical", "sheddable"},
		Fair: &queue.Fairness{Weights: map[string]float64{"tenant-1": 2}}})
	if err != nil {
		b.Fatal(err)
	}
	return q
}
