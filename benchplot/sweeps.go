package benchplot

import (
	"fmt"

	"github.com/kvfs/kvfs/bench"
)

// DepthPoint is one measurement of a kvfs bench depth sweep.
type DepthPoint struct {
	QD            int
	GBps          float64
	FioGBps       *float64 // nil when fio was not run
	Engine        string
	Op, Pattern   string
	IOSize        int
	BlocksPerCall int
}

// DepthSweep charts kvfs bench --sweep: GB/s against queue depth, with
// fio's line when every point has one.
func DepthSweep(path string, pts []DepthPoint) Chart {
	c := Chart{XLabel: "queue depth", YLabel: "GB/s", LogX: true}
	if len(pts) == 0 {
		return c
	}
	p0 := pts[0]
	c.Title = fmt.Sprintf("kvfs bench %s: %s %s of %d bytes (%s)", path, p0.Pattern, p0.Op, p0.IOSize, p0.Engine)
	if p0.BlocksPerCall > 0 {
		c.Title = fmt.Sprintf("kvfs bench %s: store.Read of %d blocks per call (%s)", path, p0.BlocksPerCall, p0.Engine)
	}
	kvfs := Series{Name: "kvfs " + p0.Engine}
	fio := Series{Name: "fio"}
	for _, p := range pts {
		kvfs.X = append(kvfs.X, float64(p.QD))
		kvfs.Y = append(kvfs.Y, p.GBps)
		if p.FioGBps != nil {
			fio.X = append(fio.X, float64(p.QD))
			fio.Y = append(fio.Y, *p.FioGBps)
		}
	}
	c.Series = []Series{kvfs}
	if len(fio.X) == len(pts) {
		c.Series = append(c.Series, fio)
	}
	return c
}

// LoadSweep charts kvfs bench-load --sweep: GB/s against concurrent
// callers.
func LoadSweep(rs []bench.LoadResult) Chart {
	c := Chart{XLabel: "callers", YLabel: "GB/s", LogX: true}
	if len(rs) == 0 {
		return c
	}
	r0 := rs[0]
	what := fmt.Sprintf("LOAD of %d groups", r0.GroupsPerCall)
	if r0.BlocksPerCall > 0 {
		what = fmt.Sprintf("LOAD_BLOCKS of %d blocks into %s", r0.BlocksPerCall, r0.Layout)
	}
	c.Title = fmt.Sprintf("kvfs bench-load %s: %s (%s)", r0.Mountpoint, what, r0.Engine)
	s := Series{Name: "kvfs " + r0.Engine}
	for _, r := range rs {
		s.X = append(s.X, float64(r.Jobs))
		s.Y = append(s.Y, r.GBps)
	}
	c.Series = []Series{s}
	return c
}
