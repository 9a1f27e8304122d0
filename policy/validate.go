package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/internal/param"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// Validate checks everything about f that a Build would, without dialing
// anything: every gate's settings against each other and against the
// classes the routes assign, each algorithm's parameters, and, on the
// Redis backend, what Redis can hold exactly and the local fallback's
// share. Parse and Load call it; call it again after changing a File in
// code. The error is Errors, each naming the file, line and field, and
// wrapping the cause when another package found it.
func Validate(f *File) error {
	errs := checkClassOrder(f)
	if f.identity.ClientIPLine > 0 && !f.identity.TenantIP && !f.countsPerClient() {
		errs = append(errs, &Error{File: f.Path, Line: f.identity.ClientIPLine, Field: "identity.client_ip",
			Msg: "applies only to a tenant keyed by ip (identity.tenant.ip: true) or to gates of scope client"})
	}
	classes := f.classes()
	for i := range f.Gates {
		g := &f.Gates[i]
		if g.kind == nil || g.params == nil {
			errs = append(errs, &Error{File: f.Path, Line: g.Line, Field: fmt.Sprintf("gates[%d].kind", i),
				Msg: fmt.Sprintf("unknown kind %q (known: %s)", g.Kind, kindNames())})
			continue
		}
		c := &checker{file: f, g: g, path: fmt.Sprintf("gates[%d]", i), classes: classes}
		c.known("classes", g.Classes, "no route assigns class %q, so this gate would never apply (classes: %s)")
		c.tenantScope()
		g.params.check(c)
		c.costs()
		errs = append(errs, c.errs...)
	}
	if len(errs) == 0 {
		return nil
	}
	slices.SortStableFunc(errs, func(a, b *Error) int { return a.Line - b.Line })
	return errs
}

// countsPerClient reports whether a gate counts per client address.
func (f *File) countsPerClient() bool {
	for i := range f.Gates {
		if f.Gates[i].Scope == sluice.ScopeClient {
			return true
		}
	}
	return false
}

// checker collects the errors of one gate's settings.
type checker struct {
	file    *File
	g       *Gate
	path    string   // "gates[i]"
	classes []string // the classes the routes assign
	errs    Errors
}

// failf records an error in the gate's field key ("" for the gate itself).
func (c *checker) failf(key, format string, args ...any) {
	c.errs = append(c.errs, &Error{File: c.file.Path, Line: c.g.fieldLine(key), Field: yamlfile.Join(c.path, key),
		Msg: fmt.Sprintf(format, args...)})
}

// fail records err, found by another package, in the field that set the
// parameter it names (a param.Error), or in the gate itself.
func (c *checker) fail(err error) {
	key := ""
	var pe *param.Error
	if errors.As(err, &pe) {
		key = fieldFor(c.g.params.fields(), pe.Param)
	}
	path := c.path
	if key != "" {
		path = yamlfile.Join(c.path, key)
	}
	c.errs = append(c.errs, &Error{File: c.file.Path, Line: c.g.fieldLine(key), Field: path, Msg: err.Error(), Err: err})
}

// known reports the names that no route assigns as a class.
func (c *checker) known(key string, names []string, format string) {
	for j, name := range names {
		if name != "" && !slices.Contains(c.classes, name) {
			c.errs = append(c.errs, &Error{File: c.file.Path, Line: c.g.fieldLine(key), Field: fmt.Sprintf("%s.%s[%d]", c.path, key, j),
				Msg: fmt.Sprintf(format, name, strings.Join(c.classes, ", "))})
		}
	}
}

// tenantScope refuses a gate counted per tenant in a policy that
// identifies no tenant: every request would be the one anonymous tenant,
// a service-wide limit under another name.
func (c *checker) tenantScope() {
	if s := c.g.Scope; (s != sluice.ScopeTenant && s != sluice.ScopeTenantOperation) || len(c.file.identity.tenantParts()) > 0 {
		return
	}
	how := "scope " + c.g.Scope.String()
	if !c.g.written("scope") {
		how += " (the default of kind " + c.g.Kind + ")"
	}
	c.failf("scope", "%s, but the policy identifies no tenant: every request would share one anonymous tenant; set identity.tenant (header, query, claim, ip or route) or write scope: service", how)
}

// capacity is a kind whose gate admits at most units of cost at once
// (key: the field that sets them; 0: cost is not counted), so that a
// request costing more is never admitted.
type capacity interface {
	capacity() (units int64, key string)
}

// costs refuses a route whose every request costs more than the gate
// admits at once: it is refused forever (a 429 no retry helps), which a
// policy means by mistake only.
func (c *checker) costs() {
	cp, ok := c.g.params.(capacity)
	if !ok {
		return
	}
	units, key := cp.capacity()
	if units <= 0 {
		return
	}
	for _, rt := range c.file.routes {
		if len(c.g.Classes) > 0 && !slices.Contains(c.g.Classes, rt.Class) {
			continue
		}
		if k := rt.Cost.least(); k > units {
			c.failf(key, "%d, but a request of the route at line %d costs at least %d units: this gate never admits it", units, rt.Line, k)
		}
	}
}

// redis reports whether the gate's state lives on Redis.
func (c *checker) redis() bool { return c.file.Store.Backend == BackendRedis }
