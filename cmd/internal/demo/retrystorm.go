package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluice-go/sluice/client"
	"github.com/sluice-go/sluice/cmd/internal/goodplot"
	"github.com/sluice-go/sluice/examples"
)

// RetryStormOptions configures RunRetryStorm. The zero value is the
// README's run.
type RetryStormOptions struct {
	// Policy is the proxy's policy (default: the embedded
	// examples/routes-api.yaml), named PolicyName.
	Policy     []byte
	PolicyName string
	// Workers is the upstream's pool (default 2: 200 reads/s of 10 ms).
	Workers int
	// Multipliers are the offered logical loads as multiples of the
	// modeled capacity (default 1, 2, 4).
	Multipliers []float64
	// Step is how long each load is offered (default 5 s).
	Step time.Duration
	// Deadline is each logical request's deadline (default 300 ms: the
	// wait queue of routes-api.yaml holds a request up to 200 ms, so an
	// attempt sent late in its request's life can be admitted and still
	// answer after its caller has gone).
	Deadline time.Duration
	// Tenants is the number of API keys the load is spread over
	// (default 20).
	Tenants int
	// Attempts bounds both clients' attempts per request (default 5).
	Attempts int
}

func (o *RetryStormOptions) defaults() {
	if len(o.Policy) == 0 {
		o.Policy, _, _ = examples.ByName("routes-api")
		o.PolicyName = "examples/routes-api.yaml"
	}
	if o.PolicyName == "" {
		o.PolicyName = "policy"
	}
	if o.Workers == 0 {
		o.Workers = 2
	}
	if len(o.Multipliers) == 0 {
		o.Multipliers = []float64{1, 2, 4}
	}
	if o.Step == 0 {
		o.Step = 5 * time.Second
	}
	if o.Deadline == 0 {
		o.Deadline = 300 * time.Millisecond
	}
	if o.Tenants == 0 {
		o.Tenants = 20
	}
	if o.Attempts == 0 {
		o.Attempts = 5
	}
}

// The two clients of the experiment.
const (
	ClientNaive  = "naive retry loop"
	ClientSluice = "sluice client"
)

// StormRow is one client at one load: rates per second of the step.
type StormRow struct {
	Client     string  `json:"client"`
	Multiplier float64 `json:"multiplier"`
	// Logical is the requests the application made (open loop); Attempts
	// what the client sent for them (first attempts and retries);
	// Refused the attempts the proxy answered 429 or 503; Local the
	// requests the client refused itself (adaptive throttle, pacing).
	LogicalRPS  float64 `json:"logical_rps"`
	AttemptsRPS float64 `json:"attempts_rps"`
	RefusedRPS  float64 `json:"refused_rps"`
	LocalRPS    float64 `json:"local_rps"`
	// GoodputRPS is the logical requests answered 200 within their
	// deadline.
	GoodputRPS float64 `json:"goodput_rps"`
	// Amplification is attempts per logical request.
	Amplification float64 `json:"amplification"`
	P99Ms         float64 `json:"p99_ms"`
}

// StormReport is RunRetryStorm's result.
type StormReport struct {
	Policy      string     `json:"policy"`
	Workers     int        `json:"workers"`
	CapacityRPS float64    `json:"capacity_rps"` // modeled: workers / 10 ms
	DeadlineMs  float64    `json:"deadline_ms"`
	StepSeconds float64    `json:"step_seconds"`
	Attempts    int        `json:"attempts"`
	Rows        []StormRow `json:"rows"`
}

