package proxy

import (
	"context"
	"net"
	"sync"
	"syscall"
	"time"
)

// goneWatch notices clients that close their connection while their
// request waits in a gate (a wait queue) of the proxy's own server, and
// cancels the request's context: the request leaves the queue, its place
// goes to the next waiter, and it never reaches the upstream for a client
// that is no longer there. net/http's server does the same with a
// background read; fasthttp's has none, and a read of our own would take
// bytes the server must parse. Instead, while requests wait, one goroutine
// looks at each of their connections without reading every goneEvery, or
// less often with many waiting (goneCost per connection per round bounds
// the polling to about 2% of a core). On Linux that is poll(2) with a zero
// timeout (gone_linux.go): the client's FIN or a reset is a client gone,
// even behind bytes not yet read (a pipelined request, the rest of a body
// that streams). Elsewhere on unix it is a non-blocking recv with MSG_PEEK
// (gone_unix.go), which sees the end of the stream or a reset only once
// every byte before it has been read. A client that half-closes (shuts
// down its sending side) and waits for the answer counts as gone, as with
// net/http's server. One close no look can see: that of a client whose body
// streams (past the buffer budgets) and fills the proxy's receive window,
// since its FIN waits behind the body in the client's own kernel until the
// proxy reads; a reset is seen.
type goneWatch struct {
	mu      sync.Mutex
	waiting map[*goneEntry]struct{}
	running bool
	every   time.Duration // the shortest round; 0: goneEvery
}

type goneEntry struct {
	rc     syscall.RawConn
	cancel context.CancelFunc
}

const (
	goneEvery = 50 * time.Millisecond
	goneCost  = time.Millisecond // a round's period per 1,000 waiting (1 µs each)
)

// watch returns a context cancelled when c's client goes away, and the
// entry to give to done (which stops watching and releases the context)
// once the wait is over; a nil entry when c cannot be peeked at, and is
// not watched.
func (w *goneWatch) watch(c net.Conn) (context.Context, *goneEntry) {
	rc := rawConn(c)
	if rc == nil {
		return context.Background(), nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &goneEntry{rc: rc, cancel: cancel}
	w.mu.Lock()
	if w.waiting == nil {
		w.waiting = make(map[*goneEntry]struct{})
	}
	w.waiting[e] = struct{}{}
	if !w.running {
		w.running = true
		go w.run()
	}
	w.mu.Unlock()
	return ctx, e
}

// done stops watching e (nil: nothing watched).
func (w *goneWatch) done(e *goneEntry) {
	if e == nil {
		return
	}
	w.mu.Lock()
	delete(w.waiting, e)
	w.mu.Unlock()
	e.cancel()
}

// rawConn returns the peekable connection under c, or nil. A coarseConn
// keeps it: one connection serves many requests.
func rawConn(c net.Conn) syscall.RawConn {
	if !canPeek {
		return nil
	}
	cc, ok := c.(*coarseConn)
	if ok && cc.raw != nil {
		return cc.raw
	}
	inner := c
	if ok {
		inner = cc.Conn
	}
	sc, isSys := inner.(syscall.Conn)
	if !isSys {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	if ok {
		cc.raw = rc
	}
	return rc
}

// run polls the waiting connections until none is left.
func (w *goneWatch) run() {
	every := w.every
	if every <= 0 {
		every = goneEvery
	}
	var round []*goneEntry
	for {
		w.mu.Lock()
		n := len(w.waiting)
		w.mu.Unlock()
		time.Sleep(max(every, time.Duration(n)*goneCost/1000))
		w.mu.Lock()
		if len(w.waiting) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		round = round[:0]
		for e := range w.waiting {
			round = append(round, e)
		}
		w.mu.Unlock()
		for _, e := range round {
			if peerGone(e.rc) {
				e.cancel() // the waiter leaves; its stop removes the entry
			}
		}
		clear(round)
	}
}
