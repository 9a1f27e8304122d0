package rls

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"pgregory.net/rapid"

	"github.com/sluice-go/sluice/internal/fakeclock"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// Replicas of the service on one Redis share the concurrency slots: a
// release that reaches replica B frees a slot that a take on replica A
// holds (before, B held no permit for it and freed nothing until the
// permit's TTL). Whichever replica each take and release reaches, the
// slots held are what the takes and releases leave, within the limit of 2.
func TestReleaseOnAnotherReplica(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	addr := startRedis(t)
	cfg := mustParse(t, extConfig)
	n := 0
	rapid.Check(t, func(rt *rapid.T) {
		n++
		clk := fakeclock.New(sec(5000))
		prefix := fmt.Sprintf("replicas%d", n)
		var replicas []*Server
		for range 3 {
			st, err := sredis.New(sredis.Options{Addrs: []string{addr}, Timeout: 2 * time.Second, DecisionClock: clk, Prefix: prefix})
			if err != nil {
				rt.Fatal(err)
			}
			defer st.Close()
			s, err := New(cfg, Options{Clock: clk, Redis: st, Timeout: 2 * time.Second, Registry: prometheus.NewRegistry()})
			if err != nil {
				rt.Fatal(err)
			}
			replicas = append(replicas, s)
		}
		held := 0
		for i := range rapid.IntRange(1, 40).Draw(rt, "calls") {
			clk.Advance(time.Duration(rapid.Int64Range(0, int64(time.Second)).Draw(rt, "advance")))
			s := replicas[rapid.IntRange(0, 2).Draw(rt, "replica")]
			release := rapid.Bool().Draw(rt, "release")
			desc := dh(1, "upload", "u")
			if release {
				desc = dneg(1, "upload", "u")
			}
			resp, err := s.ShouldRateLimit(context.Background(), &Request{Domain: "ext", Descriptors: []Descriptor{desc}})
			if err != nil {
				rt.Fatal(err)
			}
			want := CodeOK
			switch {
			case release:
				held = max(held-1, 0)
			case held < 2:
				held++
			default:
				want = CodeOverLimit
			}
			if got := resp.Statuses[0]; got.Code != want || got.Remaining != uint32(2-held) {
				rt.Fatalf("call %d (release %v): %s remaining %d, want %s remaining %d", i, release, codeName(got.Code), got.Remaining, codeName(want), 2-held)
			}
		}
	})
}
