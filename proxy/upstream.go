package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/clock"
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
	// renewed is the clock.Instant of the last renewal (0: none yet): a
	// renewal less than the slack after it would move the bound by less
	// than the slack.
	renewed atomic.Int64
	forget  func(*upConn)
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
	// The monotonic clock first (half of time.Now's cost): most calls
	// come within the slack of the last renewal and move nothing.
	mono := int64(clock.Now())
	if r := c.renewed.Load(); r != 0 && mono-r < idleSlack(c.idle) {
		return
	}
	now := time.Now().UnixNano()
	want := now + int64(c.idle)
	if want < now { // past the year 2262: as far as a deadline goes
		want = math.MaxInt64
	}
	old := c.armed.Load()
	if want-old < idleSlack(c.idle) || !c.armed.CompareAndSwap(old, want) {
		return
	}
	c.renewed.Store(mono)
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
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, fasthttp.ErrTimeout) ||
		errors.Is(err, fasthttp.ErrDialTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// retryIdempotent is the upstream client's retry rule once upTransport
// has judged that a request may be sent again: only an idempotent method
// (RFC 9110, section 9.2.2) is. (fasthttp's own rule retries an
// idempotent request after any error, a timeout included: the upstream
// may have it and be working on it, and would run it twice.)
func retryIdempotent(req *fasthttp.Request, _ int, _ error) (resetTimeout, retry bool) {
	h := &req.Header
	return false, h.IsGet() || h.IsHead() || h.IsPut() || h.IsOptions() || h.IsDelete() || h.IsTrace()
}

// upTransport is fasthttp's transport, with the judgement of which failed
// requests may be sent again (then retryIdempotent asks the method): one
// whose pooled connection had answered before and then, with no byte of
// an answer to it, ended (a bare io.EOF: fasthttp's read of the head saw
// nothing) or refused its write (EPIPE, ECONNRESET). That is the race of
// an upstream closing an idle connection as the request goes out, which
// the look before each request (pooledConn) cannot see; net/http's
// transport and nginx's keepalive connections retry it too. Not after a
// partial answer (the upstream had it), not on a new connection (nothing
// would explain an upstream hanging up on a request it never saw but a
// failure in handling it), never after a timeout.
type upTransport struct{}

func (upTransport) RoundTrip(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) (bool, error) {
	retry, err := fasthttp.DefaultTransport.RoundTrip(hc, req, resp)
	if err == nil || !retry {
		return retry, err
	}
	a, ok := resp.LocalAddr().(pooledAddr)
	if !ok || !a.c.reused {
		return false, err
	}
	var op *net.OpError
	return err == io.EOF || (errors.As(err, &op) && op.Op == "write" &&
		(errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET))), err
}

// refusedStatus reports whether b, the start of an answer, has a status
// the proxy refuses (unpassable): outside 100 to 599, or 101. A start too
// short to tell is not.
func refusedStatus(b []byte) bool {
	if len(b) < len("HTTP/1.1 200") || string(b[:7]) != "HTTP/1." || b[8] != ' ' {
		return false
	}
	sc := 0
	for _, d := range b[9:12] {
		if d < '0' || d > '9' {
			return false // fasthttp refuses it, and closes the connection
		}
		sc = sc*10 + int(d-'0')
	}
	return badStatus(sc) != nil || sc == 101
}

// pooledConn is one of the fast server's pooled upstream connections
// (fasthttp's HostClient keeps them). When a request starts on one that
// has answered before, it looks first, without waiting, for anything the
// upstream sent while it sat idle: its close (a FIN), a reset, or bytes
// nobody asked for (a 408 before a close). Any of them spoils it, and the
// request goes out on a new connection dialed in its place. Not a byte of
// the request went out on the old one, so it is sent once whatever its
// method and body. (fasthttp retries only a request without a body, and
// only after it failed: a POST on a connection the upstream had closed
// answered 502.) net/http's transport notices the same close with a read
// it keeps running on every idle connection; here the look is one poll(2)
// a request. To an https upstream the connection runs TLS itself (fasthttp
// takes a connection with a Handshake method for one already secured), so
// that a spoiled one is replaced by a new TLS session, resumed from the
// session cache where the upstream allows: the look and upTransport's
// retry hold over TLS as over TCP. Over TLS the look is two: the TCP
// connection's (a close, a reset, bytes in the kernel), and what TLS has
// already read from it, unasked, behind the last answer (a read that
// cannot wait: an answer sent right behind another in one segment would
// otherwise be taken for the next request's).
//
// Between writing a request and reading its answer it yields the
// processor once, with coarseConn's backoff and for coarseConn's reason:
// the answer is seldom there the moment the request is out, and a read
// that finds nothing costs a read call, a park and the poller's wake-up.
// Letting the other goroutines go first gives the upstream that time when
// the proxy is busy (under wrk through a loopback upstream it took the
// reads from 3.42 to 2.89 a request).
type pooledConn struct {
	cur    atomic.Pointer[pooledLeg]
	local  net.Addr // pooledAddr{c}, made once: LocalAddr is asked every request
	f      *fastServer
	addr   string
	mu     sync.Mutex // a new leg against Close
	closed bool

	// Used only by the request on the connection (the pool hands it from
	// one request to the next under its lock):
	readAny bool    // a byte has come back on the current leg
	reading bool    // the last call was a Read: the next Write starts a request
	reused  bool    // the request under way started on a leg that had answered before
	ruined  bool    // the last answer left the leg unusable (refusedStatus): the next request gets a new one
	y       yielder // before reading an answer (see coarseConn)
}

