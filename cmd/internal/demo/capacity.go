package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluice-go/sluice/internal/stall"
)

// MatrixOptions configures the capacity matrix: an upstream of each size
// and speed, behind the policy unchanged, at each multiple of its
// capacity, with callers of each deadline.
type MatrixOptions struct {
	// Exe is the sluice binary that runs the upstream and the proxy in
	// processes of their own. Required.
	Exe string
	// Policy and PolicyName are the proxy's policy, unchanged in every cell.
	Policy     []byte
	PolicyName string
	// Workers, Services and Deadlines span the matrix: upstreams of each
	// worker count and constant service time, callers whose deadline is
	// each multiple of the service time. Defaults {1, 2, 4, 8, 32}, {5,
	// 50, 200} ms, {2, 10, 100}.
	Workers   []int
	Services  []time.Duration
	Deadlines []float64
	// Loads are the offered loads, multiples of the capacity (measured
	// closed loop against the upstream alone). Default 0.5, 1, 2, 5, 10.
	Loads []float64
	// Warmup is the unmeasured start of every step, at least; a slow
	// service gets 25 of its service times more. Default 3 s.
	Warmup time.Duration
	// MinStep and MaxStep bound the measured length of a step, which is
	// what 400 completions at capacity take. Defaults 5 s and 20 s.
	MinStep, MaxStep time.Duration
	// Tenants is how many API keys the callers spread over. Default 100.
	Tenants int
	// Progress, if set, receives a line per step.
	Progress io.Writer
	// Trace, if set, receives a JSON line per second of every step
	// through the proxy: what the callers got that second (good, late,
	// refused by gate and reason) beside the proxy's /v1/gates read at
	// that second's end. It is how a failing cell is diagnosed.
	Trace io.Writer
}

func (o *MatrixOptions) defaults() {
	if len(o.Workers) == 0 {
		o.Workers = []int{1, 2, 4, 8, 32}
	}
	if len(o.Services) == 0 {
		o.Services = []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond}
	}
	if len(o.Deadlines) == 0 {
		o.Deadlines = []float64{2, 10, 100}
	}
	if len(o.Loads) == 0 {
		o.Loads = []float64{0.5, 1, 2, 5, 10}
	}
	if o.Warmup == 0 {
		o.Warmup = 3 * time.Second
	}
	if o.MinStep == 0 {
		o.MinStep = 5 * time.Second
	}
	if o.MaxStep == 0 {
		o.MaxStep = 20 * time.Second
	}
	if o.Tenants == 0 {
		o.Tenants = 100
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
}

// MatrixBar is what every cell must keep: at 2x and above, goodput at
// least Overload of capacity (measured, closed loop against the upstream
// alone); at 1x and below, at least Underload of the run without
// admission; and the p99 latency of admitted requests within the
// deadline.
var MatrixBar = struct{ Overload, Underload float64 }{0.9, 0.97}

// MatrixCell is one upstream, deadline and load of the matrix.
type MatrixCell struct {
	Workers     int     `json:"workers"`
	ServiceMs   float64 `json:"service_ms"`
	DeadlineMs  float64 `json:"deadline_ms"`
	Load        float64 `json:"load"`
	CapacityRPS float64 `json:"capacity_rps"` // measured closed loop against the upstream alone
	ModeledRPS  float64 `json:"modeled_rps"`  // workers ÷ service time
	TargetRPS   float64 `json:"target_rps"`
	OfferedRPS  float64 `json:"offered_rps"`
	GoodputRPS  float64 `json:"goodput_rps"`
	LateRPS     float64 `json:"late_rps"`
	RejectedRPS float64 `json:"rejected_rps"`
	// P99Ms is the 99th percentile latency of admitted requests (not
	// refused by the proxy), those the caller gave up on counted past the
	// deadline.
	P99Ms float64 `json:"p99_ms"`
	// BaselineRPS is the goodput of the same load without admission (at
	// 1x and below).
	BaselineRPS float64 `json:"baseline_rps,omitempty"`
	Limit       int     `json:"limit"` // the adaptive limit at the step's end
	// Behind: the load generator sent less than 95% of the target, and
	// the cell is not judged.
	Behind bool `json:"behind,omitempty"`
	// StallMs is the 99th percentile of how late the load generator's
	// process got to run while it measured, ms. Above a quarter of the
	// deadline (Saturated) the machine could not time the answers (its
	// own delays count as the answers' latency) and the cell is not
	// judged: three processes on two cores at several thousand requests a
	// second can take all of it.
	StallMs   float64 `json:"stall_ms"`
	Saturated bool    `json:"saturated,omitempty"`
	Pass      bool    `json:"pass"`
	Why       string  `json:"why,omitempty"`
}

