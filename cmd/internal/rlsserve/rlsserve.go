// Package rlsserve is `sluice serve` for an envoyproxy/ratelimit
// configuration: the rate limit service Envoy's ratelimit filter calls,
// as a drop-in for that service's binary. It serves
//
//   - on the gRPC listener, envoy.service.ratelimit.v3.RateLimitService
//     (package grpcgate/envoyrls over an rls.Server) and grpc.health.v1;
//   - on the HTTP listener, POST /json (rls.JSONHandler, the same request
//     and response as proto3 JSON) and GET /healthcheck (the peer's
//     health path: 200 "OK" while serving, 500 once shutting down);
//   - on the admin listener, /metrics (the rls counters and this package's
//     reload counters, sluice_build_info), /healthz (200 until the process
//     exits), /readyz (200 while serving, 503 from the start of the drain),
//     /rlconfig (the rules serving now) and /debug/pprof/ (profiles; the
//     listener is on loopback by default).
//
// The configuration (a file, or a folder of files, one domain each, as
// rls.Load reads them) is reloaded on Reload (SIGHUP in the command) and
// when its content changes: a change is loaded once two checks read the
// same content. A configuration that does not load is refused, each
// problem logged with its file and line, and the old one keeps serving;
// the counters carry over a reload (rls.Server.SetConfig).
//
// The library module stays free of gRPC: this package lives in the tools
// module, next to the command.
package rlsserve

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-go/sluice/clock"
	"github.com/sluice-go/sluice/grpcgate/envoyrls"
	"github.com/sluice-go/sluice/grpcgate/rls"
	"github.com/sluice-go/sluice/internal/buildinfo"
	sredis "github.com/sluice-go/sluice/store/redis"
)

// Default addresses: the peer's GRPC_PORT and PORT, on loopback; the
// admin listener of every sluice command.
const (
	DefaultListen = "127.0.0.1:8081"
	DefaultHTTP   = "127.0.0.1:8080"
	DefaultAdmin  = "127.0.0.1:9901"
)

// Paths on the HTTP and admin listeners.
const (
	JSONPath        = "/json"        // the peer's
	HealthcheckPath = "/healthcheck" // the peer's
	RulesPath       = "/rlconfig"    // the peer's debug listener's
)

// Options configures a Server.
type Options struct {
	// Config is the configuration: one file, or a folder of *.yaml and
	// *.yml files (one domain each).
	Config string
	// Listen, HTTP and Admin are the listeners' addresses. Defaults
	// DefaultListen, DefaultHTTP, DefaultAdmin.
	Listen, HTTP, Admin string
	// Redis, if set, holds the counters: one standalone server, or any
	// nodes of a Redis Cluster (store/redis discovers which). Default:
	// process memory.
	Redis []string
	// RedisPrefix starts every Redis key (the peer's CACHE_KEY_PREFIX).
	// Default "sluice".
	RedisPrefix string
	// RedisTimeout bounds each Redis call: Redis does nothing with a call
	// it reaches later. A call waits up to twice this for a reply Redis
	// ran in time (sredis.Options.ReplyGrace), and the store work of one
	// rate limit call is bounded by that. Default rls.DefaultTimeout.
	RedisTimeout time.Duration
	// RedisUsername and RedisPassword authenticate to Redis (AUTH, or an
	// ACL user), RedisTLS secures its connections (nil: plain); the
	// command takes them from the peer's REDIS_AUTH and REDIS_TLS*
	// environment variables.
	RedisUsername, RedisPassword string
	RedisTLS                     *tls.Config
	// OnFailure, Headers and ShadowMode are rls.Options'.
	OnFailure  rls.FailurePolicy
	Headers    rls.HeaderStyle
	ShadowMode bool
	// ReloadEvery is how often the configuration is checked for changes.
	// Default 1 s; negative: never (Reload only).
	ReloadEvery time.Duration
	// Ticks, if set, replaces the ReloadEvery ticker (tests).
	Ticks <-chan time.Time
	// ShutdownTimeout bounds the graceful shutdown: calls in flight get
	// this long, then connections are closed. Default 10 s.
	ShutdownTimeout time.Duration
	// DrainDelay is how long the service keeps accepting and answering
	// after ctx is done, with /readyz and the gRPC health check already
	// failing, before the listeners close and ShutdownTimeout begins: load
	// balancers stop sending first. Default 0 (stop at once).
	DrainDelay time.Duration
	// DrainAfter, if set, replaces time.After for the drain delay (tests).
	DrainAfter func(time.Duration) <-chan time.Time
	// Logger receives operational logs. Default slog.Default().
	Logger *slog.Logger
	// Clock is the wall clock the windows align to (tests; on Redis it is
	// also the scripts' decision clock). Default: the system's.
	Clock clock.Clock
}

