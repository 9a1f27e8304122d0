package gate_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/gatetest"
	"github.com/sluice-go/sluice/internal/tracefile"
	"github.com/sluice-go/sluice/limit"
	"github.com/sluice-go/sluice/store"
	"github.com/sluice-go/sluice/store/memory"
)

// switchable is a store that can be taken down and brought back.
type switchable struct {
	store.Limiter
	down bool
}

func (s *switchable) Take(ctx context.Context, key string, now clock.Instant, cost int64, deadline clock.Instant) (limit.Result, store.Handle, error) {
	if s.down {
		return limit.Result{}, 0, store.ErrUnavailable
	}
	return s.Limiter.Take(ctx, key, now, cost, deadline)
}

// fleetDriver runs a FleetUsage gate through its public API and keeps the
// permits of admitted requests by class.
type fleetDriver struct {
	g    sluice.Gate
	st   *switchable
	held map[string][]sluice.Permit
}

func (d *fleetDriver) decide(t *testing.T, cmd *tracefile.Cmd) string {
	class := cmd.Str("class", sluice.ClassDefault)
	counts := map[string]int{}
	var last sluice.Decision
	for range cmd.Int(t, "n", 1) {
		dec, p := gatetest.Decide(context.Background(), d.g, &sluice.Request{Class: class, Cost: 1}, 0)
		last = dec
		if dec.Admitted {
			counts["admitted"]++
			d.held[class] = append(d.held[class], p)
			continue
		}
		counts[fmt.Sprintf("rejected %s (%s, retry after %v)", dec.Reason, statusOf(&dec), dec.RetryAfter)]++
	}
	var lines []string
	for what, n := range counts {
		lines = append(lines, fmt.Sprintf("%s: %d", what, n))
	}
	sort.Strings(lines)
	if last.Admitted && last.Limit > 0 {
		lines = append(lines, fmt.Sprintf("remaining %d of %d", last.Remaining, last.Limit))
	}
	return strings.Join(lines, "\n")
}

func statusOf(d *sluice.Decision) string {
	if d.Entitlement() {
		return "429"
	}
	return "503"
}

// The fleet usage gate's trace: reserved classes never draw on the count,
// the others hold at most limit × (1 − reserve), releases free slots, and
// a store outage follows the failure policy.
func TestFleetUsageTrace(t *testing.T) {
	var d *fleetDriver
	tracefile.Run(t, "testdata/fleetusage.trace", func(t *testing.T, cmd *tracefile.Cmd) string {
		switch cmd.Name {
		case "fleet":
			reserve := map[string]float64{}
			for _, r := range strings.Split(cmd.Str("reserve", ""), ",") {
				if class, share, ok := strings.Cut(r, ":"); ok {
					var f float64
					fmt.Sscan(share, &f)
					reserve[class] = f
				}
			}
			n, err := gate.FleetUsageLimit(cmd.Int(t, "limit", 0), reserve)
			if err != nil {
				return err.Error()
			}
			fp, err := gate.ParseFailurePolicy(cmd.Str("on_failure", "fail_open"))
			if err != nil {
				return err.Error()
			}
			c, _ := limit.NewConcurrency(n)
			st := &switchable{Limiter: memory.NewKeyed(c, memory.Options{})}
			reserved := make([]string, 0, len(reserve))
			for class := range reserve {
				reserved = append(reserved, class)
			}
			g, err := gate.NewFleetUsage("fleet", st, reserved, gate.Options{OnFailure: fp, RetryHint: 2 * time.Second})
			if err != nil {
				return err.Error()
			}
			d = &fleetDriver{g: g, st: st, held: map[string][]sluice.Permit{}}
			return fmt.Sprintf("%d slots for classes without a reserve", n)
		case "decide":
			return d.decide(t, cmd)
		case "release":
			class := cmd.Str("class", sluice.ClassDefault)
			n := int(cmd.Int(t, "n", 1))
			held := d.held[class]
			n = min(n, len(held))
			for _, p := range held[len(held)-n:] {
				d.g.Release(&sluice.Request{Class: class, Cost: 1}, p, sluice.Completion{Outcome: sluice.OutcomeUseful})
			}
			d.held[class] = held[:len(held)-n]
			return fmt.Sprintf("released %d", n)
		case "store":
			d.st.down = cmd.Words[0] == "down"
			return fmt.Sprintf("store %s; %d store failures so far", cmd.Words[0], failuresOf(d.g))
		}
		t.Fatalf("%s: unknown command %q", cmd.Pos, cmd.Name)
		return ""
	})
}