// MatrixReport is the capacity matrix.
type MatrixReport struct {
	Policy string       `json:"policy"`
	Cells  []MatrixCell `json:"cells"`
}

// RunMatrix runs the capacity matrix.
func RunMatrix(ctx context.Context, opts MatrixOptions) (*MatrixReport, error) {
	opts.defaults()
	if opts.Exe == "" || len(opts.Policy) == 0 {
		return nil, errors.New("demo: the capacity matrix needs the sluice binary and a policy")
	}
	file, cleanup, err := writePolicy(opts.PolicyName, opts.Policy)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	rep := &MatrixReport{Policy: opts.PolicyName}
	total := len(opts.Workers) * len(opts.Services) * len(opts.Deadlines) * len(opts.Loads)
	n := 0
	for _, w := range opts.Workers {
		for _, svc := range opts.Services {
			// The upstream's capacity as it runs on this machine (its
			// sleeps overshoot: one worker of 5 ms serves about 180 req/s,
			// not 200), measured closed loop against it alone.
			modeled := float64(w) / svc.Seconds()
			measured, err := upstreamCapacity(ctx, opts.Exe, w, svc, min(max(time.Duration(50/modeled*float64(time.Second)), 3*time.Second), 15*time.Second))
			if err != nil {
				return rep, err
			}
			fmt.Fprintf(opts.Progress, "%d workers x %v: capacity %.1f req/s measured (%.0f modeled)\n", w, svc, measured, modeled)
			for _, dm := range opts.Deadlines {
				for _, m := range opts.Loads {
					n++
					c := MatrixCell{Workers: w, ServiceMs: ms(svc), DeadlineMs: ms(time.Duration(dm * float64(svc))), Load: m,
						CapacityRPS: measured, ModeledRPS: modeled}
					c.TargetRPS = m * c.CapacityRPS
					fmt.Fprintf(opts.Progress, "[%d/%d] %d workers x %v, deadline %.0fx, %.1fx: %.0f req/s\n", n, total, w, svc, dm, m, c.TargetRPS)
					// A step whose processes would not start (a port taken
					// meanwhile, a machine out of something) runs again once.
					err := matrixStep(ctx, &opts, file, svc, &c)
					if err != nil && ctx.Err() == nil {
						fmt.Fprintf(opts.Progress, "  again: %v\n", err)
						err = matrixStep(ctx, &opts, file, svc, &c)
					}
					if err != nil {
						return rep, err
					}
					judgeCell(&c)
					rep.Cells = append(rep.Cells, c)
					fmt.Fprintf(opts.Progress, "  offered %.0f, goodput %.0f (%.0f%% of capacity), late %.0f, p99 %.0f ms, baseline %.0f, limit %d, generator late %.1f ms: %s\n",
						c.OfferedRPS, c.GoodputRPS, 100*c.GoodputRPS/c.CapacityRPS, c.LateRPS, c.P99Ms, c.BaselineRPS, c.Limit, c.StallMs, verdictOf(c))
				}
			}
		}
	}
	return rep, nil
}

