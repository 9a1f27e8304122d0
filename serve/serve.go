// Package serve is `sluice serve`: sluice as the decision service of a
// proxy that stays on the data path. nginx's auth_request sends a
// subrequest for each client request and Envoy's ext_authz (HTTP service
// mode) a check request; sluice decides the original request with a policy
// file's chain and answers 200 (allow), 429 or 503 with Retry-After and the
// RateLimit fields, which the proxy passes on to its client.
//
//	s, _ := serve.New(serve.Options{Config: "api.yaml", HTTP: "127.0.0.1:8080"})
//	err := s.Run(ctx) // until ctx is done
//
// The HTTP listener answers at DecidePath (nginx: the original method and
// URI in X-Original-Method and X-Original-URI) and under ExtAuthzPrefix
// (Envoy: the check request's own method and path, behind its
// path_prefix); see httpgate.DecisionHandler. The admin listener, the
// policy's hot reload and mode switches are those of `sluice proxy`.
//
// A decision service never learns when the work it admitted ends, so only
// rate gates can be enforced: New and every reload refuse a policy with a
// gate that holds a slot or learns from completions
// (policy.CheckDecisionOnly).
package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/httpgate"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/host"
	"github.com/sluice-go/sluice/internal/httpcore"
	"github.com/sluice-go/sluice/policy"
)

// Paths of the decision endpoints on the HTTP listener.
const (
	// DecidePath answers nginx auth_request subrequests: the original
	// request's method and URI in the headers of Options.Decision
	// (X-Original-Method, X-Original-URI by default), any method.
	DecidePath = "/v1/decide"
	// ExtAuthzPrefix is the path_prefix to give Envoy's ext_authz HTTP
	// service: a check request for GET /v1/routes arrives as GET
	// /ext_authz/v1/routes.
	ExtAuthzPrefix = "/ext_authz"
)

// Options configures a decision service.
type Options struct {
	// Config is the policy file path.
	Config string
	// ConfigData, if set, is the policy itself (Config then only names it
	// in messages, and nothing reloads).
	ConfigData []byte
	// HTTP is the decision endpoints' address. Default "127.0.0.1:8080"
	// (envoyproxy/ratelimit's HTTP port; `sluice serve` gives its gRPC
	// listener 8081).
	HTTP string
	// Admin is the admin listener's address (/metrics, /healthz,
	// /v1/gates). Default "127.0.0.1:9901" (loopback: the admin API can
	// switch gates off).
	Admin string
	// AdminToken protects /v1/gates (Authorization: Bearer TOKEN). Empty: a
	// random token is generated and written to a file only this user can
	// read, whose path is logged; allowed only on a loopback admin
	// address: New refuses any other without a token.
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
	// Decision names the headers of the nginx form at DecidePath (its
	// StripPrefix must be empty: the Envoy form is at ExtAuthzPrefix).
	Decision httpgate.DecisionConfig
	// Logger receives operational logs. Default: slog.Default().
	Logger *slog.Logger
	// Clock for the chain (tests). Default: the real clock.
	Clock clock.Clock
	// Jitter spreads Retry-After values (nil: sluice.DefaultJitter; a zero
	// Jitter: exact values, for tests).
	Jitter *sluice.Jitter
	// OnPolicy, if set, is given the chain and identification rules of
	// every policy before it serves (the first and every reload), for a
	// caller that decides with them on another protocol (the command's
	// ext_authz gRPC listener); an error refuses the policy like an
	// invalid file.
	OnPolicy func(chain *sluice.Chain, rules identify.Rules) error
	// AccessLog, if set, logs every admitted request and a sample of the
	// rejections (httpgate.AccessLog; tenants show as their metrics label).
	AccessLog *httpgate.AccessLog
	// ProblemDetails answers rejections with RFC 9457 problem details
	// (application/problem+json) instead of the JSON envelope.
	ProblemDetails bool
	// DrainGrace is how long decisions in flight get to finish once Run's
	// context is done. /readyz answers 503 from that moment; a decision
	// still in flight when the grace runs out has its connection closed,
	// and is logged and counted in sluice_drain_requests_cut_total.
	// Default 10 s.
	DrainGrace time.Duration
	// DrainDelay is how long the listener goes on accepting once Run's
	// context is done, /readyz answering 503 already, before it stops and
	// the grace begins: the time load balancers take to see the 503 and
	// send nothing more (on Kubernetes, more than the readiness probe's
	// period times its failure threshold). Default 0: it stops at once,
	// and a connection the balancer still sends is refused.
	DrainDelay time.Duration
	// DrainAfter, if set, replaces time.After for the drain grace (tests).
	DrainAfter func(time.Duration) <-chan time.Time
	// KeepOpen leaves the runtime (the chain, its Redis client, its
	// leases) open when Run returns; the caller closes it with Close once
	// nothing decides with the chain any more. A caller that serves the
	// chain on a listener of its own too (the command's gRPC ext_authz)
	// drains both at once, within one grace, and closes after both.
	KeepOpen bool
}

