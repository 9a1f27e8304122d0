package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluice-go/sluice/cmd/internal/goodplot"
)

// IncidentOptions configures a long incident over real HTTP: the routes-api
// model behind the policy, offered a multiple of its capacity for the
// whole run, the upstream's service times optionally multiplied for a
// stretch (a capacity drop).
type IncidentOptions struct {
	// Exe is the sluice binary that runs the upstream and the proxy in
	// processes of their own. Required.
	Exe        string
	Policy     []byte
	PolicyName string
	Workers    int           // default 8
	Duration   time.Duration // default 30 minutes
	Load       float64       // offered load, a multiple of the capacity; default 3
	Deadline   time.Duration // default 500 ms
	Tenants    int           // default 100
	// Skew makes tenant-i's share of the load fall as 1/(i+1)^Skew (Zipf;
	// 0: equal shares), so that the heaviest tenants meet their rate limit.
	Skew float64
	// Seed, when not 0, makes the run's sequence of requests repeat: two
	// runs with one seed send the same tenants, operations and costs in
	// the same order (a policy and its candidate compared on one traffic).
	Seed uint64
	// AccessLog, when set, receives the proxy's access log: a JSON line
	// for every decision, rejections included (what sluice whatif replays).
	AccessLog io.Writer
	// Slowdown, when above 1, multiplies the upstream's service times
	// from SlowFrom for SlowFor: its capacity drops by that factor.
	Slowdown          float64
	SlowFrom, SlowFor time.Duration
	// Settle is the judged runs' grace: the first Settle of the run, and of
	// each capacity change, are not judged. Default 30 s at the start, 5 s
	// after a change.
	Settle, SettleChange time.Duration
	// Slice is the length of a judged slice. Default 10 s.
	Slice time.Duration
}

func (o *IncidentOptions) defaults() {
	if o.Workers == 0 {
		o.Workers = 8
	}
	if o.Duration == 0 {
		o.Duration = 30 * time.Minute
	}
	if o.Load == 0 {
		o.Load = 3
	}
	if o.Deadline == 0 {
		o.Deadline = 500 * time.Millisecond
	}
	if o.Tenants == 0 {
		o.Tenants = 100
	}
	if o.Settle == 0 {
		o.Settle = 30 * time.Second
	}
	if o.SettleChange == 0 {
		o.SettleChange = 5 * time.Second
	}
	if o.Slice == 0 {
		o.Slice = 10 * time.Second
	}
}

// Validate checks the options as given, before their defaults (a zero
// duration or load is refused: the command line says so only when asked
// for one): an error names the setting and what it wants. RunIncident
// checks them after the defaults.
func (o IncidentOptions) Validate() error {
	switch {
	case o.Duration < time.Second:
		return fmt.Errorf("--duration %v: want at least 1s", o.Duration)
	case !(o.Load > 0 && o.Load <= 1000):
		return fmt.Errorf("--load %g: want a multiple of the capacity above 0, at most 1000", o.Load)
	case !(o.Skew >= 0 && o.Skew <= 10):
		return fmt.Errorf("--skew %g: want 0 (equal shares) to 10", o.Skew)
	case o.Slowdown != 0 && !(o.Slowdown > 1 && o.Slowdown <= 1000):
		return fmt.Errorf("--slowdown %g: want a factor above 1 (at most 1000), or 0 for none", o.Slowdown)
	case o.SlowFrom < 0 || o.SlowFor < 0:
		return errors.New("--slow-from and --slow-for: want 0 or more")
	case o.Workers < 0 || o.Tenants < 0:
		return fmt.Errorf("workers %d, tenants %d: want at least 1 (0: the default)", o.Workers, o.Tenants)
	}
	return nil
}

// IncidentBar is what every judged slice keeps: goodput at least this
// share of the capacity (or of the offered load, when less).
const IncidentBar = 0.9

// IncidentRow is one second of the run.
type IncidentRow struct {
	T           float64 `json:"t"`
	CapacityRPS float64 `json:"capacity_rps"`
	TargetRPS   float64 `json:"target_rps"`
	OfferedRPS  float64 `json:"offered_rps"`
	GoodputRPS  float64 `json:"goodput_rps"`
	LateRPS     float64 `json:"late_rps"`
	// QuotaRPS is the requests refused at their caller's own quota (429:
	// a tenant past its rate): load the upstream did not owe an answer.
	QuotaRPS float64 `json:"quota_rps,omitempty"`
	Limit    int     `json:"limit"`
}

// IncidentSlice is one judged slice.
type IncidentSlice struct {
	T           float64 `json:"t"`
	CapacityRPS float64 `json:"capacity_rps"`
	OfferedRPS  float64 `json:"offered_rps"`
	GoodputRPS  float64 `json:"goodput_rps"`
	LateRPS     float64 `json:"late_rps"`
	QuotaRPS    float64 `json:"quota_rps,omitempty"`
	Limit       int     `json:"limit"` // the last second's
	Judged      bool    `json:"judged"`
	Pass        bool    `json:"pass"`
	Behind      bool    `json:"behind,omitempty"` // the load generator sent < 95% of the target
}

