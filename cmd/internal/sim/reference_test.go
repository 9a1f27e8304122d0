package sim

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/tracefile"
)

// section is one mapping of a scenario file: its keys (the parser's list)
// and the Go type whose fields they set.
type section struct {
	title, path, typ string
	keys             []string
}

var sections = []section{
	{"Top-level keys", "", "Scenario", scenarioFields},
	{"`server`", "server.", "Server", serverFields},
	{"`client`", "client.", "Client", clientFields},
	{"`classes` (a list)", "classes[].", "Class", classFields},
	{"`phases` (a list)", "phases[].", "Phase", phaseFields},
	{"Distributions (`client.timeout`, `classes[].service`, `classes[].timeout`)", "", "Dist", distFields},
}

// keyField maps the keys whose field is not the key in CamelCase.
var keyField = map[string]string{"service_cv": "ServiceCV", "cv": "CV", "dist": "Kind", "loads": "Loads"}

// parserOnly documents the keys that set no field of their own.
var parserOnly = map[string][2]string{
	"base": {"string", "A built-in scenario that the file starts from: the file's keys replace the base's (" + strings.Join(Builtins(), ", ") + ")."},
}

// fieldDocs reads the doc comment and type of every field of the struct
// types of scenario.go. A field without its own comment shares the one of
// the fields before it (Go groups them so: "Step ... and Warmup ...").
func fieldDocs(t *testing.T) (map[string]map[string][2]string, map[string]string) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "scenario.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]map[string][2]string{}
	types := map[string]string{}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.TYPE {
			continue
		}
		for _, sp := range gd.Specs {
			ts := sp.(*ast.TypeSpec)
			st, ok := ts.Type.(*ast.StructType)
			if !ok {
				continue
			}
			types[ts.Name.Name] = text(gd.Doc)
			m := map[string][2]string{}
			doc := ""
			for _, fl := range st.Fields.List {
				if fl.Doc != nil {
					doc = text(fl.Doc)
				}
				for _, n := range fl.Names {
					m[n.Name] = [2]string{typeName(fl.Type), doc}
				}
			}
			fields[ts.Name.Name] = m
		}
	}
	return fields, types
}

func text(g *ast.CommentGroup) string {
	if g == nil {
		return ""
	}
	return strings.Join(strings.Fields(g.Text()), " ")
}

// typeName is a field's type in the file's terms.
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		switch x.Name {
		case "string":
			return "string"
		case "float64":
			return "number"
		case "int", "int64", "uint64":
			return "integer"
		case "bool":
			return "boolean"
		case "Dist":
			return "duration or distribution"
		case "Server", "Client":
			return "mapping"
		}
		return x.Name
	case *ast.SelectorExpr:
		if x.Sel.Name == "Duration" {
			return "duration"
		}
	case *ast.ArrayType:
		switch el := typeName(x.Elt); el {
		case "Class", "Phase":
			return "list of mappings"
		default:
			return "list of " + el + "s"
		}
	case *ast.MapType:
		return "mapping of names to " + typeName(x.Value) + "s"
	}
	return fmt.Sprintf("%T", e)
}

func camel(key string) string {
	if f, ok := keyField[key]; ok {
		return f
	}
	var b strings.Builder
	for _, w := range strings.Split(key, "_") {
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}

// scenarioReference is the reference of scenario files, from the parser's
// key lists and the doc comments of the fields they set.
func scenarioReference(t *testing.T) string {
	fields, types := fieldDocs(t)
	var b strings.Builder
	b.WriteString("# Scenario file reference (`sluice sim --scenario FILE`)\n\n")
	b.WriteString("Generated from the keys the scenario parser reads and the doc comments of the fields they set " +
		"(`go test ./cmd/internal/sim -run TestScenarioReference -rewrite`); a key without a documented field fails the test. " +
		"Durations are Go durations (250ms, 1m30s); errors name the file, line and field. " +
		"An example: [examples/scenarios/retry-storm.yaml](../examples/scenarios/retry-storm.yaml).\n")
	for _, s := range sections {
		fmt.Fprintf(&b, "\n## %s\n\n", s.title)
		if s.typ == "Dist" {
			b.WriteString(types["Dist"] + " A duration alone (250ms) is a constant.\n\n")
		}
		b.WriteString("| key | type | meaning |\n|---|---|---|\n")
		for _, k := range s.keys {
			td, ok := fields[s.typ][camel(k)]
			if p, only := parserOnly[k]; only && s.typ == "Scenario" {
				td, ok = p, true
			}
			if !ok || td[1] == "" {
				t.Errorf("%s%s: no documented field %s.%s", s.path, k, s.typ, camel(k))
				continue
			}
			fmt.Fprintf(&b, "| `%s%s` | %s | %s |\n", s.path, k, td[0], strings.ReplaceAll(td[1], "|", "\\|"))
		}
	}
	return b.String()
}

// The committed scenario reference is what the parser's keys and the
// fields' docs generate: a key added to the parser without a documented
// field, or a doc changed, fails until the reference is regenerated.
func TestScenarioReference(t *testing.T) {
	tracefile.Generated(t, "../../../docs/scenario.md", scenarioReference(t), "go test ./cmd/internal/sim -run TestScenarioReference -rewrite")
}
