package policy

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/limit"
)

// field is one setting of a gate kind, bound to where its value goes: its
// key in the file, what it means (with its unit), its default, and how its
// value is read. The same description drives parsing, the "does not apply"
// and "missing" errors, error placement and the generated reference.
type field struct {
	key      string
	typ      string // the value's type, for the reference
	doc      string // meaning and unit, for the reference
	def      string // the default, as the reference shows it ("" for none)
	required bool
	// sets names the Go parameters this field feeds (constructor arguments
	// or config fields), so that their errors land on this field.
	sets  []string
	parse func(p *parser, v *yaml.Node, path string)
}

// must marks f required.
func (f field) must() field { f.required = true; return f }

// dflt documents f's default.
func (f field) dflt(format string, args ...any) field { f.def = fmt.Sprintf(format, args...); return f }

// nonZero refuses an explicit 0 in f (after dflt, whose default it names):
// the library reads a zero setting as unset, so a 0 written in the file
// would silently become the default.
func (f field) nonZero() field {
	parse, def := f.parse, f.def
	f.typ += ", not 0"
	f.parse = func(p *parser, v *yaml.Node, path string) {
		parse(p, v, path)
		if zeroScalar(v) {
			p.Errf(v, path, "0 reads as unset here; leave the field out for the default (%s), or give a value above 0", def)
		}
	}
	return f
}

// zeroScalar reports whether v is a scalar that reads as 0: a number, a
// share ("0%") or a duration ("0s").
func zeroScalar(v *yaml.Node) bool {
	if v.Kind != yaml.ScalarNode {
		return false
	}
	s := strings.TrimSpace(v.Value)
	if x, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64); err == nil {
		return x == 0
	}
	d, err := time.ParseDuration(s)
	return err == nil && d == 0
}

// feeds names the Go parameters f sets (by default, none: errors of the
// parameter named like the key land on it too).
func (f field) feeds(params ...string) field { f.sets = params; return f }

// bound writes an integer bound, powers of two as 2^n.
func bound(n int64) string {
	if n > 1024 && n&(n-1) == 0 {
		return fmt.Sprintf("2^%d", bits.TrailingZeros64(uint64(n)))
	}
	return strconv.FormatInt(n, 10)
}

// fieldFor returns the key of the field that sets the Go parameter name,
// or "" when none does.
func fieldFor(fs []field, name string) string {
	for _, f := range fs {
		if f.key == name || slices.Contains(f.sets, name) {
			return f.key
		}
	}
	return ""
}

func intField(key, doc string, dst *int64, lo, hi int64) field {
	return field{key: key, typ: fmt.Sprintf("integer in [%s, %s]", bound(lo), bound(hi)), doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.Integer(v, path, lo, hi)
	}}
}

func durationField(key, doc string, dst *time.Duration, min time.Duration) field {
	return field{key: key, typ: "duration ≥ " + min.String(), doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.Duration(v, path, min)
	}}
}

func boolField(key, doc string, dst *bool) field {
	return field{key: key, typ: "boolean", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.Boolean(v, path)
	}}
}

// rateField reads a rate such as 100/s into dst, keeping the text as
// written in text for the spec.
func rateField(key, doc string, dst *limit.Rate, text *string) field {
	return field{key: key, typ: "rate", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*text = p.Str(v, path)
		r, err := limit.ParseRate(*text)
		if err != nil {
			p.fail(v, path, err)
		}
		*dst = r
	}}
}

func shareField(key, doc string, dst *float64) field {
	return field{key: key, typ: "share", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.share(v, path)
	}}
}

// positiveShareField is a share that must not be 0 (0 would read as
// "unset" and fall back to the default).
func positiveShareField(key, doc string, dst *float64) field {
	return field{key: key, typ: "share > 0", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.share(v, path)
		if f, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v.Value), "%"), 64); err == nil && f == 0 {
			p.Errf(v, path, "must be above 0")
		}
	}}
}

