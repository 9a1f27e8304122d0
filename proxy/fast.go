package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/valyala/fasthttp"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/host"
	"github.com/sluice-go/sluice/internal/httpcore"
)

// The proxy's own HTTP/1.1 server (Run). net/http's server and
// httputil.ReverseProxy cost a goroutine hand-off per request in each
// direction and a header map per message; on a 2-core machine they cap a
// reverse proxy at about 0.4 of nginx's throughput and a rejection at
// about 0.7 of nginx limit_req's (BENCHMARKS.md), below what a proxy in
// front of a service may cost. Run therefore serves with
// github.com/valyala/fasthttp, whose server and client read and write on
// the request's own goroutine with reused buffers. The behaviour is the
// Handler's (net/http), which stays for embedding, and the tests run the
// proxy's cases through both:
//
//   - Request bodies are read whole before the decision (into a spool past
//     the server's read buffer), responses read whole from the upstream
//     (into a spool, within the shared budgets) before the request's slot
//     is released and the client is written to; streams (server-sent
//     events, "X-Accel-Buffering: no", responses past the caps) and
//     upgrades hold the slot, never past the request's deadline plus
//     Grace (MaxHold without a deadline), nor past an upstream silence of
//     UpstreamTimeout (upstream.go). A body or a response the budgets
//     cannot hold is refused with 503 (busyBody, busyResponse), never
//     streamed holding a slot for as long as a slow client takes.
//   - Hop-by-hop fields are dropped both ways; X-Forwarded-For is set to
//     the client's address, X-Forwarded-Host and -Proto to the request's,
//     and Host to the upstream's, as ReverseProxy's SetURL and
//     SetXForwarded do.
//
// One difference remains: net/http notices a client that goes away while
// its request runs at the upstream (a background read on the connection)
// and cancels the request; this server notices it only while the request
// waits in a gate (goneWatch, gone.go): once forwarded, such a request
// runs at the upstream until it answers or its deadline passes, and counts
// as served.

// fastServer serves the proxy over fasthttp.
type fastServer struct {
	s      *Server
	srv    *fasthttp.Server
	up     *fasthttp.HostClient
	base   string   // the upstream URL's path, without a final "/"
	query  string   // the upstream URL's query
	host   string   // the upstream's Host field
	conns  sync.Map // the clients' connections
	ups    conns    // the upstream's connections, for Close
	closed chan struct{}
	gone   goneWatch // clients gone while their requests wait
	// draining: every answer closes its connection (the drain delay).
	draining atomic.Bool
	// cut: Close cut the connections left (the drain's grace ran out); an
	// upstream call that fails from then on is the drain's doing.
	cut atomic.Bool
	// sessions resumes TLS sessions to an https upstream (the pool's new
	// connections, upgrades), unless its TLS configuration has a cache.
	sessions tls.ClientSessionCache
	// clientConns and upstreamConns bound the clients' connections and
	// the upstream pool's (descriptorBudget).
	clientConns, upstreamConns int
	// dial, when set, dials the upstream instead of TCP (benchmarks:
	// an upstream in memory), and the upstream's connections do not
	// yield before an answer: in memory the answer's wake-up is a
	// goroutine switch, not the read calls and park a yield saves, so
	// the yield would only add its own cost to what is measured.
	dial func(addr string, timeout time.Duration) (net.Conn, error)
}

// descriptorBudget splits the process's file descriptors (limit, when
// known): at most half for clients' connections (a client past it is
// answered 503 and closed, by fasthttp's Concurrency), a quarter for the
// upstream pool (a request past it waits for a connection, within its
// deadline), and a quarter kept for everything else (the admin listener,
// Redis, spool files, logs), so that a flood of idle connections never
// takes the descriptors the proxy needs to serve anyone. At most 262,144
// clients (fasthttp's default) and 4,096 upstream connections.
func descriptorBudget(limit uint64, known bool) (clients, upstream int) {
	clients, upstream = 256*1024, 4096
	if known {
		clients = int(min(max(limit/2, 16), uint64(clients)))
		upstream = int(min(max(limit/4, 8), uint64(upstream)))
	}
	return clients, upstream
}

// newFast builds the proxy's fasthttp server.
func (s *Server) newFast() *fastServer {
	u := s.opts.Upstream
	addr := u.Host
	if u.Port() == "" {
		if u.Scheme == "https" {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	f := &fastServer{s: s, base: strings.TrimSuffix(u.EscapedPath(), "/"), query: u.RawQuery, host: u.Host, closed: make(chan struct{}),
		sessions: tls.NewLRUClientSessionCache(0)}
	f.clientConns, f.upstreamConns = descriptorBudget(fileLimit())
	f.up = &fasthttp.HostClient{
		Addr: addr, IsTLS: u.Scheme == "https",
		MaxConns:                  f.upstreamConns,
		MaxConnWaitTimeout:        30 * time.Second, // past MaxConns a request waits for a connection, within its deadline
		MaxIdleConnDuration:       90 * time.Second,
		StreamResponseBody:        true,
		DisablePathNormalizing:    true,
		NoDefaultUserAgentHeader:  true,
		SecureErrorLogMessage:     true, // errors name no bytes of the answer: an upstream's malformed head may carry its cookies
		MaxIdemponentCallAttempts: 2,    // one retry of an idempotent request on a stale idle connection
		RetryIfErr:                retryIdempotent,
		Transport:                 upTransport{},
		ReadBufferSize:            16 << 10,
		DialTimeout:               f.dialUpstream,
	}
	f.srv = &fasthttp.Server{
		Handler:                      f.serve,
		ExpectHandler:                f.expect,
		Concurrency:                  f.clientConns,
		ErrorHandler:                 f.malformed,
		ReadTimeout:                  s.opts.ReadTimeout,
		WriteTimeout:                 s.opts.WriteTimeout,
		IdleTimeout:                  s.opts.ReadTimeout, // as ReadTimeout, so that coarseConn keeps both in one deadline
		MaxRequestBodySize:           int(min(s.opts.MaxBodyBytes, int64(^uint(0)>>1))),
		StreamRequestBody:            true,
		ReadBufferSize:               maxHead, // the largest request head taken
		NoDefaultServerHeader:        true,
		SecureErrorLogMessage:        true, // errors name no bytes of the request
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		LazyRequestTime:              true, // one clock read less a request: nothing here reads ctx.Time
		Logger:                       fastLogger{s},
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			switch st {
			case fasthttp.StateNew:
				f.conns.Store(c, struct{}{})
			case fasthttp.StateClosed, fasthttp.StateHijacked:
				f.conns.Delete(c)
			}
		},
	}
	return f
}

func (f *fastServer) closeIfDraining(ctx *fasthttp.RequestCtx) {
	if f.draining.Load() {
		ctx.SetConnectionClose()
	}
}

// SetKeepAlivesEnabled(false) makes every answer from now on close its
// connection ("Connection: close"), as net/http's server does: a drain
// delay sends the clients' pooled connections elsewhere one by one, each
// after an answer, rather than cutting them all when the delay ends.
func (f *fastServer) SetKeepAlivesEnabled(v bool) { f.draining.Store(!v) }

// serve serves ln with deadlines kept coarse (coarseConn).
func (f *fastServer) serveOn(ln net.Listener) error {
	return f.srv.Serve(&coarseListener{Listener: ln, log: f.s.log})
}

// Shutdown stops accepting and waits for the connections in flight (it
// fits host.Stopper).
func (f *fastServer) Shutdown(ctx context.Context) error { return f.srv.ShutdownWithContext(ctx) }

// Close closes every connection left: the clients', and the upstream's,
// so that the requests the drain cuts end their upstream calls too.
func (f *fastServer) Close() error {
	f.cut.Store(true)
	f.conns.Range(func(c, _ any) bool {
		c.(net.Conn).Close()
		return true
	})
	f.ups.closeAll()
	return nil
}

// coarseListener hands out coarseConns. An accept that fails for want of
// descriptors or buffers (EMFILE, ENFILE, ENOBUFS, ENOMEM) waits and tries
// again, 5 ms doubling to 1 s, as net/http's server does (fasthttp's
// would stop serving), and says so in the log at most once a second.
type coarseListener struct {
	net.Listener
	log  *slog.Logger
	last atomic.Int64 // when the log last said so, Unix ns
}

func (l *coarseListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			return &coarseConn{Conn: c}, nil
		}
		if !exhausted(err) {
			return nil, err
		}
		delay = min(max(2*delay, 5*time.Millisecond), time.Second)
		if now, last := time.Now().UnixNano(), l.last.Load(); now-last >= int64(time.Second) && l.last.CompareAndSwap(last, now) && l.log != nil {
			l.log.Warn("proxy: cannot accept a connection; retrying (logged at most once a second)", "err", err, "retry_in", delay)
		}
		time.Sleep(delay)
	}
}

