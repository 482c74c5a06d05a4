package ctl

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// benchGeo: 4 layers × 8 heads × 2 = 64 groups of 16 token rows × 256
// bytes (head_dim 128, bf16) = 4 KiB per group.
var benchGeo = layout.Geometry{Layers: 4, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// BenchmarkLoadBlock measures one LOAD of a whole block (64 groups) from a
// store on a file of this machine's disk opened with O_DIRECT (page cache
// bypassed; the file is small and the device caches it), into a registered
// buffer laid out packed (one tile per group) or NHD (vLLM's token-major
// cache: a token's rows of all heads side by side, so each group's rows are
// 8 × 256 bytes apart).
func BenchmarkLoadBlock(b *testing.B) {
	for _, layout := range []string{"packed", "nhd"} {
		b.Run(layout, func(b *testing.B) { benchLoadBlock(b, benchGeo, layout == "nhd", 0) })
	}
	// 512-byte rows (head_dim 256): bounced once (ScatterMin at its
	// default, 4 KiB) or scattered with preadv straight into the cache
	// (ScatterMin 512).
	geo := benchGeo
	geo.HeadDim = 256
	b.Run("nhd512-bounce", func(b *testing.B) { benchLoadBlock(b, geo, true, 0) })
	b.Run("nhd512-scatter", func(b *testing.B) { benchLoadBlock(b, geo, true, 512) })
}

func benchLoadBlock(b *testing.B, geo layout.Geometry, nhd bool, scatterMin int) {
	path := filepath.Join(b.TempDir(), "store")
	size := store.SizeFor(geo, 8)
	if err := createFile(path, size); err != nil {
		b.Fatal(err)
	}
	e, err := posix.Open(path, posix.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	if !e.Direct() {
		b.Skip("the file system refuses O_DIRECT")
	}
	if _, err := store.Format(e, geo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(e, store.Options{ScatterMin: scatterMin})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	n := geo.GroupsPerBlock()
	gb := geo.GroupBytes()
	w := make([]store.WriteReq, n)
	for i := range w {
		d := make([]byte, gb)
		for j := range d {
			d[j] = byte(i + j)
		}
		w[i] = store.WriteReq{Key: geo.KeyAt(1, i), Data: d}
	}
	if err := st.Write(w); err != nil {
		b.Fatal(err)
	}
	srv := NewServer(st, Options{})
	defer srv.Close()
	ss, errno := srv.Open(0, 0)
	if errno != 0 {
		b.Fatal(errno)
	}
	defer ss.Release()
	sh := newShm(b, n*gb, 4096)
	id := mustRegister(b, ss, sh)
	rowBytes := geo.RowBytes()
	es := make([]abi.Entry, n)
	for i := range es {
		k := geo.KeyAt(1, i)
		off, pitch := uint64(i*gb), uint32(0)
		if nhd {
			// Per (layer, kind) a [tokens, heads, head_dim] tile; a group
			// is one head's rows.
			lk := k.Layer*2 + int(k.Kind)
			off = uint64(lk*gb*geo.KVHeads + k.Head*rowBytes)
			pitch = uint32(geo.KVHeads * rowBytes)
		}
		es[i] = entry(k, id, off, pitch)
	}
	cmd, in := encodeBatch(true, false, es)
	out := make([]byte, len(in))
	b.SetBytes(int64(n * gb))
	b.ResetTimer()
	for range b.N {
		res, errno := ss.Ioctl(cmd, in, out)
		if errno != 0 || int(res) != n {
			b.Fatalf("load: %d of %d, %v", res, n, errno)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/block")
}

func createFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	// Real blocks, not a sparse file: a hole reads as zeros with no I/O.
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), size-off)]); err != nil {
			return err
		}
	}
	return f.Sync()
}

// BenchmarkStoreBlock measures one STORE of a whole block (64 packed 4 KiB
// tiles, in slot order) into a store on a tmpfs file (/dev/shm: no device
// time, so the copies and the control path show), durable on return.
func BenchmarkStoreBlock(b *testing.B) {
	needShm(b)
	dir, err := os.MkdirTemp("/dev/shm", "kvfs-bench")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(dir)
	geo := benchGeo
	path := filepath.Join(dir, "store")
	if err := createFile(path, store.SizeFor(geo, 8)); err != nil {
		b.Fatal(err)
	}
	e, err := posix.Open(path, posix.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	if _, err := store.Format(e, geo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	st, err := store.Open(e, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	srv := NewServer(st, Options{})
	defer srv.Close()
	ss, errno := srv.Open(0, 0)
	if errno != 0 {
		b.Fatal(errno)
	}
	defer ss.Release()
	n, gb := geo.GroupsPerBlock(), geo.GroupBytes()
	sh := newShm(b, n*gb, 4096)
	id := mustRegister(b, ss, sh)
	for i := range sh.n {
		sh.mem[i] = byte(i / 7)
	}
	es := make([]abi.Entry, n)
	b.SetBytes(int64(n * gb))
	b.ResetTimer()
	for i := range b.N {
		for j := range es {
			es[j] = entry(geo.KeyAt(uint64(i%4), j), id, uint64(j*gb), 0)
		}
		cmd, in := encodeBatch(false, false, es)
		out := make([]byte, len(in))
		res, errno := ss.Ioctl(cmd, in, out)
		if errno != 0 || int(res) != n {
			b.Fatalf("store: %d of %d, %v", res, n, errno)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N), "µs/block")
}
