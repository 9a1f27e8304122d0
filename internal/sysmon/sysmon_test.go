package sysmon

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestWith(t *testing.T) {
	for _, c := range []struct {
		in, out string
		add     bool
	}{
		{"", Setting, true},
		{"  ", Setting, true},
		{"gctrace=1", "gctrace=1," + Setting, true},
		{"http2client=0,madvdontneed=1", "http2client=0,madvdontneed=1," + Setting, true},
		{"schedtrace=0", "schedtrace=0", false},
		{"gctrace=1,schedtrace=1000", "gctrace=1,schedtrace=1000", false},
		{"gctrace=1, schedtrace=5", "gctrace=1, schedtrace=5", false},
		{"xschedtrace=1", "xschedtrace=1," + Setting, true},
	} {
		out, add := with(c.in)
		if out != c.out || add != c.add {
			t.Errorf("with(%q) = %q, %v; want %q, %v", c.in, out, add, c.out, c.add)
		}
	}
}

// The test binary runs itself as a helper that calls Reexec: the program
// starts again in the same process, with the setting in GODEBUG and the
// rest of its environment and arguments as they were.
func TestReexecStartsTheProgramAgainInTheSameProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Reexec starts the program again on Linux only")
	}
	if os.Getenv("SYSMON_HELPER") != "" {
		fmt.Printf("pid=%d godebug=%q marker=%s\n", os.Getpid(), os.Getenv("GODEBUG"), os.Getenv("SYSMON_HELPER"))
		if err := Reexec(); err != nil {
			fmt.Printf("error=%v\n", err)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestReexecStartsTheProgramAgainInTheSameProcess$")
	cmd.Env = append(os.Environ(), "SYSMON_HELPER=kept", "GODEBUG=gctrace=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("want the helper's line before and after the exec, got:\n%s", out)
	}
	pid := cmd.Process.Pid
	want := []string{
		fmt.Sprintf("pid=%d godebug=%q marker=kept", pid, "gctrace=0"),
		fmt.Sprintf("pid=%d godebug=%q marker=kept", pid, "gctrace=0,"+Setting),
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("line %d: %s\nwant    %s", i+1, lines[i], want[i])
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
