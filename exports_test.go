package sluice_test

import (
	"go/ast"
	"go/token"
	"testing"
)

// maxExported bounds the library module's exported identifiers: top-level
// names (types, functions, constants, variables) and the exported methods
// of exported types, interface methods included, in the packages a user
// imports (everything but internal/, the tools' and gRPC modules, bench/
// and examples/). The count was 858 when the surface was last reviewed
// (the Envoy rate limit service moved to module grpcgate, the concrete
// gates and controllers behind their constructors, the proxy's exchange API
// and the wire formats to internal/); a new export has to make room.
const maxExported = 642

func TestExportedIdentifiers(t *testing.T) {
	n := 0
	eachSource(t, []string{"*internal", "cmd", "bench", "grpcgate", "examples", "docs"}, func(_ *token.FileSet, _ string, f *ast.File) {
		n += exported(f)
	})
	t.Logf("%d exported identifiers (at most %d)", n, maxExported)
	if n > maxExported {
		t.Errorf("%d exported identifiers, above %d: unexport what users do not need, or move it under internal/", n, maxExported)
	}
	if n < maxExported-50 {
		t.Errorf("%d exported identifiers: lower maxExported to keep the room", n)
	}
}

// exported counts f's exported top-level names and exported methods of
// exported types.
func exported(f *ast.File) int {
	n := 0
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() {
				continue
			}
			if d.Recv == nil || receiverExported(d.Recv.List[0].Type) {
				n++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if !s.Name.IsExported() {
						continue
					}
					n++
					if it, ok := s.Type.(*ast.InterfaceType); ok {
						for _, m := range it.Methods.List {
							for _, name := range m.Names {
								if name.IsExported() {
									n++
								}
							}
						}
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}

// receiverExported reports whether a method's receiver type is exported.
func receiverExported(t ast.Expr) bool {
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}
