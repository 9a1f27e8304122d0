package sluice_test

import (
	"go/ast"
	"go/token"
	"testing"
)

// maxComplexity bounds the cyclomatic complexity of every function outside
// tests and bench/: 1, plus one per if, for, range, non-default case or
// select clause, && and || (as gocyclo counts).
const maxComplexity = 20

// No function grows past maxComplexity: past it, a function is split
// where its parts have names of their own.
func TestComplexity(t *testing.T) {
	eachSource(t, []string{"bench"}, func(fset *token.FileSet, _ string, f *ast.File) {
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			if c := complexity(fn); c > maxComplexity {
				t.Errorf("%s: %s has cyclomatic complexity %d, above %d", fset.Position(fn.Pos()), fn.Name.Name, c, maxComplexity)
			}
		}
	})
}

func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}
