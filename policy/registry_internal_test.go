package policy

import (
	"context"
	"fmt"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
)

// The kind registry is closed: what a kind is (its settings, checks, gate,
// spec line, and whether it needs to see work end or spends a lease) lives
// in its own file, and no other file switches over the kinds' settings.
// Code that asks such a question of every kind asks an interface the kinds
// implement (workBound, leaser, stateMachiner), so a new kind cannot be
// forgotten by a switch elsewhere.
func TestNoSwitchOverKindsOutsideTheirFiles(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	declared := map[string]string{} // params type -> its file
	parsed := map[string]*ast.File{}
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := goparser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		parsed[name] = f
		for _, d := range f.Decls {
			if gd, ok := d.(*ast.GenDecl); ok && gd.Tok == token.TYPE {
				for _, s := range gd.Specs {
					if ts := s.(*ast.TypeSpec); strings.HasSuffix(ts.Name.Name, "Params") {
						declared[ts.Name.Name] = name
					}
				}
			}
		}
	}
	if len(declared) < len(kinds)-3 {
		t.Fatalf("found %d settings types for %d kinds", len(declared), len(kinds))
	}
	for name, f := range parsed {
		check := func(e ast.Expr) {
			if st, ok := e.(*ast.StarExpr); ok {
				e = st.X
			}
			id, ok := e.(*ast.Ident)
			if !ok {
				return
			}
			if home, ok := declared[id.Name]; ok && home != name {
				t.Errorf("%s: a switch or assertion over %s, a kind's settings declared in %s: ask an interface the kinds implement in their own files",
					fset.Position(id.Pos()), id.Name, home)
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.TypeAssertExpr:
				if n.Type != nil {
					check(n.Type)
				}
			case *ast.CaseClause:
				for _, e := range n.List {
					check(e)
				}
			}
			return true
		})
	}
}

// echoKind is a throwaway kind: it admits the first `admit` requests a
// gate sees and refuses the rest.
var echoKind = &kind{
	name:    "echo_test",
	example: `{name: echo, kind: echo_test, admit: 1}`,
	doc:     "A throwaway kind that admits its first admit requests (a test of the registry).",
	scope:   sluice.ScopeService,
	service: true,
	reason:  always(sluice.ReasonConcurrency),
	new:     func() params { return &echoParams{} },
}

type echoParams struct{ admit int64 }

func (p *echoParams) fields() []field {
	return []field{intField("admit", "requests admitted before every other is refused", &p.admit, 1, 100).must()}
}
func (p *echoParams) check(c *checker) {}
func (p *echoParams) describe(g *Gate) string {
	return fmt.Sprintf("admits its first %d requests", p.admit)
}
func (p *echoParams) stateKey() string { return "" }
func (p *echoParams) build(b *builder) (sluice.Gate, error) {
	return &echoGate{name: b.g.Name, admit: p.admit}, nil
}

type echoGate struct {
	name  string
	admit int64
	seen  atomic.Int64
}

func (g *echoGate) Name() string { return g.name }
func (g *echoGate) Decide(ctx context.Context, r *sluice.Request, now clock.Instant, d *sluice.Decision) sluice.Permit {
	var p sluice.Permit
	*d, p = g.decide(ctx, r, now)
	return p
}

func (g *echoGate) decide(_ context.Context, _ *sluice.Request, _ clock.Instant) (sluice.Decision, sluice.Permit) {
	if g.seen.Add(1) <= g.admit {
		return sluice.Decision{Admitted: true}, 0
	}
	return sluice.Decision{Reason: sluice.ReasonConcurrency, Scope: sluice.ScopeService, Gate: g.name}, 0
}
func (g *echoGate) Release(*sluice.Request, sluice.Permit, sluice.Completion) {}

// Adding a gate kind is its file and one line in the registry: a
// throwaway kind, registered alone, parses (with its errors at file:line),
// checks, explains, is in the reference and the spec, builds into a chain
// that decides with it, and is known to the decision-only check. The
// simulator and sluice check build through Parse and Build, as here.
func TestAThrowawayKindEndToEnd(t *testing.T) {
	saved := kinds
	kinds = append(append([]*kind(nil), kinds...), echoKind) // the one registration line
	t.Cleanup(func() { kinds = saved })

	src := "version: 1\nstore: {backend: memory}\ngates:\n  - {name: echo, kind: echo_test, admit: 1}\n"
	f, err := Parse("echo.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if err := Validate(f); err != nil {
		t.Fatal(err)
	}
	if _, err := Parse("bad.yaml", []byte(strings.Replace(src, "admit: 1", "admit: 0", 1))); err == nil ||
		!strings.Contains(err.Error(), "bad.yaml:4") || !strings.Contains(err.Error(), "admit") {
		t.Fatalf("admit 0: %v; want an error at bad.yaml:4 naming admit", err)
	}
	if _, err := Parse("bad.yaml", []byte(strings.Replace(src, "admit: 1", "admitt: 1", 1))); err == nil || !strings.Contains(err.Error(), `"admit"`) {
		t.Fatalf("a misspelt field: %v; want a did-you-mean", err)
	}
	if s, err := Explain("echo_test"); err != nil || !strings.Contains(s, "throwaway") || !strings.Contains(s, "admit") {
		t.Fatalf("explain: %q, %v", s, err)
	}
	if ref := Reference(); !strings.Contains(ref, "echo_test") {
		t.Fatal("the reference leaves the kind out")
	}
	if spec := f.SpecText(); !strings.Contains(spec, "echo: admits its first 1 requests") {
		t.Fatalf("the spec leaves the gate out:\n%s", spec)
	}
	if err := CheckDecisionOnly(f); err != nil {
		t.Fatalf("a kind that needs nothing of the work is refused for decision-only: %v", err)
	}
	rt, err := Build(f, nil, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	ctx := context.Background()
	d1, tk := rt.Chain.Decide(ctx, &sluice.Request{})
	tk.Done(sluice.OutcomeUseful)
	d2, _ := rt.Chain.Decide(ctx, &sluice.Request{})
	if !d1.Admitted || d2.Admitted || d2.Gate != "echo" {
		t.Fatalf("decisions %+v, %+v; want the first admitted and the second refused by echo", d1, d2)
	}
}
