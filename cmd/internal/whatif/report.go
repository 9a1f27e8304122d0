package whatif

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluice-go/sluice/cmd/internal/goodplot"
)

// WriteTable writes the report for a terminal: the totals of both runs,
// their refusals by gate, by class and for the tenants refused most, and
// the agreement.
func (rep *Report) WriteTable(w io.Writer) error {
	c, b := &rep.Candidate, &rep.Baseline
	tw := tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	to := "15:04:05"
	if rep.From.UTC().Format(time.DateOnly) != rep.To.UTC().Format(time.DateOnly) {
		to = "2006-01-02 15:04:05"
	}
	fmt.Fprintf(w, "%d requests from %s to %s\n\n", rep.Requests, rep.From.UTC().Format("2006-01-02 15:04:05"), rep.To.UTC().Format(to))
	fmt.Fprintf(tw, "\tadmitted\trefused\trefused %%\t\n")
	for _, r := range []*Run{b, c} {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2f\t\n", label(r, r == c), r.Admitted, r.Rejected, pct(r.Rejected, r.Admitted+r.Rejected))
	}
	tw.Flush()
	fmt.Fprintln(w)
	fmt.Fprintln(w, "refused by gate (reason)")
	tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "gate\t%s\t%s\tcounts agree\tsame requests\t\n", label(b, false), label(c, true))
	for _, g := range gateRows(rep) {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t\n", g.name, g.base, g.cand, g.counts, g.agreement)
	}
	tw.Flush()
	if len(c.Classes) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "candidate by class")
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "class\tadmitted\trefused\t\n")
		for _, cl := range c.Classes {
			fmt.Fprintf(tw, "%s\t%d\t%d\t\n", cl.Class, cl.Admitted, cl.Rejected)
		}
		tw.Flush()
	}
	if len(c.Tenants) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "tenants the candidate refuses most")
		tw = tabwriter.NewWriter(w, 2, 8, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "tenant\tadmitted\trefused\t%s refused\t\n", label(b, false))
		for _, t := range c.Tenants {
			name := shown(t.Tenant)
			if name == "" {
				name = "(none)"
			}
			fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t\n", name, t.Admitted, t.Rejected, b.refusals[t.Tenant])
		}
		tw.Flush()
	}
	fmt.Fprintf(w, "\nsame decision for %.2f%% of the requests\n", 100*rep.Agreement.Share)
	for _, n := range rep.Notes {
		fmt.Fprintln(w, "note:", n)
	}
	return nil
}

// shown is s for a terminal: quoted when it holds anything but printable
// text (a tenant comes from the log, nginx's $remote_user from the
// client: raw, its bytes reached the operator's terminal, escape
// sequences included).
func shown(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || !unicode.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

func label(r *Run, candidate bool) string {
	if candidate {
		return "candidate"
	}
	switch r.Name {
	case "recorded", "none":
		return r.Name
	}
	return "current"
}

type gateRow struct {
	name              string
	base, cand        int64
	counts, agreement string
}

// gateRows lists every gate either run refused at, with both counts.
func gateRows(rep *Report) []gateRow {
	idx := map[string]int{}
	var rows []gateRow
	add := func(name string) *gateRow {
		i, ok := idx[name]
		if !ok {
			i = len(rows)
			idx[name] = i
			rows = append(rows, gateRow{name: name, counts: "-", agreement: "-"})
		}
		return &rows[i]
	}
	for _, g := range rep.Baseline.Gates {
		add(gateLabel(g)).base += g.Rejected
	}
	for _, g := range rep.Candidate.Gates {
		add(gateLabel(g)).cand += g.Rejected
	}
	for _, a := range rep.Agreement.Gates {
		if i, ok := idx[gateLabel(GateCount{Gate: a.Gate, Reason: a.Reason})]; ok {
			rows[i].agreement = fmt.Sprintf("%.1f%%", 100*a.Share)
			rows[i].counts = fmt.Sprintf("%.1f%%", 100*a.Counts)
		}
	}
	return rows
}

func gateLabel(g GateCount) string {
	name := g.Gate
	if name == "" {
		name = "-"
	}
	return name + " (" + g.Reason + ")"
}

func pct(n, of int64) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// WriteJSON writes the report as JSON to path.
func (rep *Report) WriteJSON(path string) error {
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// WritePlot draws the refusals per second over time, the baseline's and
// the candidate's, to each path (.png or .svg).
func (rep *Report) WritePlot(paths ...string) error {
	secs := rep.Interval.Seconds()
	line := func(r *Run, name string, color int) goodplot.Line {
		l := goodplot.Line{Name: name, Color: color}
		for _, p := range r.Timeline {
			l.Points = append(l.Points, [2]float64{p.T / 60, float64(p.Rejected) / secs})
		}
		return l
	}
	c := goodplot.Chart{
		Title:  fmt.Sprintf("sluice whatif: refusals of %s", rep.Candidate.Name),
		XLabel: "minutes", YLabel: "refused requests/s",
		Lines: []goodplot.Line{line(&rep.Baseline, label(&rep.Baseline, false), 2), line(&rep.Candidate, "candidate", 1)},
	}
	return goodplot.Save(c, paths...)
}
