package policy

import (
	"slices"
	"strings"

	"github.com/sluice-go/sluice"
)

// kinds is the registry of gate kinds, in the order the reference lists
// them. Each kind lives in its own file.
var kinds = []*kind{
	tokenBucketKind,
	gcraKind,
	fixedWindowKind,
	slidingWindowKind,
	slidingLogKind,
	leakyBucketKind,
	concurrencyKind,
	fleetUsageKind,
	utilizationKind,
	ladderKind,
	deadlineKind,
	adaptiveKind,
	reservationKind,
}

// kind is one gate kind: everything a policy file needs to parse, check,
// build and describe a gate of that kind.
type kind struct {
	// name is what a file writes after kind:.
	name string
	// doc is a paragraph for the reference.
	doc string
	// example is one gate of the kind in flow style, for the reference; a
	// test parses it.
	example string
	// scope is the scope of a gate that names none.
	scope sluice.Scope
	// service: the kind protects the whole service; a file may not name a
	// scope.
	service bool
	// stored: the kind keeps its state in the policy's store, so
	// on_failure applies.
	stored bool
	// reason is the reason of the kind's rejections at scope s. Whether
	// they answer 429 or 503 follows from it (sluice.Decision.Entitlement).
	reason func(s sluice.Scope) sluice.Reason
	// new returns empty settings for one gate of the kind, with its fields
	// bound to them.
	new func() params
}

// params are the settings of one gate that belong to its kind.
type params interface {
	// fields returns the kind's settings, bound to this value.
	fields() []field
	// check validates the settings against each other, the file and, for
	// kinds with state on a store, what the store can hold, reporting
	// through c. It never dials anything.
	check(c *checker)
	// build returns the gate. It runs only on checked settings.
	build(b *builder) (sluice.Gate, error)
	// describe is the gate's line in the admission policy spec.
	describe(g *Gate) string
	// stateKey says what the gate's state means: a reload that changes a
	// gate but not its state key builds the new gate over the old state.
	stateKey() string
}

// always returns a reason function that ignores the scope.
func always(r sluice.Reason) func(sluice.Scope) sluice.Reason {
	return func(sluice.Scope) sluice.Reason { return r }
}

func kindNamed(name string) *kind {
	for _, k := range kinds {
		if k.name == name {
			return k
		}
	}
	return nil
}

func kindNames() string { return strings.Join(kindList(), ", ") }

// kindList returns the kinds' names, sorted.
func kindList() []string {
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = k.name
	}
	slices.Sort(names)
	return names
}

// entitlement reports whether g's rejections answer 429 (the caller's own
// usage) rather than 503.
func (g *Gate) entitlement() bool {
	d := sluice.Decision{Reason: g.kind.reason(g.Scope), Scope: g.Scope}
	return d.Entitlement()
}

// fieldKeys lists the keys of fs.
func fieldKeys(fs []field) []string {
	keys := make([]string, len(fs))
	for i, f := range fs {
		keys[i] = f.key
	}
	return keys
}
