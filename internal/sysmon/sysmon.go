// Package sysmon keeps the Go runtime's system monitor awake in a server
// process, so that the first system call after every idle moment does not
// have to wake it. Servers call Reexec first thing in main:
//
//	if err := sysmon.Reexec(); err != nil {
//		log.Printf("sysmon: %v (running as is)", err)
//	}
//
// The monitor (runtime.sysmon) sleeps deeply whenever every processor is
// idle, and entersyscall wakes it, with a futex call, on the next system
// call of any goroutine. A proxy at a moderate rate is idle between most
// requests, so most of its reads paid that wake-up and the monitor's
// thread ran once more on a second core. Measured on `sluice proxy` at
// 2,000 requests/s on two cores: 4.4 futex calls and 7.6 context
// switches a request, 0.20 ms of CPU; with the monitor awake (and the
// proxy's yield backing off, see proxy's coarseConn) 0.06 futex calls,
// 2.3 context switches and 0.10 ms.
//
// The runtime keeps the monitor out of its deep sleep only while a
// scheduler trace is asked for (GODEBUG=schedtrace=N, in ms; see the
// comment above the deep sleep in runtime/proc.go), and it reads that
// setting only when the process starts. Reexec therefore starts the
// program again in the same process (execve(2): same pid, same open
// descriptors not marked close-on-exec, same arguments) with
// schedtrace=2147483647 added to GODEBUG. That is the longest interval it
// takes, 24.8 days: the runtime prints one "SCHED" line to standard error
// at start on a host up longer than that, and one every 24.8 days after.
// When awake the monitor still backs off to a 10 ms tick.
package sysmon

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"syscall"
)

// Setting is the GODEBUG entry that keeps the monitor awake.
const Setting = "schedtrace=2147483647"

// errNoExec is Reexec's answer where it cannot start the program again.
var errNoExec = errors.New("not on Linux: the monitor sleeps as the runtime decides")

// Reexec starts the program again in this process with Setting added to
// GODEBUG, and does not return when it does. It returns nil, doing
// nothing, when GODEBUG already names schedtrace: the monitor is awake,
// or the operator chose otherwise (GODEBUG=schedtrace=0 keeps the
// runtime's default). It returns an error when the program cannot be
// started again (not Linux, or execve failed); the process then goes on
// as it is. Call it before anything is started: goroutines, listeners
// and files are not carried over, except descriptors inherited without
// close-on-exec (a systemd socket, standard input and output).
func Reexec() error {
	godebug, ok := with(os.Getenv("GODEBUG"))
	if !ok {
		return nil
	}
	if runtime.GOOS != "linux" {
		return errNoExec
	}
	env := make([]string, 0, len(os.Environ())+1)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GODEBUG=") {
			env = append(env, kv)
		}
	}
	env = append(env, "GODEBUG="+godebug)
	// /proc/self/exe names this program even when its file was replaced or
	// removed since it started (an upgrade in place).
	if err := syscall.Exec("/proc/self/exe", os.Args, env); err != nil {
		return &os.PathError{Op: "exec", Path: "/proc/self/exe", Err: err}
	}
	return nil // not reached
}

// with returns godebug with Setting added, and false when godebug
// already names schedtrace (nothing to add).
func with(godebug string) (string, bool) {
	for kv := range strings.SplitSeq(godebug, ",") {
		if k, _, _ := strings.Cut(strings.TrimSpace(kv), "="); k == "schedtrace" {
			return godebug, false
		}
	}
	if strings.TrimSpace(godebug) == "" {
		return Setting, true
	}
	return godebug + "," + Setting, true
}
