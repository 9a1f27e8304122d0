package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func run(args ...string) (string, string, error) {
	cmd := root()
	var out, errb bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errb)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), errb.String(), err
}

func TestCheck(t *testing.T) {
	out, _, err := run("check", "--config", "../../examples/routes-api.yaml")
	if err != nil || !strings.Contains(out, "ADMISSION POLICY  routes-api") {
		t.Fatalf("%v\n%s", err, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("version: 1\ngates:\n  - {name: a, kind: token_bucket, rate: 100/x, burst: -1}\n"), 0o644)
	_, errOut, err := run("check", "--config", bad)
	if err == nil || !strings.Contains(errOut, "bad.yaml:3: gates[0].rate") || !strings.Contains(errOut, "bad.yaml:3: gates[0].burst") {
		t.Fatalf("%v\n%s", err, errOut)
	}
}

func TestVersion(t *testing.T) {
	out, _, err := run("version")
	if err != nil || !strings.HasPrefix(out, "sluice ") {
		t.Fatal(out, err)
	}
}
