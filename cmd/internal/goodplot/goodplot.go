// Package goodplot draws the goodput-against-offered-load plot that
// `sluice demo` and `sluice sim` write: one line per run and the capacity
// as a dashed reference, saved as PNG or SVG by file extension.
//
//	err := goodplot.Save(goodplot.Chart{Title: "...", Capacity: 4000, Lines: lines}, "out.png", "out.svg")
package goodplot

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Line is one run: its name and its (offered, goodput) points, joined by a
// line unless Dots (reference points).
type Line struct {
	Name   string
	Points [][2]float64
	Dots   bool
}

// Chart is what to draw. Capacity ≤ 0 draws no reference line.
type Chart struct {
	Title, XLabel, YLabel string
	CapacityLabel         string
	Capacity              float64
	Lines                 []Line
}

var palette = []color.Color{
	color.RGBA{R: 200, G: 60, B: 40, A: 255},
	color.RGBA{R: 30, G: 110, B: 200, A: 255},
	color.RGBA{R: 40, G: 150, B: 80, A: 255},
	color.RGBA{R: 140, G: 80, B: 170, A: 255},
}

// Save draws c to each path; paths must end in .png or .svg.
func Save(c Chart, paths ...string) error {
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Add(plotter.NewGrid())
	maxX, maxY := 0.0, c.Capacity
	for i, l := range c.Lines {
		pts := make(plotter.XYs, len(l.Points))
		for j, xy := range l.Points {
			pts[j].X, pts[j].Y = xy[0], xy[1]
			maxX, maxY = max(maxX, xy[0]), max(maxY, xy[1])
		}
		if l.Dots {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return err
			}
			sc.Color = color.Black
			sc.Shape = draw.CrossGlyph{}
			sc.Radius = vg.Points(4)
			p.Add(sc)
			p.Legend.Add(l.Name, sc)
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = palette[i%len(palette)]
		line.Width = vg.Points(2)
		points.Color = line.Color
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(l.Name, line, points)
	}
	if c.Capacity > 0 {
		capLine, err := plotter.NewLine(plotter.XYs{{X: 0, Y: c.Capacity}, {X: maxX, Y: c.Capacity}})
		if err != nil {
			return err
		}
		capLine.Color = color.Gray{Y: 120}
		capLine.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(capLine)
		p.Legend.Add(c.CapacityLabel, capLine)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = 1.35 * maxY
	for _, path := range paths {
		if !strings.HasSuffix(path, ".png") && !strings.HasSuffix(path, ".svg") {
			return fmt.Errorf("plot %s: want a .png or .svg file name", path)
		}
		if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
			return err
		}
	}
	return nil
}
