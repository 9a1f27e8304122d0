package policy

import (
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/limit"
)

// Error is one problem in a policy file, at a line, in a field.
type Error = yamlfile.Error

// Errors is every problem found in a file, in file order.
type Errors = yamlfile.Errors

// Load reads and parses the policy file at path.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(path, data)
}

// Parse parses and validates a policy file. On failure the error is Errors,
// each naming the file, the line and the field.
func Parse(path string, data []byte) (*File, error) {
	doc, err := yamlfile.Document(path, data, "policy")
	if err != nil {
		return nil, err
	}
	p := &parser{Walker: yamlfile.Walker{File: path}}
	f := p.file1(doc)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return f, nil
}

type parser struct {
	yamlfile.Walker
}

func (p *parser) file1(n *yaml.Node) *File {
	f := &File{Path: p.File, Store: Store{Backend: "memory", Line: n.Line}}
	seen := p.Fields(n, "", []string{"version", "service", "spec", "store", "identity", "routes", "gates"}, func(key string, v *yaml.Node) {
		switch key {
		case "version":
			f.Version = int(p.Integer(v, key, 1, 1))
		case "service":
			if f.Service = p.Str(v, key); f.Service != "" && !validName(f.Service) {
				p.Errf(v, key, "%q: want lowercase letters, digits, '.', '_' or '-' (it names metrics and Redis keys)", f.Service)
			}
		case "spec":
			p.Fields(v, key, []string{"operation", "resource", "owner"}, func(k string, v *yaml.Node) {
				s := p.Str(v, yamlfile.Join(key, k))
				switch k {
				case "operation":
					f.Spec.Operation = s
				case "resource":
					f.Spec.Resource = s
				case "owner":
					f.Spec.Owner = s
				}
			})
		case "store":
			f.Store = p.store(v)
		case "identity":
			f.Identity = p.identity(v)
		case "routes":
			f.Routes = p.routes(v)
		case "gates":
			f.Gates = p.gates(v, f.Store)
		}
	})
	if n.Kind == yaml.MappingNode {
		for _, req := range []string{"version", "gates"} {
			if _, ok := seen[req]; !ok {
				p.Errf(n, req, "missing (required)")
			}
		}
	}
	known := f.Classes()
	// Gates without their own on_failure take the store's (which may be
	// written after the gates); on memory there is nothing to fall back from.
	for i := range f.Gates {
		g := &f.Gates[i]
		if _, own := g.fields["on_failure"]; !own {
			g.OnFailure = f.Store.OnFailure
		}
		if f.Store.Backend == "memory" && (g.OnFailure == "local_fallback" || g.OnFailure == "") {
			g.OnFailure = "fail_open"
		}
		if f.Store.Backend == "redis" && !redisKinds[g.Kind] && g.Kind != "" {
			p.Errs = append(p.Errs, &Error{File: p.File, Line: g.Line, Field: fmt.Sprintf("gates[%d].kind", i),
				Msg: fmt.Sprintf("kind %s has no Redis script", g.Kind)})
		}
	}
	for i := range f.Gates {
		p.checkProtection(i, &f.Gates[i], known)
	}
	if h := f.Identity.TenantHeader; h != "" && strings.EqualFold(h, f.Identity.DeadlineHeader) {
		p.Errf(n, "identity.deadline.header", "%q is also the tenant header", h)
	}
	for i, g := range f.Gates {
		for j, c := range g.Classes {
			if c != "" && !slices.Contains(known, c) {
				p.Errs = append(p.Errs, &Error{File: p.File, Line: g.Line, Field: fmt.Sprintf("gates[%d].classes[%d]", i, j),
					Msg: fmt.Sprintf("no route assigns class %q, so this gate would never apply (classes: %s)", c, strings.Join(known, ", "))})
			}
		}
	}
	return f
}

