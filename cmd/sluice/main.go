// Command sluice runs admission control in front of any HTTP service
// (sluice proxy), decides for nginx auth_request and Envoy ext_authz, or
// serves Envoy's rate limit service from an envoyproxy/ratelimit
// configuration (sluice serve), validates policy files (sluice check), shows what
// admission does to goodput under real overload (sluice demo), and models
// it deterministically on a virtual clock (sluice sim).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/cmd/internal/demo"
	"github.com/sluice-go/sluice/cmd/internal/rlsserve"
	"github.com/sluice-go/sluice/examples"
	"github.com/sluice-go/sluice/grpcgate/rls"
	"github.com/sluice-go/sluice/internal/buildinfo"
	"github.com/sluice-go/sluice/internal/sysmon"
	"github.com/sluice-go/sluice/internal/yamlfile"
	"github.com/sluice-go/sluice/policy"
	"github.com/sluice-go/sluice/proxy"
)

func main() {
	// A write to a closed pipe fails with EPIPE instead of ending the
	// process: a log shipper that restarts, or `| head`, must not take the
	// proxy down (nor leave its admin token file behind).
	signal.Ignore(syscall.SIGPIPE)
	if err := root().Execute(); err != nil {
		os.Exit(1)
	}
}

func root() *cobra.Command {
	cmd := &cobra.Command{
		Use:           "sluice",
		Short:         "Admission control: rate limits, concurrency limits and load shedding in front of a service",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	cmd.AddCommand(checkCmd(), proxyCmd(), serveCmd(), demoCmd(), simCmd(), whatifCmd(), versionCmd())
	cmd.Version = buildinfo.Read().String()
	cmd.SetVersionTemplate("sluice {{.Version}}\n")
	addLogFlags(cmd)
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		_, err := logger(cmd) // refuses bad log flags before anything runs
		return err
	}
	return cmd
}

func checkCmd() *cobra.Command {
	var file, explain string
	var forServe, quiet bool
	cmd := &cobra.Command{
		Use:   "check FILE | check --config FILE | check --explain KIND",
		Short: "Validate a policy file (or an envoyproxy/ratelimit configuration) and print what it enforces",
		Long: "Validate a policy file (or an envoyproxy/ratelimit configuration) without dialing anything, print each problem as FILE:LINE: FIELD: message, " +
			"and on success print the admission policy spec it enforces. --quiet prints nothing (the exit code says: 0 valid, 1 not). " +
			"--explain KIND prints the reference of one gate kind or one top-level section of a policy file (" + strings.Join(policy.ExplainNames(), ", ") + ").",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if explain != "" {
				text, err := policy.Explain(explain)
				if err != nil {
					return err
				}
				fmt.Fprint(cmd.OutOrStdout(), text)
				return nil
			}
			path, err := checkPath(file, args)
			if err != nil {
				return err
			}
			if quiet {
				cmd.SetOut(io.Discard)
				cmd.SetErr(io.Discard)
				cmd.SilenceErrors = true
			}
			return check(cmd, path, forServe)
		},
	}
	cmd.Flags().StringVar(&file, "config", "", "policy file (YAML), or an envoyproxy/ratelimit configuration file or folder (or give it as the argument)")
	cmd.Flags().BoolVar(&forServe, "serve", false, "also refuse gates that sluice serve (a decision endpoint) cannot enforce")
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print nothing: the exit code says whether the file is valid (for CI)")
	cmd.Flags().StringVar(&explain, "explain", "", "print the reference of a gate kind (e.g. token_bucket) or of a section (e.g. identity), and exit")
	return cmd
}

// checkPath returns the file to check: the argument or --config, not two
// different ones.
func checkPath(config string, args []string) (string, error) {
	switch {
	case len(args) == 1 && config != "" && args[0] != config:
		return "", fmt.Errorf("two files to check: %s and --config %s", args[0], config)
	case len(args) == 1:
		return args[0], nil
	case config != "":
		return config, nil
	}
	return "", errors.New("no file to check: sluice check FILE (or --config FILE)")
}