// Server is a decision service. Its methods are safe for concurrent use.
type Server struct {
	opts    Options
	log     *slog.Logger
	host    *host.Host
	handler http.Handler

	httpAddr, adminAddr net.Addr
	httpSrv             atomic.Pointer[http.Server] // the HTTP listener's, once Run listens
	ready               chan struct{}
	inflight            *host.Tracker
}

// New loads, checks and builds the policy: it fails if the file is invalid
// or has a gate a decision service cannot enforce
// (policy.CheckDecisionOnly), or if the admin listener is off loopback
// without a token.
func New(opts Options) (*Server, error) {
	set(&opts.HTTP, "127.0.0.1:8080")
	set(&opts.Admin, "127.0.0.1:9901")
	set(&opts.AdminTimeout, 10*time.Second)
	set(&opts.ReloadEvery, time.Second)
	set(&opts.DrainGrace, host.DefaultDrainGrace)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Decision.StripPrefix != "" {
		return nil, errors.New("serve: Options.Decision.StripPrefix must be empty: the Envoy form is served under " + ExtAuthzPrefix)
	}
	if opts.ConfigData != nil {
		opts.ReloadEvery = -1
	}
	var err error
	var tokenFile string
	if opts.AdminToken, tokenFile, err = host.AdminToken("serve", opts.Admin, opts.AdminToken, opts.Logger); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, ready: make(chan struct{}), inflight: host.NewTracker()}
	s.host, err = host.New(host.Options{Config: opts.Config, TokenFile: tokenFile, ConfigData: opts.ConfigData, Logger: opts.Logger,
		AccessLog: (*httpcore.AccessLog)(opts.AccessLog), ProblemDetails: opts.ProblemDetails, Clock: opts.Clock, Jitter: opts.Jitter, Check: policy.CheckDecisionOnly, OnBuild: onBuild(opts.OnPolicy)})
	if err != nil {
		if tokenFile != "" {
			os.Remove(tokenFile)
		}
		return nil, err
	}
	mw := s.host.Middleware()
	nginx, err := mw.DecisionHandler(httpcore.DecisionConfig(opts.Decision))
	if err != nil {
		s.host.Close()
		return nil, err
	}
	envoy, err := mw.DecisionHandler(httpcore.DecisionConfig{StripPrefix: ExtAuthzPrefix})
	if err != nil {
		s.host.Close()
		return nil, err
	}
	// Dispatched by hand: http.ServeMux would redirect a check request
	// for an uncleaned original path ("//a", "/a/../b") instead of
	// deciding it.
	s.handler = s.inflight.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		rc.SetWriteDeadline(time.Time{}) // the last answer's, on a kept-alive connection, is past
		p := r.URL.Path
		switch {
		case p == DecidePath:
			nginx.ServeHTTP(w, r)
		case p == ExtAuthzPrefix || strings.HasPrefix(p, ExtAuthzPrefix+"/"):
			envoy.ServeHTTP(w, r)
		default:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusNotFound)
			io.WriteString(w, "sluice serve answers at "+DecidePath+" (nginx auth_request) and under "+ExtAuthzPrefix+"/ (Envoy ext_authz)\n")
		}
		// The answer, decided (a decision may wait in a queue for as long
		// as its deadline), goes out within answerWrite: a client that
		// never reads its answers (pipelining requests) held its
		// connection, goroutine and buffers for as long as it kept the
		// socket open. Each request sets its own, so a kept-alive
		// connection's next answer has its full bound.
		rc.SetWriteDeadline(time.Now().Add(answerWrite))
	}))
	return s, nil
}

// answerWrite bounds the writing of a decision's answer, from the end of
// its decision (Server.Handler).
var answerWrite = 30 * time.Second // a variable for the tests

// onBuild adapts Options.OnPolicy to host.Options.OnBuild.
func onBuild(f func(*sluice.Chain, identify.Rules) error) func(*policy.Runtime) error {
	if f == nil {
		return nil
	}
	return func(rt *policy.Runtime) error { return f(rt.Chain, rt.Rules) }
}

// set puts def in *v when *v is the zero value.
func set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Handler serves the decision endpoints (DecidePath, ExtAuthzPrefix).
func (s *Server) Handler() http.Handler { return s.handler }

// AdminHandler serves /metrics, /healthz, /readyz and /v1/gates (GET lists the
// gates, POST /v1/gates/{name} with {"mode":"shadow"} switches one), the
// latter behind "Authorization: Bearer TOKEN" (Options.AdminToken).
func (s *Server) AdminHandler() http.Handler { return s.host.AdminHandler(s.opts.AdminToken) }

