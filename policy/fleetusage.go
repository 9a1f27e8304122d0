package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/store"
)

var fleetUsageKind = &kind{
	name:    "fleet_usage",
	example: `{name: fleet, kind: fleet_usage, limit: 400, reserve: {critical: 20%}}`,
	doc: "Fleet usage shedder (gate.NewFleetUsage): one in-flight count for the whole fleet in which the classes without a " +
		"reserve hold at most limit × (1 − Σ reserve) slots, so reserved classes always find theirs; this gate never " +
		"rejects a reserved class. Rejects with reason overload (503).",
	scope:   sluice.ScopeService,
	service: true,
	stored:  true,
	reason:  always(sluice.ReasonOverload),
	new:     func() params { return &fleetUsageParams{} },
}

type fleetUsageParams struct {
	limit   int64
	reserve map[string]float64
	ttl     time.Duration
}

func (p *fleetUsageParams) fields() []field {
	return []field{
		intField("limit", "slots of the whole fleet (requests in flight)", &p.limit, 1, 1<<40).must().feeds("capacity"),
		sharePerClassField("reserve", "share of the slots kept for each class, e.g. {critical: 20%}", &p.reserve).must(),
		ttlField(&p.ttl),
	}
}

// slots is what the classes without a reserve may hold.
func (p *fleetUsageParams) slots() (int64, error) { return gate.FleetUsageLimit(p.limit, p.reserve) }

func (p *fleetUsageParams) algorithm() algorithmGate {
	n, _ := p.slots()
	return concurrency(n, p.ttl, func(name string, lim store.Limiter, o gate.Options) (sluice.Gate, error) {
		return gate.NewFleetUsage(name, lim, sortedKeys(p.reserve), o)
	})
}

func (p *fleetUsageParams) check(c *checker) {
	if len(p.reserve) == 0 {
		c.failf("reserve", "no class: name the classes to keep slots for, e.g. {critical: 20%%} (without one, use a concurrency gate)")
	}
	for _, class := range sortedKeys(p.reserve) {
		if !slices.Contains(c.classes, class) {
			c.errs = append(c.errs, &Error{File: c.file.Path, Line: c.g.fieldLine("reserve"), Field: yamlfile.Join(c.path, "reserve."+class),
				Msg: fmt.Sprintf("no route assigns class %q (classes: %s)", class, strings.Join(c.classes, ", "))})
		}
	}
	if _, err := p.slots(); err != nil {
		c.fail(err)
		return
	}
	p.algorithm().check(c)
}

func (p *fleetUsageParams) build(b *builder) (sluice.Gate, error) { return p.algorithm().build(b) }
func (p *fleetUsageParams) stateKey() string                      { return "" }

func (p *fleetUsageParams) describe(g *Gate) string {
	n, _ := p.slots()
	return fmt.Sprintf("fleet usage: %d slots, non-reserved classes hold at most %d (reserved: %s); 503 overload%s",
		p.limit, n, p.reserveText(), classesOnly(g))
}

// reservation is the gate's line in the spec's reservations.
func (p *fleetUsageParams) reservation(g *Gate) string {
	return fmt.Sprintf("%s reserves %s of %d fleet slots: other classes never hold more than the rest; no borrowing", g.Name, p.reserveText(), p.limit)
}

func (p *fleetUsageParams) reserveText() string {
	var parts []string
	for _, c := range sortedKeys(p.reserve) {
		parts = append(parts, fmt.Sprintf("%s %.0f%%", c, 100*p.reserve[c]))
	}
	return strings.Join(parts, ", ")
}

// afterWork: see workBound.
func (p *fleetUsageParams) afterWork() string { return "counts the fleet's requests until they end" }
