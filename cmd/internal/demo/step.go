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
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/cmd/internal/goodplot"
	"github.com/sluice-go/sluice/cmd/internal/settle"
)

// StepOptions configures the service-time step. The zero value with a
// Policy is the acceptance run: 8 workers, reads of 5 ms mean for 15 s,
// 25 ms for 30 s, 5 ms for 25 s, offered open-loop at three times the
// capacity of 25 ms reads (960 req/s), a 500 ms client deadline.
type StepOptions struct {
	Policy     []byte
	PolicyName string
	Workers    int
	// Fast and Slow are the mean service times before and after the step.
	Fast, Slow time.Duration
	// Before, During and After are the phases' lengths.
	Before, During, After time.Duration
	// Overload is the offered load as a multiple of the slow capacity.
	Overload float64
	Deadline time.Duration
	Tenants  int
}

func (o *StepOptions) defaults() {
	if o.PolicyName == "" {
		o.PolicyName = "routes-api.yaml"
	}
	if o.Workers == 0 {
		o.Workers = 8
	}
	if o.Fast == 0 {
		o.Fast = 5 * time.Millisecond
	}
	if o.Slow == 0 {
		o.Slow = 25 * time.Millisecond
	}
	if o.Before == 0 {
		o.Before = 15 * time.Second
	}
	if o.During == 0 {
		o.During = 30 * time.Second
	}
	if o.After == 0 {
		o.After = 25 * time.Second
	}
	if o.Overload == 0 {
		o.Overload = 3
	}
	if o.Deadline == 0 {
		o.Deadline = 500 * time.Millisecond
	}
	if o.Tenants == 0 {
		o.Tenants = 40
	}
}

// StepRow is one second of the service-time step.
type StepRow struct {
	T          float64 `json:"t"`
	ServiceMs  float64 `json:"service_ms"`
	CapacityPS float64 `json:"capacity_rps"` // workers ÷ mean service time
	TargetRPS  float64 `json:"target_rps"`
	OfferedRPS float64 `json:"offered_rps"`
	GoodputRPS float64 `json:"goodput_rps"`
	P99Ms      float64 `json:"p99_ms"`
	Limit      int     `json:"limit"`
	// Waited counts requests that waited for a slot in the second; Refused
	// those turned away for want of one (reasons queue, concurrency).
	Waited  int64 `json:"waited"`
	Refused int64 `json:"refused"`
}

// StepReport is the result of the service-time step.
type StepReport struct {
	Workers   int               `json:"workers"`
	Policy    string            `json:"policy"`
	Rows      []StepRow         `json:"rows"`
	Settling  []settle.Settling `json:"settling"` // after the step up and after the step down
	Changes   []int             `json:"changes"`  // the rows where the service time changes
	Behind    int               `json:"behind"`   // rows where the load generator sent < 95% of its target
	DeadlineM float64           `json:"deadline_ms"`
}

// RunServiceStep drives the demo upstream through the proxy with open-loop
// reads while the upstream's service time steps from Fast to Slow and
// back, and records goodput and the adaptive limit every second.
func RunServiceStep(ctx context.Context, opts StepOptions) (*StepReport, error) {
	opts.defaults()
	if len(opts.Policy) == 0 {
		return nil, errors.New("demo: no policy")
	}
	up, p, stop, err := behindProxy(ctx, opts.Workers, opts.PolicyName, opts.Policy)
	if err != nil {
		return nil, err
	}
	defer stop()
	up.SetServiceTime(opts.Fast)
	sizer, queuer := watched(p.s.Chain())
	if sizer == nil {
		return nil, errors.New("demo: the policy has no adaptive concurrency gate to watch")
	}
	rep := &StepReport{Workers: opts.Workers, Policy: opts.PolicyName, DeadlineM: float64(opts.Deadline) / 1e6,
		Changes: []int{int(opts.Before / time.Second), int((opts.Before + opts.During) / time.Second)}}
	rate := opts.Overload * float64(opts.Workers) / opts.Slow.Seconds()
	rows := stepRows(&opts, rep.Changes, rate)
	lat := make([][]time.Duration, len(rows))

	var wg sync.WaitGroup
	start := time.Now()
	wg.Add(1)
	go func() {
		defer wg.Done()
		stepLoad(ctx, &opts, p.url, rate, start, rows, lat)
	}()
	// The phases, and the limit at the end of every second.
	clk := p.s.Chain().Clock()
	var waited int64
	for i := 1; i <= len(rows); i++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil, ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(i) * time.Second))):
		}
		rows[i-1].Limit, _ = sizer.ConcurrencyLimit()
		if queuer != nil {
			_, _, w, _ := queuer.QueueStats(clk.Now())
			rows[i-1].Waited, waited = w-waited, w
		}
		switch i {
		case rep.Changes[0]:
			up.SetServiceTime(opts.Slow)
		case rep.Changes[1]:
			up.SetServiceTime(opts.Fast)
		}
	}
	wg.Wait()
	rep.finish(rows, lat)
	return rep, nil
}