// IncidentReport is a long incident's result.
type IncidentReport struct {
	Policy   string          `json:"policy"`
	Workers  int             `json:"workers"`
	Load     float64         `json:"load"`
	Deadline float64         `json:"deadline_ms"`
	Slowdown float64         `json:"slowdown,omitempty"`
	Rows     []IncidentRow   `json:"rows"`
	Slices   []IncidentSlice `json:"slices"`
	// WorstSlice is the lowest goodput ÷ min(capacity, offered less the
	// requests refused at their callers' own quotas) of a
	// judged slice.
	WorstSlice float64 `json:"worst_slice"`
	Pass       bool    `json:"pass"`
}

// RunIncident runs a long incident: upstream and proxy in their own
// processes, open-loop load from here, the proxy's adaptive limit read
// every second.
func RunIncident(ctx context.Context, opts IncidentOptions) (*IncidentReport, error) {
	opts.defaults()
	if opts.Exe == "" || len(opts.Policy) == 0 {
		return nil, errors.New("demo: the incident needs the sluice binary and a policy")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	file, cleanup, err := writePolicy(opts.PolicyName, opts.Policy)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	st, err := startStack(ctx, stackOptions{Exe: opts.Exe, Workers: opts.Workers, PolicyFile: file, Log: io.Discard, AccessLog: opts.AccessLog})
	if err != nil {
		return nil, err
	}
	defer st.stop()
	capacity := float64(opts.Workers) / MeanServiceTime().Seconds()
	rate := opts.Load * capacity
	n := int(opts.Duration / time.Second)
	rows := opts.rows(capacity, rate, n)
	var mu sync.Mutex // rows' counters: the load's goroutine and this one
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		atk := vegeta.NewAttacker(vegeta.Timeout(opts.Deadline), vegeta.KeepAlive(true), vegeta.Workers(64),
			vegeta.MaxWorkers(20000), vegeta.Connections(20000), vegeta.Redirects(vegeta.NoFollow))
		stop := context.AfterFunc(ctx, func() { atk.Stop() })
		defer stop()
		for r := range atk.Attack(skewedMix(st.target, opts.Tenants, opts.Skew, opts.Seed, opts.Deadline), vegeta.ConstantPacer{Freq: int(rate + 0.5), Per: time.Second}, opts.Duration, "incident") {
			i := int(r.Timestamp.Sub(start) / time.Second)
			if i < 0 || i >= n {
				continue
			}
			mu.Lock()
			rows[i].OfferedRPS++
			switch {
			case r.Code == http.StatusOK && r.Latency <= opts.Deadline:
				rows[i].GoodputRPS++
			case r.Code == http.StatusTooManyRequests:
				rows[i].QuotaRPS++
			case r.Code != http.StatusServiceUnavailable:
				rows[i].LateRPS++
			}
			mu.Unlock()
		}
	}()
	for i := 1; i <= n; i++ {
		select {
		case <-ctx.Done():
			wg.Wait()
			return nil, ctx.Err()
		case <-time.After(time.Until(start.Add(time.Duration(i) * time.Second))):
		}
		l := st.limit()
		mu.Lock()
		rows[i-1].Limit = l
		mu.Unlock()
		if f, ok := opts.slowdownAt(i); ok {
			if err := st.slowdown(f); err != nil {
				wg.Wait()
				return nil, err
			}
		}
	}
	wg.Wait()
	rep := &IncidentReport{Policy: opts.PolicyName, Workers: opts.Workers, Load: opts.Load, Deadline: ms(opts.Deadline), Rows: rows}
	if opts.Slowdown > 1 {
		rep.Slowdown = opts.Slowdown
	}
	rep.judge(&opts)
	return rep, nil
}

// rows are the run's n one-second rows, each with the capacity of its
// second (capacity req/s, divided by the slowdown while it lasts) and the
// target rate.
func (o *IncidentOptions) rows(capacity, rate float64, n int) []IncidentRow {
	rows := make([]IncidentRow, n)
	for i := range rows {
		rows[i] = IncidentRow{T: float64(i), CapacityRPS: capacity, TargetRPS: rate}
		if o.Slowdown > 1 && i >= int(o.SlowFrom/time.Second) && i < int((o.SlowFrom+o.SlowFor)/time.Second) {
			rows[i].CapacityRPS = capacity / o.Slowdown
		}
	}
	return rows
}

// slowdownAt is the service-time factor the upstream takes at second i,
// if it changes then.
func (o *IncidentOptions) slowdownAt(i int) (float64, bool) {
	if o.Slowdown <= 1 {
		return 0, false
	}
	switch i {
	case int(o.SlowFrom / time.Second):
		return o.Slowdown, true
	case int((o.SlowFrom + o.SlowFor) / time.Second):
		return 1, true
	}
	return 0, false
}

