package proxy

import (
	"errors"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
)

// exhaustedListener fails its first accepts as a process out of
// descriptors does, then hands out one end of a pipe.
type exhaustedListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *exhaustedListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	c, _ := net.Pipe()
	return c, nil
}

// A listener out of descriptors waits and goes on (fasthttp's own accept
// loop stopped serving on EMFILE, and the proxy exited); any other error
// ends Accept.
func TestAcceptWaitsOutExhaustion(t *testing.T) {
	l := &coarseListener{Listener: &exhaustedListener{}}
	l.Listener.(*exhaustedListener).fails.Store(3)
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept after 3 EMFILE: %v", err)
	}
	c.Close()
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	closed.Close()
	if _, err := (&coarseListener{Listener: closed}).Accept(); err == nil || !errors.Is(err, net.ErrClosed) {
		t.Fatalf("a closed listener: %v", err)
	}
}

// The descriptors split: half for clients, a quarter for the upstream,
// within fasthttp's default and 4,096; unknown: those defaults.
func TestDescriptorBudget(t *testing.T) {
	for _, c := range []struct {
		limit              uint64
		known              bool
		clients, upstreams int
	}{
		{256, true, 128, 64},
		{1024, true, 512, 256},
		{1 << 20, true, 256 * 1024, 4096},
		{10, true, 16, 8},
		{0, false, 256 * 1024, 4096},
	} {
		if cl, up := descriptorBudget(c.limit, c.known); cl != c.clients || up != c.upstreams {
			t.Errorf("limit %d: %d clients, %d upstream; want %d, %d", c.limit, cl, up, c.clients, c.upstreams)
		}
	}
}
