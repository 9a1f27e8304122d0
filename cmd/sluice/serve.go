package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/cmd/internal/rlsserve"
	"github.com/sluice-go/sluice/grpcgate/extauthz"
	"github.com/sluice-go/sluice/grpcgate/rls"
	"github.com/sluice-go/sluice/identify"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/serve"
)

// stopContext is done on the first SIGINT or SIGTERM. A second one ends
// the process at once, cutting short a drain (--drain-delay, --drain-grace)
// its operator does not want to wait for: the functions given to
// onForcedExit run (a generated admin token's file is removed), and the
// signal then takes its default action, so the process is seen to die of
// it.
func stopContext(parent context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	var once sync.Once
	stop := func() {
		once.Do(func() { close(done) })
		cancel()
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer signal.Stop(sig)
		select {
		case <-sig:
		case <-done:
			return
		}
		cancel()
		select {
		case s := <-sig:
			forcedExit.run()
			signal.Stop(sig) // the default action is back
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				p.Signal(s)
			}
		case <-done:
		}
	}()
	return ctx, stop
}

// forcedExit holds what must be done before a second signal ends the
// process (onForcedExit).
var forcedExit cleanups

type cleanups struct {
	mu  sync.Mutex
	fns []func()
}

// onForcedExit adds f to what a second SIGINT or SIGTERM runs before it
// ends the process.
func onForcedExit(f func()) {
	forcedExit.mu.Lock()
	defer forcedExit.mu.Unlock()
	forcedExit.fns = append(forcedExit.fns, f)
}

func (c *cleanups) run() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range c.fns {
		f()
	}
}

// baseContext is the context `sluice serve` runs under until SIGINT or
// SIGTERM (tests replace it to stop the command).
var baseContext = context.Background

// serveFlags are `sluice serve`'s flags.
type serveFlags struct {
	config, listen, http, admin, adminToken string
	methodHeader, uriHeader                 string
	redis                                   []string
	redisPrefix                             string
	redisTimeout                            time.Duration
	onFailure, headers                      string
	shadow                                  bool
	shutdown                                time.Duration // --shutdown-timeout, the old name of --drain-grace
	server                                  serverFlags
}

