// Package proxy is `sluice proxy`: a reverse proxy that puts a policy
// file's gate chain in front of any HTTP upstream, with an admin listener
// (Prometheus /metrics, /healthz, /v1/gates to read and switch gate modes)
// and hot reload of the policy on SIGHUP or file change. Run serves with
// the proxy's own HTTP/1.1 server (fast.go, on valyala/fasthttp);
// Handler is the same proxy as a net/http handler, for embedding.
//
//	s, _ := proxy.New(proxy.Options{Config: "routes-api.yaml", Upstream: u})
//	err := s.Run(ctx) // until ctx is done
package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/internal/host"
	"github.com/sluice-go/sluice/internal/httpcore"
)

// Options configures a proxy.
type Options struct {
	// Config is the policy file path.
	Config string
	// ConfigData, if set, is the policy itself (Config then only names it
	// in messages, and nothing reloads).
	ConfigData []byte
	// Upstream is the service the proxy forwards admitted requests to.
	Upstream *url.URL
	// Listen is the proxy's address. Default "127.0.0.1:8080".
	Listen string
	// Admin is the admin listener's address. Default "127.0.0.1:9901"
	// (loopback: the admin API can switch gates off).
	Admin string
	// AdminToken protects /v1/gates (Authorization: Bearer TOKEN). Empty: a
	// random token is generated and written to a file only this user can
	// read, whose path is logged (the token itself never is); allowed only
	// on a loopback admin address: New refuses any other without a token.
	AdminToken string
	// AdminTimeout bounds reading and answering one admin request, and an
	// idle admin connection. Default 10 s.
	AdminTimeout time.Duration
	// ReloadEvery is how often the policy file is checked for changes.
	// Default 1 s; negative: never (SIGHUP only).
	ReloadEvery time.Duration
	// Ticks, if set, replaces the ReloadEvery ticker: each value received
	// is one check of the policy file (tests drive the watcher with it).
	Ticks <-chan time.Time
	// Logger receives operational logs. Default: slog.Default().
	Logger *slog.Logger
	// Clock for the chain (tests). Default: the real clock.
	Clock clock.Clock
	// Jitter spreads Retry-After values (nil: sluice.DefaultJitter; a zero
	// Jitter: exact values, for tests).
	Jitter *sluice.Jitter
	// Transport for upstream calls. Default: a transport tuned for many
	// concurrent requests to one host. Run serves with net/http's server
	// when it is set (the proxy's own server has its own client).
	Transport http.RoundTripper
	// NetHTTP makes Run serve with net/http's server and
	// httputil.ReverseProxy (Handler) instead of the proxy's own HTTP/1.1
	// server (fast.go): slower. Both notice clients that go away while
	// their requests wait in a queue, and both let a request whose client
	// went away while it ran at the upstream run to its answer or its
	// deadline, holding its slot.
	NetHTTP bool
	// ReadTimeout bounds reading a whole request, body included, and (on the
	// proxy's own server) an idle keep-alive connection; both end up to 1 s
	// early (coarseConn). Default
	// 30 s. Bodies are read before the request is decided (buffer.go), so
	// a slow sender holds no admitted slot meanwhile.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a buffered response to the client (its
	// slot is already free by then). Default 60 s.
	WriteTimeout time.Duration
	// UpstreamTimeout bounds each wait on the upstream: a dial (by at most
	// 3 s on the proxy's own server, 30 s over net/http, as before), and
	// then the time between two successive reads or writes on its
	// connection, as nginx's proxy_read_timeout does, not the whole
	// exchange: a response or a stream that keeps arriving runs on, an
	// upstream that goes silent that long is cut and the request answers
	// 504, freeing its slot (a request without a deadline would otherwise
	// hold it while the connection stays open). An upgraded connection
	// (WebSocket) silent both ways that long is closed, as nginx does. It
	// may end up to an eighth of itself (at most 1 s) early; over net/http
	// the wait for an answer's head ends by the transport's timer at
	// twice that much early, so that a timeout never sends a request
	// again. Default 60 s
	// (also for 0); negative: no bound; a positive value below 1 ms is an
	// error of New. Not applied to a Transport of the caller's own.
	UpstreamTimeout time.Duration
	// Grace is how long past its deadline a request whose response
	// streams may hold its slot while the client reads. Default 1 s.
	Grace time.Duration
	// MaxHold is the longest a request admitted without a deadline holds
	// its slot once its response streams (server-sent events, an
	// "X-Accel-Buffering: no" answer, one past MaxResponseBuffer) or its
	// connection is upgraded (a WebSocket): the stream is cut then, as a
	// request with a deadline is cut at its deadline plus Grace. Default
	// 60 s, as WriteTimeout and UpstreamTimeout; negative: no bound.
	MaxHold time.Duration
	// UpstreamGrace is how long past a request's deadline the proxy still
	// waits for the upstream's answer, holding the request's slot: the
	// upstream is most likely still working on it, and a slot freed at the
	// deadline would let the gates admit work the upstream cannot start
	// (a naive upstream keeps every abandoned request, and they pile up
	// inside it). An answer that comes past the deadline is not forwarded:
	// the client gets 504 (reason deadline) when it comes, or when the
	// grace runs out and the upstream connection is closed, and the
	// request counts as late with its whole time, which the adaptive limit
	// and the deadline test learn from. Default 5 s; negative: none (the
	// call is cut at the deadline, as before).
	UpstreamGrace time.Duration
	// MaxBodyBytes is the largest request body the proxy takes; a larger
	// one is answered 400. Default 16 MiB.
	MaxBodyBytes int64
	// MaxResponseBuffer is the most of one response the proxy buffers; the
	// rest streams, holding the request's slot. Default 256 MiB.
	MaxResponseBuffer int64
	// BufferMemory and BufferDisk bound the memory and the temporary-file
	// bytes all buffered bodies and responses hold at once (each buffer
	// keeps its first 64 KiB in memory). Defaults 64 MiB and 1 GiB.
	BufferMemory, BufferDisk int64
	// BufferDir is where temporary buffer files go. Default: the system's
	// temporary directory.
	BufferDir string
	// AccessLog, if set, logs every admitted request and a sample of the
	// rejections (httpgate.AccessLog; tenants show as their metrics label).
	AccessLog *httpgate.AccessLog
	// ProblemDetails answers rejections with RFC 9457 problem details
	// (application/problem+json) instead of the JSON envelope.
	ProblemDetails bool
	// DrainGrace is how long requests in flight get to finish once Run's
	// context is done. /readyz answers 503 from that moment (before the
	// listener stops accepting); a request still in flight when the grace
	// runs out has its connection closed, and is logged and counted in
	// sluice_drain_requests_cut_total. Default 10 s.
	DrainGrace time.Duration
	// DrainDelay is how long the listener goes on accepting once Run's
	// context is done, /readyz answering 503 already, before it stops and
	// the grace begins: the time load balancers take to see the 503 and
	// send nothing more (on Kubernetes, more than the readiness probe's
	// period times its failure threshold). Default 0: it stops at once,
	// and a connection the balancer still sends is refused.
	DrainDelay time.Duration
	// DrainAfter, if set, replaces time.After for the drain grace (tests
	// end the grace by hand).
	DrainAfter func(time.Duration) <-chan time.Time
}

