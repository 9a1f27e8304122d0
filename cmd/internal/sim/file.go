package sim

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/internal/yamlfile"
)

// LoadScenario reads the scenario file at path. See ParseScenario.
func LoadScenario(path string) (Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Scenario{}, err
	}
	return ParseScenario(path, data)
}

// ParseScenario parses a scenario file: YAML with the fields of Scenario in
// snake_case (capacity, workers, server, client, classes, processes,
// balance, loads, step, warmup, phases, length, interval, seed, policy) and
// an optional base, a built-in scenario whose fields the file overrides
// (processes without balance spread the load evenly; a balance without
// processes sets their number). Durations are Go durations ("250ms"); a
// distribution is a duration (constant) or a mapping {dist, mean, cv, min,
// max}. Every error names the file, the line and the field.
func ParseScenario(path string, data []byte) (Scenario, error) {
	doc, err := yamlfile.Document(path, data, "scenario")
	if err != nil {
		return Scenario{}, err
	}
	p := &sparser{Walker: yamlfile.Walker{File: path}}
	s := p.scenario(doc)
	if err := p.Err(); err != nil {
		return Scenario{}, err
	}
	if _, err := s.withDefaults(); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			// The field's own line, or its nearest parent's when the
			// field is missing (classes[0].share → classes[0]).
			line := doc.Line
			for f := fe.Field; f != ""; f = f[:max(strings.LastIndexAny(f, ".["), 0)] {
				if l, ok := p.lines[f]; ok {
					line = l
					break
				}
			}
			return Scenario{}, yamlfile.Errors{{File: path, Line: line, Field: fe.Field, Msg: fe.Msg}}
		}
		return Scenario{}, err
	}
	return s, nil
}

type sparser struct {
	yamlfile.Walker
	lines map[string]int // field path → line, for errors found after parsing
}

func (p *sparser) at(field string, n *yaml.Node) {
	if p.lines == nil {
		p.lines = map[string]int{}
	}
	p.lines[field] = n.Line
}

// The keys of a scenario file, by mapping. docs/scenario.md documents each
// from the doc comment of the field it sets (TestScenarioReference).
var (
	scenarioFields = []string{"base", "name", "description", "unit", "capacity", "workers", "server", "client", "classes",
		"processes", "balance", "loads", "step", "warmup", "phases", "length", "interval", "seed", "policy"}
	serverFields = []string{"check_queue", "scan_cost", "cancel_point", "service", "service_cv", "release_at_deadline"}
	clientFields = []string{"timeout", "attempts", "backoff", "backoff_max", "budget", "retry_on", "ignore_retry_after", "arrivals", "retry", "clients", "deadline"}
	classFields  = []string{"name", "method", "path", "headers", "units", "share", "tenants", "service", "timeout"}
	phaseFields  = []string{"at", "load", "slowdown", "classes", "shares", "balance", "workers", "down"}
	distFields   = []string{"dist", "mean", "cv", "min", "max"}
)

func (p *sparser) scenario(n *yaml.Node) Scenario {
	s := p.base(n) // first, so the file's fields override it wherever they are
	p.Fields(n, "", scenarioFields, func(key string, v *yaml.Node) {
		p.at(key, v)
		p.field(&s, key, v)
	})
	// The file chooses between a sweep and a time series: loads given
	// without phases replace the base's phases, and the other way round.
	_, loads := p.lines["loads"]
	_, phases := p.lines["phases"]
	switch {
	case loads && !phases:
		s.Phases = nil
	case phases && !loads:
		s.Loads = nil
	}
	// Likewise processes without balance spread the load evenly, and a
	// balance without processes sets their number.
	_, procs := p.lines["processes"]
	_, balance := p.lines["balance"]
	switch {
	case procs && !balance:
		s.Balance = nil
	case balance && !procs:
		s.Processes = 0
	}
	if s.Name == "" {
		s.Name = "scenario"
	}
	return s
}

// base returns the built-in scenario the file names as its base, if any.
func (p *sparser) base(n *yaml.Node) Scenario {
	var s Scenario
	if n.Kind != yaml.MappingNode {
		return s
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k, v := n.Content[i], n.Content[i+1]; k.Value == "base" {
			name := p.Str(v, "base")
			b, ok := Builtin(name)
			if !ok && name != "" {
				p.Errf(v, "base", "unknown built-in scenario %q (known: %s)", name, strings.Join(Builtins(), ", "))
			}
			s = b
			// The base's published curve belongs to its own model,
			// not to a variant of it.
			s.Reference, s.ReferenceName = nil, ""
		}
	}
	return s
}

