package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/fair"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

var reservationKind = &kind{
	name:    "reservation",
	example: `{name: reserve, kind: reservation, capacity: 1000, shares: {critical: {reserve: 600}, default: {reserve: 300}}}`,
	doc: "Class reservations over a capacity in work units/s (capacity: fair.NewReservation) or in concurrent work units " +
		"(inflight: fair.NewSlots), a budget nested service → class → tenant. Rates: each class always finds its reserve; what " +
		"a class leaves idle, and what no class reserves, goes to a pool that classes allowed to borrow share max-min fairly, holding at " +
		"most the revocation time's worth of capacity, so an owner that comes back has its reserve at once and the " +
		"borrowed work drains within that time; rejects with reason overload (503), a class past its max and a tenant over " +
		"its class's tenant cap with policy_rate (429, at scope class and tenant). In flight: a class is always admitted up to its reserve, with or without a queue; idle " +
		"reserved units are lent, at most the recovery's worth at once, to requests whose deadline is within the revocation " +
		"time, and an owner that comes back takes them back at once from the recovery; rejects with reason " +
		"concurrency (503), and queue: lets requests wait for units. Admitted work is never cancelled; the recovery " +
		"is handed out to no class but an owner reclaiming its reserve. In-process state (per replica).",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonOverload),
	new:     func() params { return &reservationParams{} },
}

type reservationParams struct {
	opts     fair.ReservationOptions
	inflight int64
	classes  []fair.ClassShare
	lines    map[string]int // class → line, for errors
	// fieldLines are the lines of each share's fields, in classes' order
	fieldLines []map[string]int
	queue      queueSettings
}

func (p *reservationParams) fields() []field {
	return []field{
		intField("capacity", "work units/s the protected resource serves (a request's cost is its units); or inflight", &p.opts.Capacity, 1, fair.MaxRate).feeds("Capacity"),
		intField("inflight", "work units the protected resource runs at once (a request holds its cost until done); or capacity", &p.inflight, 1, sluice.MaxCost).feeds("InFlight"),
		intField("recovery", "work units/s (or units in flight) kept out of every class's reach (headroom to recover); in flight, also the most reserved units lent at once, which an owner takes back from it at once (none lent without it)", &p.opts.Recovery, 0, sluice.MaxCost).dflt("0").feeds("Recovery"),
		durationField("burst", "depth of each class's (and tenant's) bucket, as time at its rate (capacity only)", &p.opts.Burst, time.Millisecond).dflt("100ms").feeds("Burst"),
		durationField("revocation", "how long borrowed work may still run once an owner wants its reserve back: the pool holds "+
			"(capacity − recovery) × revocation units; in flight, only requests with at most this left before their deadline borrow",
			&p.opts.Revocation, time.Millisecond).dflt("1s").feeds("Revocation"),
		{key: "shares", typ: "mapping of class to {reserve, max, borrow, tenant}", doc: "per class: {reserve: units/s always available, max: units/s in all (default capacity − recovery), " +
			"borrow: may spend the pool (default true), tenant: units/s cap per tenant of the class (default none)}; classes " +
			"not listed only borrow", required: true, parse: p.parseClasses, sets: []string{"Classes"}},
		queueField(&p.queue),
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
		if first, dup := p.lines[c.Class]; dup {
			ps.Errf(name, at, "class listed twice (first at line %d)", first)
			continue
		}
		p.lines[c.Class] = name.Line
		p.fieldLines = append(p.fieldLines, seen)
		p.classes = append(p.classes, c)
	}
}

func (p *reservationParams) options() fair.ReservationOptions {
	o := p.opts
	o.Classes = p.classes
	return o
}

func (p *reservationParams) slotOptions() fair.SlotOptions {
	return fair.SlotOptions{InFlight: p.inflight, Recovery: p.opts.Recovery, Classes: p.classes, Revocation: p.opts.Revocation}
}

func (p *reservationParams) check(c *checker) {
	if !p.checkMode(c) || !p.checkShares(c) {
		return
	}
	for _, cl := range p.classes {
		if !validClass(c, cl.Class) {
			c.errs = append(c.errs, &Error{File: c.file.Path, Line: p.lines[cl.Class], Field: yamlfile.Join(c.path, "shares."+cl.Class),
				Msg: fmt.Sprintf("no route assigns class %q (classes: %s)", cl.Class, strings.Join(c.classes, ", "))})
		}
	}
	var err error
	if p.inflight > 0 {
		_, err = fair.NewSlots(c.g.Name, p.slotOptions())
	} else {
		_, err = fair.NewReservation(c.g.Name, p.options())
	}
	if err != nil {
		c.fail(err)
		return
	}
	p.checkCosts(c)
}