// Server is a running rate limit service. Its methods are safe for
// concurrent use.
type Server struct {
	opts  Options
	log   *slog.Logger
	reg   *prometheus.Registry
	svc   *rls.Server
	store *sredis.Store
	grpc  *GRPCServer
	hlth  *health.Server

	reloads  *prometheus.CounterVec
	mu       sync.Mutex // serializes reloads
	version  string     // the fingerprint of the configuration serving
	refused  string     // the fingerprint last refused (logged once)
	why      error
	draining atomic.Bool

	grpcAddr, httpAddr, adminAddr net.Addr
	ready                         chan struct{}
}

// New loads the configuration and builds the service. It fails for a
// configuration that does not load (rls.ConfigErrors, each with its file
// and line) and for options out of range.
func New(opts Options) (*Server, error) {
	set(&opts.Listen, DefaultListen)
	set(&opts.HTTP, DefaultHTTP)
	set(&opts.Admin, DefaultAdmin)
	set(&opts.RedisTimeout, rls.DefaultTimeout)
	set(&opts.ReloadEvery, time.Second)
	set(&opts.ShutdownTimeout, 10*time.Second)
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.RedisTimeout < 0 {
		return nil, fmt.Errorf("rlsserve: Redis timeout %v: want > 0", opts.RedisTimeout)
	}
	version, err := Fingerprint(opts.Config)
	if err != nil {
		return nil, err
	}
	cfg, err := rls.Load(opts.Config)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, reg: prometheus.NewRegistry(), version: version, ready: make(chan struct{})}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Collector())
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_rls_config_reloads_total",
		Help: "Configuration reloads by result: loaded, refused (the old configuration kept serving)."}, []string{"result"})
	s.reg.MustRegister(s.reloads)
	ro := rls.Options{Timeout: opts.RedisTimeout, OnFailure: opts.OnFailure, Headers: opts.Headers,
		ShadowMode: opts.ShadowMode, Registry: s.reg, Clock: opts.Clock}
	if len(opts.Redis) > 0 {
		so := sredis.Options{Addrs: opts.Redis, Timeout: opts.RedisTimeout, Prefix: opts.RedisPrefix,
			Username: opts.RedisUsername, Password: opts.RedisPassword, TLS: opts.RedisTLS}
		if opts.Clock != nil {
			so.DecisionClock = opts.Clock
		}
		if s.store, err = sredis.New(so); err != nil {
			switch {
			case sredis.RefusalOf(err) == sredis.Credentials && opts.RedisPassword == "":
				err = fmt.Errorf("%w (the server wants a password: set REDIS_AUTH)", err)
			case sredis.RefusalOf(err) == sredis.Credentials && opts.RedisUsername != "":
				err = fmt.Errorf("%w (REDIS_AUTH was read as user:password, user %q)", err, opts.RedisUsername)
			}
			return nil, err
		}
		ro.Redis = s.store
		// A call's store work may wait out the store's grace for a reply
		// Redis ran in time (sredis.Options.ReplyGrace): a stall of this
		// host is not a Redis failure, and is not answered UNAVAILABLE.
		ro.Timeout = s.store.Timeout()
	}
	if s.svc, err = rls.New(cfg, ro); err != nil {
		s.closeStore()
		return nil, err
	}
	return s, nil
}