func (p *parser) store(n *yaml.Node) Store {
	s := Store{Backend: "memory", Line: n.Line}
	seen := p.Fields(n, "store", []string{"backend", "addrs", "cluster", "timeout", "on_failure", "max_keys", "replicas", "probe_every"}, func(k string, v *yaml.Node) {
		field := yamlfile.Join("store", k)
		switch k {
		case "backend":
			s.Backend = p.OneOf(v, field, "memory", "redis")
		case "addrs":
			if v.Kind != yaml.SequenceNode {
				p.Errf(v, field, "want a list of host:port")
				return
			}
			for i, a := range v.Content {
				s.Addrs = append(s.Addrs, p.Str(a, fmt.Sprintf("%s[%d]", field, i)))
			}
		case "cluster":
			s.Cluster = p.Boolean(v, field)
		case "timeout":
			s.Timeout = p.Duration(v, field, time.Microsecond)
		case "on_failure":
			s.OnFailure = p.OneOf(v, field, "fail_open", "fail_closed", "local_fallback")
		case "max_keys":
			s.MaxKeys = int(p.Integer(v, field, 1, 1<<30))
		case "replicas":
			s.Replicas = p.Integer(v, field, 1, 100_000)
		case "probe_every":
			s.ProbeEvery = p.Duration(v, field, 10*time.Millisecond)
		}
	})
	if s.Backend == "redis" && len(s.Addrs) == 0 {
		p.Errf(n, "store.addrs", "missing: the redis backend needs addrs (host:port of a server or of cluster nodes)")
	}
	if s.Backend != "redis" {
		for _, k := range []string{"addrs", "cluster", "timeout", "replicas", "probe_every"} {
			if line, ok := seen[k]; ok {
				p.Errs = append(p.Errs, &Error{File: p.File, Line: line, Field: "store." + k, Msg: "applies to the redis backend only"})
			}
		}
	}
	return s
}

func (p *parser) identity(n *yaml.Node) Identity {
	var id Identity
	p.Fields(n, "identity", []string{"tenant", "deadline", "request_id"}, func(k string, v *yaml.Node) {
		path := yamlfile.Join("identity", k)
		known := []string{"header"}
		switch k {
		case "tenant":
			known = append(known, "required")
		case "deadline":
			known = append(known, "max", "default")
		}
		p.Fields(v, path, known, func(kk string, vv *yaml.Node) {
			field := yamlfile.Join(path, kk)
			switch {
			case kk == "header":
				h := p.Str(vv, field)
				if h != "" && !validHeaderName(h) {
					p.Errf(vv, field, "%q is not a valid header name", h)
				}
				switch k {
				case "tenant":
					id.TenantHeader = h
				case "deadline":
					id.DeadlineHeader = h
				case "request_id":
					id.RequestIDHeader = h
				}
			case kk == "required":
				id.TenantRequired = p.Boolean(vv, field)
			case kk == "max":
				id.MaxDeadline = p.Duration(vv, field, time.Millisecond)
			case kk == "default":
				id.DefaultDeadline = p.Duration(vv, field, time.Millisecond)
			}
		})
	})
	return id
}

var headerName = regexp.MustCompile(`^[A-Za-z0-9!#$%&'*+.^_` + "`" + `|~-]+$`)

func validHeaderName(h string) bool { return headerName.MatchString(h) }