// check validates the file at path and prints what it enforces.
func check(cmd *cobra.Command, file string, forServe bool) error {
	if isRLS, err := isRLSConfig(file); err != nil {
		return err
	} else if isRLS {
		cfg, err := rls.Load(file)
		if err != nil {
			if n := printConfigErrors(cmd, err); n > 0 {
				return fmt.Errorf("%s: %d error(s)", file, n)
			}
			return err
		}
		fmt.Fprint(cmd.OutOrStdout(), rlsserve.Describe(cfg))
		return nil
	}
	// Load validates everything a build would (policy.Validate)
	// without dialing the store: check works anywhere.
	f, err := policy.Load(file)
	if err != nil {
		if n := printPolicyErrors(cmd, err); n > 0 {
			return fmt.Errorf("%s: %d error(s)", file, n)
		}
		return err
	}
	if forServe { // sluice serve refuses gates it cannot enforce
		if err := policy.CheckDecisionOnly(f); err != nil {
			n := printPolicyErrors(cmd, err)
			return fmt.Errorf("%s: %d gate(s) sluice serve cannot enforce", file, n)
		}
	}
	fmt.Fprint(cmd.OutOrStdout(), f.SpecText())
	return nil
}

func proxyCmd() *cobra.Command {
	var opts proxy.Options
	var upstream string
	var sf serverFlags
	cmd := &cobra.Command{
		Use:   "proxy --config FILE --upstream URL",
		Short: "Serve a reverse proxy that admits requests to URL under the policy in FILE",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			keepMonitorAwake(cmd)
			u, err := url.Parse(upstream)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				return fmt.Errorf("--upstream %q: want an absolute http or https URL such as http://127.0.0.1:9000", upstream)
			}
			opts.Upstream = u
			if opts.AdminToken == "" {
				opts.AdminToken = os.Getenv("SLUICE_ADMIN_TOKEN")
			}
			if opts.Logger, err = logger(cmd); err != nil {
				return err
			}
			if opts.AccessLog, err = sf.accessLogger(opts.Logger); err != nil {
				return err
			}
			opts.ProblemDetails, opts.DrainGrace, opts.DrainDelay = sf.problemDetails, sf.drainGrace, sf.drainDelay
			s, err := proxy.New(opts)
			if err != nil {
				return logStartErrors(cmd, opts.Logger, err)
			}
			onForcedExit(func() { removeTokenFile(s.TokenFile()) })
			ctx, stop := stopContext(context.Background())
			defer stop()
			reloadOnHUP(ctx, s.Reload, opts.Logger, opts.Config)
			return logStartErrors(cmd, opts.Logger, s.Run(ctx))
		},
	}
	sf.add(cmd.Flags(), "request")
	cmd.Flags().StringVar(&opts.Config, "config", "", "policy file (YAML); reloaded on SIGHUP and on change")
	cmd.Flags().StringVar(&upstream, "upstream", "", "upstream base URL, e.g. http://127.0.0.1:9000")
	cmd.Flags().StringVar(&opts.Listen, "listen", "127.0.0.1:8080", "proxy listen address")
	cmd.Flags().StringVar(&opts.Admin, "admin", "127.0.0.1:9901", "admin listen address (/metrics, /healthz, /readyz, /v1/gates, the live page at /live/)")
	cmd.Flags().StringVar(&opts.AdminToken, "admin-token", "", "bearer token for /v1/gates (default $SLUICE_ADMIN_TOKEN; else, on a loopback --admin only, generated into a file whose path is logged)")
	cmd.Flags().BoolVar(&opts.NetHTTP, "net-http", false, "serve with Go's net/http server and httputil.ReverseProxy instead of the proxy's own HTTP/1.1 server: about half the throughput")
	cmd.Flags().DurationVar(&opts.UpstreamGrace, "upstream-grace", 5*time.Second, "how long past a request's deadline the proxy still waits for the upstream's answer, holding the request's slot (the upstream is most likely still working on it); the client gets 504 and the request counts as late; 0: the default; negative: cut the call at the deadline")
	cmd.Flags().DurationVar(&opts.UpstreamTimeout, "upstream-timeout", time.Minute, "the longest the upstream may stay silent on a request's connection (between two reads or writes, as nginx's proxy_read_timeout, not the whole exchange); past it the request answers 504 and frees its slot; 0: the default; negative: no bound; at least 1ms")
	cmd.Flags().DurationVar(&opts.MaxHold, "max-hold", time.Minute, "the longest a request admitted without a deadline holds its slot once its response streams (server-sent events, X-Accel-Buffering: no) or its connection is upgraded (WebSocket): the stream is cut then, as one with a deadline is at its deadline plus 1s; 0: the default; negative: no bound")
	cmd.MarkFlagRequired("config")
	cmd.MarkFlagRequired("upstream")
	return cmd
}

