package rls

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/internal/algorithm"
	"github.com/sluice-go/sluice/internal/yamlfile"
)

// This file reads envoyproxy/ratelimit's configuration format as that
// service does (its README, "The configuration format", and
// src/config/config_impl.go): one YAML file per domain, a tree of
// descriptors keyed by key and optional value, and rate_limit blocks on
// some of them. Problems are reported with the file, the line and the
// field, e.g. "a.yaml:12: descriptors[1].rate_limit.unit: ...".

// ConfigError is one problem in a configuration file, at a line, in a
// field: "a.yaml:12: descriptors[1].rate_limit.unit: ...".
type ConfigError = yamlfile.Error

// ConfigErrors is every problem found in a file (or a folder), in file
// order; errors.As finds each ConfigError.
type ConfigErrors = yamlfile.Errors

// peerWindow is the algorithm name of the peer's fixed window, every
// rule's algorithm unless it names another.
const peerWindow = "fixed_window"

// ruleAlgorithm resolves a rule's algorithm name: nil for the peer's fixed
// window, else one of sluice's registered algorithms (internal/algorithm)
// that answers at once. A paced queue, which would make a call wait, and
// the registry's own fixed window, which the peer's replaces, are not
// offered.
func ruleAlgorithm(name string) (algorithm.Algorithm, bool) {
	if name == "" || name == peerWindow {
		return nil, true
	}
	a, ok := algorithm.Lookup(name)
	if !ok || a.Behavior() == algorithm.Paces {
		return nil, false
	}
	return a, true
}

// ruleAlgorithms returns the names a rule's algorithm may take, the
// peer's first; with uses, only those that read all of them.
func ruleAlgorithms(uses algorithm.Uses, slots bool) []string {
	var names []string
	if uses == 0 && !slots {
		names = append(names, peerWindow)
	}
	for _, n := range algorithm.Names() {
		if a, ok := ruleAlgorithm(n); ok && a != nil && a.Uses()&uses == uses && (!slots || a.Behavior() == algorithm.Slots) {
			names = append(names, n)
		}
	}
	return names
}

var unitNames = [...]string{"UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK"}

// String returns the unit's protocol name, e.g. "MINUTE".
func (u Unit) String() string {
	if int(u) < len(unitNames) {
		return unitNames[u]
	}
	return "UNKNOWN"
}

// Seconds returns the unit's length in seconds as envoyproxy/ratelimit
// counts it (src/utils/utilities.go, UnitToDivider): a month is 30 days
// and a year 365 days. It returns 0 for UnitUnknown and out-of-range units.
func (u Unit) Seconds() int64 {
	switch u {
	case Second:
		return 1
	case Minute:
		return 60
	case Hour:
		return 3600
	case Day:
		return 86400
	case Week:
		return 7 * 86400
	case Month:
		return 30 * 86400
	case Year:
		return 365 * 86400
	}
	return 0
}

// Duration returns the unit's length (Seconds as a time.Duration).
func (u Unit) Duration() time.Duration { return time.Duration(u.Seconds()) * time.Second }

// Rule is one rate_limit block of a configuration. It is immutable.
type Rule struct {
	// Domain is the rule's domain.
	Domain string
	// Path is the rule's place in its domain as envoyproxy/ratelimit names
	// its statistics: the descriptors' "key" or "key_value" from the top,
	// joined by dots, e.g. "message_type_marketing.to_number".
	Path string
	// File and Line locate the rate_limit block.
	File string
	Line int

	// Name is the rate_limit's name (for replaces and the response's
	// current_limit.name).
	Name string
	// Replaces are the names of the rules this one replaces when both
	// match one request.
	Replaces []string
	// Unlimited: the descriptor is known and never limited.
	Unlimited bool
	// Unit and RequestsPerUnit are the limit: requests_per_unit hits per
	// unit (0 refuses every hit). Unit is UnitUnknown for unlimited and
	// concurrency rules.
	Unit            Unit
	RequestsPerUnit uint32

	// Algorithm is the limiter's name: "fixed_window" (the peer's, and the
	// default) or, as a sluice extension, an algorithm of sluice's that
	// answers at once: token_bucket, gcra, sliding_window, sliding_log,
	// concurrency.
	Algorithm string
	// Burst is the bucket size in hits of token_bucket and gcra rules
	// (default RequestsPerUnit).
	Burst int64
	// Limit is the slots of a concurrency rule.
	Limit int64
	// alg is the algorithm Algorithm names; nil for the peer's window.
	alg algorithm.Algorithm

	// ShadowMode: the rule counts and reports, but its verdict is always OK.
	ShadowMode bool
	// QuotaMode: the rule's OVER_LIMIT makes the overall verdict
	// OVER_LIMIT only when every quota-mode descriptor of the request is
	// over (envoyproxy/ratelimit's quota_mode, src/service/ratelimit.go).
	QuotaMode bool
	// DetailedMetric: the rule's statistics are per descriptor value.
	DetailedMetric bool
}

