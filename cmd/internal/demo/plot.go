package demo

import "github.com/sluice-go/sluice/cmd/internal/goodplot"

// WritePlot draws goodput against offered load for every run, with the
// measured capacity as a reference line, to each path (.png or .svg).
// Steps whose load generator fell behind its target are ringed.
func (r *Report) WritePlot(paths ...string) error {
	c := goodplot.Chart{
		Title:         "Goodput under open-loop overload (routes-api model)",
		XLabel:        "offered load (req/s)",
		YLabel:        "goodput: useful completions before the deadline (req/s)",
		CapacityLabel: "measured capacity",
		Capacity:      r.CapacityRPS,
	}
	for _, run := range r.Runs {
		l := goodplot.Line{Name: run.Name}
		for i, s := range run.Steps {
			l.Points = append(l.Points, [2]float64{s.OfferedRPS, s.GoodputRPS})
			if s.Behind() {
				l.Behind = append(l.Behind, i)
			}
		}
		c.Lines = append(c.Lines, l)
	}
	return goodplot.Save(c, paths...)
}