// RunRetryStorm runs the retry storm end to end over real HTTP: an open
// loop of logical requests (reads, GET /v1/routes/{id}, 10 ms of an
// upstream worker each) through `sluice proxy` in front of the demo's
// upstream, at each load once with a naive retry loop (every failure
// retried after 10 ms, Retry-After ignored, up to Attempts) and once with
// package client's Transport (the same attempt limit; its defaults
// otherwise), counting every attempt either client sends.
func RunRetryStorm(ctx context.Context, opts RetryStormOptions) (*StormReport, error) {
	opts.defaults()
	capacity := float64(opts.Workers) / (10 * time.Millisecond).Seconds()
	rep := &StormReport{Policy: opts.PolicyName, Workers: opts.Workers, CapacityRPS: capacity,
		DeadlineMs: float64(opts.Deadline) / 1e6, StepSeconds: opts.Step.Seconds(), Attempts: opts.Attempts}
	for _, m := range opts.Multipliers {
		for _, c := range []string{ClientNaive, ClientSluice} {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			row, err := stormStep(ctx, opts, c, m*capacity)
			if err != nil {
				return nil, err
			}
			row.Multiplier = m
			rep.Rows = append(rep.Rows, row)
		}
	}
	return rep, nil
}

// counting counts the attempts that reach the wire and their refusals.
type counting struct {
	base             http.RoundTripper
	attempts, refuse atomic.Int64
}

func (c *counting) RoundTrip(r *http.Request) (*http.Response, error) {
	c.attempts.Add(1)
	resp, err := c.base.RoundTrip(r)
	if err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		c.refuse.Add(1)
	}
	return resp, err
}

// naive is the retry loop many clients have: any failure is retried after
// a fixed pause, whatever the server said, up to attempts.
type naive struct {
	base     http.RoundTripper
	attempts int
}