// coarseConn keeps a connection's deadline where it is when a new one is
// at most deadlineSlack later: the server moves its read and write
// deadlines forward on every request (three runtime timer updates a
// request, 3.5% of the rejection path's throughput), and a timeout of
// tens of seconds loses nothing by ending up to deadlineSlack early. An
// earlier deadline, or none, is always applied.
//
// It also yields the processor once between writing to the client and
// reading from it again (runtime.Gosched). On a keep-alive connection the
// server reads for the next request as soon as it has written an answer,
// before the client can have sent one: the read finds nothing, the
// goroutine parks, and the poller wakes it for a second read, two read
// calls and a park a request where nginx, told by edge-triggered epoll
// that the socket is empty, makes one. Go's poller does not tell a
// program whether a socket is readable without a read. Letting the other
// runnable goroutines go first gives the client that time when the
// server is busy, which is when a request's cost matters. Under wrk, 98%
// of requests rejected, it took the reads from 1.94 to 1.26 a request.
//
// A yield is not free: the runtime wakes an idle thread for the
// goroutine it queues, a futex call and a context switch. When the
// server is not busy the next request is not there after the yield
// either, and the yield is only that cost (at 2,000 requests/s it was
// two of the 4.4 futex calls a request). So a connection yields while
// its yields pay: a read after one that returns within yieldPaid found
// the request there, and a yield that took as long ran other goroutines
// (the server is busy, and letting them go first is the point). A yield
// that returned at once followed by a read that waited makes the
// connection skip its next 1, 3, 7 … up to yieldSkipMax answers' yields;
// a yield that pays ends the skipping.
type coarseConn struct {
	net.Conn
	rd, wd atomic.Int64    // the deadlines set, Unix ns; 0: none
	raw    syscall.RawConn // the connection to peek at, once asked for (goneWatch)
	wrote  atomic.Bool     // written to since the last read (atomic: a hijacked connection is read and written by two goroutines)
	linger atomic.Bool     // close gracefully: a request's body may be unread (lingerOnClose)
	y      yielder         // used by the reading goroutine only
}

// yieldPaid is how long a read after a yield may take and still count as
// having found its request there (a read that finds data returns in a
// few µs; one that waits, waits for the client), and how long a yield
// takes when it ran other goroutines (one with nothing else to run takes
// a few µs); yieldSkipMax is the most answers a connection skips the
// yield for when its yields do not pay.
const (
	yieldPaid    = 20 * time.Microsecond
	yieldSkipMax = 63
)

func (c *coarseConn) Write(p []byte) (int, error) {
	c.wrote.Store(true)
	return c.Conn.Write(p)
}

