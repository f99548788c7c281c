// Package benchplot draws what a scale benchmark measured against the number
// of sandboxes: one PNG of stacked panels, one figure per panel, so the
// slope of each is visible. `make bench` asks for them with
// HILOOP_BENCH_PLOTS, the directory to write them to (docs/).
package benchplot

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Series is one figure: its name and unit, and a value for each x.
type Series struct {
	Name, Unit string
	Y          []float64
}

// Dir is where plots go: HILOOP_BENCH_PLOTS, or "" for nowhere.
func Dir() string { return os.Getenv("HILOOP_BENCH_PLOTS") }

// Write draws each series against xs (sandboxes, on a log scale) in its own
// panel, stacked in one PNG named file in Dir. It writes nothing when Dir is
// "".
func Write(file, title string, xs []float64, series []Series) error {
	dir := Dir()
	if dir == "" {
		return nil
	}
	var ticks []plot.Tick
	for _, x := range xs {
		ticks = append(ticks, plot.Tick{Value: x, Label: strconv.FormatFloat(x, 'f', -1, 64)})
	}
	rows := make([][]*plot.Plot, len(series))
	for i, s := range series {
		if len(s.Y) != len(xs) {
			return fmt.Errorf("benchplot: %s has %d values for %d sizes", s.Name, len(s.Y), len(xs))
		}
		p := plot.New()
		p.Title.Text = s.Name
		if i == 0 {
			p.Title.Text = title + "\n" + s.Name
		}
		p.X.Label.Text = "sandboxes"
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.X.Min, p.X.Max = xs[0]*0.8, xs[len(xs)-1]*1.25
		p.Y.Label.Text = s.Unit
		p.Y.Min = 0
		pts := make(plotter.XYs, len(xs))
		for j := range xs {
			pts[j].X, pts[j].Y = xs[j], s.Y[j]
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		points.Shape = draw.CircleGlyph{}
		p.Add(line, points, plotter.NewGrid())
		rows[i] = []*plot.Plot{p}
	}
	img := vgimg.New(6*vg.Inch, vg.Length(len(series))*2.4*vg.Inch)
	dc := draw.New(img)
	canvases := plot.Align(rows, draw.Tiles{Rows: len(series), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2,
		PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}, dc)
	for i := range rows {
		rows[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(filepath.Join(dir, file))
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