// String describes the rule for logs, e.g. "messaging.to_number: 100/DAY".
func (r *Rule) String() string {
	var what string
	switch {
	case r.Unlimited:
		what = "unlimited"
	case r.slots():
		what = fmt.Sprintf("%s %d", r.Algorithm, r.Limit)
	case r.uses(algorithm.UsesBurst):
		what = fmt.Sprintf("%s %d/%s burst %d", r.Algorithm, r.RequestsPerUnit, r.Unit, r.Burst)
	case r.alg != nil:
		what = fmt.Sprintf("%s %d/%s", r.Algorithm, r.RequestsPerUnit, r.Unit)
	default:
		what = fmt.Sprintf("%d/%s", r.RequestsPerUnit, r.Unit)
	}
	return r.Domain + "." + r.Path + ": " + what
}

// slots reports whether the rule holds slots (concurrency): a call with
// hits takes them, a call with is_negative_hits gives them back.
func (r *Rule) slots() bool { return r.alg != nil && r.alg.Behavior() == algorithm.Slots }

// uses reports whether the rule's algorithm reads setting u.
func (r *Rule) uses(u algorithm.Uses) bool { return r.alg != nil && r.alg.Uses()&u != 0 }

// Config is a set of domains, each from one file. It is immutable and
// safe for concurrent use.
type Config struct {
	domains map[string]*domain
}

// domain is one file's descriptor tree.
type domain struct {
	name  string
	file  string
	line  int
	root  level
	rules []*Rule
}

// level is one list of descriptors: where a request's entry is looked up
// first by key and value, then among the wildcard values in file order,
// then by key alone.
type level struct {
	valued map[Entry]*node
	byKey  map[string]*node
	wild   []*node
}

// node is one descriptor of the tree.
type node struct {
	key, value    string
	parts         []string // a wildcard value split on '*'; nil otherwise
	rule          *Rule
	children      level
	line          int // of the key
	valueToMetric bool
	share         bool // share_threshold
}

// Domains returns the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Rules returns the rules of domain d in file order (nil for an unknown
// domain).
func (c *Config) Rules(d string) []*Rule {
	if dom := c.domains[d]; dom != nil {
		return slices.Clone(dom.rules)
	}
	return nil
}

// Lookup returns the rule a descriptor with entries matches in domain d,
// as envoyproxy/ratelimit walks its tree (src/config/config_impl.go,
// GetLimit): each entry descends one level, matching the key and value
// exactly first, then a wildcard value (first in file order), then the key
// alone; a rule applies only at the level of the last entry. It returns
// nil when nothing matches. Replaces and overrides are the Server's.
func (c *Config) Lookup(d string, entries []Entry) *Rule {
	dom := c.domains[d]
	if dom == nil {
		return nil
	}
	m, ok := dom.lookup(entries)
	if !ok {
		return nil
	}
	return m.rule
}