// matrixStep measures one cell: through the proxy and, at 1x and below,
// without it.
func matrixStep(ctx context.Context, o *MatrixOptions, policyFile string, svc time.Duration, c *MatrixCell) error {
	deadline := time.Duration(c.DeadlineMs * 1e6)
	warm := o.Warmup + 25*svc
	measure := min(max(time.Duration(400/c.CapacityRPS*float64(time.Second)), o.MinStep), o.MaxStep)
	runs := []string{policyFile}
	if c.Load <= 1 {
		runs = append(runs, "")
	}
	for _, pf := range runs {
		st, err := startStack(ctx, stackOptions{Exe: o.Exe, Workers: c.Workers, Service: svc, PolicyFile: pf, Log: io.Discard})
		if err != nil {
			return err
		}
		var tr *stepTrace
		if o.Trace != nil && pf != "" {
			tr = traceStep(st)
		}
		r := openLoop(ctx, st.target, c.TargetRPS, warm, measure, deadline, o.Tenants, tr)
		limit := st.limit()
		if tr != nil {
			tr.write(o.Trace, c)
		}
		st.stop()
		if err := ctx.Err(); err != nil {
			return err
		}
		if pf == "" {
			c.BaselineRPS = r.goodput
			c.Behind = c.Behind || r.offered < 0.95*c.TargetRPS
			continue
		}
		c.OfferedRPS, c.GoodputRPS, c.LateRPS, c.RejectedRPS, c.P99Ms, c.Limit = r.offered, r.goodput, r.late, r.rejected, r.p99, limit
		c.StallMs = r.stall
		c.Saturated = r.stall > c.DeadlineMs/4
		c.Behind = r.offered < 0.95*c.TargetRPS
	}
	return nil
}

// upstreamCapacity measures, closed loop for d, what an upstream of
// workers workers and service time svc serves.
func upstreamCapacity(ctx context.Context, exe string, workers int, svc, d time.Duration) (float64, error) {
	st, err := startStack(ctx, stackOptions{Exe: exe, Workers: workers, Service: svc, Log: io.Discard})
	if err != nil {
		return 0, err
	}
	defer st.stop()
	rps, _ := measureCapacity(ctx, st.target, workers, d)
	return rps, ctx.Err()
}

// judgeCell applies MatrixBar.
func judgeCell(c *MatrixCell) {
	switch {
	case c.Behind:
		c.Why = "the load generator fell behind: not judged"
		c.Pass = true
		return
	case c.Saturated:
		c.Why = fmt.Sprintf("the machine was saturated (the load generator ran %.1f ms late at p99): not judged", c.StallMs)
		c.Pass = true
		return
	case c.Load >= 2 && c.GoodputRPS < MatrixBar.Overload*c.CapacityRPS:
		c.Why = fmt.Sprintf("goodput %.0f%% of capacity", 100*c.GoodputRPS/c.CapacityRPS)
	case c.Load <= 1 && c.GoodputRPS < MatrixBar.Underload*c.BaselineRPS:
		c.Why = fmt.Sprintf("goodput %.0f%% of the run without admission", 100*c.GoodputRPS/max(c.BaselineRPS, 1e-9))
	case c.P99Ms > c.DeadlineMs:
		c.Why = fmt.Sprintf("p99 of admitted %.0f ms past the %.0f ms deadline", c.P99Ms, c.DeadlineMs)
	}
	c.Pass = c.Why == ""
}

// loopResult is what an open-loop run measured, per second.
type loopResult struct {
	offered, goodput, late, rejected, p99 float64
	stall                                 float64 // ms: the generator's p99 lateness while it measured
}