func (p *parser) routes(n *yaml.Node) []Route {
	if n.Kind != yaml.SequenceNode {
		p.Errf(n, "routes", "want a list of routes, got %s", yamlfile.KindName(n))
		return nil
	}
	var rs []Route
	for i, rn := range n.Content {
		path := fmt.Sprintf("routes[%d]", i)
		r := Route{Line: rn.Line, Cost: Cost{Fixed: 1}}
		seen := p.Fields(rn, path, []string{"match", "class", "cost"}, func(k string, v *yaml.Node) {
			field := yamlfile.Join(path, k)
			switch k {
			case "match":
				p.Fields(v, field, []string{"method", "path"}, func(kk string, vv *yaml.Node) {
					switch kk {
					case "method":
						r.Method = strings.ToUpper(p.OneOf(vv, yamlfile.Join(field, kk), "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
							"get", "head", "post", "put", "patch", "delete", "options"))
					case "path":
						r.Path = p.Str(vv, yamlfile.Join(field, kk))
						if r.Path != "" && !strings.HasPrefix(r.Path, "/") {
							p.Errf(vv, yamlfile.Join(field, kk), "%q must start with /", r.Path)
						} else if strings.ContainsAny(r.Path, "?# \t") {
							p.Errf(vv, yamlfile.Join(field, kk), "%q: a path pattern has no query, fragment or spaces", r.Path)
						}
					}
				})
				if r.Path == "" && v.Kind == yaml.MappingNode {
					p.Errf(v, yamlfile.Join(field, "path"), "missing (required)")
				}
			case "class":
				r.Class = p.Str(v, field)
				if r.Class != "" && !validName(r.Class) {
					p.Errf(v, field, "%q: class names use a-z, 0-9, '_' and '-'", r.Class)
				}
			case "cost":
				r.Cost = p.cost(v, field)
			}
		})
		if _, ok := seen["match"]; !ok && rn.Kind == yaml.MappingNode {
			p.Errf(rn, yamlfile.Join(path, "match"), "missing (required)")
		}
		rs = append(rs, r)
	}
	return rs
}

