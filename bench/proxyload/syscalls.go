package main

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
)

// syscallFamilies are the system calls -syscalls counts per request, by
// what they do: a server may read with read or recv, write with write,
// writev or sendfile, and wait with either epoll call. futex counts the
// wake-ups between threads (Go's scheduler handing work across).
var syscallFamilies = []struct {
	name  string
	calls []string
}{
	{"read", []string{"read", "readv", "recvfrom", "recvmsg"}},
	{"write", []string{"write", "writev", "sendto", "sendmsg", "sendfile64"}},
	{"wait", []string{"epoll_wait", "epoll_pwait", "epoll_pwait2"}},
	{"futex", []string{"futex"}},
}

// countSyscalls starts counting the system calls of pids (every thread of
// each) with perf's syscall tracepoints, which cost the process little,
// unlike strace. stop ends the count and returns the calls by family
// (syscallFamilies); nil when perf or the tracepoints are missing.
func countSyscalls(pids []int) (stop func() map[string]float64) {
	var events []string
	for _, f := range syscallFamilies {
		for _, c := range f.calls {
			if tracepoint(c) {
				events = append(events, "syscalls:sys_enter_"+c)
			}
		}
	}
	perf, err := exec.LookPath("perf")
	if err != nil || len(events) == 0 || len(pids) == 0 {
		return func() map[string]float64 { return nil }
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	var out bytes.Buffer
	cmd := exec.Command(perf, "stat", "-x", ",", "-e", strings.Join(events, ","), "-p", strings.Join(ps, ","))
	cmd.Stderr = &out // perf stat writes its counts there
	if err := cmd.Start(); err != nil {
		return func() map[string]float64 { return nil }
	}
	return func() map[string]float64 {
		cmd.Process.Signal(syscall.SIGINT)
		cmd.Wait()
		return parsePerfStat(out.String())
	}
}

// tracepoint reports whether the kernel has the syscall tracepoint of
// call (tracefs mounted where perf finds it).
func tracepoint(call string) bool {
	for _, dir := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
		if _, err := os.Stat(dir + "/events/syscalls/sys_enter_" + call); err == nil {
			return true
		}
	}
	return false
}

// parsePerfStat sums perf stat's CSV lines (value,unit,event,...) by
// family, and all of them under "all"; a value perf did not count is left
// out.
func parsePerfStat(s string) map[string]float64 {
	byCall := map[string]float64{}
	for _, line := range strings.Split(s, "\n") {
		fs := strings.Split(line, ",")
		if len(fs) < 3 {
			continue
		}
		v, err := strconv.ParseFloat(fs[0], 64)
		if err != nil {
			continue
		}
		byCall[strings.TrimPrefix(fs[2], "syscalls:sys_enter_")] += v
	}
	if len(byCall) == 0 {
		return nil
	}
	out := map[string]float64{}
	for _, f := range syscallFamilies {
		for _, c := range f.calls {
			out[f.name] += byCall[c]
			out["all"] += byCall[c]
		}
	}
	return out
}

// pids returns the process and its children (nginx' workers).
func (p *proc) pids() []int {
	pid := p.cmd.Process.Pid
	out := []int{pid}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if n, err := strconv.Atoi(e.Name()); err == nil && n != pid && ppid(n) == pid {
			out = append(out, n)
		}
	}
	return out
}
