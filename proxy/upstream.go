package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"
)

// Connections to the upstream. Each read and each write on one waits at
// most Options.UpstreamTimeout for the upstream (the time between two
// successive operations, as nginx's proxy_read_timeout and
// proxy_send_timeout bound it, not the whole exchange: a response that
// keeps arriving, a stream that keeps sending, runs as long as it does),
// and never past the deadlines its user set. An upstream that accepts a
// request and then says nothing thus frees the request's slot; without
// the bound, a request without a deadline would hold it for as long as
// the connection stays open, and once its client went away (a request
// runs on to its answer: gone.go) nobody would end it.

// upConn is a connection to the upstream with the idle bound. Any read or
// write renews the bound of both directions (a request going out starts
// the wait for its answer; an upgrade's traffic either way keeps it
// open). The bound is renewed coarsely, only when it would move by
// idleSlack(idle) or more, so it may end up to that much early. It is safe
// for one reader and one writer at a time, as net.Conn is.
type upConn struct {
	net.Conn
	idle   time.Duration
	rd, wd atomic.Int64 // the deadlines the user set, Unix ns; 0: none
	armed  atomic.Int64 // the idle bound last set, Unix ns
	forget func(*upConn)
}

// newUpConn wraps c with the idle bound (idle <= 0: none, and c is
// returned as it is, unless forget is set); forget, if set, is called
// once c closes.
func newUpConn(c net.Conn, idle time.Duration, forget func(*upConn)) net.Conn {
	if idle <= 0 && forget == nil {
		return c
	}
	u := &upConn{Conn: c, idle: max(idle, 0), forget: forget}
	u.renew()
	return u
}

// idleSlack is how early the bound may end: an eighth of it, at most 1 s.
func idleSlack(idle time.Duration) int64 { return int64(min(idle/8, time.Second)) }

// renew moves the idle bound to now + idle if that moves it by the slack
// or more, and sets each direction's deadline to the sooner of the bound
// and the user's deadline.
func (c *upConn) renew() {
	if c.idle <= 0 {
		return
	}
	want := time.Now().UnixNano() + int64(c.idle)
	old := c.armed.Load()
	if want-old < idleSlack(c.idle) || !c.armed.CompareAndSwap(old, want) {
		return
	}
	c.Conn.SetReadDeadline(sooner(want, c.rd.Load()))
	c.Conn.SetWriteDeadline(sooner(want, c.wd.Load()))
}

// sooner returns the earlier of the Unix ns a and b as a time, a 0 being
// no deadline.
func sooner(a, b int64) time.Time {
	switch {
	case a == 0 && b == 0:
		return time.Time{}
	case a == 0 || (b != 0 && b < a):
		return time.Unix(0, b)
	}
	return time.Unix(0, a)
}

func (c *upConn) Read(p []byte) (int, error) {
	c.renew()
	return c.Conn.Read(p)
}

func (c *upConn) Write(p []byte) (int, error) {
	c.renew()
	return c.Conn.Write(p)
}

func (c *upConn) SetReadDeadline(t time.Time) error {
	c.rd.Store(unixOrZero(t))
	return c.Conn.SetReadDeadline(sooner(c.bound(), unixOrZero(t)))
}

func (c *upConn) SetWriteDeadline(t time.Time) error {
	c.wd.Store(unixOrZero(t))
	return c.Conn.SetWriteDeadline(sooner(c.bound(), unixOrZero(t)))
}

func (c *upConn) SetDeadline(t time.Time) error {
	n := unixOrZero(t)
	c.rd.Store(n)
	c.wd.Store(n)
	return c.Conn.SetDeadline(sooner(c.bound(), n))
}

// bound is the idle bound in force, Unix ns (0: none).
func (c *upConn) bound() int64 {
	if c.idle <= 0 {
		return 0
	}
	return c.armed.Load()
}

// CloseWrite half-closes the connection when the one inside can (an
// upgrade tells the upstream the client is done sending with it).
func (c *upConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

func (c *upConn) Close() error {
	if c.forget != nil {
		c.forget(c)
	}
	return c.Conn.Close()
}

// upstreamTimedOut reports whether err is an upstream connection's
// deadline or idle bound running out (the request then answers 504, as
// for its own deadline).
func upstreamTimedOut(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.Is(err, fasthttp.ErrDialTimeout)
}

// retryStale is the upstream client's retry rule: an idempotent request
// (RFC 9110, section 9.2.2) is sent again, once, only when its connection closed or was reset
// before any answer (a pooled connection the upstream had closed), never
// after a timeout or a partial answer: the upstream may have it and be
// working on it, and a retry would run it twice. (fasthttp's own rule
// retries an idempotent request after any error.)
func retryStale(req *fasthttp.Request, _ int, err error) (resetTimeout, retry bool) {
	h := &req.Header
	if !(h.IsGet() || h.IsHead() || h.IsPut() || h.IsOptions() || h.IsDelete() || h.IsTrace()) {
		return false, false
	}
	return false, errors.Is(err, io.EOF) || errors.Is(err, fasthttp.ErrConnectionClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// conns is a set of connections, for closing those left at the drain's
// cut. It is safe for concurrent use.
type conns struct{ m sync.Map }

func (s *conns) add(c *upConn)    { s.m.Store(c, struct{}{}) }
func (s *conns) forget(c *upConn) { s.m.Delete(c) }

// closeAll closes every connection in the set.
func (s *conns) closeAll() {
	s.m.Range(func(c, _ any) bool {
		c.(net.Conn).Close()
		return true
	})
}

// dialUpstream dials the fast server's upstream connections as fasthttp's
// own dialer would (within timeout, or its default of 3 s), with the idle
// bound, keeping them for Close.
func (f *fastServer) dialUpstream(addr string, timeout time.Duration) (net.Conn, error) {
	var c net.Conn
	var err error
	if timeout > 0 {
		c, err = fasthttp.DialTimeout(addr, timeout)
	} else {
		c, err = fasthttp.Dial(addr)
	}
	if err != nil {
		return nil, err
	}
	return f.track(c), nil
}

// track wraps an upstream connection with the idle bound and keeps it for
// Close until it closes.
func (f *fastServer) track(c net.Conn) net.Conn {
	u := newUpConn(c, f.s.opts.UpstreamTimeout, f.ups.forget).(*upConn)
	f.ups.add(u)
	return u
}

// dialContext is the default transport's dialer (net/http's defaults)
// with the idle bound.
func dialContext(idle time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return newUpConn(c, idle, nil), nil
	}
}
