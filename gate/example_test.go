package gate_test

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// A tenant's entitlement (a token bucket of 1 request/s, burst 2) and its
// concurrency (2 in flight) in one chain: acme's third request at once is
// refused by the rate gate with a 429; a second tenant is counted apart.
func ExampleNewRateLimit() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(1), 2)
	rate, _ := gate.NewRateLimit("request-rate", memory.NewKeyed(tb, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	c, _ := limit.NewConcurrency(2)
	inflight, _ := gate.NewInFlight("concurrent-requests", memory.NewKeyed(c, memory.Options{}), gate.Options{Scope: sluice.ScopeTenant})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate, inflight)
	for _, tenant := range []string{"acme", "acme", "acme", "globex"} {
		d, tk := chain.Decide(context.Background(), &sluice.Request{Tenant: tenant})
		if !d.Admitted {
			fmt.Println(tenant, "refused by", d.Gate, d.Reason, "entitlement:", d.Entitlement())
			continue
		}
		fmt.Println(tenant, "admitted")
		tk.Done(sluice.OutcomeUseful) // the work ended: its slot is free
	}
	// Output:
	// acme admitted
	// acme admitted
	// acme refused by request-rate policy_rate entitlement: true
	// globex admitted
}