func (p *parser) cost(n *yaml.Node, path string) Cost {
	c := Cost{Fixed: 1}
	if n.Kind == yaml.ScalarNode {
		c.Fixed = p.Integer(n, path, 1, sluice.MaxCost)
		return c
	}
	p.Fields(n, path, []string{"header", "per", "min", "max"}, func(k string, v *yaml.Node) {
		field := yamlfile.Join(path, k)
		switch k {
		case "header":
			c.Header = p.Str(v, field)
			if c.Header != "" && !validHeaderName(c.Header) {
				p.Errf(v, field, "%q is not a valid header name", c.Header)
			}
		case "per":
			c.Per = p.Integer(v, field, 1, sluice.MaxCost)
		case "min":
			c.Min = p.Integer(v, field, 1, sluice.MaxCost)
		case "max":
			c.Max = p.Integer(v, field, 1, sluice.MaxCost)
		}
	})
	if c.Header == "" && n.Kind == yaml.MappingNode {
		p.Errf(n, yamlfile.Join(path, "header"), "missing: a cost mapping reads a header (or write a fixed cost: cost: 5)")
	}
	if c.Min > 0 && c.Max > 0 && c.Min > c.Max {
		p.Errf(n, path, "min %d is above max %d", c.Min, c.Max)
	}
	return c
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

func validName(s string) bool { return nameRE.MatchString(s) }

func (p *parser) gates(n *yaml.Node, st Store) []Gate {
	if n.Kind != yaml.SequenceNode {
		p.Errf(n, "gates", "want a list of gates, got %s", yamlfile.KindName(n))
		return nil
	}
	var gs []Gate
	names := map[string]int{}
	known := append(slices.Clone(commonGateFields), "rate", "burst", "limit", "window", "queue", "ttl", "refund", "weighted",
		"reserve", "good", "bad", "delay", "shed_all_after", "tiers", "workers", "sample_every", "cost_aware", "source",
		"degrade", "shed", "min_dwell", "recover", "step_every", "protected")
	for i, gn := range n.Content {
		path := fmt.Sprintf("gates[%d]", i)
		if i == sluice.MaxGates {
			p.Errf(gn, path, "at most %d gates in one chain", sluice.MaxGates)
			break
		}
		g := Gate{Line: gn.Line, Mode: "enforce", OnFailure: st.OnFailure}
		g.fields = p.Fields(gn, path, known, func(k string, v *yaml.Node) {
			field := yamlfile.Join(path, k)
			switch k {
			case "name":
				g.Name = p.Str(v, field)
				if v.Kind == yaml.ScalarNode && !validName(g.Name) {
					p.Errf(v, field, "%q: gate names use a-z, 0-9, '_', '.' and '-', at most 64", g.Name)
				} else if first, dup := names[g.Name]; dup {
					p.Errf(v, field, "duplicate gate name %q (first at line %d)", g.Name, first)
				} else {
					names[g.Name] = v.Line
				}
			case "kind":
				g.Kind = p.Str(v, field)
				if _, ok := kindFields[g.Kind]; v.Kind == yaml.ScalarNode && !ok {
					p.Errf(v, field, "unknown kind %q (known: %s)", g.Kind, strings.Join(kinds(), ", "))
					g.Kind = ""
				}
			case "scope":
				g.Scope = p.Str(v, field)
				if _, ok := sluice.ParseScope(g.Scope); !ok {
					p.Errf(v, field, "unknown scope %q (want service, tenant, operation, tenant_operation or class)", g.Scope)
				}
			case "mode":
				g.Mode = p.OneOf(v, field, "enforce", "shadow", "off")
			case "on_failure":
				g.OnFailure = p.OneOf(v, field, "fail_open", "fail_closed", "local_fallback")
			case "retry_hint":
				g.RetryHint = p.Duration(v, field, time.Millisecond)
			case "rate":
				g.RateText = p.Str(v, field)
				r, err := limit.ParseRate(g.RateText)
				if err != nil {
					p.Errf(v, field, "%s", strings.TrimPrefix(err.Error(), "limit: invalid rate "))
				}
				g.Rate = r
			case "burst":
				g.Burst = p.Integer(v, field, 1, 1<<40)
			case "limit":
				g.Limit = p.Integer(v, field, 1, 1<<40)
			case "window":
				g.Window = p.Duration(v, field, time.Millisecond)
			case "queue":
				g.Queue = p.Integer(v, field, 0, 1<<30)
			case "ttl":
				g.TTL = p.Duration(v, field, time.Second)
			case "refund":
				g.NoRefund = !p.Boolean(v, field)
			case "weighted":
				g.Weighted = p.Boolean(v, field)
			case "classes":
				g.Classes = p.classList(v, field)
			case "tiers":
				g.Tiers = p.classList(v, field)
			case "protected":
				g.Protected = p.classList(v, field)
			case "reserve":
				g.Reserve = map[string]float64{}
				if v.Kind != yaml.MappingNode {
					p.Errf(v, field, "want a mapping of class to share, e.g. {critical: 20%%}")
				} else {
					for k := 0; k+1 < len(v.Content); k += 2 {
						class, sv := v.Content[k], v.Content[k+1]
						if !validName(class.Value) {
							p.Errf(class, yamlfile.Join(field, class.Value), "%q is not a class name", class.Value)
							continue
						}
						g.Reserve[class.Value] = p.share(sv, yamlfile.Join(field, class.Value))
					}
				}
			case "good":
				g.Good = p.share(v, field)
			case "bad":
				g.Bad = p.share(v, field)
			case "delay":
				g.Delay = p.Duration(v, field, 0)
			case "shed_all_after":
				g.ShedAllAfter = p.Duration(v, field, time.Second)
			case "workers":
				g.Workers = p.Integer(v, field, 1, 1<<30)
			case "sample_every":
				g.SampleEvery = p.Duration(v, field, time.Millisecond)
			case "cost_aware":
				g.CostAware = p.Boolean(v, field)
			case "source":
				g.Source = p.OneOf(v, field, "workers", "cpu")
			case "degrade", "shed":
				var enter, exit float64
				p.Fields(v, field, []string{"enter", "exit"}, func(kk string, vv *yaml.Node) {
					if kk == "enter" {
						enter = p.share(vv, yamlfile.Join(field, kk))
					} else {
						exit = p.share(vv, yamlfile.Join(field, kk))
					}
				})
				if k == "degrade" {
					g.DegradeEnter, g.DegradeExit = enter, exit
				} else {
					g.ShedEnter, g.ShedExit = enter, exit
				}
			case "min_dwell":
				g.MinDwell = p.Duration(v, field, 0)
			case "step_every":
				g.StepEvery = p.Duration(v, field, time.Millisecond)
			case "recover":
				if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
					p.Errf(v, field, "want a list of admitted shares, e.g. [25%%, 50%%, 75%%]")
					return
				}
				for j, sv := range v.Content {
					g.RecoverSteps = append(g.RecoverSteps, p.share(sv, fmt.Sprintf("%s[%d]", field, j)))
				}
			}
		})
		if gn.Kind != yaml.MappingNode {
			continue
		}
		for _, req := range []string{"name", "kind"} {
			if _, ok := g.fields[req]; !ok {
				p.Errf(gn, yamlfile.Join(path, req), "missing (required)")
			}
		}
		if spec, ok := kindFields[g.Kind]; ok {
			for field, line := range g.fields {
				if slices.Contains(known, field) && !slices.Contains(commonGateFields, field) && !slices.Contains(spec.allowed, field) {
					p.Errs = append(p.Errs, &Error{File: p.File, Line: line, Field: yamlfile.Join(path, field),
						Msg: fmt.Sprintf("does not apply to kind %s (it takes %s)", g.Kind, strings.Join(spec.allowed, ", "))})
				}
			}
			for _, req := range spec.required {
				if _, ok := g.fields[req]; !ok {
					p.Errf(gn, yamlfile.Join(path, req), "missing: kind %s needs %s", g.Kind, strings.Join(spec.required, " and "))
				}
			}
		}
		if g.Scope == "" {
			g.Scope = "tenant"
			if g.Kind == KindConcurrency || g.Kind == KindLeakyBucket || protectionKinds[g.Kind] {
				g.Scope = "service"
			}
		}
		if len(p.Errs) == 0 && !protectionKinds[g.Kind] {
			if _, err := g.algorithm(); err != nil {
				p.Errf(gn, path, "%s", strings.TrimPrefix(err.Error(), "limit: invalid parameters: "))
			}
		}
		gs = append(gs, g)
	}
	return gs
}

