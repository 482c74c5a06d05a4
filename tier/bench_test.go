package tier

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// benchGeo is an 8B-class model's block: 32 layers × 8 kv heads × 128 ×
// 16 tokens bf16, 4 KiB groups, 2 MiB per block.
var benchGeo = layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// BenchmarkRead reads whole blocks of a store file on disk (in
// $KVFS_BENCH_DIR, default /var/tmp, which is not tmpfs where /tmp may be)
// straight from the store, and through a tier that holds them all (every
// read a hit), one block per op with the control path's request shape: one
// range request per (layer, kind).
func BenchmarkRead(b *testing.B) {
	const blocks = 32
	dir := os.Getenv("KVFS_BENCH_DIR")
	if dir == "" {
		dir = "/var/tmp"
	}
	tmp, err := os.MkdirTemp(dir, "kvfs-tier-bench-")
	if err != nil {
		b.Skip(err)
	}
	b.Cleanup(func() { os.RemoveAll(tmp) })
	path := filepath.Join(tmp, "store")
	if _, err := engine.FormatPath(path, engine.FormatPathOptions{Geometry: benchGeo, Size: store.SizeFor(benchGeo, blocks+8)}); err != nil {
		b.Fatal(err)
	}
	st, closeStore, err := engine.OpenStore(path, engine.Options{}, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { closeStore() })
	gb := benchGeo.GroupBytes()
	data := make([]byte, gb)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for blk := range uint64(blocks) {
		reqs := make([]store.WriteReq, benchGeo.GroupsPerBlock())
		for i := range reqs {
			reqs[i] = store.WriteReq{Key: benchGeo.KeyAt(blk, i), Data: data}
		}
		if err := st.Write(reqs); err != nil {
			b.Fatal(err)
		}
	}
	tr, err := New(st, Options{Bytes: blocks * benchGeo.PayloadBytes()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { tr.Close() })
	heads := benchGeo.KVHeads
	buf, err := store.AllocAligned(int(benchGeo.PayloadBytes()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { store.FreeAligned(buf) })
	reqs := make([]store.ReadReq, 2*benchGeo.Layers)
	block := func(blk uint64) []store.ReadReq {
		for lk := range reqs {
			reqs[lk] = store.ReadReq{
				Key:   layout.Key{Block: blk, Layer: lk / 2, Kind: layout.Kind(lk % 2)},
				Heads: heads, HeadStride: gb,
				Buf: buf[lk*heads*gb : (lk+1)*heads*gb],
			}
		}
		return reqs
	}
	for _, c := range []struct {
		name string
		r    interface{ Read([]store.ReadReq) error }
	}{{"store", st}, {"tier-hit", tr}} {
		if c.name == "tier-hit" {
			for blk := range uint64(blocks) {
				if err := tr.Read(block(blk)); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(benchGeo.PayloadBytes())
			hits := tr.Metrics().Hits
			i := 0
			for b.Loop() {
				rs := block(uint64(i % blocks))
				i++
				if err := c.r.Read(rs); err != nil {
					b.Fatal(err)
				}
				for k := range rs {
					if rs[k].Err != nil {
						b.Fatal(rs[k].Err)
					}
				}
			}
			if c.name == "tier-hit" && tr.Metrics().Hits == hits {
				b.Fatal("no read was a hit")
			}
		})
	}
}
