package memory_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
)

// One token bucket per tenant: each key is stepped atomically, and a key
// costs nothing until it is first used; a denial says when to retry.
func ExampleNewKeyed() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(10), 2)
	perTenant := memory.NewKeyed(tb, memory.Options{MaxKeys: 1 << 20})
	ctx := context.Background()
	now := clock.Instant(time.Second)
	for _, tenant := range []string{"acme", "acme", "acme", "globex"} {
		res, _, _ := perTenant.Take(ctx, tenant, now, 1, 0)
		fmt.Println(tenant, res.Status, res.Remaining, res.RetryAfter)
	}
	// Output:
	// acme allowed 1 0s
	// acme allowed 0 0s
	// acme denied 0 100ms
	// globex allowed 1 0s
}