// removeTokenFile removes a generated admin token's file, if there is one.
func removeTokenFile(file string) {
	if file != "" {
		os.Remove(file)
	}
}

// keepMonitorAwake starts a serving command again with the Go runtime's
// system monitor kept awake (sysmon.Reexec: at 2,000 requests/s it halved
// the proxy's CPU per request), unless GODEBUG already names schedtrace.
// Where that cannot be done the command goes on as it is. It first has a
// SIGHUP ignored until the command listens for it (reloads): one that came
// while the policy was still being built (systemctl reload right after
// start) ended the process, SIGHUP's default action. The setting carries
// over the exec.
func keepMonitorAwake(cmd *cobra.Command) {
	signal.Ignore(syscall.SIGHUP)
	if err := sysmon.Reexec(); err != nil {
		if log, lerr := logger(cmd); lerr == nil {
			log.Debug("runtime monitor left as the runtime decides", "reason", err)
		}
	}
}

// printPolicyErrors prints each policy error on its own line and returns
// how many there were (0 if err is not a policy error).
func printPolicyErrors(cmd *cobra.Command, err error) int {
	var es policy.Errors
	if !errors.As(err, &es) {
		return 0
	}
	for _, e := range es {
		fmt.Fprintln(cmd.ErrOrStderr(), e)
	}
	return len(es)
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version: the module version, VCS revision (and whether the tree was modified) and Go version of this build",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintln(cmd.OutOrStdout(), "sluice", buildinfo.Read())
		},
	}
}

// readPolicy reads the policy file named by --config, if one is, into
// data and name (left as they are otherwise: the scenario's default).
func readPolicy(config string, data *[]byte, name *string) error {
	if config == "" {
		return nil
	}
	b, err := yamlfile.ReadFile(config)
	if err != nil {
		return err
	}
	*data, *name = b, config
	return nil
}

// demoReservation runs the reservation scenario through the proxy.
func demoReservation(cmd *cobra.Command, config, jsonPath string) error {
	var opts demo.ReservationOptions
	if err := readPolicy(config, &opts.Policy, &opts.PolicyName); err != nil {
		return err
	}
	ctx, stop := stopContext(context.Background())
	defer stop()
	fmt.Fprintln(cmd.OutOrStdout(), "sluice demo --scenario reservation: the premium and free example of the Mercury model at a tenth of its scale; "+
		"premium 100 queries/s (3 units each) → 40 → 100, free 600/s (1 unit), 10 s per phase, open loop")
	rep, err := demo.RunReservation(ctx, opts)
	if err != nil {
		return err
	}
	rep.WriteTable(cmd.OutOrStdout())
	if jsonPath != "" {
		return rep.WriteJSON(jsonPath)
	}
	return nil
}

// demoRetryStorm runs the retry storm through the proxy with both clients.
func demoRetryStorm(cmd *cobra.Command, config, jsonPath, plotBase string) error {
	var opts demo.RetryStormOptions
	if err := readPolicy(config, &opts.Policy, &opts.PolicyName); err != nil {
		return err
	}
	ctx, stop := stopContext(context.Background())
	defer stop()
	rep, err := demo.RunRetryStorm(ctx, opts)
	if err != nil {
		return err
	}
	return writeReport(cmd, rep, jsonPath, plotBase)
}