func (c *coarseConn) Read(p []byte) (int, error) {
	if !c.wrote.Load() {
		return c.Conn.Read(p)
	}
	c.wrote.Store(false)
	if !c.y.yield() {
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(p)
	c.y.read()
	return n, err
}

// yielder is a connection's yield before a read that would most likely
// find nothing yet (coarseConn's, before a client's next request;
// pooledConn's, before the upstream's answer), with its backoff. It is
// used by one goroutine at a time.
type yielder struct {
	skip, backoff int
	off           bool                 // never yield
	t1            clock.Instant        // when the last yield returned
	took          time.Duration        // how long it took
	clock         func() clock.Instant // nil: clock.Now (monotonic only: half of time.Now's cost); a test's own
}

func (y *yielder) now() clock.Instant {
	if y.clock != nil {
		return y.clock()
	}
	return clock.Now()
}

// yield yields the processor, or skips the yield as the backoff says,
// and reports whether it yielded: then read must follow the read.
func (y *yielder) yield() bool {
	if y.off {
		return false
	}
	if y.skip > 0 {
		y.skip--
		return false
	}
	t0 := y.now()
	runtime.Gosched()
	y.t1 = y.now()
	y.took = y.t1.Sub(t0)
	return true
}

// read keeps the backoff once the read after a yield has returned.
func (y *yielder) read() { y.yielded(y.took, y.now().Sub(y.t1)) }

// yielded keeps the backoff after a yield that took yield and a read
// after it that took read.
func (y *yielder) yielded(yield, read time.Duration) {
	if read <= yieldPaid || yield >= yieldPaid {
		y.backoff = 0
		return
	}
	y.backoff = min(2*y.backoff+1, yieldSkipMax)
	y.skip = y.backoff
}

const deadlineSlack = int64(time.Second)

// Lingering close. A connection closed while its client is still sending
// (a body refused before it was read: past the budgets, too large,
// unreadable, or a request refused before its body) would be reset by the
// kernel, as unread data is left, and the reset can reach the client
// before it has read the answer: it sees "connection reset" instead of the
// 503 or 413 it was sent. So such a close sends FIN first and reads on,
// discarding, until the client closes too, at most lingerTime and
// lingerBytes (net/http's server waits 500 ms the same way; nginx's
// lingering_close), in a goroutine of its own: the handler goes on at once.
const (
	lingerTime  = 2 * time.Second
	lingerBytes = 64 << 20
)

// lingerOnClose makes ctx's connection close gracefully.
func lingerOnClose(ctx *fasthttp.RequestCtx) {
	if c, ok := ctx.Conn().(*coarseConn); ok {
		c.linger.Store(true)
	}
}

// lingerUnread makes ctx's connection close gracefully when its request's
// body is streamed and was not read (a request refused before its body).
func lingerUnread(ctx *fasthttp.RequestCtx) {
	if ctx.Request.IsBodyStream() {
		lingerOnClose(ctx)
	}
}

// Close closes c, gracefully when lingerOnClose asked for it.
func (c *coarseConn) Close() error {
	cw, ok := c.Conn.(interface{ CloseWrite() error })
	if !c.linger.Load() || !ok || cw.CloseWrite() != nil {
		return c.Conn.Close()
	}
	go func() {
		c.Conn.SetReadDeadline(time.Now().Add(lingerTime))
		io.CopyN(io.Discard, c.Conn, lingerBytes)
		c.Conn.Close()
	}()
	return nil
}

func (c *coarseConn) SetReadDeadline(t time.Time) error {
	return coarse(&c.rd, t, c.Conn.SetReadDeadline)
}

func (c *coarseConn) SetWriteDeadline(t time.Time) error {
	return coarse(&c.wd, t, c.Conn.SetWriteDeadline)
}

func (c *coarseConn) SetDeadline(t time.Time) error {
	c.rd.Store(unixOrZero(t))
	c.wd.Store(unixOrZero(t))
	return c.Conn.SetDeadline(t)
}

func unixOrZero(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func coarse(cur *atomic.Int64, t time.Time, set func(time.Time) error) error {
	n := unixOrZero(t)
	if old := cur.Load(); n != 0 && old != 0 && n >= old && n-old < deadlineSlack {
		return nil
	}
	cur.Store(n)
	return set(t)
}

type fastLogger struct{ s *Server }

func (l fastLogger) Printf(format string, args ...any) {}

// respFields writes the middleware's header fields into a response.
type respFields fasthttp.ResponseHeader

func (h *respFields) Set(key string, vals []string) {
	rh := (*fasthttp.ResponseHeader)(h)
	if len(vals) == 1 { // the key is canonical already
		rh.SetCanonical(s2b(key), s2b(vals[0]))
		return
	}
	if len(vals) == 0 {
		rh.Del(key)
		return
	}
	// Several values: the first in place of the field there, if one is
	// (a delete would move the header's last field into its place), the
	// rest after; several fields there are all deleted first.
	if len(rh.PeekAll(key)) > 1 {
		rh.Del(key)
	}
	rh.SetCanonical(s2b(key), s2b(vals[0]))
	for _, v := range vals[1:] {
		rh.Add(key, v)
	}
}

// SetValue sets key (canonical) to v, copied (httpcore.ValueSetter).
func (h *respFields) SetValue(key string, v []byte) {
	(*fasthttp.ResponseHeader)(h).SetCanonical(s2b(key), v)
}

// setAnswerFields sets an admitted answer's own fields (RateLimit,
// RateLimit-Policy, the legacy X-RateLimit ones, Sluice-Level: SetHeaders)
// on h, the upstream's answer, each in place of the upstream's own fields
// of its name. With at most one such field per name, respFields replaces
// it where it stands and nothing moves. When the upstream repeated one,
// every field of each name set is deleted first (replaceFields), which
// moves others, and the answer's repeated fields are put back in their
// order once all are set. One pass over the answer's fields otherwise.
func setAnswerFields(adm *httpcore.Admission, h *fasthttp.ResponseHeader) {
	var seen [len(ownAnswerNames)]uint8
	for k := range h.All() {
		if i := ownAnswerField(b2s(k)); i >= 0 {
			if seen[i]++; seen[i] > 1 {
				rep := repeatedFields(h)
				adm.SetHeaders((*replaceFields)(h))
				restoreOrder(h, rep)
				return
			}
		}
	}
	adm.SetHeaders((*respFields)(h))
}

// ownAnswerNames are the fields sluice sets on an admitted answer.
var ownAnswerNames = [...]string{"Ratelimit", "Ratelimit-Policy", "X-Ratelimit-Limit", "X-Ratelimit-Remaining", "X-Ratelimit-Reset", sluice.LevelHeader}

// ownAnswerField returns the index in ownAnswerNames of n (any case), or
// -1.
func ownAnswerField(n string) int {
	if len(n) < len("Ratelimit") || len(n) > len("X-Ratelimit-Remaining") {
		return -1
	}
	for i, o := range ownAnswerNames {
		if len(o) == len(n) && strings.EqualFold(n, o) {
			return i
		}
	}
	return -1
}

// replaceFields is respFields for an answer that has fields of the names
// it sets: every field of a name set goes, then the new ones are added
// (setAnswerFields puts the answer's other repeated fields back in order
// after: a delete moves the header's last field into the deleted one's
// place).
type replaceFields fasthttp.ResponseHeader

func (h *replaceFields) Set(key string, vals []string) {
	rh := (*fasthttp.ResponseHeader)(h)
	rh.Del(key)
	for _, v := range vals {
		rh.Add(key, v)
	}
}

func (h *replaceFields) SetValue(key string, v []byte) {
	rh := (*fasthttp.ResponseHeader)(h)
	rh.Del(key)
	rh.AddBytesV(key, v)
}

// s2b views s as bytes, for fasthttp's setters, which copy them.
func s2b(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// b2s views b as a string; b must not change while the string is used.
func b2s(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// oneField returns the value of the answer's field name, or "" when it
// lacks it or repeats it (a cost said twice is malformed:
// identify.ActualCost keeps the estimate). The value is valid while h is.
func oneField(h *fasthttp.ResponseHeader, name string) string {
	vs := h.PeekAll(name)
	if len(vs) != 1 {
		return ""
	}
	return b2s(vs[0])
}

// input fills in with what the middleware reads of the request in ctx:
// only the fields it names (Middleware.Headers).
func (f *fastServer) input(ctx *fasthttp.RequestCtx, in *identify.Input, names []string, addr bool) (ok bool) {
	in.Method = b2s(ctx.Method())
	raw, query := target(&ctx.Request.Header)
	if strings.IndexByte(raw, '%') >= 0 {
		p, err := url.PathUnescape(raw)
		if err != nil {
			return false
		}
		raw = p
	}
	in.Path = raw
	in.RawQuery = query
	if addr {
		in.RemoteAddr = ctx.RemoteAddr().String()
	}
	h := headerPool.Get().(http.Header)
	for _, n := range names {
		for _, v := range ctx.Request.Header.PeekAll(n) {
			h[n] = append(h[n], string(v))
		}
	}
	in.Header = h
	return true
}

// target returns the path and query of a request's target as written
// (URL.Path before unescaping and URL.RawQuery of net/http's server), in
// origin or absolute form. A request target has no fragment (RFC 9112
// section 3.2): a '#' stays in the path or query, as net/http's server
// leaves it, so that the gates and the upstream see the same path.
// The strings view h's buffer.
func target(h *fasthttp.RequestHeader) (path, query string) {
	raw := b2s(h.RequestURI())
	if len(raw) > 0 && raw[0] != '/' { // absolute form: drop the scheme and authority
		if i := strings.Index(raw, "://"); i >= 0 {
			raw = raw[i+3:]
			j := strings.IndexAny(raw, "/?")
			if j < 0 {
				return "", ""
			}
			raw = raw[j:]
		}
	}
	path, query, _ = strings.Cut(raw, "?")
	return path, query
}

// appendEscapedHash appends s to b with every '#' escaped, so that the
// upstream does not take the rest for a fragment.
func appendEscapedHash(b []byte, s string) []byte {
	for {
		i := strings.IndexByte(s, '#')
		if i < 0 {
			return append(b, s...)
		}
		b = append(b, s[:i]...)
		b = append(b, "%23"...)
		s = s[i+1:]
	}
}

// headerPool holds the small header maps of Inputs; serve returns its
// map when the request is done with it.
var headerPool = sync.Pool{New: func() any { return make(http.Header, 4) }}

// putHeader empties the values of names in h, keeping their slices
// (every reader of an Input's header takes an empty one as absent), and
// pools h.
func putHeader(h http.Header, names []string) {
	if len(h) > 16 {
		return
	}
	for _, n := range names {
		if v := h[n]; len(v) > 0 {
			clear(v)
			h[n] = v[:0]
		}
	}
	headerPool.Put(h)
}

// answer writes a rendered rejection.
func answer(ctx *fasthttp.RequestCtx, rj httpcore.Rejection) {
	ctx.SetStatusCode(rj.Status)
	ctx.SetBody(rj.Body)
	rj.Release()
}

// malformed answers a request the server could not read (fasthttp's
// ErrorHandler) in the envelope, as the Handler answers them: 400, 413 for
// a body beyond MaxBodyBytes, 431 for a head beyond the read buffer.
func (f *fastServer) malformed(ctx *fasthttp.RequestCtx, err error) {
	var ne net.Error
	if (errors.As(err, &ne) && ne.Timeout()) || errors.Is(err, os.ErrDeadlineExceeded) {
		// The connection sent no whole request head within ReadTimeout
		// (an idle keep-alive or a slow client): 408 and close, as
		// net/http and fasthttp's own handler do; the client did nothing
		// malformed, so it is not counted as an invalid request.
		ctx.Response.Reset()
		ctx.SetStatusCode(http.StatusRequestTimeout)
		ctx.SetConnectionClose()
		return
	}
	detail, status := "malformed request: "+err.Error(), http.StatusBadRequest
	switch {
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		detail, status = "request body more than the "+strconv.FormatInt(f.s.opts.MaxBodyBytes, 10)+" bytes the proxy takes", http.StatusRequestEntityTooLarge
	case errors.As(err, new(*fasthttp.ErrSmallBuffer)):
		detail, status = "request head larger than the "+strconv.Itoa(f.srv.ReadBufferSize>>10)+" KiB the proxy reads", http.StatusRequestHeaderFieldsTooLarge
	}
	ctx.Response.Reset()
	in := identify.Input{Method: b2s(ctx.Method()), Path: b2s(ctx.Path()), Header: http.Header{}}
	answer(ctx, f.s.mw.RenderInvalidStatus(context.Background(), (*respFields)(&ctx.Response.Header), &in, status, detail))
	ctx.SetConnectionClose()
}

// wellFormed answers, and closes the connection of, a request net/http's
// server would refuse before its handler and fasthttp's takes: a version
// other than HTTP/1.x (505), a field name that is not a token (400, RFC
// 9110 section 5.1). Neither is forwarded: an upstream reading the request
// another way than the proxy did is how requests are smuggled.
func (f *fastServer) wellFormed(ctx *fasthttp.RequestCtx) bool {
	h := &ctx.Request.Header
	if p := b2s(h.Protocol()); p != "HTTP/1.1" && p != "HTTP/1.0" {
		ctx.Response.Reset()
		ctx.SetStatusCode(http.StatusHTTPVersionNotSupported)
		ctx.SetBodyString("sluice proxy: HTTP/1.0 and HTTP/1.1 only\n")
		ctx.SetConnectionClose()
		return false
	}
	bad := ""
	for k := range h.All() {
		if bad == "" && !httpcore.ValidToken(b2s(k)) {
			bad = string(k)
		}
	}
	if bad != "" {
		in := identify.Input{Method: b2s(ctx.Method()), Path: b2s(ctx.Path()), Header: http.Header{}}
		answer(ctx, f.s.mw.RenderInvalid(context.Background(), (*respFields)(&ctx.Response.Header), &in, "malformed header field name "+strconv.Quote(bad)))
		ctx.SetConnectionClose()
		return false
	}
	return true
}

// hop-by-hop fields (RFC 9110 section 7.6.1), which a proxy must not
// forward in either direction.
var hopFields = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// expectedKey is the user value under which expect leaves serve a request
// it decided before its body came.
const expectedKey = "sluice.expected"

// expected is a request that asked to hear before sending its body
// (Expect: 100-continue) and was admitted: serve reads its body and
// forwards it without deciding again. If the server never calls serve for
// it (the body could not be read), resetting the request's user values
// closes it, which ends its admission.
type expected struct {
	in    identify.Input
	names []string
	adm   httpcore.Admission
}

func (e *expected) Close() error {
	e.adm.Done(context.Background(), http.StatusBadRequest, true)
	putHeader(e.in.Header, e.names)
	return nil
}

// expect decides a request that sent Expect: 100-continue before its body
// comes (fasthttp's ExpectHandler): admitted, the client is told to go on
// (100 Continue) and serve forwards it; refused, it gets the refusal at
// once (its status, Retry-After and envelope) and its body is never read
// (the connection closes). A request the gates would not see (malformed,
// not proxied) goes on to serve, which answers it.
func (f *fastServer) expect(ctx *fasthttp.RequestCtx) int {
	s := f.s
	if string(ctx.Request.Header.RequestURI()) == "*" || !f.wellFormed(ctx) {
		return fasthttp.StatusContinue
	}
	snap := s.mw.Snapshot()
	e := &expected{names: snap.Headers()}
	if !f.input(ctx, &e.in, e.names, snap.ReadsAddr()) || e.in.Method == "PRI" || e.in.Method == http.MethodConnect {
		if e.in.Header != nil {
			putHeader(e.in.Header, e.names)
		}
		return fasthttp.StatusContinue
	}
	e.in.Method, e.in.Path = strings.Clone(e.in.Method), strings.Clone(e.in.Path)
	fields := (*respFields)(&ctx.Response.Header)
	var rj httpcore.Rejection
	var ok bool
	e.adm, rj, ok = f.admit(ctx, snap, &e.in, fields)
	if !ok {
		putHeader(e.in.Header, e.names)
		answer(ctx, rj)
		return rj.Status
	}
	ctx.SetUserValue(expectedKey, e)
	return fasthttp.StatusContinue
}

// serveExpected reads the body of a request expect admitted (holding its
// slot: the client was told to send it now) and forwards it.
func (f *fastServer) serveExpected(ctx *fasthttp.RequestCtx, e *expected) {
	ctx.RemoveUserValue(expectedKey) // serve ends the admission from here on
	defer putHeader(e.in.Header, e.names)
	body, ok := f.readBody(ctx, &e.in)
	if !ok {
		e.adm.Done(ctx, ctx.Response.StatusCode(), false)
		return
	}
	if body != nil {
		defer body.Close()
	}
	f.forward(ctx, &e.in, e.adm, ctx.Request.Header.ConnectionUpgrade())
}

// serve is the proxy's request handler.
func (f *fastServer) serve(ctx *fasthttp.RequestCtx) {
	defer f.closeIfDraining(ctx) // read when answering: a request under way when the drain starts closes too
	s := f.s
	if e, ok := ctx.UserValue(expectedKey).(*expected); ok {
		f.serveExpected(ctx, e)
		return
	}
	if string(ctx.Request.Header.RequestURI()) == "*" && ctx.IsOptions() {
		// Asterisk form (RFC 9112 section 3.2.4) asks about the server,
		// not a resource: answered here, as net/http's server answers it,
		// and never forwarded (it would be a request for "/*").
		ctx.Response.Header.SetContentLength(0)
		return
	}
	if !f.wellFormed(ctx) {
		lingerUnread(ctx)
		return
	}
	mw := s.mw
	snap := mw.Snapshot()
	fields := (*respFields)(&ctx.Response.Header)
	var in identify.Input
	names := snap.Headers()
	defer func() {
		if in.Header != nil {
			putHeader(in.Header, names)
		}
	}()
	if !f.input(ctx, &in, names, snap.ReadsAddr()) {
		in.Path = b2s(ctx.Path())
		in.Header = http.Header{}
		answer(ctx, mw.RenderInvalid(context.Background(), fields, &in, "malformed request path"))
		lingerUnread(ctx)
		return
	}
	if m := in.Method; m == "PRI" || m == http.MethodConnect {
		answer(ctx, mw.RenderInvalid(context.Background(), fields, &in, "method "+m+" is not proxied"))
		lingerUnread(ctx)
		return
	}
	body, ok := f.readBody(ctx, &in)
	if !ok {
		return
	}
	if body != nil {
		defer body.Close()
	}
	upgrade := ctx.Request.Header.ConnectionUpgrade()
	if upgrade { // its request outlives the handler: keep copies
		in.Method, in.Path = strings.Clone(in.Method), strings.Clone(in.Path)
	}

	var adm httpcore.Admission
	var rj httpcore.Rejection
	adm, rj, ok = f.admit(ctx, snap, &in, fields)
	if !ok {
		answer(ctx, rj)
		return
	}
	f.forward(ctx, &in, adm, upgrade)
}

// admit decides a request: watched for its client going away when it may
// wait in a gate (admitWatched), at once otherwise.
func (f *fastServer) admit(ctx *fasthttp.RequestCtx, snap httpcore.Snapshot, in *identify.Input, fields httpcore.Fields) (httpcore.Admission, httpcore.Rejection, bool) {
	if snap.MayWait() {
		return f.admitWatched(ctx, snap, in, fields)
	}
	return snap.Admit(context.Background(), in, fields)
}

// admitWatched decides a request that may wait in a gate, with a context
// that ends if its client goes away meanwhile (goneWatch).
func (f *fastServer) admitWatched(ctx *fasthttp.RequestCtx, snap httpcore.Snapshot, in *identify.Input, fields httpcore.Fields) (httpcore.Admission, httpcore.Rejection, bool) {
	actx, e := f.gone.watch(ctx.Conn())
	defer f.gone.done(e)
	adm, rj, ok := snap.Admit(actx, in, fields)
	if !ok && actx.Err() != nil {
		// Its client went away while it waited: the connection serves
		// nothing more, not even a request pipelined behind this one,
		// which the server has read already and would otherwise forward.
		ctx.SetConnectionClose()
	}
	return adm, rj, ok
}

// forward sends an admitted request to the upstream and its answer to
// the client, and reports how it ended (at once, or when its stream
// does).
func (f *fastServer) forward(ctx *fasthttp.RequestCtx, in *identify.Input, adm httpcore.Admission, upgrade bool) {
	s := f.s
	// outbound rewrites the request target in its buffer, which in.Path
	// may view: the drain's log and the access log keep a copy.
	in.Path = strings.Clone(in.Path)
	adm.SetPath(in.Path)
	tr := s.inflight.Track(in.Method, in.Path)
	path := in.Path
	streaming := false
	defer func() {
		if streaming {
			return // the stream's writer ends the request
		}
		if p := recover(); p != nil {
			// net/http's server would recover and close the connection;
			// fasthttp's would end the process.
			s.log.Error("proxy: panic serving a request", "path", path, "panic", p)
			ctx.Response.Reset()
			ctx.SetStatusCode(http.StatusInternalServerError)
			ctx.SetConnectionClose()
			adm.Done(ctx, http.StatusInternalServerError, false)
		}
		s.inflight.Untrack(tr)
	}()
	var deadline time.Time
	now := time.Now()
	if b := adm.Budget(); b > 0 {
		deadline = now.Add(b)
	}
	hold := holdEnd(deadline, s.opts.Grace, s.opts.MaxHold, now)
	trusted := s.mw.Snapshot().TrustedProxy(in.RemoteAddr)
	if upgrade {
		streaming = f.upgrade(ctx, &adm, tr, deadline, hold, trusted)
		if !streaming {
			adm.Done(ctx, ctx.Response.StatusCode(), false)
		}
		return
	}
	f.outbound(ctx, &adm, trusted)
	resp := fasthttp.AcquireResponse()
	var err error
	if deadline.IsZero() {
		err = f.up.Do(&ctx.Request, resp)
	} else {
		// The upstream gets UpstreamGrace past the deadline, holding the
		// slot: it is most likely still at work on the request.
		upDeadline := deadline
		if g := s.opts.UpstreamGrace; g > 0 {
			upDeadline = deadline.Add(g)
		}
		err = f.up.DoDeadline(&ctx.Request, resp, upDeadline)
		if err == nil && time.Now().After(deadline) {
			resp.CloseBodyStream() // released below, once
			err = errLate
		}
	}
	if err == nil {
		err = unpassable(resp)
	}
	if err != nil {
		fasthttp.ReleaseResponse(resp)
		f.upstreamError(ctx, &adm, in, err)
		adm.Done(ctx, ctx.Response.StatusCode(), false)
		return
	}
	adm.ReadCost(func(name string) string { return oneField(&resp.Header, name) })
	streaming = f.respond(ctx, resp, &adm, tr, deadline, hold)
	if !streaming {
		setAnswerFields(&adm, &ctx.Response.Header)
		adm.Done(ctx, ctx.Response.StatusCode(), false)
	}
}

// maxHead is the largest request head the proxy takes, on either front
// (a larger one is answered 431).
const maxHead = 16 << 10

// unpassable returns why resp is an answer a proxy cannot pass on, and
// closes its stream, or nil (the connection it came on is not used again:
// pooledConn marked it at the answer's first bytes, refusedStatus): a
// status outside HTTP's 100 to 599 (RFC 9110 section 15; fasthttp passed
// "099" on as "99", without framing, and the next answer followed its
// body), or a switch of protocols the request did not ask for (it was
// passed on without its Upgrade field, and the client's connection went
// on in HTTP). net/http's reverse proxy refuses both.
func unpassable(resp *fasthttp.Response) error {
	err := badStatus(resp.StatusCode())
	if err == nil && resp.StatusCode() == http.StatusSwitchingProtocols {
		err = errors.New("the upstream switched protocols on a request that asked for no upgrade")
	}
	if err != nil {
		resp.CloseBodyStream()
	}
	return err
}

// readBody reads a request body that the server streams (one past its
// read buffer) into a spool, within MaxBodyBytes, and makes it the
// request's body; it answers itself (and reports false) for one too large
// or unreadable (413, 400) and for one the budgets cannot hold right now
// (503, busyBody).
func (f *fastServer) readBody(ctx *fasthttp.RequestCtx, in *identify.Input) (*spool, bool) {
	s := f.s
	max := s.opts.MaxBodyBytes
	if !ctx.Request.IsBodyStream() { // read whole already, within the server's read buffer
		if n := len(ctx.Request.Body()); int64(n) > max {
			answer(ctx, s.mw.RenderInvalidStatus(context.Background(), (*respFields)(&ctx.Response.Header), in, http.StatusRequestEntityTooLarge, "request body more than the "+strconv.FormatInt(max, 10)+" bytes the proxy takes"))
			ctx.SetConnectionClose()
			return nil, false
		}
		return nil, true
	}
	sp := newSpool(s.bufferLimits(max))
	stream := ctx.RequestBodyStream()
	bp := s.copyBufs.get()
	_, err := spoolFrom(sp, io.LimitReader(stream, max+1), *bp)
	s.copyBufs.put(bp)
	n := sp.Len()
	fields := (*respFields)(&ctx.Response.Header)
	switch {
	case err == nil && n > max, errors.Is(err, errSpoolCap):
		sp.Close()
		answer(ctx, s.mw.RenderInvalidStatus(context.Background(), fields, in, http.StatusRequestEntityTooLarge, "request body more than the "+strconv.FormatInt(max, 10)+" bytes the proxy takes"))
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		return nil, false
	case errors.Is(err, errSpoolFull):
		// The budgets are spent: refused before it holds a slot (a body
		// that streamed would hold one for as long as its sender takes).
		sp.Close()
		answer(ctx, s.mw.RenderBusy(context.Background(), fields, in, busyBody))
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		return nil, false
	case err != nil:
		sp.Close()
		answer(ctx, s.mw.RenderInvalid(context.Background(), fields, in, "request body unreadable: "+err.Error()))
		ctx.SetConnectionClose()
		lingerOnClose(ctx)
		return nil, false
	}
	ctx.Request.SetBodyStream(sp, int(n))
	return sp, true
}

// outbound turns the client's request into the upstream's, in place: the
// upstream's path prefix, query and Host, no hop-by-hop fields, the
// X-Forwarded fields (grown by one hop from a trusted proxy, set anew from
// anyone else), and the decision passed on (class, level, deadline).
func (f *fastServer) outbound(ctx *fasthttp.RequestCtx, adm *httpcore.Admission, trusted bool) {
	req := &ctx.Request
	h := &req.Header
	var hb [256]byte // the client's Host, kept past SetHost: on the stack when it fits
	clientHost := append(hb[:0], h.Host()...)
	var ub [512]byte                                  // the new target, copied by SetRequestURIBytes: on the stack when it fits
	req.SetRequestURIBytes(f.appendTarget(ub[:0], h)) // parsed again, without normalizing, when written
	// The fields replaced or dropped below, found in one pass: a field
	// looked up, deleted or set by name costs a normalized copy of the
	// name and a pass of its own, most often for a field the request does
	// not have. (A field dropTrailer or dropHopRequest removes stays
	// marked: deleting it again is harmless.)
	var has outFields
	for k := range h.All() {
		has.mark(k)
	}
	var rep []field // the repeated fields whose order the deletions below may change
	if has.deletes() {
		rep = repeatedFields(h)
	}
	keepTE := false
	if has.te {
		te := h.Peek("Te")
		keepTE = len(te) > 0 && strings.Contains(strings.ToLower(string(te)), "trailers")
	}
	dropTrailer(h)
	dropHopRequest(h)
	if keepTE { // as ReverseProxy: "TE: trailers" passes, for gRPC-like upstreams
		h.SetCanonical(fieldTE, valueTrailers)
	}
	restoreOrder(h, rep) // before the chains of a trusted proxy are read
	h.SetNoDefaultContentType(true)
	forwarded(ctx, &has, trusted, clientHost)
	h.SetHost(f.host)
	h.ResetConnectionClose()
	switch {
	case adm == nil:
	case has.sluice:
		adm.Propagate((*propFields)(h))
	default:
		adm.Propagate((*bareFields)(h))
	}
	restoreOrder(h, rep)
	if f.up != nil && f.up.IsTLS {
		// The upstream client parses the URI from these fields, with the
		// scheme of the connection the request came on (plain HTTP), and
		// refuses one whose scheme is not its own.
		req.URI().SetScheme("https")
	}
}

// appendTarget appends to b the upstream's request target for the
// client's (h's): the upstream URL's path prefix, the client's path with
// '#' escaped, and the two queries joined.
func (f *fastServer) appendTarget(b []byte, h *fasthttp.RequestHeader) []byte {
	path, q := target(h)
	b = append(b, f.base...)
	if len(path) == 0 || path[0] != '/' {
		b = append(b, '/')
	}
	b = appendEscapedHash(b, path)
	switch {
	case f.query != "" && len(q) > 0:
		b = append(b, '?')
		b = append(b, f.query...)
		b = append(b, '&')
		b = appendEscapedHash(b, q)
	case f.query != "":
		b = append(b, '?')
		b = append(b, f.query...)
	case len(q) > 0:
		b = append(b, '?')
		b = appendEscapedHash(b, q)
	}
	return b
}

// forwarded sets the request's X-Forwarded fields and Forwarded: grown by
// one hop from a trusted proxy, set anew from anyone else; has says which
// the request came with, clientHost is its Host.
func forwarded(ctx *fasthttp.RequestCtx, has *outFields, trusted bool, clientHost []byte) {
	h := &ctx.Request.Header
	var prior, fw []byte
	if trusted {
		if has.xfFor {
			prior = joinFields(h.PeekAll("X-Forwarded-For"))
		}
		if has.forwarded {
			if fws := h.PeekAll("Forwarded"); len(fws) > 0 {
				fw = append(joinFields(fws), ", "...)
				fw = append(fw, forwardedFor(ctx.RemoteAddr().String())...)
			}
		}
	}
	if has.forwarded {
		h.Del("Forwarded")
	}
	if has.xfHost {
		h.Del("X-Forwarded-Host")
	}
	if has.xfProto {
		h.Del("X-Forwarded-Proto")
	}
	if has.expect {
		h.Del("Expect") // the body is read: the upstream gets it at once
	}
	if len(fw) > 0 {
		h.SetCanonical(fieldForwarded, fw)
	}
	if len(prior) > 0 {
		prior = append(prior, ", "...)
	} else {
		var ipb [64]byte // the client's address alone, copied by SetCanonical: no allocation
		prior = ipb[:0]
	}
	if has.xfFor {
		h.Del("X-Forwarded-For")
	}
	if ip := appendClientIP(prior, ctx.RemoteAddr()); len(ip) > 0 {
		h.SetCanonical(fieldXFF, ip)
	}
	if len(clientHost) > 0 {
		h.SetCanonical(fieldXFHost, clientHost)
	}
	h.SetCanonical(fieldXFProto, valueHTTP)
}

// The names and values outbound sets, in canonical form (SetCanonical
// takes them as they are).
var (
	fieldTE, valueTrailers = []byte("Te"), []byte("trailers")
	fieldForwarded         = []byte("Forwarded")
	fieldXFF               = []byte("X-Forwarded-For")
	fieldXFHost            = []byte("X-Forwarded-Host")
	fieldXFProto           = []byte("X-Forwarded-Proto")
	valueHTTP              = []byte("http")
)

// outFields marks which of the fields outbound replaces or drops a
// request has; hop, that it has a hop-by-hop field or a Trailer field
// (dropHopRequest and dropTrailer delete).
type outFields struct{ te, expect, forwarded, xfFor, xfHost, xfProto, hop, sluice bool }

// deletes reports whether outbound will delete a field of the request.
func (o *outFields) deletes() bool {
	return o.te || o.expect || o.forwarded || o.xfFor || o.xfHost || o.xfProto || o.hop
}

// mark marks field name k (any case) when it is one of outFields'.
func (o *outFields) mark(k []byte) {
	o.hop = o.hop || isHop(k) || strings.EqualFold(b2s(k), "Trailer")
	n := b2s(k)
	o.sluice = o.sluice || (len(n) > len(sluicePrefix) && strings.EqualFold(n[:len(sluicePrefix)], sluicePrefix))
	switch len(n) {
	case 2:
		o.te = o.te || strings.EqualFold(n, "Te")
	case 6:
		o.expect = o.expect || strings.EqualFold(n, "Expect")
	case 9:
		o.forwarded = o.forwarded || strings.EqualFold(n, "Forwarded")
	case 15:
		o.xfFor = o.xfFor || strings.EqualFold(n, "X-Forwarded-For")
	case 16:
		o.xfHost = o.xfHost || strings.EqualFold(n, "X-Forwarded-Host")
	case 17:
		o.xfProto = o.xfProto || strings.EqualFold(n, "X-Forwarded-Proto")
	}
}

// sluicePrefix begins the names of the fields propagation sets
// (sluice.ClassHeader, sluice.LevelHeader).
const sluicePrefix = "Sluice-"

// propFields is a request's header as propagation writes it: sluice's
// own fields (sluice.ClassHeader, sluice.LevelHeader) are set under their
// canonical names, as they are; other names (the deadline header) go
// through the header's own methods.
type propFields fasthttp.RequestHeader

func (p *propFields) Del(k string) { (*fasthttp.RequestHeader)(p).Del(k) }

func (p *propFields) Set(k, v string) {
	h := (*fasthttp.RequestHeader)(p)
	if k == sluice.ClassHeader || k == sluice.LevelHeader {
		h.SetCanonical(s2b(k), s2b(v))
		return
	}
	h.Set(k, v)
}

// bareFields is propFields for a request with no field of a name
// beginning sluicePrefix (outbound's pass found none): deleting one is
// skipped, as a delete by name costs a normalized copy of the name and a
// pass over the fields. (A type of its own, not a flag: a pointer is
// what an interface holds without an allocation.)
type bareFields fasthttp.RequestHeader

func (p *bareFields) Del(k string) {
	if !strings.HasPrefix(k, sluicePrefix) {
		(*fasthttp.RequestHeader)(p).Del(k)
	}
}

func (p *bareFields) Set(k, v string) { (*propFields)(p).Set(k, v) }

// appendClientIP appends the IP address of a client's address to b (an
// IPv4 one mapped into IPv6 as IPv4, an IPv6 one with its zone), as
// net.SplitHostPort of its String would give it, without building the
// string; nothing for an address that is not TCP or has no IP.
func appendClientIP(b []byte, a net.Addr) []byte {
	if t, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(t.IP); ok {
			return ip.Unmap().WithZone(t.Zone).AppendTo(b)
		}
		return b
	}
	if a == nil {
		return b
	}
	if ip, _, err := net.SplitHostPort(a.String()); err == nil {
		return append(b, ip...)
	}
	return b
}

// dropTrailer removes the fields of a chunked request's trailer section,
// which fasthttp keeps beside the head's and would forward among them
// (deleting the Trailer field merges them in): the gates decided on the
// head alone, so a trailer must not add to or replace its fields, and a
// buffered body has no trailer to forward (net/http's path forwards none
// either). The head's own fields of those names stay.
func dropTrailer(h *fasthttp.RequestHeader) {
	var keys []string
	for k := range h.Trailers() {
		keys = append(keys, string(k))
	}
	for _, k := range keys {
		var head [][]byte
		for hk, v := range h.All() {
			if strings.EqualFold(b2s(hk), k) {
				head = append(head, append([]byte(nil), v...))
			}
		}
		h.Del(k)
		for _, v := range head {
			h.AddBytesV(k, v)
		}
	}
}

// isHop reports whether k names a hop-by-hop field of hopFields.
func isHop(k []byte) bool {
	switch len(k) {
	case 2, 7, 10, 16, 17, 18, 19:
		for _, n := range hopFields {
			if len(n) == len(k) && strings.EqualFold(b2s(k), n) {
				return true
			}
		}
	}
	return false
}

// hopNamed returns the fields a Connection value names, but close and
// keep-alive (which are hop-by-hop already) and the fields that frame or
// address the message: Content-Length, Transfer-Encoding and Host stay
// whatever Connection says (the proxy frames and addresses what it sends
// on itself; deleting Content-Length left a body without its length, a
// 502, and taking framing away on a sender's word is how messages are
// smuggled past a proxy).
func hopNamed(c []byte) []string {
	var names []string
	for _, n := range strings.Split(string(c), ",") {
		if n = strings.TrimSpace(n); n != "" && !keptNamed(n) {
			names = append(names, n)
		}
	}
	return names
}

// keptNamed reports whether a field Connection names stays (hopNamed).
func keptNamed(n string) bool {
	for _, k := range [...]string{"close", "keep-alive", "Content-Length", "Transfer-Encoding", "Host"} {
		if strings.EqualFold(n, k) {
			return true
		}
	}
	return false
}

// hopHeader is a request's or a response's header, for dropNamedHop and
// dropHopFields.
type hopHeader interface {
	Peek(key string) []byte
	PeekAll(key string) [][]byte
	Del(key string)
}

// dropHopRequest removes the hop-by-hop fields of a request: the fixed
// list and those its Connection field names (fasthttp frames the body
// itself: Transfer-Encoding is its own). Most messages have none but
// Connection itself, so it looks before it deletes. Each kind of header
// ranges over its own fields: through an interface the iterator would be
// two allocations a call.
func dropHopRequest(h *fasthttp.RequestHeader) {
	dropNamedHop(h)
	for k := range h.All() {
		if fixedHop(k) {
			dropHopFields(h)
			return
		}
	}
}

// dropHopResponse is dropHopRequest for a response, which also loses its
// "Connection: close" (the client's connection is not the upstream's),
// and the fields whose names are not tokens (RFC 9110 section 5.1: "rate
// limit", "X-Foo "), which fasthttp's parser takes and net/http's
// drops: a client or cache behind the proxy may read them otherwise.
func dropHopResponse(h *fasthttp.ResponseHeader) {
	named := len(h.PeekAll("Connection")) > 0 // any of them: the first may be empty
	fixed, malformed := false, false
	for k := range h.All() {
		fixed = fixed || fixedHop(k)
		malformed = malformed || !httpcore.ValidToken(b2s(k))
	}
	if named || fixed || malformed {
		rep := repeatedFields(h) // the order the deletions may change
		dropNamedHop(h)
		if fixed {
			dropHopFields(h)
		}
		if malformed {
			dropMalformed(h)
		}
		restoreOrder(h, rep)
	}
	h.ResetConnectionClose()
	// The status line is the proxy's own version, not the upstream's
	// (RFC 9110 section 6.2): an HTTP/1.0 upstream's reached the client,
	// which then closed every keep-alive connection after one answer.
	h.SetProtocol(http11)
}

var http11 = []byte("HTTP/1.1")

// dropMalformed removes a response's fields whose names are not tokens.
func dropMalformed(h *fasthttp.ResponseHeader) {
	var bad []string
	for k := range h.All() {
		if !httpcore.ValidToken(b2s(k)) {
			bad = append(bad, string(k))
		}
	}
	for _, k := range bad {
		h.DelBytes(s2b(k))
	}
}

// dropNamedHop removes the Connection fields and the fields they name,
// every Connection field's (a message may repeat it: RFC 9110 section
// 5.3 makes them one list).
func dropNamedHop(h hopHeader) {
	cs := h.PeekAll("Connection")
	if len(cs) == 0 {
		return
	}
	var names []string
	for _, c := range cs {
		names = append(names, hopNamed(c)...) // copied: the deletes below move the fields' bytes
	}
	for _, n := range names {
		h.Del(n)
	}
	h.Del("Connection")
}

// fixedHop reports whether k is a field of hopFields other than
// Transfer-Encoding and Connection.
func fixedHop(k []byte) bool {
	return isHop(k) && !strings.EqualFold(b2s(k), "Transfer-Encoding") && !strings.EqualFold(b2s(k), "Connection")
}

// dropHopFields removes every field of hopFields but Transfer-Encoding
// and Connection.
func dropHopFields(h hopHeader) {
	for _, n := range hopFields {
		if n != "Transfer-Encoding" && n != "Connection" {
			h.Del(n)
		}
	}
}

// upstreamError answers an admitted request whose upstream call failed:
// 504 when its deadline ran out, 502 otherwise, with the admission's
// fields (RateLimit and the level, as on every admitted answer), logged
// at most once a second, with the path the upstream was sent.
func (f *fastServer) upstreamError(ctx *fasthttp.RequestCtx, adm *httpcore.Admission, in *identify.Input, err error) {
	if upstreamTimedOut(err) {
		err = context.DeadlineExceeded
	}
	s := f.s
	// A call the drain cut is logged as cut (host.Shutdown), not as the
	// upstream's failure.
	if now := time.Now().UnixNano(); !f.cut.Load() && now-s.lastUpstreamLog.Load() > int64(time.Second) {
		s.lastUpstreamLog.Store(now)
		s.log.Warn("upstream request failed (logged at most once per second)", "path", string(ctx.Request.URI().Path()), "err", err)
	}
	ctx.Response.Reset()
	method := in.Method
	if h := &ctx.Request.Header; len(h.Peek("Idempotency-Key")) > 0 || len(h.Peek("X-Idempotency-Key")) > 0 {
		method = "" // replayable: it may have reached the upstream before the attempt that failed
	}
	answer(ctx, s.mw.RenderUpstreamError((*respFields)(&ctx.Response.Header), method, in.Header, err))
	adm.SetHeaders((*respFields)(&ctx.Response.Header))
}

// respond copies the upstream's response into the client's: the body read
// whole into memory or a spool (the slot is released before the client is
// written to), streamed when it asks to be or outgrows its cap, refused
// (503) when the shared budgets cannot hold it. It reports whether it
// streams: the stream's writer then reports the
// outcome and untracks the request.
func (f *fastServer) respond(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, adm *httpcore.Admission, tr *host.Tracked, deadline, hold time.Time) bool {
	out := &ctx.Response
	resp.Header.CopyTo(&out.Header)
	dropHopResponse(&out.Header)
	out.Header.SetNoDefaultContentType(true)
	stream := resp.BodyStream()
	if stream == nil {
		out.SetBody(resp.Body())
		fasthttp.ReleaseResponse(resp)
		return false
	}
	var sp *spool
	if !streamedFast(&resp.Header) {
		// A small body stays in the response's own buffer; a larger one
		// goes to a spool, within the budgets, which the server closes
		// once the client has it.
		bp := f.s.copyBufs.get()
		var unspooled []byte // read from the upstream, not taken by the spool
		n, err := readSmall(stream, (*bp)[:smallBody+1])
		switch {
		case err == nil && n > smallBody:
			sp = newSpool(f.s.bufferLimits(f.s.opts.MaxResponseBuffer))
			if _, err = sp.Write((*bp)[:n]); err == nil {
				unspooled, err = spoolFrom(sp, stream, *bp)
			} else {
				unspooled = (*bp)[:n] // all or nothing: a cap refuses the whole write
			}
			unspooled = append([]byte(nil), unspooled...)
		case err == nil:
			out.SetBody((*bp)[:n])
		}
		f.s.copyBufs.put(bp)
		switch {
		case err == nil:
			resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
			if sp != nil {
				out.SetBodyStream(sp, int(sp.Len()))
			}
			return false
		case errors.Is(err, errSpoolFull):
			// The budgets are spent: refused, and the upstream's
			// connection closed (CloseBodyStream with the body unread),
			// rather than streamed holding the slot for as long as its
			// client takes.
			if sp != nil {
				sp.Close()
			}
			resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
			out.Reset()
			answer(ctx, f.s.mw.RenderBusy(ctx, (*respFields)(&out.Header), &identify.Input{Path: b2s(ctx.Path()), Header: http.Header{}}, busyResponse))
			return false
		case !errors.Is(err, errSpoolCap):
			// The upstream broke off mid-body: a 502, or a 504 once the
			// request's deadline has passed (it was late).
			if !deadline.IsZero() && !time.Now().Before(deadline) {
				err = errLate
			}
			if sp != nil {
				sp.Close()
			}
			resp.CloseBodyStream()
			fasthttp.ReleaseResponse(resp)
			out.Reset()
			f.upstreamError(ctx, adm, &identify.Input{Path: b2s(ctx.Path()), Header: http.Header{}}, err)
			return false
		}
		// What the spool did not take goes first (it holds nothing then),
		// or after what it holds.
		if len(unspooled) > 0 {
			stream = io.MultiReader(bytes.NewReader(unspooled), stream)
		}
	}
	// Stream: what is buffered first, then the rest as it comes, holding
	// the slot until the end, the deadline plus Grace (MaxHold without a
	// deadline) at most.
	setAnswerFields(adm, &out.Header)
	body := &streamBody{f: f, ctx: ctx, resp: resp, sp: sp, adm: adm, tr: tr, status: out.StatusCode(), hold: hold}
	body.r = stream
	if sp != nil && sp.Len() > 0 {
		body.r = io.MultiReader(sp, stream)
	}
	out.SetBodyStream(body, -1)
	return true
}

// streamBody is a streamed response's body as the server reads it (and
// writes it to the client, a chunk per read): what was buffered, then the
// upstream's body as it comes. An upstream that breaks off is an error of
// its Read, not its end, so that the server closes the connection without
// the last chunk and the client does not take a truncated response for a
// whole one. Close (the server's, once the response is written or given
// up) reports the outcome, untracks the request and gives its buffers
// back, once. It is used by one goroutine at a time.
type streamBody struct {
	f       *fastServer
	ctx     *fasthttp.RequestCtx
	r       io.Reader
	resp    *fasthttp.Response
	sp      *spool
	adm     *httpcore.Admission
	tr      *host.Tracked
	status  int
	hold    time.Time // the slot's end (holdEnd)
	started bool
	closed  bool
}

func (b *streamBody) Read(p []byte) (int, error) {
	if !b.started {
		b.started = true
		// In place of the server's WriteTimeout, which bounds buffered
		// responses: the deadline plus Grace, or MaxHold without one.
		b.ctx.Conn().SetWriteDeadline(b.hold)
	}
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		return n, fmt.Errorf("proxy: upstream broke off a streamed response: %w", err)
	}
	return n, err
}

func (b *streamBody) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	if b.sp != nil {
		b.sp.Close()
	}
	b.adm.Done(b.ctx, b.status, false)
	b.f.s.inflight.Untrack(b.tr)
	return nil
}

// readSmall reads r into buf until r ends or buf is full, whichever
// comes first; n is what it read (len(buf): r may hold more).
func readSmall(r io.Reader, buf []byte) (n int, err error) {
	for n < len(buf) {
		m, err := r.Read(buf[n:])
		n += m
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// smallBody is the largest response body kept in the response's own
// buffer (outside the budgets, like the server's read buffers).
const smallBody = 8 << 10

// streamedFast reports whether a response's headers ask for streaming
// (see streamed).
func streamedFast(h *fasthttp.ResponseHeader) bool {
	if strings.EqualFold(b2s(h.Peek("X-Accel-Buffering")), "no") {
		return true
	}
	ct, _, _ := strings.Cut(b2s(h.ContentType()), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// dialUpgrade opens an upgrade's own connection to the upstream, tracked
// (the idle bound, and the drain's cut), within the request's deadline
// and the upstream client's dial timeout, with its TLS handshake.
func (f *fastServer) dialUpgrade(deadline time.Time) (net.Conn, error) {
	d := net.Dialer{Timeout: fasthttp.DefaultDialTimeout} // as the upstream client's dial
	dctx := context.Background()
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		dctx, cancel = context.WithDeadline(dctx, deadline)
		defer cancel()
	}
	up, err := d.DialContext(dctx, "tcp", f.up.Addr)
	if err != nil {
		return nil, err
	}
	u := f.track(up) // a *upConn: compared before it becomes a net.Conn
	if u == nil {
		return nil, net.ErrClosed
	}
	if !f.up.IsTLS {
		return u, nil
	}
	// within the dial's bound too: a request without a deadline must not
	// wait on a stalled handshake for as long as the idle bound
	hctx, cancel := context.WithTimeout(dctx, fasthttp.DefaultDialTimeout)
	defer cancel()
	return f.handshake(hctx, u)
}

// upgrade forwards a request that asks for a protocol upgrade (a
// WebSocket): it sends the request on a connection of its own, and on a
// 101 answer joins the client's connection to it, both ways, until either
// ends, both are silent for UpstreamTimeout, or the request's deadline
// plus Grace. It reports whether the
// connections were joined (the joining goroutine then reports the
// outcome); otherwise the upstream's answer is the response.
func (f *fastServer) upgrade(ctx *fasthttp.RequestCtx, adm *httpcore.Admission, tr *host.Tracked, deadline, hold time.Time, trusted bool) bool {
	req := &ctx.Request
	proto := string(req.Header.Peek("Upgrade"))
	f.outbound(ctx, adm, trusted)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", proto)
	in := identify.Input{Path: b2s(ctx.Path()), Header: http.Header{}}
	up, err := f.dialUpgrade(deadline)
	if err != nil {
		f.upstreamError(ctx, adm, &in, err)
		return false
	}
	if !deadline.IsZero() {
		up.SetDeadline(deadline)
	}
	bw := bufio.NewWriter(up)
	err = req.Write(bw) // a failed write is the upstream's failure, not a read's
	if err == nil {
		err = bw.Flush()
	}
	br := bufio.NewReader(up)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.SkipBody = true
	if err == nil {
		err = readUpgradeHead(br, resp, proto)
	}
	if err != nil {
		up.Close()
		f.upstreamError(ctx, adm, &in, err)
		return false
	}
	if resp.StatusCode() != http.StatusSwitchingProtocols {
		resp.SkipBody = false
		err := resp.ReadBody(br, int(f.s.opts.MaxResponseBuffer))
		up.Close()
		if err != nil {
			f.upstreamError(ctx, adm, &in, err)
			return false
		}
		resp.CopyTo(&ctx.Response)
		ctx.Response.Header.SetNoDefaultContentType(true) // what the upstream sent, as for any answer
		dropHopResponse(&ctx.Response.Header)
		setAnswerFields(adm, &ctx.Response.Header)
		return false
	}
	// The 101's head is an admitted answer's: sluice's fields in place of
	// the upstream's, none whose name is not a token; its Connection and
	// Upgrade stay, they are the upgrade's, and no "close" beside them
	// (fasthttp's parser adds one after a malformed field). (It passed as
	// it came.)
	dropMalformed(&resp.Header)
	resp.Header.ResetConnectionClose()
	setAnswerFields(adm, &resp.Header)
	head := append([]byte(nil), resp.Header.Header()...)
	up.SetDeadline(time.Time{})
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) {
		defer func() {
			adm.Done(context.Background(), http.StatusSwitchingProtocols, false)
			f.s.inflight.Untrack(tr)
		}()
		defer up.Close()
		if !hold.IsZero() {
			c.SetDeadline(hold)
			up.SetDeadline(hold)
		}
		if _, err := c.Write(head); err != nil {
			return
		}
		sent := make(chan error, 1)        // the client's side, copied to the upstream
		answered := make(chan struct{}, 1) // the upstream's side, copied to the client
		go func() { _, err := io.Copy(up, c); closeWrite(up); sent <- err }()
		go func() { io.Copy(c, br); answered <- struct{}{} }()
		left := 2
		select {
		case err := <-sent:
			left--
			if err == nil {
				// The client half-closed: the upstream's answer still
				// goes out to it, until the upstream ends or stays
				// silent for UpstreamTimeout. (It used to be dropped.)
				<-answered
				left--
			}
		case <-answered:
			left--
		}
		// End the other side's copy: fasthttp's hijacked connection
		// closes only once this returns (its Close does nothing), so a
		// read or write blocked on it is ended by its deadline. (A
		// silent client used to hold the slot after the upstream closed.)
		c.SetDeadline(time.Unix(1, 0))
		up.Close()
		for ; left > 0; left-- {
			select {
			case <-sent:
			case <-answered:
			}
		}
	})
	return true
}

// readUpgradeHead reads into resp the head of the upstream's answer to an
// upgrade to proto, and returns why it is one the proxy refuses: a head
// that does not parse (told without its bytes: fasthttp's parser quotes
// it, cookies and all, and resp is not the upstream client's, whose
// errors quote nothing), a status outside 100 to 599, or a switch to
// another protocol than proto (the client asked for h2c, the upstream
// speaks WebSocket; net/http's reverse proxy refuses it too).
func readUpgradeHead(br *bufio.Reader, resp *fasthttp.Response, proto string) error {
	if err := resp.Header.Read(br); err != nil {
		if upstreamTimedOut(err) || errors.Is(err, io.EOF) {
			return err
		}
		return errors.New("the upstream's answer head does not parse")
	}
	sc := resp.StatusCode()
	if err := badStatus(sc); err != nil {
		return err
	}
	if got := resp.Header.Peek("Upgrade"); sc == http.StatusSwitchingProtocols && !strings.EqualFold(strings.TrimSpace(string(got)), strings.TrimSpace(proto)) {
		return fmt.Errorf("the upstream switched to protocol %q, not the %q asked for", got, proto)
	}
	return nil
}

// handshake runs TLS over a connection to an https upstream (the pool's,
// or an upgrade's), with the upstream client's TLS configuration (nil: the
// system's roots, verifying the upstream's host name). It closes raw when
// it fails.
func (f *fastServer) handshake(ctx context.Context, raw net.Conn) (net.Conn, error) {
	cfg := &tls.Config{}
	if f.up.TLSConfig != nil {
		cfg = f.up.TLSConfig.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName, _, _ = net.SplitHostPort(f.up.Addr)
	}
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = f.sessions
	}
	cfg.NextProtos = nil // HTTP/1.1: no ALPN to h2
	c := tls.Client(raw, cfg)
	if err := c.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return c, nil
}

// closeWrite half-closes an upgrade's upstream connection (TCP's FIN, or
// TLS's close_notify), telling the upstream the client is done sending.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}