// Join combines configurations; a domain in more than one is an error
// (envoyproxy/ratelimit's default, without MERGE_DOMAIN_CONFIG).
func Join(cfgs ...*Config) (*Config, error) {
	out := &Config{domains: map[string]*domain{}}
	var errs yamlfile.Errors
	for _, c := range cfgs {
		if c == nil {
			continue
		}
		for _, name := range c.Domains() {
			d := c.domains[name]
			if prev := out.domains[name]; prev != nil {
				errs = append(errs, &yamlfile.Error{File: d.file, Line: d.line, Field: "domain",
					Msg: fmt.Sprintf("duplicate domain %q (also in %s:%d): one file per domain", name, prev.file, prev.line)})
				continue
			}
			out.domains[name] = d
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return out, nil
}

// IsConfig reports whether data looks like an envoyproxy/ratelimit
// configuration rather than a sluice policy: a YAML mapping with a
// top-level "domain" key. It does not validate; Parse does.
func IsConfig(data []byte) bool {
	var doc yaml.Node
	if yaml.Unmarshal(data, &doc) != nil || len(doc.Content) == 0 {
		return false
	}
	n := doc.Content[0]
	if n.Kind != yaml.MappingNode {
		return false
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "domain" {
			return true
		}
	}
	return false
}

// Load reads the configuration at path: one file, or every *.yaml and
// *.yml regular file directly in a directory (dotfiles, subdirectories and
// what is not a regular file once symlinks are followed are skipped), each
// one domain. Errors name the file, line and field.
func Load(path string) (*Config, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		data, err := yamlfile.ReadFile(path)
		if err != nil {
			return nil, err
		}
		return Parse(path, data)
	}
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var cfgs []*Config
	var errs yamlfile.Errors
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() || strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		p := filepath.Join(path, name)
		if fi, err := os.Stat(p); err != nil {
			return nil, err
		} else if !fi.Mode().IsRegular() {
			continue // a link to a folder, a named pipe (reading it would block)
		}
		data, err := yamlfile.ReadFile(p)
		if err != nil {
			return nil, err
		}
		c, err := Parse(p, data)
		if err != nil {
			var fe yamlfile.Errors
			if errors.As(err, &fe) {
				errs = append(errs, fe...)
				continue
			}
			return nil, err
		}
		cfgs = append(cfgs, c)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	if len(cfgs) == 0 {
		return nil, fmt.Errorf("rls: %s: no *.yaml or *.yml configuration files", path)
	}
	return Join(cfgs...)
}

// Limits of a configuration file, beyond which Parse refuses it.
const (
	// MaxConfigBytes is the largest file Parse reads.
	MaxConfigBytes = 16 << 20
	// maxNodes bounds the YAML nodes of a file after its aliases are
	// expanded (an alias bomb is refused, not expanded).
	maxNodes = 1 << 20
	// MaxDepth is the deepest nesting of descriptors.
	MaxDepth = 64
)

// Parse parses one configuration file (one domain) and validates it as
// envoyproxy/ratelimit does, and somewhat more strictly (see the README,
// "Envoy rate limit service"). On failure the error is ConfigErrors:
// every problem found, each naming the file, the line and the field.
func Parse(path string, data []byte) (*Config, error) {
	if len(data) > MaxConfigBytes {
		return nil, yamlfile.Errors{{File: path, Line: 1, Field: "(file)", Msg: fmt.Sprintf("%d bytes, more than the %d a configuration may have", len(data), MaxConfigBytes)}}
	}
	doc, err := document(path, data)
	if err != nil {
		return nil, err
	}
	if !yamlfile.HasKey(doc, "domain") && yamlfile.HasKey(doc, "gates") {
		return nil, yamlfile.Errors{{File: path, Line: doc.Line, Field: "(file)",
			Msg: "a sluice policy (it has gates), not an envoyproxy/ratelimit configuration: check or serve it by its own name (a folder is read as a rate limit configuration)"}}
	}
	p := &parser{Walker: yamlfile.Walker{File: path}}
	if doc, err = p.expand(doc); err != nil {
		return nil, err
	}
	d := p.file(doc)
	if err := p.Err(); err != nil {
		return nil, err
	}
	return &Config{domains: map[string]*domain{d.name: d}}, nil
}

// document parses data as one YAML document; unlike yamlfile.Document it
// accepts anchors and aliases, which the peer's YAML library reads.
func document(path string, data []byte) (*yaml.Node, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, yamlfile.Errors{{File: path, Line: 1, Field: "(file)", Msg: "empty configuration file"}}
	}
	return yamlfile.Document(path, data, "rate limit configuration")
}

type parser struct {
	yamlfile.Walker
	nodes    int
	replaces []replaceRef
}

// expand resolves aliases and merge keys ("<<: *base") into a tree of
// plain nodes, as the peer's YAML library reads them, refusing documents
// that expand beyond maxNodes.
func (p *parser) expand(n *yaml.Node) (*yaml.Node, error) {
	out := p.resolve(n, 0)
	if p.nodes > maxNodes {
		return nil, yamlfile.Errors{{File: p.File, Line: n.Line, Field: "(file)", Msg: fmt.Sprintf("more than %d YAML nodes once its aliases are expanded", maxNodes)}}
	}
	return out, nil
}

