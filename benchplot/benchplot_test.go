package benchplot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/bench"
)

var sweep = Chart{
	Title:  "kvfs bench-load: LOAD_BLOCKS",
	XLabel: "callers",
	YLabel: "GB/s",
	LogX:   true,
	Series: []Series{
		{Name: "kvfs", X: []float64{1, 2, 4, 8, 16}, Y: []float64{3.1, 5.9, 9.8, 13.7, 13.9}},
		{Name: "fio", X: []float64{1, 2, 4, 8, 16}, Y: []float64{3.5, 6.2, 10.1, 14.0, 14.2}},
	},
}

// texts returns the character data of every <text> element of an SVG,
// failing when the document is not well-formed XML.
func texts(t *testing.T, svg []byte) (root string, out []string) {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var in int
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return root, out
		}
		if err != nil {
			t.Fatalf("the SVG does not parse: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
			}
			if tok.Name.Local == "text" {
				in++
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				in--
			}
		case xml.CharData:
			if in > 0 {
				out = append(out, strings.TrimSpace(string(tok)))
			}
		}
	}
}

func TestSVGHasAxesAndSeries(t *testing.T) {
	var b bytes.Buffer
	if err := sweep.Render(&b, "svg"); err != nil {
		t.Fatal(err)
	}
	root, txt := texts(t, b.Bytes())
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	have := map[string]bool{}
	for _, s := range txt {
		have[s] = true
	}
	for _, want := range []string{"kvfs bench-load: LOAD_BLOCKS", "callers", "GB/s", "kvfs", "fio", "1", "2", "4", "8", "16"} {
		if !have[want] {
			t.Errorf("the SVG has no text %q; texts: %q", want, txt)
		}
	}
}

func TestWritePNG(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sweep.png")
	if err := Write(path, sweep); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatalf("the PNG does not decode: %v", err)
	}
	r := img.Bounds()
	if r.Dx() != 1200 || r.Dy() != 750 {
		t.Fatalf("a %dx%d image, want 1200x750", r.Dx(), r.Dy())
	}
	// A blank margin on every side: nothing (the title, the labels) is
	// drawn within 20 pixels of an edge, and the plot is drawn inside.
	white := func(x, y int) bool {
		cr, cg, cb, _ := img.At(x, y).RGBA()
		return cr == 0xffff && cg == 0xffff && cb == 0xffff
	}
	drawn := 0
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			edge := x-r.Min.X < 20 || r.Max.X-x <= 20 || y-r.Min.Y < 20 || r.Max.Y-y <= 20
			switch {
			case edge && !white(x, y):
				t.Fatalf("pixel (%d, %d) in the margin is drawn", x, y)
			case !white(x, y):
				drawn++
			}
		}
	}
	if drawn < 1000 {
		t.Fatalf("only %d pixels drawn", drawn)
	}
}

func TestRefusals(t *testing.T) {
	dir := t.TempDir()
	if err := Write(filepath.Join(dir, "out.pdf"), sweep); !errors.Is(err, ErrFormat) {
		t.Fatalf("a .pdf name: %v, want ErrFormat", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "out.pdf")); !os.IsNotExist(err) {
		t.Fatal("a refused name left a file")
	}
	for _, p := range []string{"a.SVG", "b.png"} {
		if _, err := FormatOf(p); err != nil {
			t.Fatalf("FormatOf(%q): %v", p, err)
		}
	}
	bad := Chart{XLabel: "qd", Series: []Series{{Name: "x", X: []float64{1, 2}, Y: []float64{1}}}}
	if err := bad.Render(io.Discard, "svg"); err == nil {
		t.Fatal("a series with more x than y values rendered")
	}
	zero := Chart{LogX: true, Series: []Series{{Name: "x", X: []float64{0, 1}, Y: []float64{1, 2}}}}
	if err := zero.Render(io.Discard, "svg"); err == nil {
		t.Fatal("x = 0 on a logarithmic axis rendered")
	}
}

func TestSweepCharts(t *testing.T) {
	f := 2.5
	pts := []DepthPoint{{QD: 1, GBps: 1, FioGBps: &f, Engine: "uring", BlocksPerCall: 1}, {QD: 2, GBps: 2, FioGBps: &f, Engine: "uring", BlocksPerCall: 1}}
	c := DepthSweep("s.kvfs", pts)
	if c.XLabel != "queue depth" || !c.LogX || len(c.Series) != 2 || c.Series[1].Name != "fio" ||
		c.Series[0].X[1] != 2 || c.Series[0].Y[1] != 2 || !strings.Contains(c.Title, "1 blocks per call") {
		t.Fatalf("depth chart %+v", c)
	}
	pts[1].FioGBps = nil // fio's line only when every depth has it
	if c := DepthSweep("s.kvfs", pts); len(c.Series) != 1 {
		t.Fatalf("a partial fio line was drawn: %+v", c)
	}
	l := LoadSweep([]bench.LoadResult{{Mountpoint: "/mnt/kvcache", Engine: "uring", Jobs: 1, GBps: 3, GroupsPerCall: 256},
		{Mountpoint: "/mnt/kvcache", Engine: "uring", Jobs: 4, GBps: 9, GroupsPerCall: 256}})
	if l.XLabel != "callers" || len(l.Series) != 1 || l.Series[0].X[1] != 4 || l.Series[0].Y[1] != 9 ||
		!strings.Contains(l.Title, "LOAD of 256 groups") {
		t.Fatalf("load chart %+v", l)
	}
	if err := l.Render(io.Discard, "svg"); err != nil {
		t.Fatal(err)
	}
}