// Unready turns /readyz to 503 now, ahead of Run's drain, for a caller
// that stops other listeners first (the command's gRPC listener); Run's
// end turns it off in any case.
func (s *Server) Unready() { s.host.SetReady(false) }

// SetKeepAlivesEnabled(false) makes every answer of the HTTP listener from
// now on close its connection (Connection: close), as for a drain delay
// Run keeps itself: a caller that keeps a drain delay of its own (the
// command, for gRPC and HTTP at once) calls it when the delay starts. It
// does nothing before Run listens.
func (s *Server) SetKeepAlivesEnabled(v bool) {
	if h := s.httpSrv.Load(); h != nil {
		h.SetKeepAlivesEnabled(v)
	}
}

// Chain returns the chain deciding now.
func (s *Server) Chain() *sluice.Chain { return s.host.Chain() }

// TokenFile returns the file holding the generated admin token ("" when
// the token was given). Run removes it when it returns; a process that
// ends otherwise (a second SIGTERM during the drain) removes it itself.
func (s *Server) TokenFile() string { return s.host.TokenFile() }

// Reload re-reads the policy file. A valid file that a decision service
// can enforce replaces the policy and keeps the state of unchanged gates;
// any other is refused, logged, and the old policy keeps serving. It
// returns whether the policy changed.
func (s *Server) Reload() (bool, error) { return s.host.Reload() }

// Close releases the policy's runtime (its Redis client, its leases), for
// a Server whose Run was never called; Run closes it when it returns.
func (s *Server) Close() { s.host.Close() }

// Addrs returns the bound HTTP and admin addresses once Run has started
// listening (it blocks until then).
func (s *Server) Addrs() (http, admin net.Addr) {
	<-s.ready
	return s.httpAddr, s.adminAddr
}

// listener is one server Run starts and shuts down.
type listener struct {
	name string
	l    net.Listener
	srv  *http.Server
}

// Run listens, serves until ctx is done, then drains: /readyz turns to 503
// at once, the HTTP listener stops accepting and decisions in flight get
// Options.DrainGrace (those still running then are cut, logged and
// counted), then the admin listener (/healthz 200 until then) shuts down
// and the runtime closes.
func (s *Server) Run(ctx context.Context) error {
	defer func() {
		if !s.opts.KeepOpen {
			s.host.Close()
		}
	}()
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	at := s.opts.AdminTimeout
	ls := []*listener{
		{name: "http", srv: &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
			IdleTimeout: 2 * time.Minute, ErrorLog: errLog}},
		{name: "admin", srv: &http.Server{Handler: s.AdminHandler(), ReadHeaderTimeout: at, ReadTimeout: at, WriteTimeout: at,
			IdleTimeout: at, ErrorLog: errLog}},
	}
	addrs := []string{s.opts.HTTP, s.opts.Admin}
	for i, l := range ls {
		var err error
		if l.l, err = net.Listen("tcp", addrs[i]); err != nil {
			for _, o := range ls[:i] {
				o.l.Close()
			}
			return fmt.Errorf("%s listener: %w", l.name, err)
		}
	}
	s.httpAddr, s.adminAddr = ls[0].l.Addr(), ls[1].l.Addr()
	s.httpSrv.Store(ls[0].srv)
	s.host.SetReady(true)
	close(s.ready)
	s.log.Info("sluice serve deciding", "http", s.httpAddr.String(), "decide", DecidePath, "ext_authz", ExtAuthzPrefix+"/",
		"admin", s.adminAddr.String(), "policy", s.opts.Config, "version", s.host.Version())

	errc := make(chan error, len(ls))
	for _, l := range ls {
		go func() { errc <- l.srv.Serve(l.l) }()
	}
	var wg sync.WaitGroup
	ticks := s.opts.Ticks
	if ticks == nil && s.opts.ReloadEvery > 0 && s.host.Reloads() {
		t := time.NewTicker(s.opts.ReloadEvery)
		defer t.Stop()
		ticks = t.C
	}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	if ticks != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.host.Watch(wctx, ticks)
		}()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.host.SetReady(false)
	delay := s.opts.DrainDelay
	if serveErr != nil {
		delay = 0 // a listener failed: nothing to go on serving
	}
	s.log.Info("sluice serve draining: /readyz answers 503", "drain_delay", delay, "drain_grace", s.opts.DrainGrace)
	stopWatch()
	s.host.Shutdown(ls[0].srv, s.inflight, "serve", host.Drain{Delay: delay, Grace: s.opts.DrainGrace, After: s.opts.DrainAfter})
	actx, cancel := context.WithTimeout(context.Background(), at)
	defer cancel()
	ls[1].srv.Shutdown(actx)
	wg.Wait()
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return serveErr
}