// pooledLeg is the connection a pooledConn currently runs on.
type pooledLeg struct {
	u       *upConn          // the TCP connection: its deadlines, the idle bound, the look
	c       net.Conn         // what requests are written and answers read on: u, or TLS over it
	tls     *tls.Conn        // c over TLS (nil: plain)
	rc      syscall.RawConn  // nil: not peekable
	check   func(fd uintptr) // idleCheck(&spoiled)
	spoiled bool
}

func newPooledConn(f *fastServer, addr string, u *upConn, rw net.Conn) *pooledConn {
	c := &pooledConn{f: f, addr: addr}
	c.y.off = f != nil && f.dial != nil
	c.local = pooledAddr{c}
	c.cur.Store(newLeg(u, rw))
	return c
}

func newLeg(u *upConn, rw net.Conn) *pooledLeg {
	l := &pooledLeg{u: u, c: rw}
	l.tls, _ = rw.(*tls.Conn)
	if sc, ok := u.Conn.(syscall.Conn); ok && canPeek {
		l.rc, _ = sc.SyscallConn()
		l.check = idleCheck(&l.spoiled)
	}
	return l
}

func (c *pooledConn) Read(p []byte) (int, error) {
	first := !c.reading // the request is out: its answer is read next
	yielded := first && c.y.yield()
	n, err := c.cur.Load().c.Read(p)
	if yielded {
		c.y.read()
	}
	if first && refusedStatus(p[:n]) {
		// An answer the proxy refuses (unpassable): the connection is
		// in no state to carry another request (after a switch of
		// protocols it speaks another), and fasthttp pools it as soon as
		// the head is read. Marked before that, here.
		c.ruined = true
	}
	if n > 0 {
		c.readAny = true
	}
	c.reading = true
	return n, err
}

func (c *pooledConn) Write(p []byte) (int, error) {
	if c.reading { // a request starts
		c.reading = false
		c.reused = c.readAny
		if c.reused {
			if err := c.freshen(); err != nil {
				return 0, err
			}
		}
	}
	return c.cur.Load().c.Write(p)
}

// freshen replaces the current leg with a new connection if the upstream
// has spoiled it while it was idle.
func (c *pooledConn) freshen() error {
	old := c.cur.Load()
	ruined := c.ruined
	c.ruined = false
	if old.rc == nil && !ruined {
		return nil
	}
	if !ruined {
		old.spoiled = false
		if err := old.rc.Control(old.check); err != nil {
			return net.ErrClosed // closed here (the drain's cut): no new connection
		}
		if !old.spoiled && (old.tls == nil || !old.unrequested()) {
			return nil
		}
	}
	// The new connection is dialled and secured within this request's
	// deadline (fasthttp set it as the write deadline before writing), or
	// fasthttp's dial default: not the bound of the request that dialled
	// the old one.
	deadline := time.Now().Add(fasthttp.DefaultDialTimeout)
	if wd := old.u.wd.Load(); wd != 0 && wd < deadline.UnixNano() {
		deadline = time.Unix(0, wd)
	}
	left := time.Until(deadline)
	if left <= 0 {
		return os.ErrDeadlineExceeded
	}
	nc, err := c.f.dialRaw(c.addr, left)
	if err != nil {
		return err
	}
	u := c.f.track(nc)
	if u == nil {
		return net.ErrClosed
	}
	rw, err := c.f.secure(u, deadline)
	if err != nil {
		return err
	}
	if rd := old.u.rd.Load(); rd != 0 {
		u.SetReadDeadline(time.Unix(0, rd))
	}
	if wd := old.u.wd.Load(); wd != 0 {
		u.SetWriteDeadline(time.Unix(0, wd))
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		u.Close()
		return net.ErrClosed
	}
	c.cur.Store(newLeg(u, rw))
	c.mu.Unlock()
	old.u.Close()
	c.readAny, c.reused = false, false // a new connection
	return nil
}