func choiceField(key, doc string, dst *string, choices ...string) field {
	return field{key: key, typ: strings.Join(choices, ", "), doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.OneOf(v, path, choices...)
	}}
}

func classesField(key, doc string, dst *[]string) field {
	return field{key: key, typ: "list of classes", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = p.classList(v, path)
	}}
}

// sharesField reads a non-empty list of shares.
func sharesField(key, doc string, dst *[]float64) field {
	return field{key: key, typ: "list of shares", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
			p.Errf(v, path, "want a list of shares, e.g. [25%%, 50%%, 75%%]")
			return
		}
		for j, sv := range v.Content {
			*dst = append(*dst, p.share(sv, fmt.Sprintf("%s[%d]", path, j)))
		}
	}}
}

// thresholdsField reads {enter: share, exit: share}.
func thresholdsField(key, doc string, enter, exit *float64) field {
	return field{key: key, typ: "{enter: share, exit: share}", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		p.Fields(v, path, []string{"enter", "exit"}, func(k string, vv *yaml.Node) {
			if zeroScalar(vv) {
				p.Errf(vv, yamlfile.Join(path, k), "0 reads as unset here; leave the field out for the default, or give a share above 0")
				return
			}
			if k == "enter" {
				*enter = p.share(vv, yamlfile.Join(path, k))
			} else {
				*exit = p.share(vv, yamlfile.Join(path, k))
			}
		})
	}}
}

// sharePerClassField reads a mapping of class to share, e.g. {critical: 20%}.
func sharePerClassField(key, doc string, dst *map[string]float64) field {
	return field{key: key, typ: "mapping of class to share", doc: doc, parse: func(p *parser, v *yaml.Node, path string) {
		*dst = map[string]float64{}
		if v.Kind != yaml.MappingNode {
			p.Errf(v, path, "want a mapping of class to share, e.g. {critical: 20%%}")
			return
		}
		lines := map[string]int{}
		for k := 0; k+1 < len(v.Content); k += 2 {
			class, sv := v.Content[k], v.Content[k+1]
			if !validName(class.Value) {
				p.Errf(class, yamlfile.Join(path, class.Value), "%q is not a class name", class.Value)
				continue
			}
			if first, dup := lines[class.Value]; dup {
				p.Errf(class, yamlfile.Join(path, class.Value), "class %s listed twice (first at line %d)", class.Value, first)
				continue
			}
			lines[class.Value] = class.Line
			(*dst)[class.Value] = p.share(sv, yamlfile.Join(path, class.Value))
		}
	}}
}

// share parses a fraction: 0.2 or 20%.
func (p *parser) share(v *yaml.Node, path string) float64 {
	if v.Kind != yaml.ScalarNode {
		p.Errf(v, path, "want a share such as 0.2 or 20%%, got %s", yamlfile.KindName(v))
		return 0
	}
	s, pct := strings.CutSuffix(strings.TrimSpace(v.Value), "%")
	f, err := strconv.ParseFloat(s, 64)
	if pct {
		f /= 100
	}
	if err != nil || math.IsNaN(f) || f < 0 || f > 10 {
		p.Errf(v, path, "%q is not a share (want e.g. 0.2 or 20%%)", v.Value)
		return 0
	}
	return f
}

// classList parses a non-empty list of class names.
func (p *parser) classList(v *yaml.Node, path string) []string {
	if v.Kind != yaml.SequenceNode || len(v.Content) == 0 {
		p.Errf(v, path, "want a non-empty list of class names")
		return nil
	}
	var out []string
	for j, c := range v.Content {
		at := fmt.Sprintf("%s[%d]", path, j)
		name := p.Str(c, at)
		switch {
		case name != "" && !validName(name):
			p.Errf(c, at, "%q: class names use a-z, 0-9, '_' and '-'", name)
		case slices.Contains(out, name):
			p.Errf(c, at, "class %s listed twice", name)
		}
		out = append(out, name)
	}
	return out
}
