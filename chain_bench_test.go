package sluice_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

// benchBucket is a per-tenant token bucket in memory that never runs dry
// at benchmark rates.
func benchBucket(b *testing.B) store.Limiter {
	tb, err := limit.NewTokenBucket(limit.PerSecond(1e9), 1e9)
	if err != nil {
		b.Fatal(err)
	}
	return memory.NewKeyed(tb, memory.Options{})
}

// BenchmarkChainStoreCall is what one rate gate wraps: a token bucket's
// step on its tenant's state, with the clock read it needs.
func BenchmarkChainStoreCall(b *testing.B) {
	lim := benchBucket(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		lim.Take(ctx, "tenant-a", clock.System.Now(), 1, 0)
	}
}

// BenchmarkChain decides and completes one request, declared on the
// stack, through 1, 3 and 6 per-tenant rate gates (each over a store of
// its own), with no observer: the chain's own cost is what it adds to
// the gates' store calls (BenchmarkChainStoreCall each).
func BenchmarkChain(b *testing.B) {
	for _, n := range []int{1, 3, 6} {
		b.Run(fmt.Sprintf("gates=%d", n), func(b *testing.B) {
			gates := make([]sluice.Gate, n)
			for i := range gates {
				g, err := gate.NewRateLimit(fmt.Sprint("rate-", i), benchBucket(b), gate.Options{Scope: sluice.ScopeTenant})
				if err != nil {
					b.Fatal(err)
				}
				gates[i] = g
			}
			c, err := sluice.NewChain(sluice.ChainOptions{}, gates...)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				r := sluice.Request{Tenant: "tenant-a", Class: "default", Cost: 1}
				d, t := c.Decide(ctx, &r)
				if !d.Admitted {
					b.Fatal(d.Reason)
				}
				t.Done(sluice.OutcomeUseful)
			}
		})
	}
}