// field parses one top-level field into s.
func (p *sparser) field(s *Scenario, key string, v *yaml.Node) {
	switch key {
	case "name":
		s.Name = p.Str(v, key)
	case "description":
		s.Description = p.Str(v, key)
	case "unit":
		s.Unit = p.Str(v, key)
	case "capacity":
		s.Capacity = p.Float(v, key, 0, maxLoad)
	case "workers":
		s.Workers = int(p.Integer(v, key, 1, maxWorkers))
	case "server":
		p.server(v, &s.Server)
	case "client":
		p.client(v, &s.Client)
	case "classes":
		s.Classes = p.classes(v)
	case "processes":
		s.Processes = int(p.Integer(v, key, 1, maxProcesses))
	case "balance":
		s.Balance = p.weights(v, key)
	case "phases":
		s.Phases = p.phases(v)
	case "policy":
		s.Policy = p.Str(v, key)
	default:
		p.timing(s, key, v)
	}
}

// timing parses the fields of a run's length and shape.
func (p *sparser) timing(s *Scenario, key string, v *yaml.Node) {
	switch key {
	case "loads":
		s.Loads = nil
		p.list(v, key, func(i int, e *yaml.Node) {
			s.Loads = append(s.Loads, p.Float(e, fmt.Sprintf("loads[%d]", i), math.SmallestNonzeroFloat64, maxLoad))
		})
	case "step":
		s.Step = p.Duration(v, key, time.Millisecond)
	case "warmup":
		if s.Warmup = p.Duration(v, key, 0); s.Warmup == 0 {
			s.Warmup = -1 // explicitly none, not the default
		}
	case "length":
		s.Length = p.Duration(v, key, time.Millisecond)
	case "interval":
		s.Interval = p.Duration(v, key, time.Millisecond)
	case "seed":
		s.Seed = uint64(p.Integer(v, key, 1, math.MaxInt64))
	}
}

// weights parses a list of process weights, each in [0, 1e6].
func (p *sparser) weights(v *yaml.Node, field string) []float64 {
	w := []float64{}
	p.list(v, field, func(i int, e *yaml.Node) {
		w = append(w, p.Float(e, fmt.Sprintf("%s[%d]", field, i), 0, 1e6))
	})
	return w
}

func (p *sparser) list(v *yaml.Node, field string, each func(i int, e *yaml.Node)) {
	if v.Kind != yaml.SequenceNode {
		p.Errf(v, field, "want a list, got %s", yamlfile.KindName(v))
		return
	}
	for i, e := range v.Content {
		p.at(fmt.Sprintf("%s[%d]", field, i), e)
		each(i, e)
	}
}

func (p *sparser) server(n *yaml.Node, s *Server) {
	p.Fields(n, "server", serverFields, func(key string, v *yaml.Node) {
		f := "server." + key
		p.at(f, v)
		switch key {
		case "check_queue":
			s.CheckQueue = p.Boolean(v, f)
		case "scan_cost":
			s.ScanCost = p.Duration(v, f, 0)
		case "cancel_point":
			s.CancelPoint = p.Float(v, f, 0, 1)
		case "service":
			s.Service = p.OneOf(v, f, "exponential", "constant", "lognormal")
		case "service_cv":
			s.ServiceCV = p.Float(v, f, 0, 10)
		case "release_at_deadline":
			s.ReleaseAtDeadline = p.Boolean(v, f)
		}
	})
}

func (p *sparser) client(n *yaml.Node, c *Client) {
	p.Fields(n, "client", clientFields, func(key string, v *yaml.Node) {
		f := "client." + key
		p.at(f, v)
		switch key {
		case "timeout":
			c.Timeout = p.dist(v, f)
		case "attempts":
			c.Attempts = int(p.Integer(v, f, 1, 100))
		case "backoff":
			c.Backoff = p.Duration(v, f, time.Microsecond)
		case "backoff_max":
			c.BackoffMax = p.Duration(v, f, time.Microsecond)
		case "budget":
			c.Budget = p.Float(v, f, 0, 100)
		case "retry_on":
			c.RetryOn = []string{}
			p.list(v, f, func(i int, e *yaml.Node) {
				c.RetryOn = append(c.RetryOn, p.OneOf(e, fmt.Sprintf("%s[%d]", f, i), "timeout", "overload", "policy"))
			})
		case "ignore_retry_after":
			c.IgnoreRetryAfter = p.Boolean(v, f)
		case "arrivals":
			c.Arrivals = p.OneOf(v, f, "poisson", "uniform")
		case "retry":
			c.Retry = p.OneOf(v, f, RetryNaive, RetrySluice)
		case "clients":
			c.Clients = int(p.Integer(v, f, 1, maxClients))
		case "deadline":
			c.Deadline = p.Duration(v, f, time.Microsecond)
		}
	})
}

