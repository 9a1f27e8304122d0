package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// commonFields apply to every kind (on_failure to kinds with state in the
// store, scope to kinds that are not service-wide).
var commonFields = []string{"name", "kind", "scope", "mode", "on_failure", "retry_hint", "classes"}

// allFields is every key a gate may have, for the "unknown field" error.
func allFields() []string {
	keys := slices.Clone(commonFields)
	for _, k := range kinds {
		for _, f := range k.new().fields() {
			if !slices.Contains(keys, f.key) {
				keys = append(keys, f.key)
			}
		}
	}
	return keys
}

func (p *parser) gates(n *yaml.Node, st Store) []Gate {
	if n.Kind != yaml.SequenceNode {
		p.Errf(n, "gates", "want a list of gates, got %s", yamlfile.KindName(n))
		return nil
	}
	var gs []Gate
	names := map[string]int{}
	known := allFields()
	for i, gn := range n.Content {
		path := fmt.Sprintf("gates[%d]", i)
		if i == sluice.MaxGates {
			p.Errf(gn, path, "at most %d gates in one chain", sluice.MaxGates)
			break
		}
		g, ok := p.gate(gn, path, known, names)
		if !ok {
			continue
		}
		g.inherit(st)
		gs = append(gs, g)
	}
	return gs
}

// gate parses one gate: the common fields here, the kind's own through its
// field table.
func (p *parser) gate(n *yaml.Node, path string, known []string, names map[string]int) (Gate, bool) {
	g := Gate{Line: n.Line, lines: map[string]int{}}
	// The kind first: it decides which other fields apply.
	if n.Kind == yaml.MappingNode {
		for k := 0; k+1 < len(n.Content); k += 2 {
			if n.Content[k].Value == "kind" {
				g.kind = p.kind(n.Content[k+1], yamlfile.Join(path, "kind"))
			}
		}
	}
	var own []field
	if g.kind != nil {
		g.Kind, g.params = g.kind.name, g.kind.new()
		own = g.params.fields()
	}
	g.lines = p.Fields(n, path, known, func(k string, v *yaml.Node) {
		at := yamlfile.Join(path, k)
		if slices.Contains(commonFields, k) {
			p.commonField(&g, k, v, at, names)
			return
		}
		if g.kind == nil {
			return // unknown kind: reported once, on kind
		}
		i := slices.IndexFunc(own, func(f field) bool { return f.key == k })
		if i < 0 {
			p.Errf(v, at, "does not apply to kind %s (it takes %s)", g.kind.name, strings.Join(fieldKeys(own), ", "))
			return
		}
		own[i].parse(p, v, at)
	})
	if n.Kind != yaml.MappingNode {
		return g, false
	}
	for _, req := range []string{"name", "kind"} {
		if !g.written(req) {
			p.Errf(n, yamlfile.Join(path, req), "missing (required)")
		}
	}
	if g.kind == nil {
		return g, false
	}
	p.required(&g, n, path, own)
	if !g.written("scope") {
		g.Scope = g.kind.scope
	}
	return g, true
}

// required reports the kind's required fields the gate lacks.
func (p *parser) required(g *Gate, n *yaml.Node, path string, own []field) {
	var req []string
	for _, f := range own {
		if f.required {
			req = append(req, f.key)
		}
	}
	for _, k := range req {
		if !g.written(k) {
			p.Errf(n, yamlfile.Join(path, k), "missing: kind %s needs %s", g.kind.name, strings.Join(req, " and "))
		}
	}
}

func (p *parser) kind(v *yaml.Node, path string) *kind {
	name := p.Str(v, path)
	if v.Kind != yaml.ScalarNode {
		return nil
	}
	k := kindNamed(name)
	if k == nil {
		if best := yamlfile.Closest(name, kindList()); best != "" {
			p.Errf(v, path, "unknown kind %q; did you mean %q? (known: %s)", name, best, kindNames())
		} else {
			p.Errf(v, path, "unknown kind %q (known: %s)", name, kindNames())
		}
	}
	return k
}

// commonField parses a field every kind has.
func (p *parser) commonField(g *Gate, k string, v *yaml.Node, path string, names map[string]int) {
	switch k {
	case "name":
		p.gateName(g, v, path, names)
	case "kind":
		// read first, in gate
	case "scope":
		if g.kind != nil && g.kind.service {
			p.Errf(v, path, "does not apply to kind %s (it protects the whole service)", g.kind.name)
			return
		}
		s, err := sluice.ParseScope(p.Str(v, path))
		if err != nil && v.Kind == yaml.ScalarNode {
			p.fail(v, path, err)
		}
		g.Scope = s
	case "mode":
		m, err := sluice.ParseMode(p.Str(v, path))
		if err != nil && v.Kind == yaml.ScalarNode {
			p.fail(v, path, err)
		}
		g.Mode = m
	case "on_failure":
		if g.kind != nil && !g.kind.stored {
			p.Errf(v, path, "does not apply to kind %s (it keeps no state in the store)", g.kind.name)
			return
		}
		g.OnFailure = p.failurePolicy(v, path)
	case "retry_hint":
		g.RetryHint = p.Duration(v, path, time.Millisecond)
	case "classes":
		g.Classes = p.classList(v, path)
	}
}

func (p *parser) gateName(g *Gate, v *yaml.Node, path string, names map[string]int) {
	g.Name = p.Str(v, path)
	if v.Kind != yaml.ScalarNode {
		return
	}
	if !validName(g.Name) {
		p.Errf(v, path, "%q: gate names use a-z, 0-9, '_', '.' and '-', at most 64", g.Name)
	} else if first, dup := names[g.Name]; dup {
		p.Errf(v, path, "duplicate gate name %q (first at line %d)", g.Name, first)
	} else {
		names[g.Name] = v.Line
	}
}

// inherit gives a gate without its own failure policy the store's; on the
// memory store there is nothing to fall back from, so local_fallback
// means fail_open.
func (g *Gate) inherit(st Store) {
	if !g.written("on_failure") {
		g.OnFailure = st.OnFailure
	}
	if st.Backend != BackendRedis && g.OnFailure == gate.LocalFallback {
		g.OnFailure = gate.FailOpen
	}
}