func demoCmd() *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Show goodput under overload with and without sluice, on a modeled upstream, with real open-loop load",
		Args:  cobra.NoArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return f.run(cmd) },
	}
	cmd.Flags().StringVar(&f.scenario, "scenario", "sweep", "sweep (goodput against offered load), ladder (a load step through the degradation ladder), service-step (the upstream's service time steps 5x; the adaptive limit's trace), reservation (premium and free class reservations: the split, borrowing and reclaim), retry-storm (a naive retry loop against package client's retries, through the proxy in overload) capacity-matrix (upstreams of every size and speed behind the policy unchanged, at 0.5x to 10x, upstream and proxy in processes of their own; long: see --workers) or incident (the routes-api model at --load times its capacity for --duration, optionally --slowdown for a stretch; goodput per 10 s slice and the adaptive limit's trace)")
	cmd.Flags().IntSliceVar(&f.matrix.Workers, "workers", nil, "capacity-matrix: the upstreams' worker counts (default 1,2,4,8,32)")
	cmd.Flags().DurationSliceVar(&f.matrix.Services, "services", nil, "capacity-matrix: the upstreams' service times (default 5ms,50ms,200ms)")
	cmd.Flags().Float64SliceVar(&f.matrix.Deadlines, "deadlines", nil, "capacity-matrix: the callers' deadlines as multiples of the service time (default 2,10,100)")
	cmd.Flags().StringVar(&f.matrixTrace, "trace", "", "capacity-matrix: write a JSON line per second of every step to this file (good, late and refused answers beside the proxy's /v1/gates)")
	cmd.Flags().DurationVar(&f.incident.Duration, "duration", 30*time.Minute, "incident: how long the load holds")
	cmd.Flags().Float64Var(&f.incident.Load, "load", 3, "incident: the offered load, a multiple of the upstream's capacity")
	cmd.Flags().Float64Var(&f.incident.Slowdown, "slowdown", 0, "incident: multiply the upstream's service times by this factor for a stretch (its capacity drops by it)")
	cmd.Flags().DurationVar(&f.incident.SlowFrom, "slow-from", 30*time.Second, "incident: when the slowdown begins")
	cmd.Flags().DurationVar(&f.incident.SlowFor, "slow-for", 30*time.Second, "incident: how long the slowdown lasts")
	cmd.Flags().Float64Var(&f.incident.Skew, "skew", 0, "incident: tenant i's share of the load falls as 1/i^skew (Zipf's law; 0: the 100 tenants share it equally; 1: the heaviest sends 19%, past its rate limit)")
	cmd.Flags().Uint64Var(&f.incident.Seed, "seed", 0, "incident: repeat the sequence of requests of another run with this seed (0: a new one): a policy and a candidate compared on the same traffic")
	cmd.Flags().StringVar(&f.record, "record", "", "incident: write the proxy's access log to this file, a JSON line for every decision, rejections included (for sluice whatif)")
	cmd.AddCommand(demoUpstreamCmd())
	cmd.Flags().StringVar(&f.config, "config", "", "policy file for the proxy (default: the embedded examples/routes-api.yaml)")
	cmd.Flags().StringVar(&f.jsonPath, "json", "", "also write the table rows as JSON to this file")
	cmd.Flags().StringVar(&f.plotBase, "plot", "sluice-demo", "write the goodput plot to this path plus .png and .svg (empty: no plot)")
	cmd.Flags().DurationVar(&f.opts.Step, "step", 5*time.Second, "load duration of each step")
	cmd.Flags().DurationVar(&f.opts.Deadline, "deadline", 500*time.Millisecond, "client deadline")
	cmd.Flags().Float64SliceVar(&f.opts.Multipliers, "loads", []float64{0.5, 1, 2, 5, 10}, "offered loads as multiples of the measured capacity")
	return cmd
}

// demoFlags are sluice demo's flags.
type demoFlags struct {
	opts                                              demo.Options
	matrix                                            demo.MatrixOptions
	incident                                          demo.IncidentOptions
	record                                            string
	config, jsonPath, plotBase, scenario, matrixTrace string
}

// check refuses a scenario's flags on another scenario, and incident
// settings that cannot run.
func (f *demoFlags) check(cmd *cobra.Command) error {
	for scenario, names := range map[string][]string{
		"incident":        {"duration", "load", "slowdown", "slow-from", "slow-for", "skew", "seed", "record"},
		"capacity-matrix": {"workers", "services", "deadlines", "trace"},
	} {
		for _, name := range names {
			if f.scenario != scenario && cmd.Flags().Changed(name) {
				return fmt.Errorf("--%s: only the %s scenario takes it", name, scenario)
			}
		}
	}
	if f.scenario == "incident" {
		return f.incident.Validate()
	}
	return nil
}

