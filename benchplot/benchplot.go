// Package benchplot draws benchmark sweeps (throughput against queue depth
// or callers) as SVG or PNG charts with gonum's plot package. It is kept
// apart from package bench so the libraries kvfs links do not carry a
// plotting library; only the command line imports it.
package benchplot

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"
)

// ErrFormat is returned for a file name whose extension is neither .svg
// nor .png.
var ErrFormat = errors.New("benchplot: want a .svg or .png file")

// Series is one line: Y[i] measured at X[i].
type Series struct {
	Name string
	X, Y []float64
}

// Chart is what to draw. With LogX the x axis is logarithmic (base 2
// sweeps: 1, 2, 4, … evenly spaced) and ticks sit at the measured points.
type Chart struct {
	Title, XLabel, YLabel string
	LogX                  bool
	Series                []Series
}

// Size of the image, the blank margin around the plot (so the title and
// the axis labels never touch the edge), and the resolution of a PNG
// (1200×750 pixels).
const (
	Width  = 8 * vg.Inch
	Height = 5 * vg.Inch
	Margin = 0.2 * vg.Inch
	DPI    = 150
)

// FormatOf returns "svg" or "png" for path's extension, or ErrFormat;
// commands check it before running a long benchmark.
func FormatOf(path string) (string, error) {
	switch ext := strings.ToLower(filepath.Ext(path)); ext {
	case ".svg", ".png":
		return ext[1:], nil
	}
	return "", fmt.Errorf("%w: %q", ErrFormat, path)
}

// Write renders c into the file path, SVG or PNG by its extension.
func Write(path string, c Chart) (err error) {
	format, err := FormatOf(path)
	if err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	return c.Render(f, format)
}

// Render writes c to w as format ("svg" or "png").
func (c Chart) Render(w io.Writer, format string) error {
	if format != "svg" && format != "png" {
		return fmt.Errorf("%w: format %q", ErrFormat, format)
	}
	p := plot.New()
	p.Title.Text = c.Title
	p.X.Label.Text = c.XLabel
	p.Y.Label.Text = c.YLabel
	p.Y.Min = 0
	p.Add(plotter.NewGrid())
	var ticks []plot.Tick
	seen := map[float64]bool{}
	var lines []any
	ymax := 0.0
	for _, s := range c.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("benchplot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		pts := make(plotter.XYs, len(s.X))
		for i := range s.X {
			if c.LogX && !(s.X[i] > 0) {
				return fmt.Errorf("benchplot: series %q: x %v on a logarithmic axis", s.Name, s.X[i])
			}
			pts[i] = plotter.XY{X: s.X[i], Y: s.Y[i]}
			ymax = max(ymax, s.Y[i])
			if !seen[s.X[i]] {
				seen[s.X[i]] = true
				ticks = append(ticks, plot.Tick{Value: s.X[i], Label: strconv.FormatFloat(s.X[i], 'g', -1, 64)})
			}
		}
		lines = append(lines, s.Name, pts)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	if ymax > 0 {
		p.Y.Max = ymax * 1.08 // room above the highest point
	}
	if c.LogX {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	}
	// Throughput rises with depth: the bottom right corner is the emptiest.
	p.Legend.Top, p.Legend.Left = false, false
	p.Title.Padding = 0.12 * vg.Inch
	var cv vg.CanvasWriterTo
	if format == "png" {
		cv = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(Width, Height), vgimg.UseDPI(DPI))}
	} else {
		cv = vgsvg.New(Width, Height)
	}
	p.Draw(draw.Crop(draw.New(cv), Margin, -Margin, Margin, -Margin))
	if _, err := cv.WriteTo(w); err != nil {
		return fmt.Errorf("benchplot: %w", err)
	}
	return nil
}