// checkMode checks that the gate reserves a rate or units in flight, with
// the settings of that mode only; false: nothing more to check.
func (p *reservationParams) checkMode(c *checker) bool {
	switch {
	case p.inflight == 0 && p.opts.Capacity == 0:
		c.failf("capacity", "missing: a reservation needs capacity (work units/s) or inflight (work units at once)")
		return false
	case p.inflight > 0 && p.opts.Capacity > 0:
		c.failf("inflight", "set capacity or inflight, not both (two reservation gates reserve both)")
		return false
	case p.inflight > 0 && p.opts.Burst != 0:
		c.failf("burst", "burst is the depth of a rate's buckets; an inflight reservation has none")
	case p.opts.Capacity > 0 && p.queue.set:
		c.failf("queue", "a wait queue waits for units in flight: it needs inflight, not capacity")
	}
	p.queue.check(c, false)
	return true
}

// checkShares reports a share's own bad fields, each on its field;
// false: one was bad.
func (p *reservationParams) checkShares(c *checker) bool {
	usable := p.inflight
	if usable == 0 {
		usable = p.opts.Capacity
	}
	usable -= p.opts.Recovery
	ok := true
	for i, cl := range p.classes {
		fail := func(f, format string, args ...any) {
			line := p.lines[cl.Class]
			if l, found := p.fieldLines[i][f]; found {
				line = l
			}
			c.errs = append(c.errs, &Error{File: c.file.Path, Line: line, Field: yamlfile.Join(c.path, "shares."+cl.Class+"."+f),
				Msg: fmt.Sprintf(format, args...)})
			ok = false
		}
		if f, msg := shareProblem(c, cl, usable, p.inflight > 0); f != "" {
			fail(f, "%s", msg)
		}
	}
	return ok && p.checkUnlisted(c, usable)
}

// shareProblem is the first bad field of share cl, and what is wrong with
// it ("" when nothing is).
func shareProblem(c *checker, cl fair.ClassShare, usable int64, inflight bool) (field, msg string) {
	switch {
	case cl.Reserve > usable && usable > 0:
		return "reserve", fmt.Sprintf("%d above the usable %d (capacity − recovery)", cl.Reserve, usable)
	case cl.Max > usable && usable > 0:
		return "max", fmt.Sprintf("%d above the usable %d (capacity − recovery)", cl.Max, usable)
	case cl.Max > 0 && cl.Max < cl.Reserve:
		return "max", fmt.Sprintf("%d below the class's reserve %d", cl.Max, cl.Reserve)
	case cl.Tenant > 0 && inflight:
		return "tenant", "a tenant cap applies to rates (capacity), not to units in flight"
	case cl.Reserve == 0 && cl.NoBorrow:
		return "borrow", "a class with no reserve that never borrows is never admitted: give it a reserve or let it borrow"
	case cl.NoBorrow && cl.Max > cl.Reserve:
		return "max", fmt.Sprintf("%d above the reserve %d of a class that never borrows: it can never be reached", cl.Max, cl.Reserve)
	case cl.Max > 0 && cl.Tenant > cl.Max:
		return "tenant", fmt.Sprintf("%d per tenant above the class's max %d never binds", cl.Tenant, cl.Max)
	case len(c.g.Classes) > 0 && !slices.Contains(c.g.Classes, cl.Class):
		return "reserve", fmt.Sprintf("the gate applies only to classes %s (its classes: field), so this share is never used", strings.Join(c.g.Classes, ", "))
	}
	return "", ""
}

// checkUnlisted reports, for a reservation of units in flight that
// reserves them all, a class the routes assign that has no share: it may
// only borrow, which needs a deadline within the revocation time, and the
// file's default deadline is longer (or there is none).
func (p *reservationParams) checkUnlisted(c *checker, usable int64) bool {
	if p.inflight == 0 {
		return true
	}
	reserved := int64(0)
	for _, cl := range p.classes {
		reserved += cl.Reserve
	}
	rev := p.revocation()
	if reserved < usable || (c.file.identity.DefaultDeadline > 0 && c.file.identity.DefaultDeadline <= rev) {
		return true
	}
	for _, rt := range c.file.routes {
		if rt.Class == "" || slices.ContainsFunc(p.classes, func(s fair.ClassShare) bool { return s.Class == rt.Class }) {
			continue
		}
		c.failf("shares", "class %s (route at line %d) has no share and every unit is reserved: it could only borrow, which "+
			"needs a deadline within the revocation time %v, and requests without one get %v; leave units unreserved or give it a share",
			rt.Class, rt.Line, rev, orNone(c.file.identity.DefaultDeadline))
		return false
	}
	return true
}

func orNone(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}

