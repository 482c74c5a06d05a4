package fuseint

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestMeasureReads measures reading every group of many full blocks of the
// default geometry through the mount (one process: find | xargs cat, and a
// Go loop of open/read/close) next to in-process store reads of the same
// data (per group as kvfs get does, and batched per block). It runs only
// with KVFS_MEASURE=1 (KVFS_MEASURE_BLOCKS blocks, default 64):
//
//	KVFS_MEASURE=1 go test -run Measure -v ./integration/fuse/
func TestMeasureReads(t *testing.T) {
	if os.Getenv("KVFS_MEASURE") == "" {
		t.Skip("measurement: set KVFS_MEASURE=1")
	}
	need(t)
	blocks := 64
	if v, err := strconv.Atoi(os.Getenv("KVFS_MEASURE_BLOCKS")); err == nil && v > 0 {
		blocks = v
	}
	dir := t.TempDir()
	if d := os.Getenv("KVFS_MEASURE_DIR"); d != "" {
		dir = d
	}
	st := filepath.Join(dir, "measure.kvfs")
	geo := defaultGeo
	size := store.SizeFor(geo, int64(blocks)+2)
	kvfs(t, "format", st, "--force", "--size", strconv.FormatInt(size, 10), "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--block-tokens", "16", "--dtype", "bf16")
	gb := geo.GroupBytes()
	groups := blocks * geo.GroupsPerBlock()
	total := float64(groups * gb)
	report := func(name string, d time.Duration) {
		t.Logf("%-44s %8.0f groups/s %7.3f GB/s (%v)", name, float64(groups)/d.Seconds(), total/d.Seconds()/1e9, d.Round(time.Millisecond))
	}

	// Fill, then read in process.
	s, closeAll, err := engine.OpenStore(st, engine.Options{}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("engine %s, %d blocks × %d groups of %d bytes = %.0f MiB", s.Engine().Name(), blocks, geo.GroupsPerBlock(), gb, total/(1<<20))
	keysOf := func(b int) []layout.Key {
		ks := make([]layout.Key, geo.GroupsPerBlock())
		for i := range ks {
			ks[i] = geo.KeyAt(uint64(0x100+b), i)
		}
		return ks
	}
	for b := range blocks {
		reqs := make([]store.WriteReq, geo.GroupsPerBlock())
		for i, k := range keysOf(b) {
			reqs[i] = store.WriteReq{Key: k, Data: groupBytes(uint64(b<<16 | i))}
		}
		if err := s.Write(reqs); err != nil {
			t.Fatal(err)
		}
	}
	buf := make([]byte, gb)
	start := time.Now()
	for b := range blocks {
		for _, k := range keysOf(b) {
			r := []store.ReadReq{{Key: k, Buf: buf}}
			if err := s.Read(r); err != nil || r[0].Err != nil {
				t.Fatal(err, r[0].Err)
			}
		}
	}
	report("in-process store.Read, 1 group per call", time.Since(start))
	bb := make([]byte, gb*geo.GroupsPerBlock())
	start = time.Now()
	for b := range blocks {
		ks := keysOf(b)
		r := make([]store.ReadReq, len(ks))
		for i, k := range ks {
			r[i] = store.ReadReq{Key: k, Buf: bb[i*gb : (i+1)*gb]}
		}
		if err := s.Read(r); err != nil {
			t.Fatal(err)
		}
	}
	report("in-process store.Read, 1 block per call", time.Since(start))
	if err := closeAll(); err != nil {
		t.Fatal(err)
	}

	// Through the mount, with and without read-ahead.
	var paths []string
	for _, ra := range []string{"0", "1MiB"} {
		mnt := t.TempDir()
		d := startMount(t, st, mnt, "--read-ahead", ra)
		paths = paths[:0]
		for b := range blocks {
			for _, k := range keysOf(b) {
				paths = append(paths, filepath.Join(mnt, geo.Name(k)))
			}
		}
		for round := range 2 {
			start = time.Now()
			out, err := sh(mnt, "find layer-* -type f | xargs cat | wc -c")
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			report(fmt.Sprintf("mount --read-ahead %s: find | xargs cat #%d", ra, round+1), time.Since(start))
			if n, _ := strconv.Atoi(trim(out)); n != groups*gb {
				t.Fatalf("cat read %s bytes", out)
			}
			start = time.Now()
			out, err = sh(mnt, "find layer-* -type f | xargs -P 8 -n 1024 cat | wc -c")
			if err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			report(fmt.Sprintf("mount --read-ahead %s: xargs -P 8 cat #%d", ra, round+1), time.Since(start))
			start = time.Now()
			for _, p := range paths {
				f, err := os.Open(p)
				if err != nil {
					t.Fatal(err)
				}
				if n, err := f.Read(buf); err != nil || n != gb {
					t.Fatal(n, err)
				}
				f.Close()
			}
			report(fmt.Sprintf("mount --read-ahead %s: Go open/read/close #%d", ra, round+1), time.Since(start))
		}
		if err := d.stop(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
}

func trim(s string) string {
	for len(s) > 0 && (s[len(s)-1] == '\n' || s[len(s)-1] == ' ') {
		s = s[:len(s)-1]
	}
	return s
}
