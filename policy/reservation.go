package policy

import (
	"fmt"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

var reservationKind = &kind{
	name: "reservation",
	doc: "Class reservations over a capacity in work units/s (fair.Reservation), a budget nested service → class → " +
		"tenant: each class always finds its reserve; what a class leaves idle, and what no class reserves, goes to a " +
		"pool that classes allowed to borrow spend, holding at most the revocation time's worth of capacity, so an owner " +
		"that comes back has its reserve at once and the borrowed work drains within that time; admitted work is never " +
		"cancelled; the recovery reserve is never handed out. In-process state (per replica). Rejects with reason " +
		"overload (503); a tenant over its class's tenant cap with policy_rate (429).",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonOverload),
	new:     func() params { return &reservationParams{} },
}

type reservationParams struct {
	opts    fair.ReservationOptions
	classes []fair.ClassShare
	lines   map[string]int // class → line, for errors
}

func (p *reservationParams) fields() []field {
	return []field{
		intField("capacity", "work units/s the protected resource serves (a request's cost is its units)", &p.opts.Capacity, 1, fair.MaxRate).must().feeds("Capacity"),
		intField("recovery", "work units/s kept out of every class's reach (headroom to recover)", &p.opts.Recovery, 0, fair.MaxRate).dflt("0").feeds("Recovery"),
		durationField("burst", "depth of each class's (and tenant's) bucket, as time at its rate", &p.opts.Burst, time.Millisecond).dflt("100ms").feeds("Burst"),
		durationField("revocation", "how long borrowed work may still run once an owner wants its reserve back: the pool holds "+
			"(capacity − recovery) × revocation units", &p.opts.Revocation, time.Millisecond).dflt("1s").feeds("Revocation"),
		{key: "shares", doc: "per class: {reserve: units/s always available, max: units/s in all (default capacity − recovery), " +
			"borrow: may spend the pool (default true), tenant: units/s cap per tenant of the class (default none)}; classes " +
			"not listed only borrow", required: true, parse: p.parseClasses},
	}
}

func (p *reservationParams) parseClasses(ps *parser, v *yaml.Node, path string) {
	p.lines = map[string]int{}
	if v.Kind != yaml.MappingNode || len(v.Content) == 0 {
		ps.Errf(v, path, "want a mapping of class to {reserve: units/s, ...}, e.g. {critical: {reserve: 2400}}")
		return
	}
	for k := 0; k+1 < len(v.Content); k += 2 {
		name, body := v.Content[k], v.Content[k+1]
		at := yamlfile.Join(path, name.Value)
		if !validName(name.Value) {
			ps.Errf(name, at, "%q is not a class name", name.Value)
			continue
		}
		c := fair.ClassShare{Class: name.Value}
		seen := ps.Fields(body, at, []string{"reserve", "max", "borrow", "tenant"}, func(key string, vv *yaml.Node) {
			f := yamlfile.Join(at, key)
			switch key {
			case "reserve":
				c.Reserve = ps.Integer(vv, f, 0, fair.MaxRate)
			case "max":
				c.Max = ps.Integer(vv, f, 1, fair.MaxRate)
			case "borrow":
				c.NoBorrow = !ps.Boolean(vv, f)
			case "tenant":
				c.Tenant = ps.Integer(vv, f, 1, fair.MaxRate)
			}
		})
		if _, ok := seen["reserve"]; !ok && body.Kind == yaml.MappingNode {
			ps.Errf(body, yamlfile.Join(at, "reserve"), "missing: the class's reserve in units/s (0 to only cap or borrow)")
		}
		p.lines[c.Class] = name.Line
		p.classes = append(p.classes, c)
	}
}

func (p *reservationParams) options() fair.ReservationOptions {
	o := p.opts
	o.Classes = p.classes
	return o
}

func (p *reservationParams) check(c *checker) {
	for _, cl := range p.classes {
		if !validClass(c, cl.Class) {
			c.errs = append(c.errs, &Error{File: c.file.Path, Line: p.lines[cl.Class], Field: yamlfile.Join(c.path, "shares."+cl.Class),
				Msg: fmt.Sprintf("no route assigns class %q (classes: %s)", cl.Class, strings.Join(c.classes, ", "))})
		}
	}
	if _, err := fair.NewReservation(c.g.Name, p.options()); err != nil {
		c.failf("shares", "%v", err)
	}
}

func (p *reservationParams) build(b *builder) (sluice.Gate, error) {
	return fair.NewReservation(b.g.Name, p.options())
}

func (p *reservationParams) stateKey() string { return "" }

func (p *reservationParams) describe(g *Gate) string {
	return fmt.Sprintf("reservation of %d work units/s (recovery %d kept back): %s; borrowed work drains within %v; 503 overload%s",
		p.opts.Capacity, p.opts.Recovery, p.sharesText(), p.revocation(), classesOnly(g))
}

func (p *reservationParams) revocation() time.Duration {
	if p.opts.Revocation == 0 {
		return time.Second
	}
	return p.opts.Revocation
}

func (p *reservationParams) sharesText() string {
	var parts []string
	for _, c := range p.classes {
		s := fmt.Sprintf("%s %d units/s", c.Class, c.Reserve)
		if c.Max > 0 {
			s += fmt.Sprintf(" (max %d)", c.Max)
		}
		if c.NoBorrow {
			s += " never borrowing"
		}
		if c.Tenant > 0 {
			s += fmt.Sprintf(", %d per tenant", c.Tenant)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// reservation is the gate's line in the spec's reservations.
func (p *reservationParams) reservation(g *Gate) string {
	return fmt.Sprintf("%s reserves %s of %d work units/s, recovery %d; idle reserves are lent and reclaimed at once, "+
		"borrowed work drains within %v", g.Name, p.sharesText(), p.opts.Capacity, p.opts.Recovery, p.revocation())
}