// openLoop sends GET /v1/routes/{id} at rate (requests/s) to base for
// warm+measure, each with a deadline header and a client timeout of
// deadline, and measures the requests sent after warm.
func openLoop(ctx context.Context, base string, rate float64, warm, measure, deadline time.Duration, tenants int, tr *stepTrace) loopResult {
	atk := vegeta.NewAttacker(vegeta.Timeout(deadline), vegeta.KeepAlive(true), vegeta.Workers(64),
		vegeta.MaxWorkers(20000), vegeta.Connections(20000), vegeta.Redirects(vegeta.NoFollow))
	timeout := deadline.String()
	tgt := func(t *vegeta.Target) error {
		t.Method = http.MethodGet
		t.URL = base + "/v1/routes/" + strconv.Itoa(rand.IntN(100000))
		t.Header = http.Header{"X-Api-Key": {"tenant-" + strconv.Itoa(rand.IntN(tenants))}, "X-Request-Timeout": {timeout}}
		return nil
	}
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	begin := time.Now()
	from := begin.Add(warm)
	meter := stall.Start()
	defer meter.Stop()
	reset := time.AfterFunc(warm, meter.Reset)
	defer reset.Stop()
	// One hit every 1/rate: a rate rounded to whole hits a second sent 2
	// of 2.5 req/s, and the step was discarded as behind.
	pacer := vegeta.ConstantPacer{Freq: 1, Per: time.Duration(float64(time.Second) / rate)}
	var sent, good, late, refused int
	var admitted []time.Duration
	for r := range atk.Attack(tgt, pacer, warm+measure, "matrix") {
		tr.count(r, begin, deadline)
		if r.Timestamp.Before(from) {
			continue
		}
		sent++
		switch {
		case r.Code == http.StatusTooManyRequests || r.Code == http.StatusServiceUnavailable:
			refused++
		case r.Code == http.StatusOK && r.Latency <= deadline:
			good++
			admitted = append(admitted, r.Latency)
		default: // late: past the deadline, a 504, or given up on
			late++
			admitted = append(admitted, deadline+time.Millisecond)
		}
	}
	secs := measure.Seconds()
	res := loopResult{offered: float64(sent) / secs, goodput: float64(good) / secs, late: float64(late) / secs, rejected: float64(refused) / secs,
		stall: ms(meter.Quantile(0.99))}
	if len(admitted) > 0 {
		slices.Sort(admitted)
		res.p99 = ms(admitted[min(len(admitted)*99/100, len(admitted)-1)])
	}
	return res
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// Failed returns the cells that failed the bar.
func (r *MatrixReport) Failed() []MatrixCell {
	var out []MatrixCell
	for _, c := range r.Cells {
		if !c.Pass {
			out = append(out, c)
		}
	}
	return out
}

// verdictOf is a cell's result in words.
func verdictOf(c MatrixCell) string {
	switch {
	case c.Behind:
		return "behind (not judged)"
	case c.Saturated:
		return "saturated (not judged)"
	case !c.Pass:
		return "FAIL: " + c.Why
	}
	return "PASS"
}

// WriteTable prints the matrix: a line per cell.
func (r *MatrixReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "capacity matrix through sluice proxy (%s), upstream and proxy in processes of their own\n", r.Policy)
	fmt.Fprintf(w, "bar: at 2x and above goodput >= %.0f%% of capacity; at 1x and below >= %.0f%% of the run without admission; p99 of admitted within the deadline\n\n",
		100*MatrixBar.Overload, 100*MatrixBar.Underload)
	fmt.Fprintf(w, "%7s %8s %9s %5s %9s %9s %9s %8s %8s %9s %6s  %s\n", "workers", "service", "deadline", "load", "capacity", "offered", "goodput", "good%", "p99 ms", "baseline", "limit", "result")
	for _, c := range r.Cells {
		verdict := verdictOf(c)
		base := "-"
		if c.BaselineRPS > 0 {
			base = strconv.FormatFloat(c.BaselineRPS, 'f', 0, 64)
		}
		fmt.Fprintf(w, "%7d %6.0fms %7.0fms %4.1fx %9.0f %9.0f %9.0f %7.0f%% %8.0f %9s %6d  %s\n", c.Workers, c.ServiceMs, c.DeadlineMs, c.Load,
			c.CapacityRPS, c.OfferedRPS, c.GoodputRPS, 100*c.GoodputRPS/c.CapacityRPS, c.P99Ms, base, c.Limit, verdict)
	}
	judged, passed := 0, 0
	for _, c := range r.Cells {
		if !c.Behind && !c.Saturated {
			judged++
			if c.Pass {
				passed++
			}
		}
	}
	fmt.Fprintf(w, "\n%d of %d judged cells pass; %d not judged (the load generator fell behind, or the machine was saturated)\n", passed, judged, len(r.Cells)-judged)
}

// WriteJSON writes the report as JSON to path.
func (r *MatrixReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
