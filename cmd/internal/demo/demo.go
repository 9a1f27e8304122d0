// Package demo is `sluice demo`: a modeled routes-api upstream on loopback,
// the sluice proxy in front of it, and an open-loop load sweep from 0.5x to
// 10x the upstream's measured capacity, once straight to the upstream and
// once through sluice, with client deadlines. It reports goodput (useful
// completions per second) per step as a table, JSON and a plot.
//
//	rep, err := demo.Run(ctx, demo.Options{Policy: routes-api policy})
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/sluice-go/sluice/proxy"
)

// Options configures a demo run. The zero value with a Policy is the
// default demo (under two minutes on two cores).
type Options struct {
	// Policy is the policy file content for the proxy (routes-api.yaml).
	Policy []byte
	// PolicyName names it in messages.
	PolicyName string
	// Workers is the upstream's worker pool size. Default 8. (The
	// worker-pool gate of examples/routes-api.yaml is not sized to it: its
	// limit adapts.)
	Workers int
	// Multipliers are the offered loads as multiples of the measured
	// capacity. Default 0.5, 1, 2, 5, 10.
	Multipliers []float64
	// Step is the attack duration of each load level. Default 5 s.
	Step time.Duration
	// Warmup is the load offered before each step's measured Step, on
	// the step's fresh processes, so that the adaptive limit (which starts
	// from one request in flight) has found the upstream. Default 2 s;
	// negative: none.
	Warmup time.Duration
	// Deadline is the client's deadline (sent as X-Request-Timeout, and the
	// client gives up then). Default 500 ms.
	Deadline time.Duration
	// Tenants is the number of distinct API keys. Default 40.
	Tenants int
	// CapacityWindow is how long capacity is measured at saturation.
	// Default 5 s.
	CapacityWindow time.Duration
	// Progress receives a progress line while the demo runs (nil: none).
	Progress io.Writer
	// Exe, when set, is the sluice binary: each step then runs the
	// upstream and the proxy in processes of their own, and the load
	// generator here competes with them as a separate client would (in one
	// process, on two cores, it fell behind at 10x in 5 of 13 runs and
	// took the proxy's goodput down with it). Empty: all in this process.
	Exe string
}

// Run is one run of a sweep: the name and its steps.
type RunResult struct {
	Name  string `json:"name"`
	Steps []Step `json:"steps"`
}

// Report is the demo's result.
type Report struct {
	CapacityRPS float64 `json:"capacity_rps"`
	// CapacityWork is the worker time the upstream delivered per second at
	// saturation, in workers (at most Workers: the closed loop leaves gaps).
	CapacityWork   float64     `json:"capacity_work"`
	ModeledRPS     float64     `json:"modeled_capacity_rps"`
	Workers        int         `json:"workers"`
	DeadlineMs     float64     `json:"deadline_ms"`
	StepSeconds    float64     `json:"step_seconds"`
	WarmupSeconds  float64     `json:"warmup_seconds"` // offered before each step's measured seconds
	Runs           []RunResult `json:"runs"`
	ElapsedSeconds float64     `json:"elapsed_seconds"`
	MeanServiceMs  float64     `json:"mean_service_ms"`
	OpenLoopNote   string      `json:"note"`
	// Apart: the upstream and the proxy ran in processes of their own.
	Apart bool `json:"apart,omitempty"`
}

