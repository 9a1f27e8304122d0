// Package goodplot draws the goodput-against-offered-load plot that
// `sluice demo` and `sluice sim` write: one line per run and the capacity
// as a dashed reference, saved as PNG or SVG by file extension.
//
//	err := goodplot.Save(goodplot.Chart{Title: "...", Capacity: 4000, Lines: lines}, "out.png", "out.svg")
package goodplot

import (
	"fmt"
	"image/color"
	"os"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Line is one run: its name and its (offered, goodput) points, joined by a
// line unless Dots (reference points). Color picks the palette entry
// (0: by the line's position). Behind lists the points (indexes) where the
// load generator fell short of its target: they get a ring and a legend
// entry, so a reader does not take them for what was asked.
type Line struct {
	Name   string
	Points [][2]float64
	Dots   bool
	Color  int
	Behind []int
}

// Mark is a vertical dotted line at X with a label at its top: a phase
// change (a load step) on a time axis.
type Mark struct {
	X     float64
	Label string
}

// BehindLabel is the legend entry of the points a load generator fell
// short on.
const BehindLabel = "load generator behind (< 95% of target)"

// Chart is what to draw. Capacity ≤ 0 draws no reference line. Lower,
// if set, is a second panel under the first on the same x axis (an
// adaptive limit under the goodput it allowed).
type Chart struct {
	Title, XLabel, YLabel string
	CapacityLabel         string
	Capacity              float64
	Lines                 []Line
	Lower                 *Panel
	Marks                 []Mark // drawn on both panels; labelled on the upper
}

// Panel is a lower panel: its y label and lines.
type Panel struct {
	YLabel string
	Lines  []Line
}

var palette = []color.Color{
	color.RGBA{R: 200, G: 60, B: 40, A: 255},
	color.RGBA{R: 30, G: 110, B: 200, A: 255},
	color.RGBA{R: 40, G: 150, B: 80, A: 255},
	color.RGBA{R: 140, G: 80, B: 170, A: 255},
}

// Save draws c to each path; paths must end in .png or .svg.
func Save(c Chart, paths ...string) error {
	for _, path := range paths {
		if !strings.HasSuffix(path, ".png") && !strings.HasSuffix(path, ".svg") {
			return fmt.Errorf("plot %s: want a .png or .svg file name", path)
		}
	}
	p, err := panel(c.Title, c.XLabel, c.YLabel, c.Lines, c.Capacity, c.CapacityLabel)
	if err != nil {
		return err
	}
	if err := addMarks(p, c.Marks, true); err != nil {
		return err
	}
	if c.Lower == nil {
		for _, path := range paths {
			if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
				return err
			}
		}
		return nil
	}
	low, err := panel("", c.XLabel, c.Lower.YLabel, c.Lower.Lines, 0, "")
	if err != nil {
		return err
	}
	if err := addMarks(low, c.Marks, false); err != nil {
		return err
	}
	p.X.Label.Text = ""
	low.X.Min, low.X.Max = p.X.Min, p.X.Max
	for _, path := range paths {
		w, h := 8*vg.Inch, 7.5*vg.Inch
		img, err := draw.NewFormattedCanvas(w, h, strings.TrimPrefix(path[strings.LastIndexByte(path, '.'):], "."))
		if err != nil {
			return err
		}
		tiles := plot.Align([][]*plot.Plot{{p}, {low}}, draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Points(6)}, draw.New(img))
		p.Draw(tiles[0][0])
		low.Draw(tiles[1][0])
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		_, err = img.WriteTo(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// panel draws lines, and the capacity as a dashed line when > 0.
func panel(title, xlabel, ylabel string, lines []Line, capacity float64, capLabel string) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	maxX, maxY := 0.0, capacity
	behindShown := false
	for i, l := range lines {
		pts := make(plotter.XYs, len(l.Points))
		for j, xy := range l.Points {
			pts[j].X, pts[j].Y = xy[0], xy[1]
			maxX, maxY = max(maxX, xy[0]), max(maxY, xy[1])
		}
		if l.Dots {
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return nil, err
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
			return nil, err
		}
		k := i
		if l.Color > 0 {
			k = l.Color - 1
		}
		line.Color = palette[k%len(palette)]
		line.Width = vg.Points(2)
		points.Color = line.Color
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points)
		p.Legend.Add(l.Name, line, points)
		if err := addBehind(p, l, pts, &behindShown); err != nil {
			return nil, err
		}
	}
	if capacity > 0 {
		capLine, err := plotter.NewLine(plotter.XYs{{X: 0, Y: capacity}, {X: maxX, Y: capacity}})
		if err != nil {
			return nil, err
		}
		capLine.Color = color.Gray{Y: 120}
		capLine.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(capLine)
		p.Legend.Add(capLabel, capLine)
	}
	p.Legend.Top = true
	p.Y.Min = 0
	p.Y.Max = 1.35 * maxY
	p.X.Min, p.X.Max = 0, maxX
	return p, nil
}

// addBehind rings the points of l the load generator fell short on, with
// one legend entry for the whole plot.
func addBehind(p *plot.Plot, l Line, pts plotter.XYs, shown *bool) error {
	var xys plotter.XYs
	for _, i := range l.Behind {
		if i >= 0 && i < len(pts) {
			xys = append(xys, pts[i])
		}
	}
	if len(xys) == 0 {
		return nil
	}
	sc, err := plotter.NewScatter(xys)
	if err != nil {
		return err
	}
	sc.Color = color.RGBA{R: 230, G: 140, B: 0, A: 255}
	sc.Shape = draw.RingGlyph{}
	sc.Radius = vg.Points(7)
	p.Add(sc)
	if !*shown {
		p.Legend.Add(BehindLabel, sc)
		*shown = true
	}
	return nil
}

// addMarks draws each mark as a dotted vertical line across p, labelled
// at its top when label is set.
func addMarks(p *plot.Plot, marks []Mark, label bool) error {
	if len(marks) == 0 {
		return nil
	}
	top := p.Y.Max
	var at plotter.XYs
	var names []string
	for _, m := range marks {
		l, err := plotter.NewLine(plotter.XYs{{X: m.X, Y: p.Y.Min}, {X: m.X, Y: top}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 90}
		l.Dashes = []vg.Length{vg.Points(1), vg.Points(3)}
		p.Add(l)
		at = append(at, plotter.XY{X: m.X, Y: top * 0.97})
		names = append(names, " "+m.Label)
	}
	if !label {
		return nil
	}
	labels, err := plotter.NewLabels(plotter.XYLabels{XYs: at, Labels: names})
	if err != nil {
		return err
	}
	p.Add(labels)
	return nil
}
