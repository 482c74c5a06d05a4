package fs

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// benchGeo is make run's default geometry: 4 KiB groups, 512 per block.
var benchGeo = layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// BenchmarkReadGroupFiles reads every group of 16 full blocks through the
// mount, one open/read/close per group (what cat does), under the cache
// policies considered. The store is in memory, so this measures the FUSE
// path itself.
//
//	go test -run '^$' -bench ReadGroupFiles -benchtime 3x ./fs/
func BenchmarkReadGroupFiles(b *testing.B) {
	const blocks = 16
	for _, c := range []struct {
		name string
		o    Options
	}{
		{"direct-io", Options{}},
		{"direct-io-dirtimeout0", Options{EntryTimeout: -1}},
		{"page-cache", Options{pageCache: true}},
	} {
		b.Run(c.name, func(b *testing.B) {
			requireFUSE(b)
			dir := mountBench(b, blocks, c.o)
			var paths []string
			for blk := range blocks {
				for idx := range benchGeo.GroupsPerBlock() {
					paths = append(paths, filepath.Join(dir, benchGeo.Name(benchGeo.KeyAt(uint64(blk), idx))))
				}
			}
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				for _, p := range paths {
					if _, err := os.ReadFile(p); err != nil {
						b.Fatal(err)
					}
				}
			}
			d := time.Since(start)
			n := len(paths) * b.N
			b.ReportMetric(float64(n)/d.Seconds(), "groups/s")
			b.ReportMetric(float64(n*benchGeo.GroupBytes())/d.Seconds()/1e6, "MB/s")
		})
	}
}

// mountBench mounts an in-memory store holding blocks full blocks.
func mountBench(b *testing.B, blocks int, o Options) string {
	b.Helper()
	_, st := newStore(b, benchGeo, int64(blocks))
	gb := benchGeo.GroupBytes()
	for blk := range blocks {
		reqs := make([]store.WriteReq, benchGeo.GroupsPerBlock())
		for i := range reqs {
			reqs[i] = store.WriteReq{Key: benchGeo.KeyAt(uint64(blk), i), Data: make([]byte, gb)}
			reqs[i].Data[0] = byte(i)
		}
		if err := st.Write(reqs); err != nil {
			b.Fatal(err)
		}
	}
	dir := b.TempDir()
	srv, err := Mount(dir, st, o)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = unmountRetry(srv); srv.Wait(); _ = st.Close() })
	return dir
}
