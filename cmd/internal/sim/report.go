package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sluice-go/sluice"
	"github.com/sluice-go/sluice/cmd/internal/goodplot"
	"github.com/sluice-go/sluice/cmd/internal/settle"
)

// Row is one sweep step or one time-series interval. Loads are in the
// scenario's units per second, averaged over the measured time. Each
// figure counts the events inside that time, so work admitted just before
// it and started inside it can make Started a little above Admitted.
type Row struct {
	// T is the start of a time-series interval in seconds (0 in a sweep).
	T float64 `json:"t,omitempty"`
	// Load is the configured offered load.
	Load float64 `json:"load"`
	// Offered counts first attempts (new operations).
	Offered float64 `json:"offered"`
	// Attempts counts every attempt sent, retries included; Retried the
	// retries alone.
	Attempts float64 `json:"attempts"`
	Retried  float64 `json:"retried"`
	// Admitted attempts passed the admission chain (all of them without
	// admission); Rejected splits the others by reason.
	Admitted float64            `json:"admitted"`
	Rejected map[string]float64 `json:"rejected"`
	// Started work took a worker.
	Started float64 `json:"started"`
	// Goodput is useful work: answered before the caller stopped waiting.
	Goodput float64 `json:"goodput"`
	// Late work finished after its caller had gone; Abandoned work was
	// dropped at the cancellation checkpoint, part-done; TimedOut counts
	// attempts whose caller stopped waiting.
	Late      float64 `json:"late"`
	Abandoned float64 `json:"abandoned"`
	TimedOut  float64 `json:"timed_out"`
	// Throttled counts operations the callers' adaptive throttle refused
	// locally, never sent (client retry "sluice").
	Throttled float64 `json:"throttled,omitempty"`
	// Failed counts admitted attempts that failed at once because their
	// process could not reach the service (Phase.Down).
	Failed float64 `json:"failed,omitempty"`
	// P50Ms and P99Ms are percentiles of the latency of useful attempts.
	P50Ms float64 `json:"p50_ms"`
	P99Ms float64 `json:"p99_ms"`
	// Utilization is the busy fraction of the worker pool.
	Utilization float64 `json:"utilization"`
	// Queue is the queue length at the end of a time-series interval.
	Queue int `json:"queue,omitempty"`
	// Level is the highest degradation level decided in the interval.
	Level string `json:"level,omitempty"`
	// Limit is the adaptive concurrency limit at the end of a time-series
	// interval (the first gate of the chain whose limit moves), and Waited
	// the requests per second that waited in a wait queue for a slot. With
	// several processes both are sums over the processes.
	Limit  int     `json:"limit,omitempty"`
	Waited float64 `json:"waited,omitempty"`
	// Classes splits offered, admitted and useful work by scenario class.
	Classes []ClassRow `json:"classes,omitempty"`
	// Processes splits them by simulated process, when there is more than
	// one (Scenario.Processes).
	Processes []ProcessRow `json:"processes,omitempty"`

	rejected [sluice.ReasonCount]float64
}

func (r *Row) reject(reason sluice.Reason, units float64) {
	if int(reason) < len(r.rejected) {
		r.rejected[reason] += units
	}
}

// ClassRow is one class's share of a Row, in the scenario's unit per
// second.
type ClassRow struct {
	Name     string  `json:"name"`
	Offered  float64 `json:"offered"`
	Admitted float64 `json:"admitted"`
	Goodput  float64 `json:"goodput"`
}

// ProcessRow is one simulated process's share of a Row, in the scenario's
// unit per second.
type ProcessRow struct {
	Name string `json:"name"`
	// Offered counts the first attempts sent to the process, Attempts
	// every attempt (the demand its gates saw), Admitted those its chain
	// admitted and Goodput their useful work.
	Offered  float64 `json:"offered"`
	Attempts float64 `json:"attempts"`
	Admitted float64 `json:"admitted"`
	Goodput  float64 `json:"goodput"`
	// Lease is the grant of the process's first lease gate at the end of
	// the row, in units/s, when LeaseLive: the process's share of the
	// fleet's budget, which the grants of all processes never exceed. A
	// gate without a live lease (none yet, lapsed, or nothing granted while
	// the allocator learns) spends its failure mode's rate instead.
	Lease     int64 `json:"lease,omitempty"`
	LeaseLive bool  `json:"lease_live,omitempty"`
}

