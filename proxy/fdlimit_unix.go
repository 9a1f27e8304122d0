//go:build unix

package proxy

import (
	"errors"
	"syscall"
)

// fileLimit returns the process's limit on open file descriptors (the
// soft one, which Go raises to the hard one at start).
func fileLimit() (uint64, bool) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, false
	}
	return uint64(r.Cur), true
}

// exhausted reports whether an accept failed for want of a resource that
// frees itself (descriptors, buffers): the listener waits and goes on.
func exhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}
