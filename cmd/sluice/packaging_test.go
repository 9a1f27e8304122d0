package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, its continuation lines joined.
type instruction struct {
	line int
	cmd  string // upper case
	args string
}

// dockerInstructions splits a Dockerfile into instructions (comments and
// blank lines dropped, backslash continuations joined).
func dockerInstructions(t *testing.T, data string) []instruction {
	t.Helper()
	var out []instruction
	var cur *instruction
	for i, l := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(l)
		if cur == nil && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		cont := strings.HasSuffix(trimmed, "\\")
		trimmed = strings.TrimSuffix(trimmed, "\\")
		if cur == nil {
			cmd, args, _ := strings.Cut(trimmed, " ")
			out = append(out, instruction{line: i + 1, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)})
			cur = &out[len(out)-1]
		} else {
			cur.args += " " + strings.TrimSpace(trimmed)
		}
		if !cont {
			cur = nil
		}
	}
	return out
}

// The Dockerfile, read statically (no Docker engine here): a build stage
// on the Go image that builds ./cmd/sluice static, a final stage on a
// minimal base that copies only the binary, runs as a non-root user,
// exposes the listeners, has an exec-form entrypoint and no HEALTHCHECK
// (orchestrators probe /readyz and /healthz).
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ins := dockerInstructions(t, string(data))
	known := map[string]bool{"FROM": true, "WORKDIR": true, "COPY": true, "RUN": true, "USER": true, "EXPOSE": true,
		"ENTRYPOINT": true, "CMD": true, "STOPSIGNAL": true, "ARG": true, "ENV": true, "LABEL": true}
	var stages [][]instruction
	for _, in := range ins {
		if !known[in.cmd] {
			t.Errorf("Dockerfile:%d: instruction %s", in.line, in.cmd)
		}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("Dockerfile:%d: %s before any FROM", in.line, in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	if len(stages) != 2 {
		t.Fatalf("%d stages, want a build and a run stage", len(stages))
	}
	build, final := stages[0], stages[1]
	if !regexp.MustCompile(`^golang:1\.\d+\S* AS build$`).MatchString(build[0].args) {
		t.Errorf("build stage FROM %q: want the golang image AS build", build[0].args)
	}
	builds := false
	for _, in := range build {
		if in.cmd == "RUN" && strings.Contains(in.args, "CGO_ENABLED=0") && strings.Contains(in.args, "go build") && strings.HasSuffix(in.args, "./cmd/sluice") {
			builds = true
		}
	}
	if !builds {
		t.Error("the build stage does not build ./cmd/sluice with CGO_ENABLED=0")
	}
	if base := final[0].args; !strings.HasPrefix(base, "gcr.io/distroless/") && !strings.HasPrefix(base, "debian:") {
		t.Errorf("final stage FROM %q: want distroless or debian-slim", base)
	}
	var user, entry string
	var exposed []string
	for _, in := range final {
		switch in.cmd {
		case "USER":
			user = in.args
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		case "ENTRYPOINT":
			entry = in.args
		case "COPY":
			if !strings.HasPrefix(in.args, "--from=build ") {
				t.Errorf("Dockerfile:%d: the final stage copies %q, not only the built binary", in.line, in.args)
			}
		case "RUN":
			t.Errorf("Dockerfile:%d: RUN in the final stage (it has no shell)", in.line)
		}
	}
	if name, _, _ := strings.Cut(user, ":"); user == "" || name == "root" || name == "0" {
		t.Errorf("final stage USER %q: want a non-root user", user)
	}
	if got := strings.Join(exposed, " "); got != "8080 8081 9901" {
		t.Errorf("EXPOSE %q, want the proxy/HTTP, gRPC and admin ports", got)
	}
	if !strings.HasPrefix(entry, `["/usr/local/bin/sluice"`) {
		t.Errorf("ENTRYPOINT %q: want the exec form", entry)
	}
	if !strings.Contains(string(data), "/readyz") {
		t.Error("the Dockerfile does not say how to probe readiness")
	}
}

// The systemd unit example passes systemd-analyze verify (with its binary
// replaced by one that exists here), runs without privileges and reloads
// on SIGHUP.
func TestSystemdUnit(t *testing.T) {
	data, err := os.ReadFile("../../examples/systemd/sluice-proxy.service")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n",
		"ExecReload=/bin/kill -HUP $MAINPID", "--log-format json", "--drain-grace"} {
		if !strings.Contains(string(data), want) {
			t.Errorf("the unit has no %q", strings.TrimSpace(want))
		}
	}
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("no systemd-analyze")
	}
	unit := filepath.Join(t.TempDir(), "sluice-proxy.service")
	os.WriteFile(unit, []byte(strings.ReplaceAll(string(data), "/usr/local/bin/sluice", "/bin/true")), 0o644)
	if out, err := exec.Command(analyze, "verify", unit).CombinedOutput(); err != nil || len(out) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}
