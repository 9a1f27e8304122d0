package policy

import (
	"fmt"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
)

// commonDocs documents the fields every gate has, for the reference.
var commonDocs = []struct{ key, typ, def, doc string }{
	{"name", "string", "required", "the gate's name in metrics, headers and the admin API: a-z, 0-9, '_', '.' and '-', at most 64"},
	{"kind", "string", "required", "one of the kinds below"},
	{"scope", spellings[sluice.Scope](), "the kind's", "what the limit is counted over; kinds that protect the whole service take none; tenant and tenant_operation need identity.tenant; client counts per client address (identity.client_ip finds it), beside the tenant's own limits"},
	{"mode", spellings[sluice.Mode](), sluice.ModeEnforce.String(), "shadow decides and records but never rejects; switchable at run time"},
	{"on_failure", spellings[gate.FailurePolicy](), "the store's", "what a gate with state in the store decides while the store fails"},
	{"retry_hint", "duration ≥ 1ms", gate.DefaultRetryHint.String(), "Retry-After of rejections without an exact wait (concurrency, shedding)"},
	{"classes", "list of classes", "all", "the classes the gate applies to; requests of other classes pass it untouched"},
}

// spellings lists the names of an enum whose values count up from zero and
// whose String says "unknown" past the last.
func spellings[T interface {
	~uint8 | ~uint32
	String() string
}]() string {
	var names []string
	for v := T(0); v.String() != "unknown"; v++ {
		names = append(names, v.String())
	}
	return strings.Join(names, ", ")
}

// valueSyntax documents the value types the tables name.
const valueSyntax = `## Values

- **duration**: a Go duration: a number and a unit, ns, us (or µs), ms, s, m, h, combined as in 1m30s. No days: write 24h.
- **rate**: N/PERIOD with no spaces: N is a decimal number, with an optional fraction and exponent (100, 2.5, 1e3);
  PERIOD is a unit, ns, us (or µs), ms, s, m, h or d, or a duration that starts with a digit (10s, 1m30s).
  Examples: 100/s, 5/m, 1/h, 2.5/s, 1000/10s. Words (10/sec, 5/min, 1/hour, 1/day) are refused, and so are spaces.
- **share**: a fraction, 0.2, or a percentage, 20%.
- **integer**: decimal digits, with optional _ between them (1_000); the range is in the type.
- **header name**: an HTTP field name (letters, digits and !#$%&'*+.^_` + "`" + `|~-), in any case.
- **class name**: a-z, 0-9, '_', '.' and '-', starting with a letter or digit, at most 64.
- Every problem is reported as FILE:LINE: FIELD: message, e.g. ` + "`p.yaml:12: gates[1].rate: ...`" + `; an unknown key names the
  closest known one.
`

// Reference returns the reference of a policy file as Markdown: an example
// that writes every key, the value syntax, every key outside the gates
// (type, default, meaning and unit, example), the fields every gate has,
// then each gate kind with what it does, what its rejections answer, its
// fields and an example. It is generated from the tables the parser reads
// its keys from (the schema and the gate-kind registry), so it cannot
// drift from them; make test checks docs/policy.md against it.
func Reference() string {
	var b strings.Builder
	b.WriteString("# Policy file reference\n\n")
	b.WriteString("Generated from the tables package policy parses with (`go test ./policy -run TestReference -rewrite`); " +
		"`sluice check --explain NAME` prints one section or gate kind. A policy file is YAML: one document, spaces for indentation.\n\n")
	b.WriteString("## Every key at once\n\nThis file writes every key outside the gates (its values are examples, not defaults) and parses:\n\n```yaml\n")
	b.WriteString(exampleFile())
	b.WriteString("```\n\n")
	b.WriteString(valueSyntax)
	b.WriteString("\n## Top-level keys\n\n| key | type | default | meaning | example |\n|---|---|---|---|---|\n")
	for i := range schema {
		writeRow(&b, "", &schema[i])
	}
	for i := range schema {
		if len(schema[i].sub) > 0 {
			b.WriteString("\n")
			writeSection(&b, &schema[i])
		}
	}
	b.WriteString("\n## Fields of every gate\n\n| field | type | default | meaning |\n|---|---|---|---|\n")
	for _, c := range commonDocs {
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", c.key, c.typ, c.def, c.doc)
	}
	b.WriteString("\n# Gate kinds\n")
	for _, k := range kinds {
		b.WriteString("\n")
		writeKind(&b, k)
	}
	return b.String()
}

// writeSection writes the table of a section and of its sub-sections.
func writeSection(b *strings.Builder, k *key) {
	fmt.Fprintf(b, "## `%s`\n\n%s (%s; default: %s).\n\n", k.key, capitalize(k.doc), k.typ, k.def)
	if len(k.sub) == 0 {
		fmt.Fprintf(b, "Example: `%s: %s`\n", k.key, k.example)
		return
	}
	b.WriteString("| key | type | default | meaning | example |\n|---|---|---|---|---|\n")
	var walk func(prefix string, ks []key)
	walk = func(prefix string, ks []key) {
		for i := range ks {
			writeRow(b, prefix, &ks[i])
			if len(ks[i].sub) > 0 {
				walk(prefix+ks[i].key+".", ks[i].sub)
			}
		}
	}
	walk(k.key+".", k.sub)
}

func writeRow(b *strings.Builder, prefix string, k *key) {
	ex := "`" + k.example + "`"
	if k.example == "" {
		ex = "see below"
		if prefix != "" {
			ex = "the keys below"
		}
	}
	fmt.Fprintf(b, "| `%s%s` | %s | %s | %s | %s |\n", prefix, k.key, cell(k.typ), cell(k.def), cell(k.doc), cell(ex))
}

// writeKind writes one gate kind's reference.
func writeKind(b *strings.Builder, k *kind) {
	fmt.Fprintf(b, "## `%s`\n\n%s\n\n", k.name, k.doc)
	fmt.Fprintf(b, "Default scope: %s", k.scope)
	if k.service {
		b.WriteString(" (always: it protects the whole service)")
	}
	if k.stored {
		b.WriteString("; state in the policy's store, so `on_failure` applies")
	}
	fmt.Fprintf(b, ".\n\n```yaml\ngates:\n  - %s\n```\n\n| field | type | default | meaning |\n|---|---|---|---|\n", k.example)
	for _, f := range k.new().fields() {
		def := f.def
		switch {
		case f.required:
			def = "required"
		case def == "":
			def = "none"
		}
		fmt.Fprintf(b, "| `%s` | %s | %s | %s |\n", f.key, cell(f.typ), cell(def), cell(f.doc))
	}
}

// cell escapes a table cell.
func cell(s string) string { return strings.ReplaceAll(s, "|", "\\|") }

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