func (p *parser) resolve(n *yaml.Node, depth int) *yaml.Node {
	p.nodes++
	if p.nodes > maxNodes || depth > 4*MaxDepth+16 {
		p.nodes = maxNodes + 1
		return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line}
	}
	switch n.Kind {
	case yaml.AliasNode:
		if n.Alias == nil {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Line: n.Line}
		}
		return p.resolve(n.Alias, depth+1)
	case yaml.SequenceNode:
		c := *n
		c.Content = make([]*yaml.Node, len(n.Content))
		for i, e := range n.Content {
			c.Content[i] = p.resolve(e, depth+1)
		}
		return &c
	case yaml.MappingNode:
		c := *n
		c.Content = nil
		var merged []*yaml.Node // key/value pairs from "<<", after the explicit ones
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Kind == yaml.ScalarNode && k.Value == "<<" && k.Tag == "!!merge" {
				src := []*yaml.Node{v}
				if v.Kind == yaml.SequenceNode {
					src = v.Content
				}
				for _, s := range src {
					if r := p.resolve(s, depth+1); r.Kind == yaml.MappingNode {
						merged = append(merged, r.Content...)
					} else {
						p.Errf(k, "<<", "a merge key takes a mapping or a list of mappings, got %s", yamlfile.KindName(r))
					}
				}
				continue
			}
			c.Content = append(c.Content, p.resolve(k, depth+1), p.resolve(v, depth+1))
		}
		for i := 0; i+1 < len(merged); i += 2 {
			if !hasKey(&c, merged[i].Value) {
				c.Content = append(c.Content, merged[i], merged[i+1])
			}
		}
		return &c
	}
	return n
}

func hasKey(m *yaml.Node, key string) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return true
		}
	}
	return false
}

func isNull(v *yaml.Node) bool {
	return v.Kind == yaml.ScalarNode && v.Tag == "!!null"
}

// str reads a scalar as text, as the peer's YAML library does for its
// string fields (123 is "123", null is "").
func (p *parser) str(v *yaml.Node, field string) string {
	if isNull(v) {
		return ""
	}
	if v.Kind != yaml.ScalarNode {
		p.Errf(v, field, "want a string, got %s", yamlfile.KindName(v))
		return ""
	}
	return v.Value
}

// boolean reads a YAML 1.1 boolean (true, yes, on, ... as the peer's YAML
// library); null is false.
func (p *parser) boolean(v *yaml.Node, field string) bool {
	if isNull(v) {
		return false
	}
	if v.Kind == yaml.ScalarNode {
		switch v.Value {
		case "true", "True", "TRUE", "yes", "Yes", "YES", "y", "Y", "on", "On", "ON":
			return true
		case "false", "False", "FALSE", "no", "No", "NO", "n", "N", "off", "Off", "OFF":
			return false
		}
	}
	p.Errf(v, field, "want true or false, got %s", yamlfile.KindName(v))
	return false
}

// integer reads an integer in [lo, hi]: decimal, or 0x / 0o / 0b / leading
// 0 (octal) as YAML 1.1, with optional underscores.
func (p *parser) integer(v *yaml.Node, field string, lo, hi int64) int64 {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		p.Errf(v, field, "want an integer, got %s", yamlfile.KindName(v))
		return 0
	}
	s := strings.ReplaceAll(v.Value, "_", "")
	n, err := strconv.ParseInt(s, 0, 64)
	if errors.Is(err, strconv.ErrRange) || (err == nil && (n < lo || n > hi)) {
		p.Errf(v, field, "%s is out of range [%d, %d]", v.Value, lo, hi)
		return 0
	}
	if err != nil {
		p.Errf(v, field, "%q is not an integer", v.Value)
		return 0
	}
	return n
}

// list returns a sequence's items; null is an empty list.
func (p *parser) list(v *yaml.Node, field string) []*yaml.Node {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		p.Errf(v, field, "want a list, got %s", yamlfile.KindName(v))
		return nil
	}
	return v.Content
}

var (
	topFields        = []string{"domain", "descriptors"}
	descriptorFields = []string{"key", "value", "rate_limit", "descriptors", "shadow_mode", "quota_mode",
		"detailed_metric", "value_to_metric", "share_threshold", "metadata"}
	rateLimitFields = []string{"unit", "requests_per_unit", "unlimited", "name", "replaces",
		"algorithm", "burst", "limit"}
)

func (p *parser) file(n *yaml.Node) *domain {
	d := &domain{file: p.File, line: n.Line}
	var descs *yaml.Node
	p.fields(n, "", topFields, func(k string, v *yaml.Node) {
		switch k {
		case "domain":
			d.name, d.line = p.str(v, k), v.Line
		case "descriptors":
			descs = v
		}
	})
	if n.Kind != yaml.MappingNode {
		return d
	}
	if d.name == "" {
		p.Errf(n, "domain", "missing or empty: a configuration file names its domain")
	}
	if descs != nil {
		p.level(d, &d.root, descs, "descriptors", "", 1)
	}
	p.checkReplaces(d)
	return d
}

