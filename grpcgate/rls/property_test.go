package rls

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/internal/fakeclock"
)

// TestWindowMatchesPeerModel checks the fixed window against a model of
// envoyproxy/ratelimit's counter (src/redis/fixed_cache_impl.go: INCRBY
// on the key of the aligned window, over when the result exceeds the
// limit), call by call, over random limits, units, clocks, hits (0 = a
// check), request-level hits and refunds; and that the hits admitted in
// any aligned window, less the hits refunded in it, never exceed the limit.
func TestWindowMatchesPeerModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		limit := rapid.Int64Range(0, 20).Draw(rt, "limit")
		unit := rapid.SampledFrom([]Unit{Second, Minute, Hour}).Draw(rt, "unit")
		cfg, err := Parse("p.yaml", []byte(fmt.Sprintf("domain: p\ndescriptors:\n  - {key: k, rate_limit: {unit: %s, requests_per_unit: %d}}\n", unit, limit)))
		if err != nil {
			rt.Fatal(err)
		}
		clk := fakeclock.New(sec(rapid.Int64Range(0, 1<<32).Draw(rt, "start")))
		s, err := New(cfg, Options{Clock: clk, Registry: prometheus.NewRegistry()})
		if err != nil {
			rt.Fatal(err)
		}
		unitNs := int64(unit.Duration())
		count := map[int64]int64{}    // the peer's counter per window
		admitted := map[int64]int64{} // hits admitted per window
		refunded := map[int64]int64{}
		for i := range rapid.IntRange(1, 150).Draw(rt, "calls") {
			clk.Advance(time.Duration(rapid.Int64Range(0, 3*unitNs/2).Draw(rt, "advance")))
			now := int64(clk.Now())
			win := now / unitNs
			var desc Descriptor
			var reqHits uint32
			var hits int64
			switch rapid.IntRange(0, 5).Draw(rt, "op") {
			case 0: // request-level hits (0 means 1)
				reqHits = uint32(rapid.IntRange(0, 4).Draw(rt, "reqHits"))
				desc, hits = d("k", "v"), int64(max(reqHits, 1))
			case 1: // a refund
				hits = rapid.Int64Range(0, 4).Draw(rt, "refund")
				desc = dneg(uint64(hits), "k", "v")
			default: // the descriptor's own hits, 0 a check
				hits = rapid.Int64Range(0, 4).Draw(rt, "hits")
				desc = dh(uint64(hits), "k", "v")
			}
			resp, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "p", Descriptors: []Descriptor{desc}, Hits: reqHits})
			if err != nil {
				rt.Fatalf("call %d: %v", i, err)
			}
			got := resp.Statuses[0]
			// The model.
			var wantCode Code = CodeOK
			if desc.Negative {
				count[win] = max(count[win]-hits, 0)
				refunded[win] += hits
			} else {
				count[win] += hits
				if count[win] > limit {
					wantCode = CodeOverLimit
				} else if hits > 0 {
					admitted[win] += hits
				}
			}
			wantRemaining := uint32(0)
			if wantCode == CodeOK {
				wantRemaining = uint32(max(limit-count[win], 0))
			}
			// whole seconds, from the second now falls in, as the peer's
			wantReset := time.Duration(unit.Seconds()-(now/int64(time.Second))%unit.Seconds()) * time.Second
			if got.Code != wantCode || got.Remaining != wantRemaining || got.ResetIn != wantReset || resp.Overall != wantCode {
				rt.Fatalf("call %d at %v (window %d, count %d, limit %d): %+v, want %s remaining %d reset %v",
					i, now, win, count[win], limit, got, codeName(wantCode), wantRemaining, wantReset)
			}
			if admitted[win]-refunded[win] > limit {
				rt.Fatalf("window %d: %d admitted, %d refunded, limit %d", win, admitted[win], refunded[win], limit)
			}
		}
	})
}

// A refused call leaves the quotas as they were: a server that answers
// every call and a twin that is sent only the calls the first one let
// through, at the same instants, give those calls the same answers, for
// token buckets, GCRA, sliding windows and concurrency slots beside a
// descriptor that refuses often (before, a refused call's hits counted
// against the descriptors that allowed it, and its concurrency slots
// stayed held until their TTL).
func TestRefusedCallsLeaveQuotasUnchanged(t *testing.T) {
	cfg := mustParse(t, extConfig+"  - key: deny\n    rate_limit: {algorithm: token_bucket, unit: second, requests_per_unit: 1, burst: 1}\n")
	for _, b := range backends(t, false) {
		t.Run(b.name, func(t *testing.T) {
			rapid.Check(t, func(rt *rapid.T) {
				all, clkA := b.server(t, cfg, Options{})
				let, clkB := b.server(t, cfg, Options{})
				keys := []string{"api_key", "tenant", "path", "upload", "deny"}
				for i := range rapid.IntRange(1, 60).Draw(rt, "calls") {
					adv := time.Duration(rapid.Int64Range(0, int64(700*time.Millisecond)).Draw(rt, "advance"))
					clkA.Advance(adv)
					clkB.Advance(adv)
					if rapid.IntRange(0, 4).Draw(rt, "release") == 0 {
						// the end of an earlier request, sent to both
						v := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, "released")
						req := &Request{Domain: "ext", Descriptors: []Descriptor{dneg(1, "upload", v)}}
						for _, s := range []*Server{all, let} {
							if _, err := s.ShouldRateLimit(context.Background(), req); err != nil {
								rt.Fatal(err)
							}
						}
						continue
					}
					// one descriptor per counter in a call: on Redis a call's
					// descriptors run side by side, in no set order
					var descs []Descriptor
					seen := map[string]bool{}
					for j := range rapid.IntRange(1, 3).Draw(rt, "descriptors") {
						k := rapid.SampledFrom(keys).Draw(rt, fmt.Sprint("key", j))
						v := rapid.SampledFrom([]string{"a", "b"}).Draw(rt, fmt.Sprint("value", j))
						hits := uint64(rapid.IntRange(1, 3).Draw(rt, fmt.Sprint("hits", j)))
						if !seen[k+v] {
							seen[k+v] = true
							descs = append(descs, dh(hits, k, v))
						}
					}
					req := &Request{Domain: "ext", Descriptors: descs}
					ra, err := all.ShouldRateLimit(context.Background(), req)
					if err != nil {
						rt.Fatal(err)
					}
					if ra.Overall == CodeOverLimit {
						continue
					}
					rb, err := let.ShouldRateLimit(context.Background(), req)
					if err != nil {
						rt.Fatal(err)
					}
					for j := range ra.Statuses {
						a, b := ra.Statuses[j], rb.Statuses[j]
						if a.Code != b.Code || a.Remaining != b.Remaining {
							rt.Fatalf("call %d, descriptor %d (%v): %s remaining %d after the refused calls, %s remaining %d without them",
								i, j, descs[j].Entries, codeName(a.Code), a.Remaining, codeName(b.Code), b.Remaining)
						}
					}
				}
			})
		})
	}
}
