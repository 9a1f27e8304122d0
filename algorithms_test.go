package sluice_test

import (
	"go/ast"
	"go/token"
	"testing"
)

// algorithmTypes are package limit's algorithms.
var algorithmTypes = map[string]bool{"TokenBucket": true, "GCRA": true, "FixedWindow": true, "SlidingWindow": true,
	"SlidingLog": true, "LeakyBucket": true, "Concurrency": true}

// The algorithm registry is closed: an algorithm is its step function
// (package limit), its Lua twin (its file in store/redis, which registers
// itself) and one line of internal/algorithm's registry, and no other code
// switches or asserts over package limit's algorithm types, so a new
// algorithm cannot be forgotten by a switch elsewhere (the policy file's
// kinds and the Envoy rate limit service build through the registry).
// store/storetest, the conformance suite, exercises each algorithm by
// design.
func TestNoSwitchOverAlgorithmsOutsideTheRegistry(t *testing.T) {
	n := eachSource(t, []string{"limit", "store/storetest"}, func(fset *token.FileSet, _ string, f *ast.File) {
		check := func(e ast.Expr) {
			ast.Inspect(e, func(x ast.Node) bool {
				if sel, ok := x.(*ast.SelectorExpr); ok {
					if pkg, ok := sel.X.(*ast.Ident); ok && pkg.Name == "limit" && algorithmTypes[sel.Sel.Name] {
						t.Errorf("%s: a switch or assertion over limit.%s: build algorithms through internal/algorithm's registry",
							fset.Position(sel.Pos()), sel.Sel.Name)
					}
				}
				return true
			})
		}
		ast.Inspect(f, func(x ast.Node) bool {
			switch x := x.(type) {
			case *ast.TypeAssertExpr:
				if x.Type != nil {
					check(x.Type)
				}
			case *ast.TypeSwitchStmt:
				for _, c := range x.Body.List {
					for _, e := range c.(*ast.CaseClause).List {
						check(e)
					}
				}
			}
			return true
		})
	})
	if n < 100 {
		t.Fatalf("walked only %d files", n)
	}
}