// serveCmd is `sluice serve`: the decision service for proxies that stay
// on the data path. Under a sluice policy it answers nginx auth_request
// and Envoy ext_authz (HTTP and gRPC); under an envoyproxy/ratelimit
// configuration it is that rate limit service.
func serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve --config PATH [--listen ADDR] [--http ADDR] [--admin ADDR]",
		Short: "Serve Envoy's rate limit service (an envoyproxy/ratelimit configuration) or decide for nginx and Envoy (a sluice policy)",
		Long: "sluice serve reads PATH and serves what it is:\n\n" +
			"An envoyproxy/ratelimit configuration (a YAML file with a top-level domain key, or a folder of\n" +
			"them, one domain each): the drop-in for that service. --listen serves gRPC\n" +
			"envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit (and grpc.health.v1), --http serves\n" +
			"POST " + rlsserve.JSONPath + " (the same request and response as proto3 JSON: 200 OK, 429 OVER_LIMIT, 400\n" +
			"malformed, 503 store unavailable) and GET " + rlsserve.HealthcheckPath + ", --admin serves /metrics, /healthz and\n" +
			rlsserve.RulesPath + ". Counters live in memory, or in Redis or a Redis Cluster with --redis; --on-failure\n" +
			"says what a call answers when Redis cannot (error: UNAVAILABLE, the peer's; open: OK, counted;\n" +
			"closed: OVER_LIMIT), within --redis-timeout.\n\n" +
			"A sluice policy: --http answers at " + serve.DecidePath + " an nginx auth_request subrequest (the original\n" +
			"method and URI in X-Original-Method and X-Original-URI) and under " + serve.ExtAuthzPrefix + "/ an Envoy ext_authz\n" +
			"HTTP check (path_prefix " + serve.ExtAuthzPrefix + "); --listen answers Envoy ext_authz over gRPC\n" +
			"(envoy.service.auth.v3.Authorization/Check). It admits (200, OK) or refuses (429/503 with\n" +
			"Retry-After and the RateLimit fields; 400 for malformed headers). The proxy never says when the\n" +
			"work ends, so a policy with concurrency, queue or completion-driven gates is refused (sluice check\n" +
			"--serve lists them). The admin listener and hot reload are those of sluice proxy.\n\n" +
			"Both reload PATH on SIGHUP and when it changes; a file that does not load is refused with its\n" +
			"errors logged (file:line) and the old configuration keeps serving.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keepMonitorAwake(cmd)
			log, err := logger(cmd)
			if err != nil {
				return err
			}
			isRLS, err := isRLSConfig(f.config)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("shutdown-timeout") {
				log.Warn("--shutdown-timeout is deprecated: use --drain-grace")
				if !cmd.Flags().Changed("drain-grace") {
					f.server.drainGrace = f.shutdown
				}
			}
			ctx, stop := stopContext(baseContext())
			defer stop()
			if isRLS {
				return runRLS(ctx, cmd, f, log)
			}
			return runPolicy(ctx, cmd, f, log)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.config, "config", "", "a sluice policy file, an envoyproxy/ratelimit configuration file, or a folder of those (one domain per file); reloaded on SIGHUP and on change")
	fl.StringVar(&f.listen, "listen", rlsserve.DefaultListen, "gRPC listen address (RateLimitService, or ext_authz under a policy)")
	fl.StringVar(&f.http, "http", rlsserve.DefaultHTTP, "HTTP listen address ("+rlsserve.JSONPath+" and "+rlsserve.HealthcheckPath+"; under a policy "+serve.DecidePath+" and "+serve.ExtAuthzPrefix+"/)")
	fl.StringVar(&f.admin, "admin", rlsserve.DefaultAdmin, "admin listen address (/metrics, /healthz, /readyz (503 from the start of a drain); "+rlsserve.RulesPath+", or /v1/gates under a policy)")
	fl.StringVar(&f.adminToken, "admin-token", "", "policy only: bearer token for /v1/gates (default $SLUICE_ADMIN_TOKEN; else, on a loopback --admin only, generated into a file whose path is logged)")
	fl.StringVar(&f.methodHeader, "method-header", "X-Original-Method", "policy only: header with the original method at "+serve.DecidePath)
	fl.StringVar(&f.uriHeader, "uri-header", "X-Original-URI", "policy only: header with the original request URI at "+serve.DecidePath)
	fl.StringSliceVar(&f.redis, "redis", nil, "rate limit configuration only: Redis address(es) for the counters, host:port[,host:port...]: one server, or any nodes of a Redis Cluster (discovered); default: in memory")
	fl.StringVar(&f.redisPrefix, "redis-prefix", "sluice", "rate limit configuration only: the first part of every Redis key")
	fl.DurationVar(&f.redisTimeout, "redis-timeout", rls.DefaultTimeout, "rate limit configuration only: bound on a call's Redis work")
	fl.StringVar(&f.onFailure, "on-failure", "error", "rate limit configuration only: a call's answer when Redis fails: error (UNAVAILABLE), open (OK, counted), closed (OVER_LIMIT)")
	fl.StringVar(&f.headers, "headers", "off", "rate limit configuration only: response headers: off, draft (RateLimit-Policy, RateLimit), peer (RateLimit-Limit, -Remaining, -Reset)")
	fl.BoolVar(&f.shadow, "shadow", false, "rate limit configuration only: global shadow mode (every overall verdict OK; counters and statuses unchanged)")
	fl.DurationVar(&f.shutdown, "shutdown-timeout", 10*time.Second, "the old name of --drain-grace")
	// Hidden, and its deprecation logged by the command (not by pflag, which
	// would print it again in the process keepMonitorAwake starts).
	fl.MarkHidden("shutdown-timeout")
	f.server.add(fl, "decision (policy only)")
	cmd.MarkFlagRequired("config")
	return cmd
}

