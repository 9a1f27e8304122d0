//go:build unix && !linux

package proxy

import (
	"errors"
	"syscall"
)

const canPeek = true

// peerGone reports whether the client of rc has closed its connection (or
// reset it), peeking without waiting and without consuming a byte. It goes
// through Control, not Read: Read would fail on a read deadline already
// passed (the server's, set when the request was read) and wait for the
// server's own read lock.
func peerGone(rc syscall.RawConn) bool {
	var buf [1]byte
	gone := false
	err := rc.Control(func(fd uintptr) {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.EWOULDBLOCK), errors.Is(err, syscall.EINTR):
		case err != nil:
			gone = true // a reset, or another error the next read will meet too
		case n == 0:
			gone = true // end of stream
		}
	})
	return gone || err != nil // err: the connection is closed already
}

// idleCheck returns the look at an idle upstream connection, for
// RawConn.Control (made once per connection). It sets *spoiled when the
// upstream has sent anything (bytes nobody asked for, the end of the
// stream, a reset), peeking without waiting and without consuming a byte.
func idleCheck(spoiled *bool) func(fd uintptr) {
	return func(fd uintptr) {
		var buf [1]byte
		_, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		*spoiled = !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR)
	}
}