func (o *Options) defaults() {
	if o.Workers == 0 {
		o.Workers = 8
	}
	if len(o.Multipliers) == 0 {
		o.Multipliers = []float64{0.5, 1, 2, 5, 10}
	}
	if o.Warmup == 0 {
		o.Warmup = 2 * time.Second
	}
	o.Warmup = max(o.Warmup, 0)
	if o.Step == 0 {
		o.Step = 5 * time.Second
	}
	if o.Deadline == 0 {
		o.Deadline = 500 * time.Millisecond
	}
	if o.Tenants == 0 {
		o.Tenants = 40
	}
	if o.CapacityWindow == 0 {
		o.CapacityWindow = 5 * time.Second
	}
	if o.PolicyName == "" {
		o.PolicyName = "routes-api.yaml"
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// serve starts h on a loopback port and returns its URL and a stop func.
func serve(h http.Handler) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(l)
	return "http://" + l.Addr().String(), func() { srv.Close() }, nil
}

// Run runs the demo.
func Run(ctx context.Context, opts Options) (*Report, error) {
	if len(opts.Policy) == 0 {
		return nil, errors.New("demo: no policy")
	}
	opts.defaults()
	start := time.Now()
	rep := &Report{
		Workers:       opts.Workers,
		DeadlineMs:    float64(opts.Deadline) / 1e6,
		StepSeconds:   opts.Step.Seconds(),
		WarmupSeconds: opts.Warmup.Seconds(),
		MeanServiceMs: float64(MeanServiceTime()) / 1e6,
		ModeledRPS:    float64(opts.Workers) / MeanServiceTime().Seconds(),
		OpenLoopNote:  "open-loop load (tsenart/vegeta): arrivals do not slow down when the service does",
		Apart:         opts.Exe != "",
	}

	// Capacity, measured at saturation straight against a fresh upstream.
	fmt.Fprintf(opts.Progress, "\rmeasuring upstream capacity (%d workers, closed loop)...", opts.Workers)
	up := NewUpstream(opts.Workers)
	base, stop, err := serve(up)
	if err != nil {
		return nil, err
	}
	rep.CapacityRPS, rep.CapacityWork = measureCapacity(ctx, base, opts.Workers, opts.CapacityWindow)
	up.Close()
	stop()
	if rep.CapacityRPS <= 0 {
		return nil, errors.New("demo: upstream completed nothing while measuring capacity")
	}

	total := 2 * len(opts.Multipliers)
	n := 0
	for _, run := range []string{"no admission", "sluice"} {
		rr := RunResult{Name: run}
		for _, m := range opts.Multipliers {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			n++
			rps := m * rep.CapacityRPS
			fmt.Fprintf(opts.Progress, "\r[%2d/%d] %-12s %4.1fx capacity: %6.0f req/s offered for %v ...           ",
				n, total, run, m, rps, opts.Step)
			st, err := step(ctx, opts, run == "sluice", rps)
			if err != nil {
				return nil, err
			}
			st.Multiplier = m
			if st.Behind() {
				fmt.Fprintf(opts.Progress, "\rwarning: %s at %.1fx: the load generator offered %.0f req/s of the %.0f asked (%.0f%% short); this machine is too busy to offer the load, the step is marked (!)\n",
					run, m, st.OfferedRPS, st.TargetRPS, 100*(1-st.OfferedRPS/st.TargetRPS))
			}
			rr.Steps = append(rr.Steps, st)
		}
		rep.Runs = append(rep.Runs, rr)
	}
	fmt.Fprintf(opts.Progress, "\r%80s\r", "")
	rep.ElapsedSeconds = time.Since(start).Seconds()
	return rep, nil
}

// running is a sluice proxy in front of a demo upstream.
type running struct {
	url  string // the proxy's
	s    *proxy.Server
	stop func() // stops the upstream's workers, then the proxy
}

// startProxy runs the proxy with policy in front of up (served at base)
// on loopback ports until stop.
func startProxy(ctx context.Context, name string, policy []byte, base string, up *Upstream) (*running, error) {
	u, _ := url.Parse(base)
	s, err := proxy.New(proxy.Options{
		Config: name, ConfigData: policy, Upstream: u,
		Listen: "127.0.0.1:0", Admin: "127.0.0.1:0", AdminToken: "demo",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Run(pctx) }()
	addr, _ := s.Addrs()
	return &running{url: "http://" + addr.String(), s: s, stop: func() {
		up.Close() // release handlers blocked on the upstream first
		cancel()
		<-done
	}}, nil
}

// behindProxy starts an upstream of workers workers and the proxy with
// policy in front of it; stop stops both.
func behindProxy(ctx context.Context, workers int, name string, policy []byte) (up *Upstream, p *running, stop func(), err error) {
	up = NewUpstream(workers)
	base, stopUp, err := serve(up)
	if err != nil {
		up.Close()
		return nil, nil, nil, err
	}
	p, err = startProxy(ctx, name, policy, base, up)
	if err != nil {
		up.Close()
		stopUp()
		return nil, nil, nil, err
	}
	return up, p, func() { p.stop(); stopUp() }, nil
}

// step runs one load level against a fresh upstream (and a fresh proxy).
func step(ctx context.Context, opts Options, admission bool, rps float64) (Step, error) {
	if opts.Exe != "" {
		return stepApart(ctx, opts, admission, rps)
	}
	up := NewUpstream(opts.Workers)
	defer up.Close()
	base, stopUp, err := serve(up)
	if err != nil {
		return Step{}, err
	}
	defer stopUp()
	target := base
	if admission {
		p, err := startProxy(ctx, opts.PolicyName, opts.Policy, base, up)
		if err != nil {
			return Step{}, err
		}
		defer p.stop()
		target = p.url
	}
	return attack(ctx, target, rps, opts.Warmup, opts.Step, opts.Deadline, opts.Tenants), nil
}

// stepApart is step with the upstream and the proxy in processes of their
// own.
func stepApart(ctx context.Context, opts Options, admission bool, rps float64) (Step, error) {
	file := ""
	if admission {
		f, cleanup, err := writePolicy(opts.PolicyName, opts.Policy)
		if err != nil {
			return Step{}, err
		}
		defer cleanup()
		file = f
	}
	st, err := startStack(ctx, stackOptions{Exe: opts.Exe, Workers: opts.Workers, PolicyFile: file, Log: io.Discard})
	if err != nil {
		return Step{}, err
	}
	defer st.stop()
	return attack(ctx, st.target, rps, opts.Warmup, opts.Step, opts.Deadline, opts.Tenants), nil
}

// WriteJSON writes the report as JSON to path.
func (r *Report) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable prints one table per run.
func (r *Report) WriteTable(w io.Writer) {
	apart := ""
	if r.Apart {
		apart = "; upstream and proxy in processes of their own"
	}
	fmt.Fprintf(w, "upstream: %d workers, mean service %.1f ms, measured capacity %.0f req/s (modeled %.0f); client deadline %.0f ms; %.0f s per step measured after %.0f s of warm-up, open-loop load%s\n",
		r.Workers, r.MeanServiceMs, r.CapacityRPS, r.ModeledRPS, r.DeadlineMs, r.StepSeconds, r.WarmupSeconds, apart)
	behind := 0
	for _, run := range r.Runs {
		fmt.Fprintf(w, "\n%s\n", run.Name)
		fmt.Fprintf(w, "%6s %9s %9s %9s %8s %8s %8s %9s %9s  %s\n", "load", "offered", "admitted", "goodput", "good%", "work%", "late", "p50 ms", "p99 ms", "rejected by reason (req/s)")
		for _, s := range run.Steps {
			mark := ""
			if s.Behind() {
				mark, behind = "  (!)", behind+1
			}
			fmt.Fprintf(w, "%5.1fx %9.0f %9.0f %9.0f %7.0f%% %7.0f%% %8.0f %9.1f %9.1f  %s%s\n",
				s.Multiplier, s.OfferedRPS, s.AdmittedRPS, s.GoodputRPS, 100*s.GoodputRPS/r.CapacityRPS, 100*s.UsefulWork/float64(r.Workers),
				s.LateRPS, s.P50Ms, s.P99Ms, fmtReasons(s.RejectedRPS), mark)
		}
	}
	fmt.Fprintf(w, "\ngood%% is goodput (answers in time) as a share of the measured capacity in req/s; work%% is the share of the upstream's\n"+
		"worker time spent on those answers, which does not move when admission favours cheap or costly requests\n"+
		"(a critical route solve costs 5x a read). %.0f s in all.\n", r.ElapsedSeconds)
	if behind > 0 {
		fmt.Fprintf(w, "(!) on %d step(s) the load generator sent less than 95%% of the target rate: this machine was too busy to offer the load, so those figures understate it.\n", behind)
	}
}
