package store_test

import (
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
	"github.com/kvfs/kvfs/store/storetest"
)

// BenchmarkReadWholeBlock measures the store's own cost per group (the
// in-memory engine makes I/O nearly free): whole blocks of the default
// geometry, 512 groups of 4 KiB, into one contiguous buffer.
func BenchmarkReadWholeBlock(b *testing.B) {
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	m := storetest.Formatted(b, geo, 4, 4096)
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
	m := storetest.Formatted(b, geo, 4, 4096)
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

// syncCounter counts the engine's syncs.
type syncCounter struct {
	store.Engine
	syncs atomic.Int64
}

func (c *syncCounter) Sync() error {
	c.syncs.Add(1)
	return c.Engine.Sync()
}

// BenchmarkWriteConcurrent: 8 goroutines each storing whole blocks (64
// groups of 4 KiB) on a file of this machine's disk with O_DIRECT and
// fdatasync; reports the syncs per Write call.
func BenchmarkWriteConcurrent(b *testing.B) {
	geo := layout.Geometry{Layers: 4, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	const writers, slots = 8, 64
	path := filepath.Join(b.TempDir(), "store")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(store.SizeFor(geo, slots)); err != nil {
		b.Fatal(err)
	}
	f.Close()
	pe, err := posix.Open(path, posix.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pe.Close() }) // after the store's close (cleanups run last first)
	if _, err := store.Format(pe, geo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	e := &syncCounter{Engine: pe}
	s := openStore(b, e, store.Options{})
	data := make([]byte, geo.GroupBytes())
	var calls atomic.Int64
	var next atomic.Int64
	e.syncs.Store(0)
	b.SetParallelism(writers / max(1, runtime.GOMAXPROCS(0)))
	b.SetBytes(int64(geo.GroupsPerBlock() * geo.GroupBytes()))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		reqs := make([]store.WriteReq, geo.GroupsPerBlock())
		for pb.Next() {
			blk := uint64(next.Add(1) % (slots / 2))
			for i := range reqs {
				reqs[i] = store.WriteReq{Key: geo.KeyAt(blk, i), Data: data}
			}
			if err := s.Write(reqs); err != nil {
				b.Error(err)
				return
			}
			calls.Add(1)
		}
	})
	b.ReportMetric(float64(e.syncs.Load())/float64(calls.Load()), "syncs/write")
}

// BenchmarkLookup4096 is LOOKUP's store side: 4,096 (block, tag) pairs of
// a stored chain of tagged blocks, answered from the index (no I/O); the
// figure per id is ns/op over 4,096.
func BenchmarkLookup4096(b *testing.B) {
	const n = 4096
	m := storetest.NewMem(store.SizeFor(testGeo, n), 512)
	if _, err := store.Format(m, testGeo, store.FormatOptions{}); err != nil {
		b.Fatal(err)
	}
	s := openStore(b, m, store.Options{})
	ids := make([]uint64, n)
	tags := make([]store.Tag, n)
	const batch = 256
	for lo := 0; lo < n; lo += batch {
		var w []store.WriteReq
		for i := lo; i < lo+batch; i++ {
			ids[i] = uint64(i+1) * 0x9e3779b97f4a7c15 // spread like hashes
			tags[i] = store.Tag{byte(i), byte(i >> 8), 1}
			meta := &store.BlockMeta{Tag: tags[i]}
			if i > 0 {
				meta.Parent, meta.HasParent = ids[i-1], true
			}
			for g := range testGeo.GroupsPerBlock() {
				k := testGeo.KeyAt(ids[i], g)
				w = append(w, store.WriteReq{Key: k, Data: make([]byte, testGeo.GroupBytes()), Meta: meta})
			}
		}
		if err := s.Write(w); err != nil {
			b.Fatal(err)
		}
	}
	out := make([]index.Status, n)
	b.ResetTimer()
	for range b.N {
		if run := s.Lookup(ids, tags, out); run != n {
			b.Fatalf("run %d of %d", run, n)
		}
	}
}