// Server is a running proxy.
type Server struct {
	opts    Options
	log     *slog.Logger
	host    *host.Host // the policy, its reloads and the admin API
	mw      *httpcore.Middleware
	proxy   *httputil.ReverseProxy
	handler http.Handler

	memBudget, diskBudget *budget

	proxyAddr, adminAddr net.Addr
	ready                chan struct{}
	lastUpstreamLog      atomic.Int64
	inflight             *host.Tracker   // admitted requests at the upstream, for the drain
	cut                  context.Context // done when the drain cuts the requests left, or on Close
	cutNow               context.CancelFunc
	copyBufs             copyBuffers
}

// New loads and builds the policy; it fails if the file is invalid.
func New(opts Options) (*Server, error) {
	if opts.Upstream == nil {
		return nil, errors.New("proxy: no upstream")
	}
	if u := opts.Upstream; (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
		return nil, fmt.Errorf("proxy: upstream %q: want an http or https URL with a host and no user, such as http://127.0.0.1:9000", u.Redacted())
	}
	if t := opts.UpstreamTimeout; t > 0 && t < time.Millisecond {
		return nil, fmt.Errorf("proxy: upstream timeout %v is below 1ms: every request would answer 504 (negative: no bound)", t)
	}
	opts.withDefaults()
	var err error
	var tokenFile string
	if opts.AdminToken, tokenFile, err = host.AdminToken("proxy", opts.Admin, opts.AdminToken, opts.Logger); err != nil {
		return nil, err
	}
	if opts.ConfigData != nil {
		opts.ReloadEvery = -1
	}
	s := &Server{opts: opts, log: opts.Logger, ready: make(chan struct{}), inflight: host.NewTracker(),
		memBudget: newBudget(opts.BufferMemory), diskBudget: newBudget(opts.BufferDisk)}
	s.cut, s.cutNow = context.WithCancel(context.Background())
	s.host, err = host.New(host.Options{Config: opts.Config, TokenFile: tokenFile, ConfigData: opts.ConfigData, Logger: opts.Logger,
		AccessLog: (*httpcore.AccessLog)(opts.AccessLog), ProblemDetails: opts.ProblemDetails, Clock: opts.Clock, Jitter: opts.Jitter, Upstream: true})
	if err != nil {
		if tokenFile != "" {
			os.Remove(tokenFile)
		}
		return nil, err
	}
	s.mw = s.host.Middleware()
	tr := opts.Transport
	if tr == nil {
		tr = upstreamTransport(opts.UpstreamTimeout)
	}
	up := opts.Upstream
	s.proxy = &httputil.ReverseProxy{
		Rewrite:        func(pr *httputil.ProxyRequest) { s.rewrite(pr, up) },
		Transport:      tr,
		ModifyResponse: lateResponse,
		BufferPool:     &s.copyBufs,
		ErrorHandler:   s.upstreamError,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	// Only admitted requests are tracked for the drain: a rejection costs
	// nothing more, and is answered long before any grace runs out.
	s.handler = s.buffered(s.mw.Wrap(s.inflight.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if bw := bufferedOf(w); bw != nil {
			bw.setDeadline(r) // admitted: a streamed response holds the slot until the deadline at most
			bw.markOwn()
		}
		body, ok := s.readExpected(w, r)
		if !ok {
			return
		}
		if body != nil {
			defer body.Close()
		}
		ctx, cancel := s.detach(r.Context())
		defer cancel()
		if r.Header.Get("Upgrade") != "" {
			if bw := bufferedOf(w); bw != nil {
				ctx = context.WithValue(ctx, upgradeKey{}, bw)
			}
			w = upgradeWriter{w}
		}
		s.proxy.ServeHTTP(w, r.WithContext(ctx))
	}))))
	return s, nil
}

