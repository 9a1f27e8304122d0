package redis_test

import (
	"context"
	"fmt"
	"log"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store/memory"
	"github.com/sluice-go/sluice/store/redis"
)

// A fleet-wide token bucket on Redis that, while Redis is unreachable,
// decides on a local bucket of a quarter of the budget (four replicas).
// Here nothing listens at the address, so the store starts anyway and the
// local fallback decides: New never needs Redis to be up.
func Example() {
	tb, _ := limit.NewTokenBucket(limit.PerSecond(100), 500)
	spec, err := redis.SpecOf("request-rate", tb) // checked without a connection
	if err != nil {
		log.Fatal(err)
	}
	st, err := redis.New(redis.Options{Addrs: []string{"127.0.0.1:1"}})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	local, _ := limit.NewTokenBucket(limit.PerSecond(25), 125)
	rate, _ := gate.NewRateLimit("request-rate", st.Limiter(spec), gate.Options{
		Scope:     sluice.ScopeTenant,
		OnFailure: gate.LocalFallback,
		Fallback:  memory.NewKeyed(local, memory.Options{}),
	})
	chain, _ := sluice.NewChain(sluice.ChainOptions{}, rate)
	d, _ := chain.Do(context.Background(), &sluice.Request{Tenant: "acme"}, func(context.Context) error { return nil })
	fmt.Println(d.Admitted, d.Limit)
	// Output:
	// true 125
}
