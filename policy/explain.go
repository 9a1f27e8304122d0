package policy

import (
	"fmt"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"strings"
)

// ExplainNames lists what Explain knows: the top-level sections of a
// policy file, then the gate kinds.
func ExplainNames() []string {
	var names []string
	for _, k := range schema {
		names = append(names, k.key)
	}
	for _, k := range kinds {
		names = append(names, k.name)
	}
	return names
}

// Explain returns the reference of one gate kind or one top-level section
// of a policy file, as the full reference (Reference) has it. An unknown
// name is an error listing the known ones.
func Explain(name string) (string, error) {
	var b strings.Builder
	for i := range schema {
		if schema[i].key == name {
			writeSection(&b, &schema[i])
			return b.String(), nil
		}
	}
	if k := kindNamed(name); k != nil {
		writeKind(&b, k)
		return b.String(), nil
	}
	names := ExplainNames()
	if c := yamlfile.Closest(name, names); c != "" {
		return "", fmt.Errorf("policy: nothing named %q to explain: did you mean %q? (known: %s)", name, c, strings.Join(names, ", "))
	}
	return "", fmt.Errorf("policy: nothing named %q to explain (known: %s)", name, strings.Join(names, ", "))
}