func (p *sparser) classes(n *yaml.Node) []Class {
	var out []Class
	p.list(n, "classes", func(i int, e *yaml.Node) {
		path := fmt.Sprintf("classes[%d]", i)
		var c Class
		p.Fields(e, path, classFields, func(key string, v *yaml.Node) {
			f := path + "." + key
			p.at(f, v)
			switch key {
			case "name":
				c.Name = p.Str(v, f)
			case "method":
				c.Method = p.Str(v, f)
			case "path":
				c.Path = p.Str(v, f)
			case "headers":
				if v.Kind != yaml.MappingNode {
					p.Errf(v, f, "want a mapping of header names to values, got %s", yamlfile.KindName(v))
					return
				}
				c.Headers = map[string]string{}
				for j := 0; j+1 < len(v.Content); j += 2 {
					c.Headers[v.Content[j].Value] = p.Str(v.Content[j+1], f+"."+v.Content[j].Value)
				}
			case "units":
				c.Units = p.Integer(v, f, 1, 1<<20)
			case "share":
				c.Share = p.Float(v, f, math.SmallestNonzeroFloat64, 1e6)
			case "tenants":
				c.Tenants = int(p.Integer(v, f, 1, 1<<20))
			case "service":
				c.Service = p.dist(v, f)
			case "timeout":
				c.Timeout = p.dist(v, f)
			}
		})
		out = append(out, c)
	})
	return out
}

func (p *sparser) phases(n *yaml.Node) []Phase {
	var out []Phase
	p.list(n, "phases", func(i int, e *yaml.Node) {
		path := fmt.Sprintf("phases[%d]", i)
		var ph Phase
		p.Fields(e, path, phaseFields, func(key string, v *yaml.Node) {
			f := path + "." + key
			p.at(f, v)
			switch key {
			case "at":
				ph.At = p.Duration(v, f, 0)
			case "load":
				ph.Load = p.Float(v, f, 0, maxLoad)
			case "slowdown":
				ph.Slowdown = p.Float(v, f, math.SmallestNonzeroFloat64, 1000)
			case "classes":
				p.list(v, f, func(j int, e *yaml.Node) {
					ph.Classes = append(ph.Classes, p.Str(e, fmt.Sprintf("%s[%d]", f, j)))
				})
			case "shares":
				ph.Shares = map[string]float64{}
				if v.Kind != yaml.MappingNode {
					p.Errf(v, f, "want a mapping of class name to share")
					break
				}
				for k := 0; k+1 < len(v.Content); k += 2 {
					ph.Shares[v.Content[k].Value] = p.Float(v.Content[k+1], f+"."+v.Content[k].Value, 0, 1e6)
				}
			case "balance":
				ph.Balance = p.weights(v, f)
			case "workers":
				ph.Workers = int(p.Integer(v, f, 1, maxWorkers))
			case "down":
				p.list(v, f, func(j int, e *yaml.Node) {
					ph.Down = append(ph.Down, int(p.Integer(e, fmt.Sprintf("%s[%d]", f, j), 1, 64)))
				})
			}
		})
		out = append(out, ph)
	})
	return out
}

// dist parses "250ms" (constant) or {dist, mean, cv, min, max}.
func (p *sparser) dist(v *yaml.Node, field string) Dist {
	if v.Kind == yaml.ScalarNode {
		return Const(p.Duration(v, field, time.Nanosecond))
	}
	var d Dist
	p.Fields(v, field, distFields, func(key string, x *yaml.Node) {
		f := field + "." + key
		switch key {
		case "dist":
			d.Kind = p.OneOf(x, f, "constant", "exponential", "lognormal", "uniform", "loguniform")
		case "mean":
			d.Mean = p.Duration(x, f, time.Nanosecond)
		case "cv":
			d.CV = p.Float(x, f, 0, 10)
		case "min":
			d.Min = p.Duration(x, f, time.Nanosecond)
		case "max":
			d.Max = p.Duration(x, f, time.Nanosecond)
		}
	})
	if d.Kind == "" {
		p.Errf(v, field, "missing dist (constant, exponential, lognormal, uniform or loguniform)")
		return Dist{}
	}
	if err := d.validate(); err != nil {
		p.Errf(v, field, "%v", err)
	}
	return d
}