// upstreamTransport is the net/http front's transport to the upstream,
// with the idle bound idle (UpstreamTimeout) on its connections.
func upstreamTransport(idle time.Duration) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 4096
	t.MaxIdleConnsPerHost = 4096
	t.IdleConnTimeout = 90 * time.Second
	t.DialContext = dialContext(idle)
	if idle > 0 {
		// The wait for an answer's head ends by the transport's own
		// timer, before the connection's idle bound can (that ends up to
		// its slack early): a read that times out on a reused connection
		// is, to the transport, an upstream that closed it, and a GET
		// went out again on a new one, to be run twice. Its timeout
		// sends nothing again.
		t.ResponseHeaderTimeout = idle - 2*time.Duration(idleSlack(idle))
	}
	t.DisableCompression = true // the client's Accept-Encoding passes as sent; the transport asks for no gzip of its own to undo
	return t
}

// rewrite turns the client's request into the upstream's at up
// (ReverseProxy.Rewrite).
func (s *Server) rewrite(pr *httputil.ProxyRequest, up *url.URL) {
	pr.SetURL(up)
	if s.mw.Snapshot().TrustedProxy(pr.In.RemoteAddr) {
		// Behind a proxy of ours the forwarding fields grow by one hop
		// (RFC 7239 section 4): the client's own address is the one that
		// proxy appended.
		pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
		if fw := pr.In.Header["Forwarded"]; len(fw) > 0 {
			pr.Out.Header["Forwarded"] = []string{strings.Join(fw, ", ") + ", " + forwardedFor(pr.In.RemoteAddr)}
		}
	}
	pr.SetXForwarded()
	pr.Out.Header.Del("Expect") // the body is read: the upstream gets it at once
	// The decision the admission set on the request is sluice's, not the
	// client's: a Connection field of the client's that names its fields
	// does not drop it (the reverse proxy drops those before this runs;
	// the upstream got no deadline).
	for _, n := range s.mw.Snapshot().Propagated() {
		if v, ok := pr.In.Header[n]; ok {
			pr.Out.Header[n] = v
		}
	}
}

