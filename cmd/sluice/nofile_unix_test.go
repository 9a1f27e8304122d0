//go:build unix

package main

import (
	"strconv"
	"syscall"
)

// setNoFile lowers the process's soft limit on open files to n (a child
// run as sluice under test).
func setNoFile(n string) {
	v, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		return
	}
	var r syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r) == nil {
		r.Cur = min(v, r.Max)
		syscall.Setrlimit(syscall.RLIMIT_NOFILE, &r)
	}
}