// finish turns counts over secs seconds into rates.
func (r *Row) finish(secs float64, h *hist, busy float64, workers int) {
	for _, p := range []*float64{&r.Offered, &r.Attempts, &r.Retried, &r.Admitted, &r.Started, &r.Goodput, &r.Late, &r.Abandoned, &r.TimedOut, &r.Throttled, &r.Failed} {
		*p /= secs
	}
	for i := range r.Classes {
		c := &r.Classes[i]
		c.Offered, c.Admitted, c.Goodput = c.Offered/secs, c.Admitted/secs, c.Goodput/secs
	}
	for i := range r.Processes {
		p := &r.Processes[i]
		p.Offered, p.Attempts, p.Admitted, p.Goodput = p.Offered/secs, p.Attempts/secs, p.Admitted/secs, p.Goodput/secs
	}
	r.Rejected = map[string]float64{}
	for reason, v := range r.rejected {
		if v > 0 {
			r.Rejected[sluice.Reason(reason).String()] = v / secs
		}
	}
	r.P50Ms, r.P99Ms = h.quantile(0.50)/1e6, h.quantile(0.99)/1e6
	r.Utilization = busy / (secs * 1e9 * float64(workers))
}

// writeClasses prints a run's offered, admitted and useful work by class
// (when there is more than one), a row per step or interval.
func writeClasses(w io.Writer, run Run, series bool) {
	if len(run.Steps) == 0 || len(run.Steps[0].Classes) < 2 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "offered"
	if series {
		head = "t"
	}
	fmt.Fprintf(tw, "%s\t", head)
	for _, c := range run.Steps[0].Classes {
		fmt.Fprintf(tw, "%s offered\tadmitted\tuseful\t", c.Name)
	}
	fmt.Fprintln(tw)
	for _, s := range run.Steps {
		if series {
			fmt.Fprintf(tw, "%.0fs\t", s.T)
		} else {
			fmt.Fprintf(tw, "%.0f\t", s.Offered)
		}
		for _, c := range s.Classes {
			fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t", c.Offered, c.Admitted, c.Goodput)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(w, "  by class:")
	tw.Flush()
}

// writeProcesses prints a run's offered, admitted and useful work by
// process (when there is more than one), and each process's live lease
// at the end of the row when the policy has a lease gate ("-": none).
func writeProcesses(w io.Writer, run Run, series bool) {
	if len(run.Steps) == 0 || len(run.Steps[0].Processes) < 2 {
		return
	}
	leased := slices.ContainsFunc(run.Steps, func(r Row) bool {
		return slices.ContainsFunc(r.Processes, func(p ProcessRow) bool { return p.LeaseLive })
	})
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "offered"
	if series {
		head = "t"
	}
	fmt.Fprintf(tw, "%s\t", head)
	for _, p := range run.Steps[0].Processes {
		fmt.Fprintf(tw, "%s offered\tadmitted\tuseful\t", p.Name)
		if leased {
			fmt.Fprint(tw, "lease\t")
		}
	}
	fmt.Fprintln(tw)
	for _, s := range run.Steps {
		if series {
			fmt.Fprintf(tw, "%.0fs\t", s.T)
		} else {
			fmt.Fprintf(tw, "%.0f\t", s.Offered)
		}
		for _, p := range s.Processes {
			fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t", p.Offered, p.Admitted, p.Goodput)
			if leased {
				if p.LeaseLive {
					fmt.Fprintf(tw, "%d\t", p.Lease)
				} else {
					fmt.Fprint(tw, "-\t")
				}
			}
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprintln(w, "  by process:")
	tw.Flush()
}

// RejectedTotal sums Rejected.
func (r *Row) RejectedTotal() float64 {
	t := 0.0
	for _, v := range r.Rejected {
		t += v
	}
	return t
}

// Run is one policy's rows.
type Run struct {
	Name  string `json:"name"`
	Steps []Row  `json:"steps"`
}

// Report is what `sluice sim` prints, plots and writes as JSON.
type Report struct {
	Scenario    string  `json:"scenario"`
	Unit        string  `json:"unit"`
	Capacity    float64 `json:"capacity"`
	Workers     int     `json:"workers"`
	Processes   int     `json:"processes,omitempty"` // simulated gateway processes, when more than one
	Seed        uint64  `json:"seed"`
	StepSeconds float64 `json:"step_seconds,omitempty"`
	Series      bool    `json:"series,omitempty"`
	Policy      string  `json:"policy"`
	Note        string  `json:"note,omitempty"`
	Runs        []Run   `json:"runs"`
	// Reference is the scenario's published curve, if any.
	Reference     []Point `json:"reference,omitempty"`
	ReferenceName string  `json:"reference_name,omitempty"`
}

// Deviation returns, for each reference point, the relative deviation of
// the run without admission at the same offered load ((sim − ref) ÷ ref),
// or nil when the report has no reference or no matching steps.
func (r *Report) Deviation() []float64 {
	if len(r.Reference) == 0 || len(r.Runs) == 0 {
		return nil
	}
	var out []float64
	for _, p := range r.Reference {
		for _, s := range r.Runs[0].Steps {
			if s.Load == p.Offered {
				out = append(out, (s.Goodput-p.Goodput)/p.Goodput)
			}
		}
	}
	return out
}

// WriteJSON writes r as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable prints one table per run.
func (r *Report) WriteTable(w io.Writer) {
	u := r.Unit + "/s"
	fmt.Fprintf(w, "scenario %s: capacity %.4g %s on %d workers", r.Scenario, r.Capacity, u, r.Workers)
	if r.Processes > 1 {
		fmt.Fprintf(w, " behind %d processes", r.Processes)
	}
	fmt.Fprintf(w, ", seed %d", r.Seed)
	if r.StepSeconds > 0 {
		fmt.Fprintf(w, ", %gs per step", r.StepSeconds)
	}
	fmt.Fprintln(w)
	if r.Note != "" {
		fmt.Fprintf(w, "note: %s.\n", r.Note)
	}
	for _, run := range r.Runs {
		fmt.Fprintf(w, "\n%s (%s)\n", run.Name, u)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		if r.Series {
			fmt.Fprintln(tw, "t\toffered\tretried\tadmitted\trejected\tstarted\tgoodput\tlate\tabandoned\tqueue\tp99 ms\tlevel\tlimit\t")
			for _, s := range run.Steps {
				limit := "-"
				if s.Limit > 0 {
					limit = strconv.Itoa(s.Limit)
				}
				fmt.Fprintf(tw, "%.0fs\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t%s\t%s\t%s\t\n",
					s.T, s.Offered, s.Retried, s.Admitted, s.RejectedTotal(), s.Started, s.Goodput, s.Late, s.Abandoned, s.Queue, ms(s.P99Ms, s.Goodput), s.Level, limit)
			}
		} else {
			fmt.Fprintln(tw, "offered\tretried\tadmitted\trejected\tstarted\tgoodput\tlate\tabandoned\tp50 ms\tp99 ms\tbusy\t")
			for _, s := range run.Steps {
				fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%s\t%.0f\t%.0f\t%.0f\t%.0f\t%s\t%s\t%.0f%%\t\n",
					s.Offered, s.Retried, s.Admitted, rejectedText(s.Rejected), s.Started, s.Goodput, s.Late, s.Abandoned, ms(s.P50Ms, s.Goodput), ms(s.P99Ms, s.Goodput), 100*s.Utilization)
			}
		}
		tw.Flush()
		writeClasses(w, run, r.Series)
		writeProcesses(w, run, r.Series)
	}
	if dev := r.Deviation(); len(dev) > 0 {
		fmt.Fprintf(w, "\n%s, goodput without admission:", r.ReferenceName)
		for i, p := range r.Reference {
			if i < len(dev) {
				fmt.Fprintf(w, " %.0f at %.0f (sim %+.1f%%)", p.Goodput, p.Offered, 100*dev[i])
				if i < len(dev)-1 {
					fmt.Fprint(w, ",")
				}
			}
		}
		fmt.Fprintln(w)
	}
}

// ms prints a latency of useful work, or "-" when there was none.
func ms(v, goodput float64) string {
	if goodput == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", v)
}

func rejectedText(m map[string]float64) string {
	if len(m) == 0 {
		return "0"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		if v := m[k]; v < 1 {
			parts[i] = k + " <1"
		} else {
			parts[i] = fmt.Sprintf("%s %.0f", k, v)
		}
	}
	return strings.Join(parts, ", ")
}

// WritePlot draws goodput against offered load for every run of a sweep,
// or goodput over time for a time series, to each path (.png or .svg).
func (r *Report) WritePlot(paths ...string) error {
	c := goodplot.Chart{
		Title:         fmt.Sprintf("sluice sim: %s", r.Scenario),
		XLabel:        fmt.Sprintf("offered load (%s/s)", r.Unit),
		YLabel:        fmt.Sprintf("goodput: useful work before the deadline (%s/s)", r.Unit),
		CapacityLabel: "capacity",
		Capacity:      r.Capacity,
	}
	if r.Series {
		c.XLabel = "time (s)"
	}
	for _, run := range r.Runs {
		l := goodplot.Line{Name: run.Name}
		for _, s := range run.Steps {
			x := s.Offered
			if r.Series {
				x = s.T
			}
			l.Points = append(l.Points, [2]float64{x, s.Goodput})
		}
		c.Lines = append(c.Lines, l)
	}
	if r.Series {
		c.Marks = r.phaseMarks()
		for i, run := range r.Runs {
			l := goodplot.Line{Name: run.Name + ": adaptive limit", Color: i + 1}
			for _, s := range run.Steps {
				if s.Limit > 0 {
					l.Points = append(l.Points, [2]float64{s.T, float64(s.Limit)})
				}
			}
			if len(l.Points) > 0 {
				if c.Lower == nil {
					c.Lower = &goodplot.Panel{YLabel: "concurrency limit (requests)"}
				}
				c.Lower.Lines = append(c.Lower.Lines, l)
			}
		}
	}
	if len(r.Reference) > 0 && !r.Series {
		l := goodplot.Line{Name: r.ReferenceName, Dots: true}
		for _, p := range r.Reference {
			l.Points = append(l.Points, [2]float64{p.Offered, p.Goodput})
		}
		c.Lines = append(c.Lines, l)
	}
	return goodplot.Save(c, paths...)
}

// phaseMarks marks a time series where its configured load changes (the
// scenario's phases).
func (r *Report) phaseMarks() []goodplot.Mark {
	if len(r.Runs) == 0 {
		return nil
	}
	var marks []goodplot.Mark
	steps := r.Runs[0].Steps
	for i := 1; i < len(steps); i++ {
		if steps[i].Load != steps[i-1].Load {
			marks = append(marks, goodplot.Mark{X: steps[i].T, Label: fmt.Sprintf("load %g → %g", steps[i-1].Load, steps[i].Load)})
		}
	}
	return marks
}

// hist is a log-linear latency histogram in nanoseconds: 16 sub-buckets
// per power of two, so a quantile is within 1/16 (6.25%) of the truth.
type hist struct {
	counts [64 * 16]uint64
	n      uint64
}

func (h *hist) add(ns int64) {
	v := uint64(max(ns, 1))
	e := bits.Len64(v) - 1 // v in [2^e, 2^(e+1))
	sub := uint64(0)
	if e >= 4 {
		sub = (v >> (e - 4)) & 15
	} else {
		sub = (v << (4 - e)) & 15
	}
	h.counts[e*16+int(sub)]++
	h.n++
}

// quantile returns the q-quantile in nanoseconds (the middle of its
// bucket), 0 when empty.
func (h *hist) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= max(rank, 1) {
			e, sub := i/16, i%16
			lo := math.Ldexp(1+float64(sub)/16, e)
			return lo * (1 + 1.0/32)
		}
	}
	return 0
}

// Settle measures the limit's settling between rows from and to (see
// package settle): the limit binds in a row where requests waited for a
// slot or were turned away for want of one.
func Settle(rows []Row, from, to int) settle.Settling {
	ws := make([]settle.Window, len(rows))
	for i, r := range rows {
		ws[i] = settle.Window{Limit: r.Limit, Binding: r.Waited > 0 || r.Rejected["queue"] > 0 || r.Rejected["concurrency"] > 0}
	}
	return settle.Measure(ws, from, to)
}