// fields walks a mapping as yamlfile.Walker.Fields does (unknown keys are
// errors with a suggestion, duplicates are errors), also refusing keys
// that are not strings, as the peer does.
func (p *parser) fields(n *yaml.Node, path string, known []string, visit func(k string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		where := path
		if where == "" {
			where = "(file)"
		}
		p.Errf(n, where, "want a mapping of fields, got %s", yamlfile.KindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		field := yamlfile.Join(path, k.Value)
		switch {
		case k.Kind != yaml.ScalarNode || k.Tag != "!!str":
			p.Errf(k, field, "a key must be a string, got %s", yamlfile.KindName(k))
		case seen[k.Value]:
			p.Errf(k, field, "duplicate field")
		case !slices.Contains(known, k.Value):
			msg := "unknown field"
			if best := yamlfile.Closest(k.Value, known); best != "" {
				msg += fmt.Sprintf("; did you mean %q?", best)
			}
			p.Errf(k, field, "%s (known: %s)", msg, strings.Join(known, ", "))
		default:
			seen[k.Value] = true
			visit(k.Value, v)
		}
	}
}

// level parses one list of descriptors into lv. statsPath is the parent's
// peer statistics path ("" at the top).
func (p *parser) level(d *domain, lv *level, v *yaml.Node, field, statsPath string, depth int) {
	items := p.list(v, field)
	if depth > MaxDepth && len(items) > 0 {
		p.Errf(v, field, "descriptors nested deeper than %d levels", MaxDepth)
		return
	}
	for i, item := range items {
		p.descriptor(d, lv, item, fmt.Sprintf("%s[%d]", field, i), statsPath, depth)
	}
}

func (p *parser) descriptor(d *domain, lv *level, n *yaml.Node, field, parentPath string, depth int) {
	if n.Kind != yaml.MappingNode {
		p.Errf(n, field, "want a descriptor (a mapping with key, value, rate_limit, descriptors), got %s", yamlfile.KindName(n))
		return
	}
	nd, raw := p.descriptorFields(n, field)
	if nd.key == "" {
		p.Errf(n, yamlfile.Join(field, "key"), "missing or empty: every descriptor has a key")
		return
	}
	seg := nd.key
	if nd.value != "" {
		seg += "_" + nd.value
	}
	statsPath := seg
	if parentPath != "" {
		statsPath = parentPath + "." + seg
	}
	if strings.Contains(nd.value, "*") {
		nd.parts = strings.Split(nd.value, "*")
	}
	if nd.share && nd.parts == nil {
		p.Errf(n, yamlfile.Join(field, "share_threshold"), "applies only to a wildcard value (one with '*'); %q has none", nd.value)
	}
	if prev := lv.find(nd); prev != nil { // the same key and value twice in one list
		at := "key"
		if nd.value != "" {
			at = "value"
		}
		p.Errf(n, yamlfile.Join(field, at), "duplicate descriptor %q at this level (line %d)", d.name+"."+statsPath, prev.line)
		return
	}
	p.descriptorRule(d, nd, raw, field, statsPath)
	if raw.children != nil {
		p.level(d, &nd.children, raw.children, yamlfile.Join(field, "descriptors"), statsPath, depth+1)
	}
	lv.add(nd)
}

// descriptorNodes are the fields of a descriptor read after its key and
// value are known.
type descriptorNodes struct {
	rule, children, shadow, quota, detailed *yaml.Node
}

// descriptorFields reads a descriptor's own fields into a node, and keeps
// the others' nodes.
func (p *parser) descriptorFields(n *yaml.Node, field string) (*node, descriptorNodes) {
	nd := &node{line: n.Line}
	var raw descriptorNodes
	p.fields(n, field, descriptorFields, func(k string, v *yaml.Node) {
		f := yamlfile.Join(field, k)
		switch k {
		case "key":
			nd.key, nd.line = p.str(v, f), v.Line
		case "value":
			nd.value = p.str(v, f)
		case "rate_limit":
			raw.rule = v
		case "descriptors":
			raw.children = v
		case "shadow_mode":
			raw.shadow = v
		case "quota_mode":
			raw.quota = v
		case "detailed_metric":
			raw.detailed = v
		case "value_to_metric":
			nd.valueToMetric = p.boolean(v, f)
		case "share_threshold":
			nd.share = p.boolean(v, f)
		case "metadata":
			// Returned by the peer as dynamic metadata, which sluice does not
			// emit: accepted (a mapping, as the peer requires) and ignored.
			if !isNull(v) && v.Kind != yaml.MappingNode {
				p.Errf(v, f, "want a mapping, got %s", yamlfile.KindName(v))
			}
		}
	})
	return nd, raw
}

// descriptorRule parses a descriptor's rate_limit and the flags that go
// with it; without a rule the flags mean nothing, and only their syntax is
// checked.
func (p *parser) descriptorRule(d *domain, nd *node, raw descriptorNodes, field, statsPath string) {
	flag := func(v *yaml.Node, k string) bool { return v != nil && p.boolean(v, yamlfile.Join(field, k)) }
	if raw.rule == nil || isNull(raw.rule) {
		flag(raw.shadow, "shadow_mode")
		flag(raw.quota, "quota_mode")
		flag(raw.detailed, "detailed_metric")
		return
	}
	nd.rule = p.rule(d, raw.rule, yamlfile.Join(field, "rate_limit"), statsPath)
	if nd.rule != nil {
		nd.rule.ShadowMode = flag(raw.shadow, "shadow_mode")
		nd.rule.QuotaMode = flag(raw.quota, "quota_mode")
		nd.rule.DetailedMetric = flag(raw.detailed, "detailed_metric")
	}
}

// find returns the node of lv with nd's key and value, or nil.
func (lv *level) find(nd *node) *node {
	if nd.value == "" {
		return lv.byKey[nd.key]
	}
	return lv.valued[Entry{nd.key, nd.value}]
}

// add puts nd in lv.
func (lv *level) add(nd *node) {
	if nd.value == "" {
		if lv.byKey == nil {
			lv.byKey = map[string]*node{}
		}
		lv.byKey[nd.key] = nd
		return
	}
	if lv.valued == nil {
		lv.valued = map[Entry]*node{}
	}
	lv.valued[Entry{nd.key, nd.value}] = nd
	if nd.parts != nil {
		lv.wild = append(lv.wild, nd)
	}
}

// unitByName reads a unit as the peer does: any case of a
// RateLimitResponse.RateLimit.Unit name but UNKNOWN.
func unitByName(s string) Unit {
	for u, name := range unitNames {
		if u > 0 && strings.EqualFold(s, name) {
			return Unit(u)
		}
	}
	return UnitUnknown
}

func (p *parser) rule(d *domain, n *yaml.Node, field, statsPath string) *Rule {
	if n.Kind != yaml.MappingNode {
		p.Errf(n, field, "want a mapping (unit, requests_per_unit, ...), got %s", yamlfile.KindName(n))
		return nil
	}
	r := &Rule{Domain: d.name, Path: statsPath, File: p.File, Line: n.Line}
	seen := map[string]*yaml.Node{}
	before := len(p.Errs)
	p.fields(n, field, rateLimitFields, func(k string, v *yaml.Node) {
		seen[k] = v
		p.ruleField(r, k, v, yamlfile.Join(field, k))
	})
	if len(p.Errs) > before {
		return nil
	}
	p.checkRule(r, n, seen, field)
	if len(p.Errs) > before {
		return nil
	}
	d.rules = append(d.rules, r)
	return r
}

// ruleField reads one field k of a rate_limit into r.
func (p *parser) ruleField(r *Rule, k string, v *yaml.Node, f string) {
	switch k {
	case "unit":
		s := p.str(v, f)
		if r.Unit = unitByName(s); r.Unit == UnitUnknown {
			p.Errf(v, f, "invalid rate limit unit %q (want second, minute, hour, day, week, month or year)", s)
		}
	case "requests_per_unit":
		r.RequestsPerUnit = uint32(p.integer(v, f, 0, math.MaxUint32))
	case "unlimited":
		r.Unlimited = p.boolean(v, f)
	case "name":
		r.Name = p.str(v, f)
	case "replaces":
		p.replacesOf(r, v, f)
	case "algorithm":
		s := p.str(v, f)
		if a, ok := ruleAlgorithm(s); ok {
			r.Algorithm, r.alg = s, a
		} else {
			p.Errf(v, f, "%q is not an algorithm (want %s)", s, strings.Join(ruleAlgorithms(0, false), ", "))
		}
	case "burst":
		r.Burst = p.integer(v, f, 1, math.MaxUint32)
	case "limit":
		r.Limit = p.integer(v, f, 1, math.MaxUint32)
	}
}

// replacesOf reads a rule's replaces list (mappings with a name), to be
// checked against the file's names once they are all known.
func (p *parser) replacesOf(r *Rule, v *yaml.Node, f string) {
	for i, item := range p.list(v, f) {
		rf := fmt.Sprintf("%s[%d]", f, i)
		if item.Kind != yaml.MappingNode {
			p.Errf(item, rf, "want a mapping with a name, got %s", yamlfile.KindName(item))
			continue
		}
		var name string
		p.fields(item, rf, []string{"name"}, func(_ string, nv *yaml.Node) { name = p.str(nv, rf+".name") })
		if name == "" {
			p.Errf(item, rf+".name", "should not have an empty replaces entry")
			continue
		}
		r.Replaces = append(r.Replaces, name)
		p.replaces = append(p.replaces, replaceRef{rule: r, name: name, node: item, field: rf + ".name"})
	}
}

// checkRule checks the fields of a parsed rule (n, at field) against each
// other and its algorithm, and fills the defaults they imply.
func (p *parser) checkRule(r *Rule, n *yaml.Node, seen map[string]*yaml.Node, field string) {
	refuse := func(k, format string, args ...any) {
		if v := seen[k]; v != nil {
			p.Errf(v, yamlfile.Join(field, k), format, args...)
		}
	}
	only := func(k string, uses algorithm.Uses, slots bool) {
		if !r.uses(uses) || (slots && !r.slots()) {
			refuse(k, "applies only to algorithm %s, not %s", strings.Join(ruleAlgorithms(uses, slots), " or "), r.algorithmName())
		}
	}
	switch {
	case r.Unlimited:
		refuse("unit", "should not specify rate limit unit when unlimited")
		refuse("algorithm", "an unlimited rule has no algorithm")
		refuse("burst", "an unlimited rule has no burst")
		refuse("limit", "an unlimited rule has no limit")
		// requests_per_unit is ignored with unlimited, as the peer ignores it.
		r.RequestsPerUnit = 0
	case r.slots():
		refuse("unit", "a %s rule holds limit slots and has no unit", r.Algorithm)
		refuse("requests_per_unit", "a %s rule holds limit slots and has no requests_per_unit", r.Algorithm)
		if seen["limit"] == nil {
			p.Errf(n, yamlfile.Join(field, "limit"), "missing: a %s rule needs limit (the slots held at once)", r.Algorithm)
		}
		only("burst", algorithm.UsesBurst, false)
		r.RequestsPerUnit = uint32(min(r.Limit, math.MaxUint32))
	default:
		p.checkRateRule(r, n, seen, field)
		only("burst", algorithm.UsesBurst, false)
		only("limit", algorithm.UsesLimit, true)
	}
	for _, name := range r.Replaces {
		if name == r.Name {
			refuse("replaces", "replaces should not contain name of same descriptor (%q)", name)
		}
	}
}

// checkRateRule checks a rule that counts requests per unit of time.
func (p *parser) checkRateRule(r *Rule, n *yaml.Node, seen map[string]*yaml.Node, field string) {
	if seen["unit"] == nil {
		p.Errf(n, yamlfile.Join(field, "unit"), "missing: want second, minute, hour, day, week, month or year (or unlimited: true)")
	}
	rpu := seen["requests_per_unit"]
	if rpu == nil {
		p.Errf(n, yamlfile.Join(field, "requests_per_unit"), "missing (write 0 to refuse every request)")
	}
	if r.alg != nil && rpu != nil && r.RequestsPerUnit == 0 {
		p.Errf(rpu, yamlfile.Join(field, "requests_per_unit"), "must be ≥ 1 for %s (only the fixed window refuses everything with 0)", r.Algorithm)
	}
	if r.uses(algorithm.UsesBurst) && r.Burst == 0 {
		r.Burst = int64(r.RequestsPerUnit)
	}
}

// algorithmName is the rule's algorithm as the file names it.
func (r *Rule) algorithmName() string {
	if r.alg == nil {
		return peerWindow
	}
	return r.Algorithm
}

// replaceRef is one replaces entry, checked once the file's names are known.
type replaceRef struct {
	rule  *Rule
	name  string
	node  *yaml.Node
	field string
}

// checkReplaces refuses a replaces entry that names no rule of the domain
// (the peer accepts it, and it never takes effect: most likely a typo).
func (p *parser) checkReplaces(d *domain) {
	var names []string
	for _, r := range d.rules {
		if r.Name != "" {
			names = append(names, r.Name)
		}
	}
	for _, ref := range p.replaces {
		if slices.Contains(names, ref.name) {
			continue
		}
		msg := fmt.Sprintf("%q names no rate_limit of domain %q", ref.name, d.name)
		if best := yamlfile.Closest(ref.name, names); best != "" {
			msg += fmt.Sprintf("; did you mean %q?", best)
		}
		p.Errf(ref.node, ref.field, "%s", msg)
	}
}

// wildMatch reports whether value matches a wildcard value split on '*':
// each '*' matches any run of bytes, possibly empty, in order
// (envoyproxy/ratelimit README, Example 9).
func wildMatch(parts []string, value string) bool {
	first, last := parts[0], parts[len(parts)-1]
	if len(value) < len(first)+len(last) || !strings.HasPrefix(value, first) || !strings.HasSuffix(value, last) {
		return false
	}
	mid := value[len(first) : len(value)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(mid, p)
		if i < 0 {
			return false
		}
		mid = mid[i+len(p):]
	}
	return true
}

// match is what a descriptor resolved to in a domain's tree.
type match struct {
	rule *Rule
	// stats is the peer's statistics key without the domain, e.g.
	// "key1_value1.subkey1" (the metrics' key label).
	stats string
	// shared holds, per entry, the wildcard value that replaces the
	// entry's value in the counter key (share_threshold), or "".
	shared []string
}

// lookup walks the tree as envoyproxy/ratelimit's GetLimit does (see
// Config.Lookup), and builds the statistics key as it does: the matched
// path, with the request's values where value_to_metric asks for them, or
// every entry's key_value with detailed_metric.
func (d *domain) lookup(entries []Entry) (match, bool) {
	lv := &d.root
	var stats strings.Builder
	var shared []string
	for i, e := range entries {
		n, how := lv.match(e)
		if n == nil {
			return match{}, false
		}
		if how == matchWild && n.share {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = n.value
		}
		if i > 0 {
			stats.WriteByte('.')
		}
		stats.WriteString(e.Key)
		if shown := n.shown(e, how); shown != "" {
			stats.WriteByte('_')
			stats.WriteString(shown)
		}
		if i == len(entries)-1 {
			if n.rule == nil {
				return match{}, false
			}
			m := match{rule: n.rule, stats: stats.String(), shared: shared}
			if n.rule.DetailedMetric {
				m.stats = detailedKey(entries, shared)
			}
			return m, true
		}
		if len(n.children.valued) == 0 && len(n.children.byKey) == 0 {
			return match{}, false // the request is deeper than the tree
		}
		lv = &n.children
	}
	return match{}, false
}

const (
	matchExact = iota
	matchWild
	matchKey
)

// match finds the node of lv for entry e, as the peer does: its exact key
// and value, then a wildcard value, then the key alone; nil if none.
func (lv *level) match(e Entry) (*node, int) {
	if n := lv.valued[e]; n != nil {
		return n, matchExact
	}
	for _, w := range lv.wild {
		if w.key == e.Key && wildMatch(w.parts, e.Value) {
			return w, matchWild
		}
	}
	return lv.byKey[e.Key], matchKey
}

// shown is the value the statistics key shows for entry e matched by n
// (how): the request's own where value_to_metric asks for it.
func (n *node) shown(e Entry, how int) string {
	switch how {
	case matchExact:
		return e.Value
	case matchWild:
		if !n.share && n.valueToMetric {
			return e.Value
		}
		return n.value
	case matchKey:
		if n.valueToMetric {
			return e.Value
		}
	}
	return ""
}

// detailedKey is the peer's statistics key of a detailed_metric rule:
// every entry as key_value (with the underscore even for an empty value),
// or, when some entry shares a wildcard threshold, those entries with the
// wildcard and the others as key or key_value.
func detailedKey(entries []Entry, shared []string) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		switch {
		case shared != nil && shared[i] != "":
			b.WriteByte('_')
			b.WriteString(shared[i])
		case shared != nil:
			if e.Value != "" {
				b.WriteByte('_')
				b.WriteString(e.Value)
			}
		default:
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// plainKey is the peer's statistics key of a descriptor with a limit
// override: key or key_value per entry (src/config/config_impl.go,
// descriptorKey).
func plainKey(entries []Entry) string {
	var b strings.Builder
	for i, e := range entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	return b.String()
}