// watched finds the chain's first moving limit and first wait queue.
func watched(c *sluice.Chain) (sluice.Sizer, sluice.Queuer) {
	var sizer sluice.Sizer
	var queuer sluice.Queuer
	for _, g := range c.Gates() {
		if sz, ok := sluice.As[sluice.Sizer](g); ok && sizer == nil {
			sizer = sz
		}
		if q, ok := sluice.As[sluice.Queuer](g); ok && queuer == nil {
			queuer = q
		}
	}
	return sizer, queuer
}

// stepRows lays out a row a second, with the service time and capacity
// of its phase.
func stepRows(opts *StepOptions, changes []int, rate float64) []StepRow {
	rows := make([]StepRow, int((opts.Before+opts.During+opts.After)/time.Second))
	for i := range rows {
		svc := opts.Fast
		if i >= changes[0] && i < changes[1] {
			svc = opts.Slow
		}
		rows[i] = StepRow{T: float64(i), ServiceMs: float64(svc) / 1e6, CapacityPS: float64(opts.Workers) / svc.Seconds(), TargetRPS: rate}
	}
	return rows
}

// stepLoad sends reads open-loop at rate for the whole series and counts
// each result in the row of the second it was sent in.
func stepLoad(ctx context.Context, opts *StepOptions, target string, rate float64, start time.Time, rows []StepRow, lat [][]time.Duration) {
	atk := vegeta.NewAttacker(vegeta.Timeout(opts.Deadline), vegeta.KeepAlive(true), vegeta.Workers(64),
		vegeta.MaxWorkers(20000), vegeta.Connections(20000), vegeta.Redirects(vegeta.NoFollow))
	timeout := opts.Deadline.String()
	tgt := func(t *vegeta.Target) error {
		t.Method = http.MethodGet
		t.URL = target + "/v1/routes/" + strconv.Itoa(rand.IntN(100000))
		t.Header = http.Header{"X-Api-Key": {"tenant-" + strconv.Itoa(rand.IntN(opts.Tenants))}, "X-Request-Timeout": {timeout}}
		return nil
	}
	stop := context.AfterFunc(ctx, func() { atk.Stop() })
	defer stop()
	total := time.Duration(len(rows)) * time.Second
	for r := range atk.Attack(tgt, vegeta.ConstantPacer{Freq: int(rate + 0.5), Per: time.Second}, total, "step") {
		i := int(r.Timestamp.Sub(start) / time.Second)
		if i < 0 || i >= len(rows) {
			continue
		}
		rows[i].OfferedRPS++
		if r.Code == http.StatusOK && r.Latency <= opts.Deadline {
			rows[i].GoodputRPS++
			lat[i] = append(lat[i], r.Latency)
		}
		if r.Code == http.StatusServiceUnavailable {
			if why := reasonOf(r.Body, 503); why == "queue" || why == "concurrency" {
				rows[i].Refused++
			}
		}
	}
}

// finish computes the rows' p99s, the seconds the load generator fell
// behind, and the limit's settling after both changes.
func (r *StepReport) finish(rows []StepRow, lat [][]time.Duration) {
	ws := make([]settle.Window, len(rows))
	for i := range rows {
		if l := lat[i]; len(l) > 0 {
			slices.Sort(l)
			rows[i].P99Ms = float64(l[min(len(l)*99/100, len(l)-1)]) / 1e6
		}
		if rows[i].OfferedRPS < 0.95*rows[i].TargetRPS {
			r.Behind++
		}
		ws[i] = settle.Window{Limit: rows[i].Limit, Binding: rows[i].Waited > 0 || rows[i].Refused > 0}
	}
	r.Rows = rows
	r.Settling = []settle.Settling{settle.Measure(ws, r.Changes[0], r.Changes[1]), settle.Measure(ws, r.Changes[1], len(rows))}
}

