package policy

import (
	"errors"

	"github.com/sluice-go/sluice/clock"
	"slices"
	"strings"
	"testing"
)

const orderRoutes = "version: 1\nroutes:\n  - {match: {path: /c}, class: critical}\n  - {match: {path: /s}, class: sheddable}\ngates:\n"

// Every way a policy could shed or queue its most important class behind
// a less important one is refused, naming the class and the fix.
func TestClassOrderFootguns(t *testing.T) {
	for _, c := range []struct {
		name, gates string
		line        int
		field, msg  string
	}{
		{"tiers leave critical out", "  - {name: u, kind: utilization, workers: 4, tiers: [sheddable, default]}\n", 6, "gates[0].tiers",
			`class "critical", which tiers leaves out, so it would be shed with the first tier: list every routed class, first shed first (tiers: [sheddable, default, critical])`},
		{"tiers with cohorts leave critical out", "  - {name: u, kind: utilization, workers: 4, tiers: [sheddable, default], cohorts: {count: 8}}\n", 6, "gates[0].tiers", `class "critical"`},
		{"tiers shed critical first", "  - {name: u, kind: utilization, workers: 4, tiers: [critical, sheddable, default]}\n", 6, "gates[0].tiers",
			`sheds "critical" before "sheddable", against the class order (critical > default > sheddable > sandbox`},
		{"queue leaves critical out", "  - {name: p, kind: concurrency, limit: 4, queue: {max_wait: 50ms, classes: [default, sheddable]}}\n", 6, "gates[0].queue.classes",
			`leaves out class "critical", so its waiters are served after "default"'s`},
		{"queue serves sheddable first", "  - {name: p, kind: concurrency, limit: 4, queue: {max_wait: 50ms, classes: [sheddable, critical, default]}}\n", 6, "gates[0].queue.classes",
			`serves "sheddable" before "critical"`},
		{"reservation queue leaves critical out", "  - {name: r, kind: reservation, inflight: 8, shares: {critical: {reserve: 4}}, queue: {max_wait: 50ms, classes: [default]}}\n", 6, "gates[0].queue.classes",
			`leaves out class "critical"`},
		{"ladder protects default, not critical", "  - {name: l, kind: ladder, workers: 4, protected: [default]}\n", 6, "gates[0].protected",
			`protects "default" but not "critical"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("p.yaml", []byte(orderRoutes+c.gates))
			var es Errors
			if !errors.As(err, &es) || len(es) != 1 {
				t.Fatalf("want one error, got %v", err)
			}
			if e := es[0]; e.Line != c.line || e.Field != c.field || !strings.Contains(e.Msg, c.msg) {
				t.Fatalf("got  %v\nwant p.yaml:%d: %s: …%s…", e, c.line, c.field, c.msg)
			}
		})
	}
	// The policy's own order: gold above critical, stated once.
	own := "version: 1\nclasses: [gold, critical, default]\nroutes:\n  - {match: {path: /g}, class: gold}\n  - {match: {path: /c}, class: critical}\ngates:\n"
	if _, err := Parse("p.yaml", []byte(own+"  - {name: u, kind: utilization, workers: 4, tiers: [default, critical, gold]}\n")); err != nil {
		t.Fatalf("tiers in the policy's order: %v", err)
	}
	_, err := Parse("p.yaml", []byte(own+"  - {name: u, kind: utilization, workers: 4, tiers: [default, gold, critical]}\n"))
	if err == nil || !strings.Contains(err.Error(), `sheds "gold" before "critical", against the class order (gold > critical > default`) {
		t.Fatalf("tiers against the policy's order: %v", err)
	}
	_, err = Parse("p.yaml", []byte("version: 1\nclasses: [critical, default]\nroutes:\n  - {match: {path: /s}, class: sheddable}\ngates:\n  - {name: c, kind: concurrency, limit: 1}\n"))
	if err == nil || !strings.Contains(err.Error(), `p.yaml:2: classes: the routes assign class "sheddable", which the order leaves out: place it, most protected first (e.g. classes: [critical, default, sheddable])`) {
		t.Fatalf("an order that leaves a routed class out: %v", err)
	}
}

// Tiers left out follow the class order, least protected first, with a
// routed class outside the standard four just below default.
func TestTiersFollowTheClassOrder(t *testing.T) {
	f, err := Parse("p.yaml", []byte("version: 1\nroutes:\n  - {match: {path: /b}, class: batch}\n  - {match: {path: /c}, class: critical}\ngates:\n  - {name: u, kind: utilization, workers: 4}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.orderOfClasses(), []string{"critical", "default", "batch", "sheddable", "sandbox"}; !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
	rt, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	type stater interface{ ReportState(clock.Instant) any }
	for _, g := range rt.Chain.Gates() {
		if s, ok := g.(stater); ok && g.Name() == "u" {
			tiers := s.ReportState(0).(map[string]any)["shed_by_tier"].(map[string]float64)
			if len(tiers) != 5 {
				t.Fatalf("tiers %v, want the five classes of the order", tiers)
			}
			return
		}
	}
	t.Fatal("no utilization gate u with a state")
}
