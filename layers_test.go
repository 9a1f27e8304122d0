package sluice_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// layerOf places every package of the module (by its path below the
// module, "" for the root) in a layer of the package doc's map; a
// trailing "/" places a whole subtree.
var layerOf = []struct {
	name string
	pkgs []string
}{
	{"vocabulary", []string{"", "clock", "internal/buildinfo", "internal/fakeclock", "internal/gatetest", "internal/leakcheck",
		"internal/logbuf", "internal/param", "internal/poll", "internal/redistest", "internal/stall",
		"internal/sysmon", "internal/topk", "internal/tracefile", "internal/yamlfile"}},
	{"algorithms and wire formats", []string{"limit", "internal/leasealloc", "internal/servicetime", "internal/wire", "identify"}},
	{"stores", []string{"store", "store/memory", "store/redis", "store/storetest", "internal/algorithm"}},
	{"gates", []string{"gate", "adaptive", "shed", "fair", "queue", "lease"}},
	{"assembly", []string{"policy", "metrics"}},
	{"surfaces", []string{"httpgate", "internal/httpcore", "client", "proxy", "serve", "internal/host"}},
	{"examples", []string{"examples"}},
}

// sameLayer are the imports allowed within a layer: a package on the
// interface it implements, or on the vocabulary beside it.
var sameLayer = map[[2]string]bool{
	{"", "clock"}:                          true,
	{"internal/fakeclock", "clock"}:        true,
	{"store/memory", "store"}:              true,
	{"store/redis", "store"}:               true,
	{"store/storetest", "store"}:           true,
	{"httpgate", "internal/httpcore"}:      true, // the public face of the implementation
	{"proxy", "httpgate"}:                  true,
	{"proxy", "internal/httpcore"}:         true,
	{"serve", "httpgate"}:                  true,
	{"serve", "internal/httpcore"}:         true,
	{"internal/host", "internal/httpcore"}: true,
	{"proxy", "internal/host"}:             true,
	{"serve", "internal/host"}:             true,
	{"identify", "internal/wire"}:          true,
	{"internal/leasealloc", "limit"}:       true,
	// the algorithm registry builds each algorithm on either store
	{"internal/algorithm", "store"}:        true,
	{"internal/algorithm", "store/memory"}: true,
	{"internal/algorithm", "store/redis"}:  true,
}

// The layers of the package doc hold: every package imports only from
// the layers below its own (and within its layer only what sameLayer
// lists), so a gate package never reaches for another gate, a store for a
// gate, or a gate for the policy that assembles it. A new package fails
// here until it is placed.
func TestLayers(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/sluice-go/sluice"
	rel := func(p string) (string, bool) {
		if p == mod {
			return "", true
		}
		r, ok := strings.CutPrefix(p, mod+"/")
		return r, ok
	}
	layer := func(p string) int {
		for i, l := range layerOf {
			if slices.Contains(l.pkgs, p) {
				return i
			}
		}
		return -1
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fs := strings.Fields(line)
		p, _ := rel(fs[0])
		lp := layer(p)
		if lp < 0 {
			t.Errorf("package %q is in no layer: place it in layerOf and the package doc's map", p)
			continue
		}
		for _, imp := range fs[1:] {
			q, ok := rel(imp)
			if !ok {
				continue
			}
			lq := layer(q)
			switch {
			case lq < 0:
				continue // reported as a package of its own
			case lq > lp:
				t.Errorf("%q (%s) imports %q (%s), a layer above it", p, layerOf[lp].name, q, layerOf[lq].name)
			case lq == lp && !sameLayer[[2]string{p, q}] && lp != 0:
				t.Errorf("%q imports %q, in the same layer (%s): move what they share a layer down", p, q, layerOf[lp].name)
			}
		}
	}
}