// judge cuts the rows into slices and judges those past the settling
// times.
func (r *IncidentReport) judge(o *IncidentOptions) {
	changes := []int{0}
	if o.Slowdown > 1 {
		changes = append(changes, int(o.SlowFrom/time.Second), int((o.SlowFrom+o.SlowFor)/time.Second))
	}
	settled := func(i int) bool {
		for k, c := range changes {
			grace := int(o.SettleChange / time.Second)
			if k == 0 {
				grace = int(o.Settle / time.Second)
			}
			if i >= c && i < c+grace {
				return false
			}
		}
		return true
	}
	// A slice never spans a change of capacity: slices restart at each.
	size := max(int(o.Slice/time.Second), 1)
	r.Pass, r.WorstSlice = true, 10
	for from := 0; from < len(r.Rows); {
		to := min(from+size, len(r.Rows))
		for _, c := range changes {
			if c > from && c < to {
				to = c
			}
		}
		s := IncidentSlice{T: float64(from), Judged: true}
		for i := from; i < to; i++ {
			row := r.Rows[i]
			s.CapacityRPS += row.CapacityRPS / float64(to-from)
			s.OfferedRPS += row.OfferedRPS / float64(to-from)
			s.GoodputRPS += row.GoodputRPS / float64(to-from)
			s.LateRPS += row.LateRPS / float64(to-from)
			s.QuotaRPS += row.QuotaRPS / float64(to-from)
			s.Limit = row.Limit
			s.Judged = s.Judged && settled(i)
			if row.OfferedRPS < 0.95*row.TargetRPS {
				s.Behind = true
			}
		}
		want := min(s.CapacityRPS, s.OfferedRPS-s.QuotaRPS) // a tenant refused at its own quota is not owed an answer
		s.Pass = !s.Judged || s.GoodputRPS >= IncidentBar*want
		if s.Judged && want > 0 {
			r.WorstSlice = min(r.WorstSlice, s.GoodputRPS/want)
		}
		r.Pass = r.Pass && s.Pass
		r.Slices = append(r.Slices, s)
		from = to
	}
}

// WriteTable prints a line per slice and the verdict.
func (r *IncidentReport) WriteTable(w io.Writer) {
	drop := ""
	if r.Slowdown > 1 {
		drop = fmt.Sprintf("; service times x%g for a stretch", r.Slowdown)
	}
	fmt.Fprintf(w, "long incident through sluice proxy (%s): %d workers, %gx capacity, %.0f ms deadline%s; upstream and proxy in processes of their own\n",
		r.Policy, r.Workers, r.Load, r.Deadline, drop)
	fmt.Fprintf(w, "%7s %9s %9s %9s %7s %7s %6s  %s\n", "t", "capacity", "offered", "goodput", "good%", "late", "limit", "")
	for _, s := range r.Slices {
		mark := ""
		switch {
		case !s.Judged:
			mark = "(settling, not judged)"
		case !s.Pass:
			mark = "FAIL"
		}
		if s.Behind {
			mark += " (!)"
		}
		fmt.Fprintf(w, "%6.0fs %9.0f %9.0f %9.0f %6.0f%% %7.1f %6d  %s\n", s.T, s.CapacityRPS, s.OfferedRPS, s.GoodputRPS,
			100*s.GoodputRPS/max(min(s.CapacityRPS, s.OfferedRPS-s.QuotaRPS), 1e-9), s.LateRPS, s.Limit, mark)
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	judged := false
	for _, s := range r.Slices {
		judged = judged || s.Judged
	}
	if judged {
		fmt.Fprintf(w, "worst judged slice: goodput %.1f%% of min(capacity, offered less quota refusals); bar %.0f%%: %s\n", 100*r.WorstSlice, 100*IncidentBar, verdict)
	} else {
		fmt.Fprintln(w, "no slice judged: the run is no longer than its settling time")
	}
	for _, s := range r.Slices {
		if s.Behind {
			fmt.Fprintln(w, "(!): the load generator sent less than 95% of the target in a second of the slice (this machine was too busy)")
			break
		}
	}
}

// WriteJSON writes the report as JSON to path.
func (r *IncidentReport) WriteJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// WritePlot draws goodput and capacity over time with the adaptive limit
// in a panel beneath, to each path (.png or .svg).
func (r *IncidentReport) WritePlot(paths ...string) error {
	good := goodplot.Line{Name: "goodput through sluice", Color: 2}
	capacity := goodplot.Line{Name: "upstream capacity", Color: 1}
	limit := goodplot.Line{Name: "adaptive limit", Color: 2}
	for i, row := range r.Rows {
		good.Points = append(good.Points, [2]float64{row.T, row.GoodputRPS})
		if row.OfferedRPS < 0.95*row.TargetRPS {
			good.Behind = append(good.Behind, i)
		}
		capacity.Points = append(capacity.Points, [2]float64{row.T, row.CapacityRPS})
		limit.Points = append(limit.Points, [2]float64{row.T, float64(row.Limit)})
	}
	title := fmt.Sprintf("%gx capacity for %v through sluice (%d workers, open-loop)", r.Load, time.Duration(len(r.Rows))*time.Second, r.Workers)
	c := goodplot.Chart{
		Title:  title,
		XLabel: "time (s)", YLabel: "req/s",
		Lines: []goodplot.Line{capacity, good},
		Lower: &goodplot.Panel{YLabel: "concurrency limit (requests)", Lines: []goodplot.Line{limit}},
	}
	return goodplot.Save(c, paths...)
}