// checkCosts reports a class whose buckets cannot hold one request of the
// smallest cost a route of the class assigns (a fixed cost, or a header
// cost's minimum): such a class could never be admitted from its reserve.
func (p *reservationParams) checkCosts(c *checker) {
	if p.inflight > 0 {
		p.checkInflightCosts(c)
		return
	}
	burst := p.opts.Burst
	if burst == 0 {
		burst = 100 * time.Millisecond
	}
	for _, cl := range p.classes {
		cost, routeLine := largestCost(c, cl.Class)
		for _, b := range []struct {
			what string
			rate int64
		}{{"reserve", cl.Reserve}, {"max", cl.Max}, {"tenant", cl.Tenant}} {
			if b.rate == 0 || cost == 0 {
				continue
			}
			if holds := max(float64(b.rate)*burst.Seconds(), 1); float64(cost) > holds {
				line := p.lines[cl.Class]
				for i := range p.classes {
					if l, ok := p.fieldLines[i][b.what]; ok && p.classes[i].Class == cl.Class {
						line = l
					}
				}
				c.errs = append(c.errs, &Error{File: c.file.Path, Line: line, Field: yamlfile.Join(c.path, "shares."+cl.Class+"."+b.what),
					Msg: fmt.Sprintf("%s %d units/s × burst %v holds %.3g units, less than one request of class %s (cost %d, route at line %d): raise burst to at least %v",
						b.what, b.rate, burst, holds, cl.Class, cost, routeLine, time.Duration(float64(cost)/float64(b.rate)*float64(time.Second)).Round(time.Millisecond))})
			}
		}
	}
}

func (p *reservationParams) build(b *builder) (sluice.Gate, error) {
	if p.inflight > 0 {
		g, err := fair.NewSlots(b.g.Name, p.slotOptions())
		if err != nil {
			return nil, err
		}
		return p.queue.wrap(b, g)
	}
	return fair.NewReservation(b.g.Name, p.options())
}

func (p *reservationParams) stateKey() string { return "" }

func (p *reservationParams) describe(g *Gate) string {
	if p.inflight > 0 {
		return fmt.Sprintf("reservation of %d work units in flight (recovery %d kept back, the most reserved units lent): %s; only requests due within %v borrow reserved units; 503 concurrency%s%s",
			p.inflight, p.opts.Recovery, p.sharesText(), p.revocation(), p.queue.describe(), classesOnly(g))
	}
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
	unit := "units/s"
	if p.inflight > 0 {
		unit = "units"
	}
	var parts []string
	for _, c := range p.classes {
		s := fmt.Sprintf("%s %d %s", c.Class, c.Reserve, unit)
		if c.Max > 0 {
			s += fmt.Sprintf(" (max %d)", c.Max)
		}
		if c.NoBorrow {
			s += " never borrowing"
		}
		if c.Tenant > 0 {
			s += fmt.Sprintf(" (≤ %d per tenant)", c.Tenant)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// largestCost is the largest of the smallest costs the routes of class
// assign (a fixed cost, or a header cost's minimum), and that route's line.
func largestCost(c *checker, class string) (cost int64, line int) {
	for _, rt := range c.file.routes {
		if rt.Class != class {
			continue
		}
		k := rt.Cost.least()
		if rt.Cost.Header != "" {
			k = max(rt.Cost.Min, 1) // what a header can ask for, at least
		}
		if k > cost {
			cost, line = k, rt.Line
		}
	}
	return cost, line
}

// checkInflightCosts reports a class one of whose requests is above the
// usable units (never admitted) or above its own reserve (never admitted
// within it).
func (p *reservationParams) checkInflightCosts(c *checker) {
	usable := p.inflight - p.opts.Recovery
	for i, cl := range p.classes {
		cost, line := largestCost(c, cl.Class)
		what, limit := "", int64(0)
		switch {
		case cost > usable:
			what, limit = "inflight", usable
		case cl.Reserve > 0 && cost > cl.Reserve:
			what, limit = "reserve", cl.Reserve
		default:
			continue
		}
		at := p.lines[cl.Class]
		if l, ok := p.fieldLines[i]["reserve"]; ok {
			at = l
		}
		c.errs = append(c.errs, &Error{File: c.file.Path, Line: at, Field: yamlfile.Join(c.path, "shares."+cl.Class+".reserve"),
			Msg: fmt.Sprintf("a request of class %s costs %d units (route at line %d), more than the %d units of its %s: it is never admitted within them",
				cl.Class, cost, line, limit, what)})
	}
}

// reservation is the gate's line in the spec's reservations.
func (p *reservationParams) reservation(g *Gate) string {
	if p.inflight > 0 {
		return fmt.Sprintf("%s reserves %s of %d work units in flight, recovery %d; idle reserves are lent, at most %d units at once (the recovery), "+
			"to requests due within %v; an owner takes its reserve back at once, into the recovery, so no class is refused below its reserve",
			g.Name, p.sharesText(), p.inflight, p.opts.Recovery, p.opts.Recovery, p.revocation())
	}
	burst := p.opts.Burst
	if burst == 0 {
		burst = 100 * time.Millisecond
	}
	return fmt.Sprintf("%s reserves %s of %d work units/s, recovery %d; idle reserves go to a pool of at most %.0f units "+
		"((capacity − recovery) × revocation), lent and reclaimed at once, so borrowed work drains within %v; each class "+
		"bucket holds %v of its reserve", g.Name, p.sharesText(), p.opts.Capacity, p.opts.Recovery,
		float64(p.opts.Capacity-p.opts.Recovery)*p.revocation().Seconds(), p.revocation(), burst)
}

// afterWork: see workBound.
func (p *reservationParams) afterWork() string {
	if p.inflight > 0 {
		return "holds its work units until the work ends"
	}
	if p.queue.set {
		return "queues requests for units that completions free"
	}
	return ""
}