func set[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}

// Service returns the rls.Server answering the calls.
func (s *Server) Service() *rls.Server { return s.svc }

// Registry returns the registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// Addrs returns the bound gRPC, HTTP and admin addresses once Run listens
// (it blocks until then).
func (s *Server) Addrs() (grpcAddr, httpAddr, admin net.Addr) {
	<-s.ready
	return s.grpcAddr, s.httpAddr, s.adminAddr
}

// Describe returns the configuration's rules, one a line, by domain.
func Describe(cfg *rls.Config) string {
	var b strings.Builder
	for _, d := range cfg.Domains() {
		rules := cfg.Rules(d)
		fmt.Fprintf(&b, "domain %s: %d rule(s)\n", d, len(rules))
		for _, r := range rules {
			fmt.Fprintf(&b, "  %s", r)
			if r.Name != "" {
				fmt.Fprintf(&b, " (name %s)", r.Name)
			}
			if len(r.Replaces) > 0 {
				fmt.Fprintf(&b, " replaces %s", strings.Join(r.Replaces, ", "))
			}
			if r.ShadowMode {
				b.WriteString(" shadow_mode")
			}
			if r.QuotaMode {
				b.WriteString(" quota_mode")
			}
			fmt.Fprintf(&b, "  [%s:%d]\n", r.File, r.Line)
		}
	}
	return b.String()
}

// Fingerprint digests the configuration at path: a file's content, or a
// folder's *.yaml and *.yml files (the ones rls.Load reads) by name and
// content. Two equal fingerprints are the same configuration.
func Fingerprint(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	if !st.IsDir() {
		data, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		h.Write(data)
	} else {
		ents, err := os.ReadDir(path)
		if err != nil {
			return "", err
		}
		var names []string
		for _, e := range ents {
			n := e.Name()
			if e.IsDir() || strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				continue
			}
			if fi, err := os.Stat(filepath.Join(path, n)); err != nil {
				return "", err
			} else if !fi.Mode().IsRegular() {
				continue // as rls.Load: a link to a folder, a named pipe
			}
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			data, err := os.ReadFile(filepath.Join(path, n))
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%s\x00%d\x00", n, len(data))
			h.Write(data)
		}
	}
	return hex.EncodeToString(h.Sum(nil)[:8]), nil
}

// Reload re-reads the configuration. One that loads replaces the serving
// one (the counters carry over); one that does not is refused, each
// problem logged with its file and line (once per content), and the old
// one keeps serving. It returns whether the configuration changed.
func (s *Server) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, err := Fingerprint(s.opts.Config)
	if err != nil {
		s.reloads.WithLabelValues("refused").Inc()
		s.log.Error("configuration reload refused: cannot read it; the old configuration keeps serving", "config", s.opts.Config, "err", err)
		return false, err
	}
	if v == s.version {
		return false, nil
	}
	if v == s.refused {
		return false, fmt.Errorf("%w: %w", ErrRefusedBefore, s.why)
	}
	cfg, err := rls.Load(s.opts.Config)
	if err == nil {
		err = s.svc.SetConfig(cfg)
	}
	if err != nil {
		s.refused, s.why = v, err
		s.reloads.WithLabelValues("refused").Inc()
		s.log.Error("configuration reload refused; the old configuration keeps serving", "config", s.opts.Config)
		LogErrors(s.log, err)
		return false, err
	}
	s.version, s.refused, s.why = v, "", nil
	s.reloads.WithLabelValues("loaded").Inc()
	n := 0
	for _, d := range cfg.Domains() {
		n += len(cfg.Rules(d))
	}
	s.log.Info("configuration reloaded", "config", s.opts.Config, "version", v, "domains", len(cfg.Domains()), "rules", n)
	return true, nil
}

// ErrRefusedBefore is what Reload returns, wrapped around the reasons it
// logged then, for a configuration it refused already and that did not
// change since: nothing is logged again (the file watcher asks once a
// second).
var ErrRefusedBefore = errors.New("the configuration on disk is the one refused before")

