package sluice_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The library stands alone: a service that imports sluice's library
// packages must not pull the tools' modules (the CLI, the load generator,
// the plots live in the module github.com/sluice-go/sluice/cmd) nor gRPC
// (module github.com/sluice-go/sluice/grpcgate). This builds
// a fresh consumer module, as an adopter would, and reads its module graph.
func TestLibraryStandsAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module example.com/consumer\n\ngo 1.26.0\n\nrequire github.com/sluice-go/sluice v0.0.0\n\nreplace github.com/sluice-go/sluice => " + root + "\n"
	main := `package main

import (
	_ "github.com/sluice-go/sluice"
	_ "github.com/sluice-go/sluice/adaptive"
	_ "github.com/sluice-go/sluice/client"
	_ "github.com/sluice-go/sluice/fair"
	_ "github.com/sluice-go/sluice/gate"
	_ "github.com/sluice-go/sluice/httpgate"
	_ "github.com/sluice-go/sluice/lease"
	_ "github.com/sluice-go/sluice/limit"
	_ "github.com/sluice-go/sluice/metrics"
	_ "github.com/sluice-go/sluice/policy"
	_ "github.com/sluice-go/sluice/proxy"
	_ "github.com/sluice-go/sluice/queue"
	_ "github.com/sluice-go/sluice/serve"
	_ "github.com/sluice-go/sluice/shed"
	_ "github.com/sluice-go/sluice/store"
	_ "github.com/sluice-go/sluice/store/memory"
	_ "github.com/sluice-go/sluice/store/redis"
)

func main() {}
`
	sum, err := os.ReadFile("go.sum") // the library's own hashes: no checksum lookups needed
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "main.go": []byte(main), "go.sum": sum} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) string {
		cmd := exec.Command(goBin, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run("build", "-o", os.DevNull, ".")
	for _, m := range strings.Fields(run("list", "-m", "all")) {
		for _, banned := range []string{"github.com/spf13/cobra", "github.com/tsenart/vegeta", "gonum.org/",
			"google.golang.org/grpc", "github.com/envoyproxy/"} { // gRPC lives in module grpcgate
			if strings.HasPrefix(m, banned) {
				t.Errorf("a consumer of the library pulls %s", m)
			}
		}
	}
}
