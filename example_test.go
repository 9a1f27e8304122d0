package sluice_test

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// A chain of a per-tenant token bucket (100/s sustained, bursts of 500)
// and a per-tenant concurrency limit of 20, used without HTTP: Do decides,
// runs the work when admitted and releases the Ticket on every path.
func ExampleChain_Do() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}),
		gate.Options{Scope: sluice.ScopeTenant})
	c, _ := limit.NewConcurrency(20)
	inflight, _ := gate.NewInFlight("concurrent-requests", memory.NewKeyed(c, memory.Options{}),
		gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, inflight)

	ctx := context.Background()
	d, err := chain.Do(ctx, &sluice.Request{Tenant: "acme", Cost: 1}, func(ctx context.Context) error {
		return nil // the work
	})
	fmt.Println(d.Admitted, err, d.Remaining)

	// A request costing more than the burst can never be admitted: the
	// rejection says so (not retryable), and the work does not run.
	d, _ = chain.Do(ctx, &sluice.Request{Tenant: "acme", Cost: 501}, func(ctx context.Context) error {
		panic("not run")
	})
	fmt.Println(d.Admitted, d.Reason, d.Gate, d.Retryable)
	// Output:
	// true <nil> 19
	// false policy_rate request-rate false
}

// Decide and Done split the decision from the work, for callers that
// cannot wrap their work in a function.
func ExampleChain_Decide() {
	c, _ := limit.NewConcurrency(1)
	pool, _ := gate.NewInFlight("worker-pool", memory.NewKeyed(c, memory.Options{}),
		gate.Options{Scope: sluice.ScopeService})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, pool)

	ctx := context.Background()
	d, first := chain.Decide(ctx, &sluice.Request{})
	fmt.Println(d.Admitted)
	d, _ = chain.Decide(ctx, &sluice.Request{})
	fmt.Println(d.Admitted, d.Reason, d.Entitlement())
	first.Done(sluice.OutcomeUseful) // the slot is free again
	d, second := chain.Decide(ctx, &sluice.Request{})
	fmt.Println(d.Admitted)
	second.Done(sluice.OutcomeUseful)
	// Output:
	// true
	// false concurrency false
	// true
}

// blocklist is a gate of one's own: it refuses the tenants it lists and
// holds nothing, so it also spends at admission (nothing to release).
type blocklist struct{ blocked map[string]bool }

func (b *blocklist) Name() string { return "blocklist" }

// Decide writes the verdict to *d, which the chain hands over zeroed.
func (b *blocklist) Decide(_ context.Context, r *sluice.Request, _ clock.Instant, d *sluice.Decision) sluice.Permit {
	d.Gate, d.Scope = "blocklist", sluice.ScopeTenant
	if b.blocked[r.Tenant] {
		d.Reason = sluice.ReasonPolicyRate // 429, and retrying cannot help
		return 0
	}
	d.Admitted = true
	return 0
}

func (b *blocklist) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

func (b *blocklist) SpendsAtAdmission() bool { return true }

// A gate of one's own in a chain: the Gate interface is three methods,
// and a gate that holds nothing while the work runs says so.
func ExampleGate() {
	ch, _ := sluice.NewChain(sluice.ChainOptions{}, &blocklist{blocked: map[string]bool{"mallory": true}})
	for _, tenant := range []string{"alice", "mallory"} {
		d, t := ch.Decide(context.Background(), &sluice.Request{Tenant: tenant})
		fmt.Println(tenant, d.Admitted, d.Reason, d.Retryable)
		t.Done(sluice.OutcomeUseful)
	}
	// Output:
	// alice true  false
	// mallory false policy_rate false
}