// LogErrors logs each configuration error on its own line (file:line:
// field: message), or err itself when it is no configuration error.
func LogErrors(log *slog.Logger, err error) {
	var es rls.ConfigErrors
	if !errors.As(err, &es) {
		log.Error(err.Error())
		return
	}
	for _, e := range es {
		log.Error(e.Error())
	}
}

// Version returns the fingerprint of the configuration serving now.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// watch checks the configuration on every tick until ctx is done and
// reloads it when its content changed and two checks in a row read the
// same content (a writer in the middle of a file is not loaded; a
// half-written file that does not parse would be refused anyway).
func (s *Server) watch(ctx context.Context, ticks <-chan time.Time) {
	pending, unreadable := "", ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticks:
			v, err := Fingerprint(s.opts.Config)
			if err != nil && err.Error() != unreadable {
				// Once per error, not per tick: a file deleted or made
				// unreadable said nothing while the old one kept serving.
				unreadable = err.Error()
				s.log.Warn("configuration unreadable; the old configuration keeps serving", "config", s.opts.Config, "err", err)
			} else if err == nil {
				unreadable = ""
			}
			if err != nil || v == s.Version() {
				pending = ""
				continue
			}
			if v != pending {
				pending = v
				continue
			}
			s.Reload()
		}
	}
}

// storeWatchEvery is how often storeWatch looks at the store's failures;
// storeRetell how often it repeats that an outage goes on.
var storeWatchEvery, storeRetell = time.Second, 30 * time.Second

// storeWatch logs the Redis store's outages, which the decision path
// does not (it must stay cheap while Redis is down), as outageLog says.
func (s *Server) storeWatch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	o := outageLog{log: s.log, policy: failureNames[s.opts.OnFailure], retell: storeRetell, last: s.store.Failures()}
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			o.look(now, s.store.Failures(), func() error { return s.storePing(ctx) })
		}
	}
}

// outageLog turns looks at a store's failed calls into log lines: a
// warning when they grow, with what Redis answers a PING and the failure
// policy that decides meanwhile; again every retell while they go on; and
// a line when Redis answers again (two looks without a failure, then a
// PING that succeeds). Nothing is logged while Redis answers, and an
// outage that begins less than retell after the last warning (a Redis
// that comes and goes) is not told on its own: the next warning counts
// it.
type outageLog struct {
	log    *slog.Logger
	policy string
	retell time.Duration
	last   int64     // the failures at the last look
	down   time.Time // when the outage under way began (zero: none)
	told   time.Time // when a warning was last logged (zero: never)
	atDown int64     // the failures when the outage began
	quiet  int       // looks without a failure since the last one
	said   bool      // the outage under way was told
	unsaid int       // outages begun and not told since the last warning
}

func (o *outageLog) look(now time.Time, n int64, ping func() error) {
	switch {
	case n > o.last && o.down.IsZero():
		o.down, o.atDown, o.quiet, o.said = now, o.last, 0, false
		if o.told.IsZero() || now.Sub(o.told) >= o.retell {
			o.warn(now, "sluice serve: Redis is failing; calls are decided by the failure policy until it answers", n, ping)
		} else {
			o.unsaid++
		}
	case n > o.last:
		o.quiet = 0
		if now.Sub(o.told) >= o.retell {
			o.warn(now, "sluice serve: Redis is still failing", n, ping)
		}
	case !o.down.IsZero():
		if o.quiet++; o.quiet >= 2 && ping() == nil {
			if o.said {
				o.log.Info("sluice serve: Redis answers again", "after", now.Sub(o.down).Round(100*time.Millisecond), "failed_calls", n-o.atDown)
			}
			o.down = time.Time{}
		}
	}
	o.last = n
}

