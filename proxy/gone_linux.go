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