// WriteJSON writes the report as JSON to path.
func (r *StepReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WriteTable prints the time series and the limit's settling.
func (r *StepReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%5s %8s %9s %9s %9s %7s %8s %6s %7s %8s\n", "t", "service", "capacity", "offered", "goodput", "good%", "p99 ms", "limit", "waited", "refused")
	for i, row := range r.Rows {
		mark := ""
		if i > 0 && row.ServiceMs != r.Rows[i-1].ServiceMs {
			mark = "  <- service time steps"
		}
		if row.OfferedRPS < 0.95*row.TargetRPS {
			mark += "  (!)"
		}
		fmt.Fprintf(w, "%4.0fs %6.0fms %9.0f %9.0f %9.0f %6.0f%% %8.1f %6d %7d %8d%s\n", row.T, row.ServiceMs, row.CapacityPS, row.OfferedRPS,
			row.GoodputRPS, 100*min(row.GoodputRPS/min(row.CapacityPS, row.OfferedRPS), 9.99), row.P99Ms, row.Limit, row.Waited, row.Refused, mark)
	}
	for i, st := range r.Settling {
		what := []string{"after the step up", "after the step down"}[i]
		if st.Windows < 0 {
			fmt.Fprintf(w, "limit %s (t=%ds): did not settle (stay within ±max(2, 10%%) of %d, or bind nothing, for 5 s)\n", what, st.From, st.Final)
			continue
		}
		fmt.Fprintf(w, "limit %s (t=%ds): settled at %d within %d windows (s), then stayed within a range of %d where it bound\n", what, st.From, st.Final, st.Windows, st.Swing)
	}
	fmt.Fprintln(w, "settled: within ±max(2, 10%) of the final limit, or binding nothing (no request waited for a slot or was refused one).")
	fmt.Fprintln(w, "good% is goodput as a share of what could be served: the offered load or, when more, the capacity.")
	if r.Behind > 0 {
		fmt.Fprintf(w, "(!) in %d second(s) the load generator sent less than 95%% of the target rate (%.0f req/s): this machine was too busy to offer the load.\n", r.Behind, r.Rows[0].TargetRPS)
	}
}

// WritePlot draws goodput and capacity over time, with the adaptive limit
// in a panel beneath, to each path (.png or .svg). The service time's
// changes are marked, and the seconds the load generator fell behind
// ringed.
func (r *StepReport) WritePlot(paths ...string) error {
	good := goodplot.Line{Name: "goodput through sluice", Color: 2}
	capacity := goodplot.Line{Name: "upstream capacity", Color: 1}
	limit := goodplot.Line{Name: "adaptive limit", Color: 2}
	for i, row := range r.Rows {
		good.Points = append(good.Points, [2]float64{row.T, row.GoodputRPS})
		if row.OfferedRPS < 0.95*row.TargetRPS {
			good.Behind = append(good.Behind, i)
		}
		capacity.Points = append(capacity.Points, [2]float64{row.T, row.CapacityPS})
		limit.Points = append(limit.Points, [2]float64{row.T, float64(row.Limit)})
	}
	c := goodplot.Chart{
		Title:  fmt.Sprintf("Service-time step through sluice (%d workers, open-loop)", r.Workers),
		XLabel: "time (s)", YLabel: "req/s",
		Lines: []goodplot.Line{capacity, good},
		Lower: &goodplot.Panel{YLabel: "concurrency limit (requests)", Lines: []goodplot.Line{limit}},
	}
	for _, i := range r.Changes {
		if i > 0 && i < len(r.Rows) {
			c.Marks = append(c.Marks, goodplot.Mark{X: r.Rows[i].T,
				Label: fmt.Sprintf("service %.0f → %.0f ms", r.Rows[i-1].ServiceMs, r.Rows[i].ServiceMs)})
		}
	}
	return goodplot.Save(c, paths...)
}
