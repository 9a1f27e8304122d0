package proxy

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const canPeek = true

// peerGone reports whether the client of rc has closed its connection (or
// reset it), without waiting and without reading: poll(2) with a zero
// timeout for POLLRDHUP (the client sent its FIN), POLLHUP and POLLERR (a
// reset). Unlike a peek (gone_unix.go), it sees the close behind bytes
// still unread: a pipelined request, or the rest of a body that streams.
// Through Control, not Read: Read would fail on a read deadline already
// passed (the server's, set when the request was read) and wait for the
// server's own read lock.
func peerGone(rc syscall.RawConn) bool {
	gone := false
	err := rc.Control(func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		if n, err := unix.Poll(fds[:], 0); err != nil || n == 0 {
			return // nothing to tell (EINTR: the next round asks again)
		}
		gone = fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
	})
	return gone || err != nil // err: the connection is closed already
}

// idleCheck returns the look at an idle upstream connection, for
// RawConn.Control (made once per connection: a closure made per look
// would be an allocation per request). It sets *spoiled when the upstream
// has sent anything, without waiting and without reading: poll(2) with a
// zero timeout, for bytes (POLLIN: an answer nobody asked for), its FIN
// (POLLRDHUP) or a reset (POLLHUP, POLLERR).
func idleCheck(spoiled *bool) func(fd uintptr) {
	return func(fd uintptr) {
		fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLRDHUP}}
		n, err := unix.Poll(fds[:], 0)
		*spoiled = err == nil && n > 0 && fds[0].Revents != 0
	}
}