// classList parses a non-empty list of class names.
func (p *parser) classList(v *yaml.Node, field string) []string {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.Errf(v, field, "want a non-empty list of class names")
		return nil
	}
	var out []string
	for j, c := range v.Content {
		name := p.Str(c, fmt.Sprintf("%s[%d]", field, j))
		if name != "" && !validName(name) {
			p.Errf(c, fmt.Sprintf("%s[%d]", field, j), "%q: class names use a-z, 0-9, '_' and '-'", name)
		}
		out = append(out, name)
	}
	return out
}

// share parses a fraction: 0.2 or 20%.
func (p *parser) share(v *yaml.Node, field string) float64 {
	if v.Kind != yaml.ScalarNode {
		p.Errf(v, field, "want a share such as 0.2 or 20%%, got %s", yamlfile.KindName(v))
		return 0
	}
	s, pct := strings.CutSuffix(strings.TrimSpace(v.Value), "%")
	f, err := strconv.ParseFloat(s, 64)
	if pct {
		f /= 100
	}
	if err != nil || math.IsNaN(f) || f < 0 || f > 10 {
		p.Errf(v, field, "%q is not a share (want e.g. 0.2 or 20%%)", v.Value)
		return 0
	}
	return f
}

func kinds() []string {
	ks := make([]string, 0, len(kindFields))
	for k := range kindFields {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// failure returns the gate's failure policy.
func (g *Gate) failure() gate.FailurePolicy {
	fp, err := gate.ParseFailurePolicy(g.OnFailure)
	if err != nil {
		return gate.FailOpen
	}
	return fp
}

var errNoAlgorithm = errors.New("no algorithm")