// boundHead gives net/http's server hs the request head's bounds of the
// proxy's own server: 16 KiB (net/http adds 4 KiB to MaxHeaderBytes; its
// default let a 1 MiB head through to the upstream), read within
// ReadTimeout (it was 10 s on this front, 30 on the other).
func (s *Server) boundHead(hs *http.Server) {
	hs.MaxHeaderBytes = maxHead - 4<<10
	hs.ReadHeaderTimeout = s.opts.ReadTimeout
}

// upgradeWriter hands ReverseProxy an upgraded client connection
// (endingConn) that ends when the upstream's side does, as on the proxy's
// own server.
type upgradeWriter struct{ http.ResponseWriter }

func (w upgradeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w upgradeWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	// net/http's Hijack clears the read deadline setDeadline put on the
	// connection: the slot's end (the deadline plus Grace, or MaxHold)
	// goes on again, both ways.
	if bw := bufferedOf(w.ResponseWriter); bw != nil && !bw.deadline.IsZero() {
		c.SetDeadline(bw.deadline)
	}
	return endingConn{c}, brw, nil
}

// endingConn is an upgraded client connection whose CloseWrite, which is
// how ReverseProxy passes on the upstream's end of the upgrade, also ends
// the copy of the client's side: ReverseProxy would wait for the client
// to close too, and a silent client held the request's slot.
type endingConn struct{ net.Conn }

func (c endingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	return c.Conn.SetReadDeadline(time.Unix(1, 0))
}

// detach returns a context with ctx's values and deadline that a client
// going away does not end: an admitted request's call to the upstream runs
// to its answer or its deadline, and holds its slot meanwhile, as on the
// proxy's own server. Cancelling the call would free the slot while the
// upstream may go on working on it, so that clients that time out and
// retry would have the upstream run more requests than the gates admit.
// The drain's cut (and Close) still ends it.
func (s *Server) detach(ctx context.Context) (context.Context, context.CancelFunc) {
	d := context.WithoutCancel(ctx)
	var c context.Context
	var cancel context.CancelFunc
	if dl, ok := ctx.Deadline(); ok {
		if g := s.opts.UpstreamGrace; g > 0 {
			d = context.WithValue(d, lateKey{}, dl)
			dl = dl.Add(g)
		}
		c, cancel = context.WithDeadline(d, dl)
	} else {
		c, cancel = context.WithCancel(d)
	}
	stop := context.AfterFunc(s.cut, cancel)
	return c, func() { stop(); cancel() }
}

// badStatus returns the failure of an upstream answer whose status is
// outside HTTP's 100 to 599 (RFC 9110 section 15), or nil: a proxy
// cannot pass it on, on either front.
func badStatus(sc int) error {
	if sc >= 100 && sc <= 599 {
		return nil
	}
	return fmt.Errorf("the upstream answered status %d, outside HTTP's 100 to 599", sc)
}

// upgradeKey is the context key of an upgrade request's bufferedWriter.
type upgradeKey struct{}

// lateKey is the context key of a request's own deadline when its
// upstream call may run past it (Options.UpstreamGrace).
type lateKey struct{}

// errLate is a response that came past its request's deadline, within the
// upstream grace: answered 504, as for a call cut at the deadline.
var errLate = fmt.Errorf("upstream answered past the request's deadline: %w", context.DeadlineExceeded)