// run runs the scenario the flags name.
func (f *demoFlags) run(cmd *cobra.Command) error {
	if err := f.check(cmd); err != nil {
		return err
	}
	switch f.scenario {
	case "ladder":
		return demoLadder(cmd)
	case "reservation":
		return demoReservation(cmd, f.config, f.jsonPath)
	case "retry-storm":
		return demoRetryStorm(cmd, f.config, f.jsonPath, f.plotBase)
	case "", "sweep", "service-step", "capacity-matrix", "incident":
	default:
		return fmt.Errorf("--scenario %q: want sweep, ladder, service-step, reservation, retry-storm, capacity-matrix or incident", f.scenario)
	}
	opts := f.opts
	opts.Policy, _, _ = examples.ByName("routes-api")
	opts.PolicyName = "examples/routes-api.yaml (embedded)"
	if err := readPolicy(f.config, &opts.Policy, &opts.PolicyName); err != nil {
		return err
	}
	if _, err := policy.Parse(opts.PolicyName, opts.Policy); err != nil {
		return err
	}
	switch f.scenario {
	case "capacity-matrix":
		return demoMatrix(cmd, &f.matrix, f.matrixTrace, opts, f.jsonPath)
	case "incident":
		return demoIncident(cmd, &f.incident, opts, f.record, f.jsonPath, f.plotBase)
	case "service-step":
		return demoServiceStep(cmd, opts, f.jsonPath, f.plotBase)
	}
	return demoSweep(cmd, opts, f.jsonPath, f.plotBase)
}

// demoLadder is sluice demo --scenario ladder.
func demoLadder(cmd *cobra.Command) error {
	ctx, stop := stopContext(context.Background())
	defer stop()
	fmt.Fprintln(cmd.OutOrStdout(), "sluice demo --scenario ladder: critical route solves at 25% of capacity, analytics stepping 20% → 65% → 300% → 20%")
	rep, err := demo.RunLadderStep(ctx, []demo.LadderPhase{
		{For: 2 * time.Second, Share: 0.2}, {For: 3 * time.Second, Share: 0.65},
		{For: 5 * time.Second, Share: 3}, {For: 8 * time.Second, Share: 0.2},
	})
	if err != nil {
		return err
	}
	rep.WriteTable(cmd.OutOrStdout())
	return nil
}

// demoServiceStep is sluice demo --scenario service-step.
func demoServiceStep(cmd *cobra.Command, opts demo.Options, jsonPath, plotBase string) error {
	ctx, stop := stopContext(context.Background())
	defer stop()
	fmt.Fprintf(cmd.OutOrStdout(), "sluice demo --scenario service-step: 8 workers behind %s; reads 5 ms → 25 ms for 30 s → 5 ms, 960 req/s open-loop (3x the 25 ms capacity)\n", opts.PolicyName)
	rep, err := demo.RunServiceStep(ctx, demo.StepOptions{Policy: opts.Policy, PolicyName: opts.PolicyName, Deadline: opts.Deadline})
	if err != nil {
		return err
	}
	return writeReport(cmd, rep, jsonPath, plotBase)
}

// demoSweep is sluice demo's default scenario: goodput against offered
// load, the upstream and the proxy in processes of their own.
func demoSweep(cmd *cobra.Command, opts demo.Options, jsonPath, plotBase string) error {
	opts.Progress = cmd.ErrOrStderr()
	if exe, err := os.Executable(); err == nil {
		opts.Exe = exe // the upstream and the proxy in processes of their own
	}
	ctx, stop := stopContext(context.Background())
	defer stop()
	fmt.Fprintf(cmd.OutOrStdout(), "sluice demo: routes-api model behind %s\n", opts.PolicyName)
	rep, err := demo.Run(ctx, opts)
	if err != nil {
		return err
	}
	if err := writeReport(cmd, rep, jsonPath, plotBase); err != nil {
		return err
	}
	if jsonPath != "" {
		fmt.Fprintf(cmd.OutOrStdout(), "rows written to %s\n", jsonPath)
	}
	return nil
}

