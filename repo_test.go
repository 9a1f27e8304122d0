package sluice_test

import (
	"bytes"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// No build output is tracked: every tracked file is at most 1 MiB (the
// largest, the docs' plots and the README, are under 200 KiB), and none is
// an executable binary. A 57 MB build of the CLI was committed once and
// went unnoticed for two sessions.
func TestNoBuildOutputsTracked(t *testing.T) {
	out, err := exec.Command("git", "ls-files", "-z").Output()
	if err != nil {
		t.Skipf("not a git checkout: %v", err)
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		st, err := os.Stat(name)
		if err != nil {
			continue // deleted in the work tree
		}
		if st.Size() > 1<<20 {
			t.Errorf("%s: %d bytes tracked (at most 1 MiB; build outputs belong in .gitignore)", name, st.Size())
			continue
		}
		f, err := os.Open(name)
		if err != nil {
			continue
		}
		head := make([]byte, 4)
		n, _ := f.Read(head)
		f.Close()
		if bytes.Equal(head[:n], []byte("\x7fELF")) || st.Mode()&0o111 != 0 && !strings.HasSuffix(name, ".sh") && !strings.HasPrefix(name, ".ci/") && n == 4 && head[0] != '#' {
			t.Errorf("%s: an executable binary is tracked", name)
		}
	}
}

// The README's library snippet is ExampleChain_Do's body, which go test
// compiles and runs: the front page cannot drift from code that works.
func TestReadmeSnippetIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	ex, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, body, ok := strings.Cut(string(ex), "func ExampleChain_Do() {\n")
	body, _, ok2 := strings.Cut(body, "\t// Output:")
	if !ok || !ok2 {
		t.Fatal("example_test.go: ExampleChain_Do and its Output comment not found")
	}
	var want []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n"), "\n") {
		want = append(want, strings.TrimPrefix(l, "\t"))
	}
	_, block, ok := strings.Cut(string(readme), "## The library in a few lines")
	_, block, ok2 = strings.Cut(block, "```go\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("README.md: the library section's go block not found")
	}
	if got := strings.TrimRight(block, "\n"); got != strings.Join(want, "\n") {
		t.Errorf("README.md's library snippet differs from ExampleChain_Do's body:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

// Every package with tests checks for leaked goroutines once its tests end
// (goleak.VerifyTestMain in a TestMain): a test that leaves a goroutine
// running fails its package instead of slowing or breaking the next.
// (bench/ holds the peer comparisons of make bench, which make test does not
// run.)
func TestEveryPackageChecksLeaks(t *testing.T) {
	dirs := map[string]bool{} // dir -> has a leak check
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		dir := filepath.Dir(path)
		if dir == "bench" {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dirs[dir] = dirs[dir] || bytes.Contains(data, []byte("goleak.VerifyTestMain"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) < 30 {
		t.Fatalf("found tests in only %d folders", len(dirs))
	}
	for dir, ok := range dirs {
		if !ok {
			t.Errorf("%s: no goleak.VerifyTestMain in its tests (add a leak_test.go)", dir)
		}
	}
}
