package sluice_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// eachSource parses every non-test Go file of the tree below the module's
// root, skipping hidden folders, testdata and the folders skip names (a
// path from the root such as "bench", or "*internal" for every folder of
// that name), and calls fn with each. It returns how many
// files it parsed.
func eachSource(t *testing.T, skip []string, fn func(fset *token.FileSet, path string, f *ast.File)) int {
	t.Helper()
	fset := token.NewFileSet()
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || skipped(skip, path, d.Name())) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		n++
		fn(fset, path, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// skipped reports whether skip names the folder at path: by its path from
// the root, or as "*name" any folder of that name.
func skipped(skip []string, path, name string) bool {
	for _, s := range skip {
		if s == path || s == "*"+name {
			return true
		}
	}
	return false
}
