package policy

import (
	"fmt"
	"strings"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/gate"
)

// commonDocs documents the fields every gate has, for the reference.
var commonDocs = []struct{ key, def, doc string }{
	{"name", "required", "the gate's name in metrics, headers and the admin API: a-z, 0-9, '_', '.' and '-', at most 64"},
	{"kind", "required", "one of the kinds below"},
	{"scope", "the kind's", spellings[sluice.Scope]() + ": what the limit is counted over; kinds that protect the whole service take none"},
	{"mode", sluice.ModeEnforce.String(), spellings[sluice.Mode]() + ": shadow decides and records but never rejects; switchable at run time"},
	{"on_failure", "the store's", spellings[gate.FailurePolicy]() + ": what a gate with state in the store decides while the store fails"},
	{"retry_hint", gate.DefaultRetryHint.String(), "Retry-After of rejections without an exact wait (concurrency, shedding)"},
	{"classes", "all", "the classes the gate applies to; requests of other classes pass it untouched"},
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

// Reference returns the reference of the gates section of a policy file
// as Markdown: the fields every gate has, then each kind with what it does,
// what its rejections answer and its fields (meaning and unit, default or
// "required"). It is generated from the same kind registry that parses and
// builds gates, so it cannot drift from them.
func Reference() string {
	var b strings.Builder
	b.WriteString("# Gate kinds\n\n")
	b.WriteString("Generated from the gate-kind registry of package policy (`go test ./policy -run TestReference -rewrite`).\n\n")
	b.WriteString("## Fields of every gate\n\n| field | default | meaning |\n|---|---|---|\n")
	for _, c := range commonDocs {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", c.key, c.def, c.doc)
	}
	for _, k := range kinds {
		fmt.Fprintf(&b, "\n## `%s`\n\n%s\n\n", k.name, k.doc)
		fmt.Fprintf(&b, "Default scope: %s", k.scope)
		if k.service {
			b.WriteString(" (always: it protects the whole service)")
		}
		if k.stored {
			b.WriteString("; state in the policy's store, so `on_failure` applies")
		}
		b.WriteString(".\n\n| field | default | meaning |\n|---|---|---|\n")
		for _, f := range k.new().fields() {
			def := f.def
			switch {
			case f.required:
				def = "required"
			case def == "":
				def = "none"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s |\n", f.key, def, strings.ReplaceAll(f.doc, "|", "\\|"))
		}
	}
	return b.String()
}
