package demo

import (
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// WritePlot draws goodput against offered load for every run, with the
// measured capacity as a reference line, to each path (.png or .svg).
func (r *Report) WritePlot(paths ...string) error {
	p := plot.New()
	p.Title.Text = "Goodput under open-loop overload (routes-api model)"
	p.X.Label.Text = "offered load (req/s)"
	p.Y.Label.Text = "goodput: useful completions before the deadline (req/s)"
	p.Add(plotter.NewGrid())
	colors := []color.Color{color.RGBA{R: 200, G: 60, B: 40, A: 255}, color.RGBA{R: 30, G: 110, B: 200, A: 255}}
	maxX := 0.0
	for i, run := range r.Runs {
		pts := make(plotter.XYs, len(run.Steps))
		for j, s := range run.Steps {
			pts[j].X, pts[j].Y = s.OfferedRPS, s.GoodputRPS
			maxX = max(maxX, s.OfferedRPS)
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = colors[i%len(colors)]
		line.Width = vg.Points(2)
		points.Color = line.Color
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(run.Name, line, points)
	}
	capLine, err := plotter.NewLine(plotter.XYs{{X: 0, Y: r.CapacityRPS}, {X: maxX, Y: r.CapacityRPS}})
	if err != nil {
		return err
	}
	capLine.Color = color.Gray{Y: 120}
	capLine.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	p.Add(capLine)
	p.Legend.Add("measured capacity", capLine)
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = 1.35 * r.CapacityRPS
	for _, path := range paths {
		if !strings.HasSuffix(path, ".png") && !strings.HasSuffix(path, ".svg") {
			continue
		}
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return err
		}
	}
	return nil
}