// unrequested reports whether TLS holds, already read from the socket,
// something nobody asked for: application data, an alert, the close. It
// reads once with a deadline long past, so that TLS returns what it holds
// and never waits on the socket (a timeout leaves a TLS connection
// usable), and puts the read deadline back.
func (l *pooledLeg) unrequested() bool {
	rd := l.u.rd.Load()
	l.u.SetReadDeadline(time.Unix(1, 0))
	var b [1]byte
	n, err := l.tls.Read(b[:])
	var back time.Time
	if rd != 0 {
		back = time.Unix(0, rd)
	}
	l.u.SetReadDeadline(back)
	return n > 0 || !errors.Is(err, os.ErrDeadlineExceeded)
}

func (c *pooledConn) Close() error {
	c.mu.Lock()
	c.closed = true
	l := c.cur.Load()
	c.mu.Unlock()
	return l.u.Close()
}

// Handshake tells fasthttp that the connection to an https upstream is
// secured already (dialUpstream ran TLS over it).
func (c *pooledConn) Handshake() error { return nil }

func (c *pooledConn) LocalAddr() net.Addr                { return c.local }
func (c *pooledConn) RemoteAddr() net.Addr               { return c.cur.Load().u.RemoteAddr() }
func (c *pooledConn) SetDeadline(t time.Time) error      { return c.cur.Load().u.SetDeadline(t) }
func (c *pooledConn) SetReadDeadline(t time.Time) error  { return c.cur.Load().u.SetReadDeadline(t) }
func (c *pooledConn) SetWriteDeadline(t time.Time) error { return c.cur.Load().u.SetWriteDeadline(t) }

// pooledAddr is a pooledConn's local address. It names the current leg's,
// and lets upTransport find the connection a request failed on (fasthttp
// keeps it in the response: Response.LocalAddr).
type pooledAddr struct{ c *pooledConn }

func (a pooledAddr) Network() string { return a.c.cur.Load().u.LocalAddr().Network() }
func (a pooledAddr) String() string  { return a.c.cur.Load().u.LocalAddr().String() }

// conns is a set of connections, for closing those left at the drain's
// cut. It is safe for concurrent use.
type conns struct {
	m    sync.Map
	shut atomic.Bool
}

// add keeps c, or reports false once closeAll has run.
func (s *conns) add(c *upConn) bool {
	s.m.Store(c, struct{}{})
	if s.shut.Load() {
		s.m.Delete(c)
		return false
	}
	return true
}

func (s *conns) forget(c *upConn) { s.m.Delete(c) }

// closeAll closes every connection in the set, and any added later.
func (s *conns) closeAll() {
	s.shut.Store(true)
	s.m.Range(func(c, _ any) bool {
		c.(net.Conn).Close()
		return true
	})
}

// dialUpstream dials the fast server's pooled upstream connections
// (pooledConn, with the idle bound), as fasthttp's own dialer would.
func (f *fastServer) dialUpstream(addr string, timeout time.Duration) (net.Conn, error) {
	start := time.Now()
	c, err := f.dialRaw(addr, timeout)
	if err != nil {
		return nil, err
	}
	u := f.track(c)
	if u == nil {
		return nil, net.ErrClosed
	}
	if timeout <= 0 {
		timeout = fasthttp.DefaultDialTimeout
	}
	rw, err := f.secure(u, start.Add(timeout)) // the dial and the handshake within one timeout
	if err != nil {
		return nil, err
	}
	return newPooledConn(f, addr, u, rw), nil
}

// secure runs TLS over u to an https upstream, the handshake done by
// deadline; it returns u itself to an http one. It closes u when the
// handshake fails.
func (f *fastServer) secure(u *upConn, deadline time.Time) (net.Conn, error) {
	if !f.up.IsTLS {
		return u, nil
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	return f.handshake(ctx, u)
}

// dialRaw dials addr within timeout, or fasthttp's default of 3 s.
func (f *fastServer) dialRaw(addr string, timeout time.Duration) (net.Conn, error) {
	if f.dial != nil {
		return f.dial(addr, timeout)
	}
	if timeout > 0 {
		return fasthttp.DialTimeout(addr, timeout)
	}
	return fasthttp.Dial(addr)
}

// track wraps an upstream connection with the idle bound and keeps it for
// Close until it closes; nil (and c closed) once Close has run.
func (f *fastServer) track(c net.Conn) *upConn {
	u := newUpConn(c, f.s.opts.UpstreamTimeout, f.ups.forget).(*upConn)
	if !f.ups.add(u) {
		c.Close()
		return nil
	}
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