// isRLSConfig reports whether path is an envoyproxy/ratelimit
// configuration: a folder (a policy is one file), or a file with a
// top-level domain key.
func isRLSConfig(path string) (bool, error) {
	st, err := os.Stat(path)
	if err != nil {
		return false, err
	}
	if st.IsDir() {
		return true, nil
	}
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return false, err
	}
	return rls.IsConfig(data), nil
}

// refuseFlags fails when a flag of the other form was set.
func refuseFlags(cmd *cobra.Command, form string, names ...string) error {
	var set []string
	for _, n := range names {
		if cmd.Flags().Changed(n) {
			set = append(set, "--"+n)
		}
	}
	if len(set) > 0 {
		return fmt.Errorf("%s does not apply to %s", strings.Join(set, ", "), form)
	}
	return nil
}

func parseFailure(s string) (rls.FailurePolicy, error) {
	switch s {
	case "error":
		return rls.FailError, nil
	case "open":
		return rls.FailOpen, nil
	case "closed":
		return rls.FailClosed, nil
	}
	return 0, fmt.Errorf("--on-failure %q: want error, open or closed", s)
}

func parseHeaders(s string) (rls.HeaderStyle, error) {
	switch s {
	case "off":
		return rls.HeadersOff, nil
	case "draft":
		return rls.HeadersDraft, nil
	case "peer":
		return rls.HeadersPeer, nil
	}
	return 0, fmt.Errorf("--headers %q: want off, draft or peer", s)
}

// rlsOptions turns the flags into rlsserve.Options.
func rlsOptions(f serveFlags) (rlsserve.Options, error) {
	o := rlsserve.Options{Config: f.config, Listen: f.listen, HTTP: f.http, Admin: f.admin, Redis: f.redis, RedisPrefix: f.redisPrefix,
		RedisTimeout: f.redisTimeout, ShadowMode: f.shadow, ShutdownTimeout: f.server.drainGrace,
		DrainDelay: f.server.drainDelay}
	var err error
	if o.OnFailure, err = parseFailure(f.onFailure); err != nil {
		return o, err
	}
	if o.Headers, err = parseHeaders(f.headers); err != nil {
		return o, err
	}
	if f.server.drainGrace <= 0 {
		return o, fmt.Errorf("--drain-grace %v: want > 0", f.server.drainGrace)
	}
	if f.server.drainDelay < 0 {
		return o, fmt.Errorf("--drain-delay %v: want 0 or more", f.server.drainDelay)
	}
	if f.redisTimeout <= 0 {
		return o, fmt.Errorf("--redis-timeout %v: want > 0", f.redisTimeout)
	}
	if len(o.Redis) > 0 {
		if o.RedisUsername, o.RedisPassword, o.RedisTLS, err = redisEnv(os.Getenv); err != nil {
			return o, err
		}
	}
	return o, nil
}

