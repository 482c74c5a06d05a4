package store_test

import (
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// BenchmarkReadWholeBlock measures the store's own cost per group (the
// in-memory engine makes I/O nearly free): whole blocks of the default
// geometry, 512 groups of 4 KiB, into one contiguous buffer.
func BenchmarkReadWholeBlock(b *testing.B) {
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	m := storetest.NewMem(store.SizeFor(geo, 4), 4096)
	if _, err := store.Format(m, geo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	s := openStore(b, m, store.Options{})
	n := geo.GroupsPerBlock()
	w := make([]store.WriteReq, n)
	for i := range w {
		w[i] = store.WriteReq{Key: geo.KeyAt(1, i), Data: make([]byte, geo.GroupBytes())}
	}
	if err := s.Write(w); err != nil {
		b.Fatal(err)
	}
	buf, _ := store.AllocAligned(n * geo.GroupBytes())
	defer store.FreeAligned(buf)
	reqs := make([]store.ReadReq, n)
	b.SetBytes(int64(n * geo.GroupBytes()))
	b.ResetTimer()
	for range b.N {
		for i := range reqs {
			reqs[i] = store.ReadReq{Key: geo.KeyAt(1, i), Buf: buf[i*geo.GroupBytes() : (i+1)*geo.GroupBytes()]}
		}
		if err := s.Read(reqs); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/group")
}

// BenchmarkReadMissBatch measures a batch of 256 groups of which none is
// present (the normal case of a cache lookup that finds nothing): the
// store's control cost per miss.
func BenchmarkReadMissBatch(b *testing.B) {
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	m := storetest.NewMem(store.SizeFor(geo, 4), 4096)
	if _, err := store.Format(m, geo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	s := openStore(b, m, store.Options{})
	const n = 256
	buf := make([]byte, n*geo.GroupBytes())
	reqs := make([]store.ReadReq, n)
	b.ResetTimer()
	for range b.N {
		for i := range reqs {
			reqs[i] = store.ReadReq{Key: geo.KeyAt(7, i), Buf: buf[i*geo.GroupBytes() : (i+1)*geo.GroupBytes()]}
		}
		if err := s.Read(reqs); err != nil {
			b.Fatal(err)
		}
	}
	if reqs[0].Err == nil {
		b.Fatal("a miss was found")
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n)/1000, "µs/group")
}
