//go:build !unix

package proxy

import "syscall"

// canPeek: no non-blocking peek here; waiting requests are not watched
// (they wait until their deadline, as without goneWatch).
const canPeek = false

func peerGone(syscall.RawConn) bool { return false }

func idleCheck(*bool) func(uintptr) { return func(uintptr) {} }