// report is what a demo scenario's run returns: a table, its rows as
// JSON, and a plot.
type report interface {
	WriteTable(io.Writer)
	WriteJSON(path string) error
	WritePlot(paths ...string) error
}

// writeReport prints rep's table, writes its rows to jsonPath (if set)
// and its plot to plotBase (if set).
func writeReport(cmd *cobra.Command, rep report, jsonPath, plotBase string) error {
	rep.WriteTable(cmd.OutOrStdout())
	if jsonPath != "" {
		if err := rep.WriteJSON(jsonPath); err != nil {
			return err
		}
	}
	return savePlot(cmd, rep, plotBase)
}

// savePlot writes base.png and base.svg with p, unless base is empty, and
// says where.
func savePlot(cmd *cobra.Command, p interface{ WritePlot(...string) error }, base string) error {
	if base == "" {
		return nil
	}
	if err := p.WritePlot(base+".png", base+".svg"); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "plot written to %s.png and %s.svg\n", base, base)
	return nil
}

// demoMatrix runs the capacity matrix through the policy in opts.
func demoMatrix(cmd *cobra.Command, m *demo.MatrixOptions, matrixTrace string, opts demo.Options, jsonPath string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	m.Exe, m.Policy, m.PolicyName, m.Progress = exe, opts.Policy, opts.PolicyName, cmd.ErrOrStderr()
	if matrixTrace != "" {
		f, err := os.Create(matrixTrace)
		if err != nil {
			return err
		}
		defer f.Close()
		m.Trace = f
	}
	if cmd.Flags().Changed("loads") {
		m.Loads = opts.Multipliers
	}
	ctx, stop := stopContext(context.Background())
	defer stop()
	rep, err := demo.RunMatrix(ctx, *m)
	if rep != nil && len(rep.Cells) > 0 {
		rep.WriteTable(cmd.OutOrStdout()) // what was measured, also when a step failed
	}
	if err != nil {
		return err
	}
	if jsonPath != "" {
		if err := rep.WriteJSON(jsonPath); err != nil {
			return err
		}
	}
	if f := rep.Failed(); len(f) > 0 {
		return fmt.Errorf("%d cell(s) of the capacity matrix failed", len(f))
	}
	return nil
}

// demoUpstreamCmd is the hidden upstream role of the multi-process demos:
// the demo's modeled upstream on an address, until SIGTERM.
func demoUpstreamCmd() *cobra.Command {
	var listen string
	var workers int
	var service time.Duration
	cmd := &cobra.Command{
		Use:    "upstream",
		Short:  "Serve the demo's modeled upstream (the multi-process demos start it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := stopContext(context.Background())
			defer stop()
			return demo.ServeUpstream(ctx, listen, workers, service)
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:9000", "address to serve on")
	cmd.Flags().IntVar(&workers, "workers", 8, "workers, each serving one request at a time")
	cmd.Flags().DurationVar(&service, "service", 0, "every request's service time (0: the routes-api model)")
	return cmd
}

// demoIncident runs a long incident through the policy in opts.
func demoIncident(cmd *cobra.Command, in *demo.IncidentOptions, opts demo.Options, record, jsonPath, plotBase string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if record != "" {
		f, err := os.Create(record)
		if err != nil {
			return err
		}
		defer f.Close()
		in.AccessLog = f // the proxy process writes to it directly
	}
	in.Exe, in.Policy, in.PolicyName, in.Deadline = exe, opts.Policy, opts.PolicyName, opts.Deadline
	ctx, stop := stopContext(context.Background())
	defer stop()
	fmt.Fprintf(cmd.ErrOrStderr(), "sluice demo --scenario incident: %gx capacity for %v...\n", in.Load, in.Duration)
	rep, err := demo.RunIncident(ctx, *in)
	if err != nil {
		return err
	}
	if err := writeReport(cmd, rep, jsonPath, plotBase); err != nil {
		return err
	}
	if !rep.Pass {
		return errors.New("a judged slice fell under the bar")
	}
	return nil
}
