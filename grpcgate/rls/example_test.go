package rls_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/grpcgate/rls"
	"github.com/sluice-go/sluice/internal/fakeclock"
)

// An envoyproxy/ratelimit configuration as it is, with one rule moved to
// a token bucket; answers at a fixed instant (20 s into a minute).
func Example() {
	cfg, err := rls.Parse("edge.yaml", []byte(`
domain: edge_proxy
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address      # this address is refused outright
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: api_key
    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 10, burst: 20}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	srv, err := rls.New(cfg, rls.Options{Clock: fakeclock.New(1_700_000_000 * int64(time.Second))})
	if err != nil {
		fmt.Println(err)
		return
	}
	ask := func(key, value string, hits uint32) {
		resp, err := srv.ShouldRateLimit(context.Background(), &rls.Request{Domain: "edge_proxy", Hits: hits,
			Descriptors: []rls.Descriptor{{Entries: []rls.Entry{{Key: key, Value: value}}}}})
		if err != nil {
			fmt.Println(err)
			return
		}
		st := resp.Statuses[0]
		fmt.Printf("%s=%s: %v, %d/%v, %d left, reset in %v\n", key, value, resp.Overall, st.Limit.RequestsPerUnit, st.Limit.Unit, st.Remaining, st.ResetIn)
	}
	ask("remote_address", "10.0.0.1", 1)
	ask("remote_address", "10.0.0.1", 1)
	ask("remote_address", "10.0.0.1", 1)
	ask("remote_address", "50.0.0.5", 1)
	ask("api_key", "k-42", 15)
	ask("api_key", "k-42", 10)
	_, err = srv.ShouldRateLimit(context.Background(), &rls.Request{Domain: "edge_proxy"})
	fmt.Println(err)
	// Output:
	// remote_address=10.0.0.1: OK, 2/MINUTE, 1 left, reset in 40s
	// remote_address=10.0.0.1: OK, 2/MINUTE, 0 left, reset in 40s
	// remote_address=10.0.0.1: OVER_LIMIT, 2/MINUTE, 0 left, reset in 40s
	// remote_address=50.0.0.5: OVER_LIMIT, 0/SECOND, 0 left, reset in 1s
	// api_key=k-42: OK, 10/SECOND, 5 left, reset in 1.5s
	// api_key=k-42: OVER_LIMIT, 10/SECOND, 0 left, reset in 1.5s
	// rls: invalid request: rate limit descriptor list must not be empty
}
