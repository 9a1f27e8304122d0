package policy_test

import (
	"context"
	"fmt"
	"log"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/policy"
)

// stopped is a clock at which time stands still, so the example's output
// does not depend on how fast it runs.
type stopped struct{}

func (stopped) Now() clock.Instant { return 1 }

// A policy file parsed, validated and built into a chain: a per-tenant
// token bucket (429) in front of a service-wide concurrency limit (503).
func ExampleBuild() {
	const file = `version: 1
service: routes-api
identity:
  tenant: {header: X-Api-Key}
gates:
  - {name: request-rate, kind: token_bucket, scope: tenant, rate: 100/s, burst: 2}
  - {name: worker-pool, kind: concurrency, limit: 10}
`
	f, err := policy.Parse("routes-api.yaml", []byte(file))
	if err != nil {
		log.Fatal(err)
	}
	rt, err := policy.Build(f, nil, policy.Options{Clock: stopped{}})
	if err != nil {
		log.Fatal(err)
	}
	defer rt.Close()
	for range 3 {
		d, _ := rt.Chain.Do(context.Background(), &sluice.Request{Tenant: "acme"}, func(context.Context) error { return nil })
		if d.Admitted {
			fmt.Println("admitted; tightest:", d.Gate, d.Remaining)
		} else {
			fmt.Println("rejected by", d.Gate, d.Reason, "429:", d.Entitlement())
		}
	}
	// Output:
	// admitted; tightest: request-rate 1
	// admitted; tightest: request-rate 0
	// rejected by request-rate policy_rate 429: true
}

// A mistake is reported with the file, the line and the field.
func ExampleParse() {
	_, err := policy.Parse("routes-api.yaml", []byte(`version: 1
gates:
  - {name: request-rate, kind: token_bucket, rate: 100/x, burst: 500}
`))
	fmt.Println(err)
	// Output:
	// routes-api.yaml:3: gates[0].rate: invalid rate "100/x": bad period "x" (want ns, us, ms, s, m, h, d or a duration like 10s)
}
