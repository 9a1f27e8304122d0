package policy

import (
	"strings"
	"testing"

	"github.com/sluice-go/sluice/internal/tracefile"
)

// The committed reference is what the schema and the registry generate: a
// key, a kind, a field, a default or a doc changed in code changes the
// reference in the same commit.
func TestReference(t *testing.T) {
	tracefile.Generated(t, "../docs/policy.md", Reference(), "go test ./policy -run TestReference -rewrite")
}

// The example that writes every key of the schema parses: every
// documented key is one the parser reads, with a valid example.
func TestSchemaExamplesParse(t *testing.T) {
	src := exampleFile()
	t.Setenv("REDIS_PASSWORD", "example") // store.password_env's example
	f, err := Parse("every-key.yaml", []byte(src))
	if err != nil {
		t.Fatalf("%v\n%s", err, src)
	}
	if len(f.identity.tenantParts()) != 5 || len(f.identity.ClientIP.TrustedProxies) != 2 || f.Store.Backend != BackendRedis || len(f.routes) != 1 {
		t.Fatalf("the example's keys did not all land: %+v", f)
	}
	var walk func(path string, ks []key)
	walk = func(path string, ks []key) {
		for _, k := range ks {
			if k.typ == "" || k.def == "" || k.doc == "" || (k.example == "" && len(k.sub) == 0 && k.key != "gates") {
				t.Errorf("%s%s: type, default, doc or example missing", path, k.key)
			}
			walk(path+k.key+".", k.sub)
		}
	}
	walk("", schema)
}

// Each kind's example parses as a gate, and each field has a type and a
// doc.
func TestKindExamplesParse(t *testing.T) {
	const head = "version: 1\nidentity: {tenant: {header: X-Api-Key}}\nroutes:\n  - {match: {path: /a}, class: critical}\n  - {match: {path: /b}, class: sheddable}\ngates:\n  - "
	for _, k := range kinds {
		if k.example == "" || !strings.Contains(k.example, "kind: "+k.name) {
			t.Errorf("%s: no example of the kind", k.name)
			continue
		}
		if _, err := Parse(k.name+".yaml", []byte(head+k.example+"\n")); err != nil {
			t.Errorf("%s: %v", k.name, err)
		}
		for _, f := range k.new().fields() {
			if f.typ == "" || f.doc == "" {
				t.Errorf("%s.%s: type or doc missing", k.name, f.key)
			}
		}
	}
}

func TestExplain(t *testing.T) {
	for _, name := range []string{"token_bucket", "identity", "store"} {
		text, err := Explain(name)
		if err != nil || !strings.Contains(text, "`"+name+"`") || !strings.Contains(Reference(), text) {
			t.Errorf("%s: %v\n%s", name, err, text)
		}
	}
	if text, err := Explain("version"); err != nil || !strings.Contains(text, "only 1 exists") {
		t.Errorf("version: %v\n%s", err, text)
	}
	if _, err := Explain("token_buckt"); err == nil || !strings.Contains(err.Error(), "token_bucket") {
		t.Errorf("unknown name: %v", err)
	}
}