// redisEnv reads the peer's Redis settings from the environment (getenv):
// REDIS_AUTH, "password" or "user:password" (split at the first colon, as
// the peer does); REDIS_TLS (a boolean) with REDIS_TLS_CACERT (PEM CAs
// that sign the server's certificate; empty: the system's roots) and
// REDIS_TLS_CLIENT_CERT with REDIS_TLS_CLIENT_KEY (a client certificate).
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is refused: the server's
// certificate is verified for the address's host.
func redisEnv(getenv func(string) string) (user, password string, cfg *tls.Config, err error) {
	if auth := getenv("REDIS_AUTH"); auth != "" {
		if u, p, ok := strings.Cut(auth, ":"); ok {
			user, password = u, p
		} else {
			password = auth
		}
	}
	on := false
	if v := getenv("REDIS_TLS"); v != "" {
		if on, err = strconv.ParseBool(v); err != nil {
			return "", "", nil, fmt.Errorf("REDIS_TLS %q: want true or false", v)
		}
	}
	ca, cert, key := getenv("REDIS_TLS_CACERT"), getenv("REDIS_TLS_CLIENT_CERT"), getenv("REDIS_TLS_CLIENT_KEY")
	if !on {
		for name, v := range map[string]string{"REDIS_TLS_CACERT": ca, "REDIS_TLS_CLIENT_CERT": cert, "REDIS_TLS_CLIENT_KEY": key} {
			if v != "" {
				return "", "", nil, fmt.Errorf("%s is set but REDIS_TLS is not true", name)
			}
		}
		return user, password, nil, nil
	}
	if v := getenv("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION"); v != "" {
		if skip, err := strconv.ParseBool(v); err != nil || skip {
			return "", "", nil, fmt.Errorf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION %q is not supported: the server's certificate must hold the address's host", v)
		}
	}
	cfg = &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return "", "", nil, fmt.Errorf("REDIS_TLS_CACERT: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return "", "", nil, fmt.Errorf("REDIS_TLS_CACERT %s: no PEM certificate in it", ca)
		}
	}
	if (cert == "") != (key == "") {
		return "", "", nil, errors.New("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY: give both, or neither")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return "", "", nil, fmt.Errorf("REDIS_TLS_CLIENT_CERT, REDIS_TLS_CLIENT_KEY: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return user, password, cfg, nil
}

// runRLS serves an envoyproxy/ratelimit configuration.
func runRLS(ctx context.Context, cmd *cobra.Command, f serveFlags, log *slog.Logger) error {
	if err := refuseFlags(cmd, "an envoyproxy/ratelimit configuration", "admin-token", "method-header", "uri-header",
		"access-log", "access-log-rejects", "problem-details"); err != nil {
		return err
	}
	if cmd.Flags().Changed("redis") && len(f.redis) == 0 {
		// An empty --redis (an unset variable in a unit file) would give
		// every replica counters of its own, in memory, silently.
		return errors.New("--redis is empty: give Redis' address(es), or leave the flag out for counters in memory")
	}
	opts, err := rlsOptions(f)
	if err != nil {
		return err
	}
	opts.Logger = log
	s, err := rlsserve.New(opts)
	if err != nil {
		var es rls.ConfigErrors
		if errors.As(err, &es) {
			rlsserve.LogErrors(log, err)
		}
		return logStartErrors(cmd, log, err)
	}
	reloadOnHUP(ctx, s.Reload, log, f.config)
	return logStartErrors(cmd, log, s.Run(ctx))
}

// printConfigErrors prints each rate limit configuration error on its own
// line and returns how many there were.
func printConfigErrors(cmd *cobra.Command, err error) int {
	var es rls.ConfigErrors
	if !errors.As(err, &es) {
		return 0
	}
	for _, e := range es {
		fmt.Fprintln(cmd.ErrOrStderr(), e)
	}
	return len(es)
}

// runPolicy serves a sluice policy: the HTTP decision endpoints (package
// serve) and Envoy ext_authz over gRPC on --listen, one chain for both
// (a reload updates both, or neither).
func runPolicy(ctx context.Context, cmd *cobra.Command, f serveFlags, log *slog.Logger) error {
	if err := refuseFlags(cmd, "a sluice policy (its store is in the file)", "redis", "redis-prefix", "redis-timeout", "on-failure", "headers", "shadow"); err != nil {
		return err
	}
	al, err := f.server.accessLogger(log)
	if err != nil {
		return err
	}
	opts := serve.Options{Config: f.config, HTTP: f.http, Admin: f.admin, AdminToken: f.adminToken, Logger: log,
		AccessLog: al, ProblemDetails: f.server.problemDetails, DrainGrace: f.server.drainGrace, // the drain delay is below, for gRPC and HTTP at once
		KeepOpen: true} // closed below, once gRPC and HTTP have both drained
	opts.Decision.MethodHeader, opts.Decision.URIHeader = f.methodHeader, f.uriHeader
	if opts.AdminToken == "" {
		opts.AdminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
	}
	var ext *extauthz.Server
	opts.OnPolicy = func(chain *sluice.Chain, rules identify.Rules) error {
		cfg := extauthz.Config{Rules: rules, ProblemDetails: f.server.problemDetails}
		if ext == nil {
			var err error
			ext, err = extauthz.New(chain, cfg)
			return err
		}
		return ext.Update(chain, cfg)
	}
	s, err := serve.New(opts)
	if err != nil {
		return logStartErrors(cmd, log, err)
	}
	onForcedExit(func() { removeTokenFile(s.TokenFile()) })
	lis, err := net.Listen("tcp", f.listen)
	if err != nil {
		s.Close()
		return logStartErrors(cmd, log, fmt.Errorf("gRPC listener (--listen): %w", err))
	}
	gs := rlsserve.NewGRPCServer(runtime.GOMAXPROCS(0), log)
	extauthz.Register(gs, ext)
	hlth := health.NewServer() // grpc.health.v1: SERVING until the drain starts
	healthpb.RegisterHealthServer(gs, hlth)
	log.Info("sluice serve: ext_authz gRPC", "grpc", lis.Addr().String())
	reloadOnHUP(ctx, s.Reload, log, f.config)

	// The gRPC server and the HTTP listeners drain at once, within one
	// grace; the chain they decide with closes after both.
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	defer stopHTTP()
	httpDone := make(chan error, 1)
	go func() { httpDone <- s.Run(httpCtx) }()
	grpcDone := make(chan error, 1)
	go func() { grpcDone <- gs.Serve(lis) }()
	var grpcErr, httpErr error
	httpEnded := false
	select {
	case <-ctx.Done():
	case grpcErr = <-grpcDone:
	case httpErr = <-httpDone:
		httpEnded = true
	}
	s.Unready() // /readyz: 503 before any listener drains
	hlth.Shutdown()
	if d := f.server.drainDelay; d > 0 && ctx.Err() != nil && grpcErr == nil && !httpEnded {
		s.SetKeepAlivesEnabled(false) // answers close their connections from now on
		log.Info("sluice serve draining: /readyz answers 503; still accepting while load balancers see it; answers close their connections", "drain_delay", d)
		time.Sleep(d) // both listeners go on serving
	}
	grpcStopped := make(chan struct{})
	go func() {
		gracefulStop(gs, f.server.drainGrace, log)
		close(grpcStopped)
	}()
	stopHTTP()
	if !httpEnded {
		httpErr = <-httpDone
	}
	<-grpcStopped
	s.Close()
	if grpcErr != nil && !errors.Is(grpcErr, grpc.ErrServerStopped) {
		return logStartErrors(cmd, log, grpcErr)
	}
	return logStartErrors(cmd, log, httpErr)
}

// gracefulStop stops gs gracefully, closing its connections after d (the
// calls cut then are logged with their number).
func gracefulStop(gs *rlsserve.GRPCServer, d time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		log.Warn("gRPC calls still in flight after the drain grace: closing their connections", "calls_cut", gs.InProgress(), "drain_grace", d)
		gs.Stop()
		<-done
	}
}

// reloadGap is the least time between two reloads on SIGHUP: the signals
// that come meanwhile make one reload after it, so a storm of SIGHUPs (a
// script in a loop, a config manager that signals on every write) costs a
// reload a second at most and never multiplies what reloads hand over
// (leases, permits, buckets).
const reloadGap = time.Second

// reloadOnHUP reloads the configuration on SIGHUP until ctx is done, at
// most once per reloadGap.
func reloadOnHUP(ctx context.Context, reload func() (bool, error), log *slog.Logger, file string) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for {
			select {
			case <-ctx.Done():
				// Draining: a SIGHUP now reloads nothing, and must not end
				// the process either (its default action): ignored.
				signal.Ignore(syscall.SIGHUP)
				signal.Stop(hup)
				return
			case <-hup:
				switch changed, err := reload(); {
				case err == nil && !changed:
					log.Info("SIGHUP: configuration unchanged", "config", file)
				case errors.Is(err, rlsserve.ErrRefusedBefore):
					// Refused before, and logged then: the signal gets an
					// answer all the same.
					log.Warn("SIGHUP: configuration reload refused, as before; the old configuration keeps serving", "config", file, "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(reloadGap):
				}
			}
		}
	}()
}