// warn logs msg about the outage under way at now (n failures so far).
func (o *outageLog) warn(now time.Time, msg string, n int64, ping func() error) {
	args := []any{"for", now.Sub(o.down).Round(time.Second), "on_failure", o.policy, "failed_calls", n - o.atDown, "err", ping()}
	if o.unsaid > 0 {
		args = append(args, "brief_outages_untold", o.unsaid)
	}
	o.log.Warn(msg, args...)
	o.told, o.said, o.unsaid = now, true, 0
}

// failureNames are the failure policies as --on-failure names them.
var failureNames = map[rls.FailurePolicy]string{rls.FailError: "error", rls.FailOpen: "open", rls.FailClosed: "closed"}

// storePing returns what one PING to the store's Redis gets (nil: an
// answer).
func (s *Server) storePing(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return s.store.Ping(ctx)
}

// handler is the HTTP listener's: POST /json and GET /healthcheck.
func (s *Server) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle(JSONPath, &rls.JSONHandler{Service: s.svc})
	mux.HandleFunc(HealthcheckPath, s.healthcheck)
	return mux
}

func (s *Server) healthcheck(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		http.Error(w, "shutting down", http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// AdminHandler serves /metrics, /healthz, /readyz, /rlconfig and
// /debug/pprof/.
func (s *Server) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		if s.draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "draining\n")
			return
		}
		io.WriteString(w, "ready\n")
	})
	// Profiles, as the peer's debug listener has them.
	mux.HandleFunc("GET /debug/pprof/", pprof.Index)
	mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("GET "+RulesPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, Describe(s.svc.Config()))
	})
	return mux
}

// Run listens, serves until ctx is done, then shuts down: the health
// checks turn to failing, the gRPC server stops gracefully (calls in
// flight get Options.ShutdownTimeout, then the connections are closed),
// the HTTP servers shut down within the same bound, and the Redis client
// closes.
func (s *Server) Run(ctx context.Context) error {
	defer s.closeStore()
	// The transport bounds a request's size (it refuses a larger message
	// before reading it), so the handler need not size every request again.
	rs, err := envoyrls.New(s.svc, envoyrls.Options{MaxRequestBytes: -1})
	if err != nil {
		return err
	}
	s.grpc = NewGRPCServer(s.workers(), s.log)
	s.reg.MustRegister(s.grpc.Collectors()...) // a Server runs once: nothing of the name is registered yet
	envoyrls.Register(s.grpc, rs)
	s.hlth = health.NewServer()
	healthpb.RegisterHealthServer(s.grpc, s.hlth)

	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	hs := []*http.Server{
		// WriteTimeout: a client that never reads its answers holds its
		// connection no longer (a decision takes milliseconds).
		{Handler: s.handler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
			IdleTimeout: 2 * time.Minute, ErrorLog: errLog},
		{Handler: s.AdminHandler(), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 70 * time.Second,
			IdleTimeout: 10 * time.Second, ErrorLog: errLog},
	}
	addrs := []string{s.opts.Listen, s.opts.HTTP, s.opts.Admin}
	ls := make([]net.Listener, len(addrs))
	for i, a := range addrs {
		if ls[i], err = net.Listen("tcp", a); err != nil {
			for _, l := range ls[:i] {
				l.Close()
			}
			return err
		}
	}
	s.grpcAddr, s.httpAddr, s.adminAddr = ls[0].Addr(), ls[1].Addr(), ls[2].Addr()
	close(s.ready)
	store := "memory"
	if len(s.opts.Redis) > 0 {
		store = "redis " + strings.Join(s.opts.Redis, ",")
	}
	cfg := s.svc.Config()
	s.log.Info("sluice serve: rate limit service", "grpc", s.grpcAddr.String(), "http", s.httpAddr.String(),
		"admin", s.adminAddr.String(), "config", s.opts.Config, "domains", strings.Join(cfg.Domains(), ","),
		"store", store, "version", s.Version())

	errc := make(chan error, 3)
	go func() { errc <- s.grpc.Serve(ls[0]) }()
	for i, h := range hs {
		go func() { errc <- h.Serve(ls[i+1]) }()
	}
	ticks := s.opts.Ticks
	if ticks == nil && s.opts.ReloadEvery > 0 {
		t := time.NewTicker(s.opts.ReloadEvery)
		defer t.Stop()
		ticks = t.C
	}
	wctx, stopWatch := context.WithCancel(ctx)
	// Redis' outages are told through the drain too: the service serves
	// on while load balancers see it fail its health checks.
	sctx, stopStoreWatch := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if ticks != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.watch(wctx, ticks)
		}()
	}
	if s.store != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.storeWatch(sctx, storeWatchEvery)
		}()
	}
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	s.draining.Store(true) // /readyz: 503 from here
	s.hlth.Shutdown()
	if d := s.opts.DrainDelay; d > 0 && serveErr == nil {
		after := time.After
		if s.opts.DrainAfter != nil {
			after = s.opts.DrainAfter
		}
		hs[0].SetKeepAlivesEnabled(false) // /json answers close their connections from now on
		s.log.Info("draining: serving on while load balancers see the failing health checks", "delay", d)
		select {
		case <-after(d):
		case serveErr = <-errc: // a listener failed meanwhile
		}
	}
	stopWatch()
	stopStoreWatch()
	wg.Wait()
	s.shutdown(hs)
	if errors.Is(serveErr, http.ErrServerClosed) || errors.Is(serveErr, grpc.ErrServerStopped) {
		serveErr = nil
	}
	return serveErr
}