func (n *naive) RoundTrip(r *http.Request) (*http.Response, error) {
	for i := 1; ; i++ {
		resp, err := n.base.RoundTrip(r.Clone(r.Context()))
		failed := err != nil || resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
		if !failed || i >= n.attempts || r.Context().Err() != nil {
			return resp, err
		}
		if resp != nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		select {
		case <-time.After(10 * time.Millisecond):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
}

// stormStep offers rps logical requests per second for opts.Step through
// a fresh proxy and upstream with one client.
func stormStep(ctx context.Context, opts RetryStormOptions, which string, rps float64) (StormRow, error) {
	_, p, stop, err := behindProxy(ctx, opts.Workers, opts.PolicyName, opts.Policy)
	if err != nil {
		return StormRow{}, err
	}
	defer stop()
	wire := &http.Transport{MaxIdleConnsPerHost: 10000, MaxConnsPerHost: 0, DisableCompression: true}
	defer wire.CloseIdleConnections()
	cnt := &counting{base: wire}
	var rt http.RoundTripper
	var local atomic.Int64
	switch which {
	case ClientNaive:
		rt = &naive{base: cnt, attempts: opts.Attempts}
	default:
		r, err := client.New(client.Options{MaxAttempts: opts.Attempts})
		if err != nil {
			return StormRow{}, err
		}
		rt = &client.Transport{Base: cnt, Retrier: r, DeadlineHeader: "X-Request-Timeout"}
	}
	hc := &http.Client{Transport: rt, Timeout: opts.Deadline}
	atk := vegeta.NewAttacker(vegeta.Client(hc), vegeta.Workers(64), vegeta.MaxWorkers(20000), vegeta.Redirects(vegeta.NoFollow))
	timeout := opts.Deadline.String()
	var seq atomic.Int64
	tgt := func(t *vegeta.Target) error {
		n := seq.Add(1)
		t.Method, t.URL = http.MethodGet, p.url+"/v1/routes/"+strconv.FormatInt(n%100000, 10)
		t.Header = http.Header{"X-Api-Key": {"tenant-" + strconv.FormatInt(n%int64(opts.Tenants), 10)}, "X-Request-Timeout": {timeout}}
		return nil
	}
	stopAtk := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stopAtk()
	var logical, good int64
	var lat []time.Duration
	for r := range atk.Attack(tgt, vegeta.ConstantPacer{Freq: int(rps + 0.5), Per: time.Second}, opts.Step, which) {
		logical++
		switch {
		case r.Code == http.StatusOK && r.Latency <= opts.Deadline:
			good++
			lat = append(lat, r.Latency)
		case r.Code == 0 && errors.Is(errorOf(r.Error), client.ErrLocal):
			local.Add(1)
		}
	}
	secs := opts.Step.Seconds()
	row := StormRow{Client: which, LogicalRPS: float64(logical) / secs, AttemptsRPS: float64(cnt.attempts.Load()) / secs,
		RefusedRPS: float64(cnt.refuse.Load()) / secs, LocalRPS: float64(local.Load()) / secs, GoodputRPS: float64(good) / secs}
	if logical > 0 {
		row.Amplification = float64(cnt.attempts.Load()) / float64(logical)
	}
	row.P99Ms = p99(lat)
	return row, nil
}

// errorOf turns vegeta's error text back into an error that matches
// client.ErrLocal when it says so (vegeta keeps only the text).
func errorOf(msg string) error {
	if msg != "" && containsLocal(msg) {
		return client.ErrLocal
	}
	return errors.New(msg)
}

func containsLocal(msg string) bool {
	return strings.Contains(msg, "rejected locally")
}

func p99(lat []time.Duration) float64 {
	if len(lat) == 0 {
		return 0
	}
	slices.Sort(lat)
	return float64(lat[min(len(lat)*99/100, len(lat)-1)]) / 1e6
}

// WriteTable prints the experiment's rows.
func (r *StormReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "retry storm through sluice proxy (%s): %d workers, reads of 10 ms (capacity %.0f req/s), deadline %.0f ms, up to %d attempts, %.0f s per step, open loop\n\n",
		r.Policy, r.Workers, r.CapacityRPS, r.DeadlineMs, r.Attempts, r.StepSeconds)
	fmt.Fprintf(w, "%5s  %-17s %8s %9s %8s %8s %8s %8s %7s\n", "load", "client", "logical", "attempts", "per req", "refused", "local", "goodput", "p99 ms")
	for _, s := range r.Rows {
		fmt.Fprintf(w, "%4.0fx  %-17s %8.0f %9.0f %7.2fx %8.0f %8.0f %8.0f %7.0f\n",
			s.Multiplier, s.Client, s.LogicalRPS, s.AttemptsRPS, s.Amplification, s.RefusedRPS, s.LocalRPS, s.GoodputRPS, s.P99Ms)
	}
	fmt.Fprintln(w, "\nlogical: requests the application made (per second); attempts: what its client sent for them, retries included;\n"+
		"refused: attempts the proxy answered 429 or 503; local: requests the sluice client refused itself; goodput: logical requests answered in time.")
}

// WriteJSON writes the report as JSON to path.
func (r *StormReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WritePlot draws goodput and attempts against the offered logical load
// for both clients.
func (r *StormReport) WritePlot(paths ...string) error {
	c := goodplot.Chart{
		Title:         "Retry storm through sluice proxy: naive retries vs the sluice client",
		XLabel:        "offered logical requests (req/s)",
		YLabel:        "goodput: requests answered in time (req/s)",
		CapacityLabel: "capacity",
		Capacity:      r.CapacityRPS,
		Lower:         &goodplot.Panel{YLabel: "attempts sent per request"},
	}
	for i, name := range []string{ClientNaive, ClientSluice} {
		good, amp := goodplot.Line{Name: name, Color: i + 1}, goodplot.Line{Name: name, Color: i + 1}
		for _, s := range r.Rows {
			if s.Client == name {
				good.Points = append(good.Points, [2]float64{s.LogicalRPS, s.GoodputRPS})
				amp.Points = append(amp.Points, [2]float64{s.LogicalRPS, s.Amplification})
			}
		}
		c.Lines = append(c.Lines, good)
		c.Lower.Lines = append(c.Lower.Lines, amp)
	}
	return goodplot.Save(c, paths...)
}
