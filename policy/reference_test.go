package policy

import (
	"flag"
	"os"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite docs/policy-gates.md from the kind registry")

// The committed reference is what the registry generates: a kind, a field,
// a default or a doc changed in code changes the reference in the same
// commit.
func TestReference(t *testing.T) {
	const path = "../docs/policy-gates.md"
	got := Reference()
	if *rewrite {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != got {
		t.Fatalf("%s is not what the registry generates; go test ./policy -run TestReference -rewrite", path)
	}
}