// shutdown stops the gRPC server gracefully and the HTTP server, within
// Options.ShutdownTimeout, then closes what is left; the admin server
// (hs[1]: /healthz, /readyz) stops last.
func (s *Server) shutdown(hs []*http.Server) {
	defer func() {
		actx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if hs[1].Shutdown(actx) != nil {
			hs[1].Close()
		}
	}()
	sctx, cancel := context.WithTimeout(context.Background(), s.opts.ShutdownTimeout)
	defer cancel()
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	var wg sync.WaitGroup
	for _, h := range hs[:1] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if h.Shutdown(sctx) != nil {
				h.Close()
			}
		}()
	}
	select {
	case <-done:
	case <-sctx.Done():
		s.log.Warn("gRPC calls still in flight after the shutdown timeout: closing their connections", "calls_cut", s.grpc.InProgress(), "timeout", s.opts.ShutdownTimeout)
		s.grpc.Stop()
		<-done
	}
	wg.Wait()
}

// serverOptions are the gRPC server's options: the request size bound
// (envoyrls.DefaultMaxRequestBytes) in the transport, and a pool of
// workers goroutines that run the calls. Without the pool every call runs
// on a new goroutine, whose stack grows (is copied) on its way down to the
// handler: 8-10% of the server's CPU in profiles. A call that finds every
// worker busy gets a goroutine of its own, as without a pool. Calls that
// never wait (counters in memory) need one worker per CPU; calls that wait
// for Redis need about as many as are in flight (measured with
// bench/rlsload: one per CPU saves 12-14% of the CPU per call in memory,
// and 128 a further 10% on Redis).
//
// They also bound what callers can hold: MaxStreamsPerConn calls per
// connection, MaxCalls in all (one more is refused at once with
// RESOURCE_EXHAUSTED, with GRPCServer's count), each at most CallTimeout (a
// call whose message never comes gives its slot back then).
func serverOptions(workers int, g *callGuard) []grpc.ServerOption {
	return append(guardOptions(g), grpc.MaxRecvMsgSize(envoyrls.DefaultMaxRequestBytes), grpc.NumStreamWorkers(uint32(max(workers, 1))))
}

// workers is the stream worker pool's size for the store (serverOptions).
func (s *Server) workers() int {
	if s.store != nil {
		return 128
	}
	return runtime.GOMAXPROCS(0)
}

func (s *Server) closeStore() {
	if s.store != nil {
		s.store.Close()
	}
}

// Close releases the Redis client of a Server whose Run was never called;
// Run releases it when it returns.
func (s *Server) Close() { s.closeStore() }