// lateResponse refuses a response that came past its request's deadline
// (ReverseProxy.ModifyResponse): the caller has given up on it; and one
// whose status is not HTTP's.
// A 101's fields of the names sluice set on the answer are dropped: the
// reverse proxy adds the upstream's to the client's header after it
// hijacks the connection, past any hook of ours, and they reached the
// client beside sluice's.
func lateResponse(resp *http.Response) error {
	if err := badStatus(resp.StatusCode); err != nil {
		return err // net/http's server panics on writing it, which closed the client's connection with no answer
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		if bw, ok := resp.Request.Context().Value(upgradeKey{}).(*bufferedWriter); ok {
			bw.dropOwnNames(resp.Header)
		}
	}
	if dl, ok := resp.Request.Context().Value(lateKey{}).(time.Time); ok && time.Now().After(dl) {
		return errLate
	}
	return nil
}

// cutting is net/http's server for the drain, whose Close also ends the
// upstream calls of the requests it cuts (detach keeps them from ending
// with their connections).
type cutting struct {
	*http.Server
	cut context.CancelFunc
}

func (c cutting) Close() error {
	c.cut()
	return c.Server.Close()
}

// set puts def in *v when *v is the zero value.
func set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// withDefaults fills in the documented defaults.
func (o *Options) withDefaults() {
	set(&o.Listen, "127.0.0.1:8080")
	set(&o.Admin, "127.0.0.1:9901")
	set(&o.ReloadEvery, time.Second)
	set(&o.ReadTimeout, 30*time.Second)
	set(&o.WriteTimeout, time.Minute)
	set(&o.Grace, time.Second)
	set(&o.MaxHold, time.Minute)
	set(&o.UpstreamGrace, 5*time.Second)
	set(&o.UpstreamTimeout, time.Minute)
	set(&o.MaxBodyBytes, 16<<20)
	set(&o.MaxResponseBuffer, 256<<20)
	set(&o.BufferMemory, 64<<20)
	set(&o.BufferDisk, 1<<30)
	set(&o.AdminTimeout, 10*time.Second)
	set(&o.DrainGrace, host.DefaultDrainGrace)
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// upstreamError answers a failed upstream call through the middleware
// (502, or 504 when the caller's deadline ran out; both count as errored
// outcomes) and logs at most once per second.
func (s *Server) upstreamError(w http.ResponseWriter, r *http.Request, err error) {
	if upstreamTimedOut(err) {
		err = context.DeadlineExceeded
	}
	// A client gone, or a call the drain cut (logged as cut), is not the
	// upstream's failure.
	gone := errors.Is(err, context.Canceled) && (r.Context().Err() != nil || s.cut.Err() != nil)
	if now := time.Now().UnixNano(); !gone && now-s.lastUpstreamLog.Load() > int64(time.Second) {
		s.lastUpstreamLog.Store(now)
		s.log.Warn("upstream request failed (logged at most once per second)", "path", r.URL.Path, "err", err)
	}
	s.mw.UpstreamError(w, r, err)
}

// Handler is the proxy handler: buffering (buffer.go) around the
// middleware in front of the upstream.
func (s *Server) Handler() http.Handler { return s.handler }

// Chain returns the chain serving now.
func (s *Server) Chain() *sluice.Chain { return s.host.Chain() }

// TokenFile returns the file holding the generated admin token ("" when
// the token was given). Run removes it when it returns; a process that
// ends otherwise (a second SIGTERM during the drain) removes it itself.
func (s *Server) TokenFile() string { return s.host.TokenFile() }

// Reload re-reads the policy file. A valid file replaces the policy without
// dropping requests in flight and keeps the state of unchanged gates; an
// invalid one is refused, logged, and the old policy keeps serving. It
// returns whether the policy changed.
func (s *Server) Reload() (bool, error) { return s.host.Reload() }

// Close releases the policy's runtime (its Redis client, its leases), for
// a Server whose Run was never called (its Handler served elsewhere), and
// ends the upstream calls of Handler's requests still in flight (they
// answer 502); Run closes it when it returns.
func (s *Server) Close() {
	s.cutNow()
	s.host.Close()
}

// AdminHandler serves /metrics, /healthz, /readyz and /v1/gates (GET lists the
// gates, POST /v1/gates/{name} with {"mode":"shadow"} switches one), the
// latter behind "Authorization: Bearer TOKEN" (Options.AdminToken), and
// the live page (/live/, polling GET /v1/live).
func (s *Server) AdminHandler() http.Handler { return s.host.AdminHandler(s.opts.AdminToken) }

// Addrs returns the bound proxy and admin addresses once Run has started
// listening (it blocks until then).
func (s *Server) Addrs() (proxy, admin net.Addr) {
	<-s.ready
	return s.proxyAddr, s.adminAddr
}

// Run serves until ctx is done, then drains: /readyz turns to 503 at once,
// the proxy listener stops accepting and requests in flight get
// Options.DrainGrace to finish (those still running then are cut, logged
// and counted); the admin listener (/healthz 200) stays up until the drain
// is over.
func (s *Server) Run(ctx context.Context) error {
	pl, err := net.Listen("tcp", s.opts.Listen)
	if err != nil {
		s.host.Close() // Run closes the runtime (and removes a generated token's file) whenever it returns
		return fmt.Errorf("proxy listener: %w", err)
	}
	al, err := net.Listen("tcp", s.opts.Admin)
	if err != nil {
		pl.Close()
		s.host.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	s.proxyAddr, s.adminAddr = pl.Addr(), al.Addr()
	s.host.SetReady(true)
	close(s.ready)
	var ps host.Stopper
	var servePublic func() error
	if s.opts.Transport == nil && !s.opts.NetHTTP {
		fs := s.newFast()
		defer fs.up.CloseIdleConnections()
		ps, servePublic = fs, func() error { return fs.serveOn(pl) }
		limit, _ := fileLimit()
		s.log.Info("sluice proxy descriptors", "file_limit", limit, "max_client_conns", fs.clientConns, "max_upstream_conns", fs.upstreamConns)
	} else {
		hs := &http.Server{Handler: s.Handler(), ReadTimeout: s.opts.ReadTimeout,
			IdleTimeout: 2 * time.Minute, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
		s.boundHead(hs)
		ps, servePublic = cutting{hs, s.cutNow}, func() error { return hs.Serve(pl) }
	}
	at := s.opts.AdminTimeout
	as := &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: at, ReadTimeout: at, WriteTimeout: at, IdleTimeout: at,
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	s.log.Info("sluice proxy serving", "listen", pl.Addr().String(), "admin", al.Addr().String(), "upstream", s.opts.Upstream.String(), "policy", s.opts.Config, "version", s.host.Version())

	errc := make(chan error, 2)
	go func() { errc <- servePublic() }()
	go func() { errc <- as.Serve(al) }()
	var wg sync.WaitGroup
	ticks := s.opts.Ticks
	if ticks == nil && s.opts.ReloadEvery > 0 && s.opts.ConfigData == nil {
		t := time.NewTicker(s.opts.ReloadEvery)
		defer t.Stop()
		ticks = t.C
	}
	wctx, stopWatch := context.WithCancel(ctx) // a listener's failure ends the watcher too
	defer stopWatch()
	if ticks != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.host.Watch(wctx, ticks)
		}()
	}
	var serveErr error
	left := 2 // serve loops still running
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		left--
	}
	s.host.SetReady(false)
	delay := s.opts.DrainDelay
	if serveErr != nil {
		delay = 0 // a listener failed: nothing to go on serving
	}
	s.log.Info("sluice proxy draining: /readyz answers 503", "drain_delay", delay, "in_flight", s.inflight.Len(), "drain_grace", s.opts.DrainGrace)
	stopWatch()
	s.host.Shutdown(ps, s.inflight, "proxy", host.Drain{Delay: delay, Grace: s.opts.DrainGrace, After: s.opts.DrainAfter})
	actx, cancel := context.WithTimeout(context.Background(), s.opts.AdminTimeout)
	defer cancel()
	as.Shutdown(actx)
	wg.Wait()
	// Both listeners are closed: their serve loops end now; Run returns
	// after them (a test's leak check saw the public one still in Accept).
	for range left {
		<-errc
	}
	s.host.Close()
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}
