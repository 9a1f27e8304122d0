package rls

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkShouldRateLimit: one call of one or three descriptors (fixed
// windows and a token bucket), on memory and on a local Redis.
func BenchmarkShouldRateLimit(b *testing.B) {
	cfg := mustParse(b, conformanceConfig+"  - {key: bucket, rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 1000000000, burst: 1000000000}}\n")
	kinds := []backend{{name: "memory"}}
	if !testing.Short() {
		srv := startRedis(b)
		kinds = append(kinds, backend{name: "redis", addrs: []string{srv}})
	}
	for _, k := range kinds {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("%s/%ddesc", k.name, n), func(b *testing.B) {
				s, clk := k.server(b, cfg, Options{})
				clk.Set(sec(1_700_000_000))
				descs := []Descriptor{d("bucket", "b"), d("tenant", "t"), d("internal", "i")}[:n]
				b.ReportAllocs()
				if k.addrs != nil {
					b.SetParallelism(32) // many callers in flight, as under Envoy
				}
				b.RunParallel(func(pb *testing.PB) {
					req := &Request{Domain: "edge", Descriptors: descs}
					for pb.Next() {
						if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
