package ctl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// blocksGeo is the geometry of the v1 measurements in docs/abi.md: 8 layers
// × 4 kv heads × 128 × 16 tokens bf16 — 4 KiB groups, 64 groups (256 KiB)
// per block.
var blocksGeo = layout.Geometry{Layers: 8, KVHeads: 4, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}

// blocksFixture is a server on an in-memory store of geo with `stored`
// blocks (ids 0..stored-1), a session, and a target of nb cache blocks in
// the given layout in one registered /dev/shm buffer.
type blocksFixture struct {
	st        *store.Store
	mem       *storetest.Mem
	srv       *Server
	ss        *Session
	cache     []byte
	cachePath string
	target    uint32
	arr       []byte // entry array: registered buffer arrID
	arrID     uint32
}

func newBlocksFixture(tb testing.TB, geo layout.Geometry, stored, nb int, nhd bool) *blocksFixture {
	tb.Helper()
	return newBlocksFixtureTier(tb, geo, stored, nb, nhd, 0)
}

// newBlocksFixtureTier is newBlocksFixture with a DRAM tier of tierBlocks
// blocks in front of the store (none for 0).
func newBlocksFixtureTier(tb testing.TB, geo layout.Geometry, stored, nb int, nhd bool, tierBlocks int) *blocksFixture {
	tb.Helper()
	needShm(tb)
	m := storetest.Formatted(tb, geo, int64(stored)+2, 4096)
	st := storetest.Open(tb, m, store.Options{})
	gb := geo.GroupBytes()
	for b := range stored {
		reqs := make([]store.WriteReq, geo.GroupsPerBlock())
		for i := range reqs {
			data := make([]byte, gb)
			binary.LittleEndian.PutUint64(data, uint64(b)<<16|uint64(i))
			reqs[i] = store.WriteReq{Key: geo.KeyAt(uint64(b), i), Data: data}
		}
		if err := st.Write(reqs); err != nil {
			tb.Fatal(err)
		}
	}
	var o Options
	if tierBlocks > 0 {
		tr, err := tier.New(st, tier.Options{Bytes: int64(tierBlocks) * geo.PayloadBytes()})
		if err != nil {
			tb.Fatal(err)
		}
		o.Tier = tr
	}
	srv := NewServer(st, o)
	ss, errno := srv.Open(0, 0)
	if errno != 0 {
		tb.Fatal(errno)
	}
	tb.Cleanup(func() {
		ss.Release()
		srv.Close()
		if o.Tier != nil {
			o.Tier.Close()
		}
		st.Close()
	})
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := nb * T * H * rb
	n := 2 * geo.Layers * tensor
	path, mem := newShmPath(tb, n)
	id, errno := register(tb, ss, path, uint64(n))
	if errno != 0 {
		tb.Fatal(errno)
	}
	tg := &abi.Target{ABI: abi.Version, NumBlocks: uint32(nb), RowBytes: uint32(rb), LayerCount: uint16(geo.Layers), HeadCount: uint16(H)}
	if nhd {
		tg.BlockStride, tg.HeadStride, tg.RowPitch = uint64(T*H*rb), uint64(rb), uint32(H*rb)
	} else {
		tg.BlockStride, tg.HeadStride, tg.RowPitch = uint64(H*T*rb), uint64(T*rb), uint32(rb)
	}
	for i := range 2 * geo.Layers {
		tg.Regions[i] = abi.TargetRegion{Buffer: id, Offset: uint64(i * tensor)}
	}
	in := make([]byte, abi.TargetSize)
	tg.Marshal(in)
	out := make([]byte, abi.TargetSize)
	if _, errno := ss.Ioctl(abi.CmdRegisterTarget, in, out); errno != 0 {
		tb.Fatalf("register target: %v", errno)
	}
	f := &blocksFixture{st: st, mem: m, srv: srv, ss: ss, cache: mem, cachePath: path, target: binary.LittleEndian.Uint32(out[abi.TargetOutOff:])}
	apath, amem := newShmPath(tb, abi.BlocksMax*abi.BlockEntrySize)
	if f.arrID, errno = register(tb, ss, apath, uint64(len(amem))); errno != 0 {
		tb.Fatal(errno)
	}
	f.arr = amem
	return f
}

func newShmPath(tb testing.TB, n int) (string, []byte) {
	tb.Helper()
	s := newShm(tb, n, 0)
	return s.path, s.mem
}

// loadBlocks issues LOAD_BLOCKS of whole blocks ids[i] into cache block i
// through the entry array and returns n_ok.
func (f *blocksFixture) loadBlocks(tb testing.TB, geo layout.Geometry, ids []uint64) int {
	for i, b := range ids {
		(&abi.BlockEntry{Block: b, CacheBlock: uint32(i), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
			Kinds: abi.KindsBoth}).Marshal(f.arr[i*abi.BlockEntrySize:])
	}
	var in, out [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: uint32(len(ids)), Buffer: f.arrID}).Marshal(in[:])
	n, errno := f.ss.Ioctl(abi.CmdLoadBlocks, in[:], out[:])
	if errno != 0 {
		tb.Fatal(errno)
	}
	return int(n)
}

// TestLoadBlocksPartial: an entry whose block lacks one group and has one
// corrupt reports Corrupt (its most serious failure) with GroupsOK short
// by two; the corrupt group's tile is zeroed, the missing one's left as it
// was, every other tile lands; the next entry is unaffected. The control
// path asks for a (layer, kind)'s heads with one store request, so this is
// the store range's outcome read back per entry. The same holds through a
// DRAM tier: a block with a corrupt group never enters it, and the store
// answers.
func TestLoadBlocksPartial(t *testing.T) {
	geo := blocksGeo
	for _, c := range []struct {
		nhd        bool
		tierBlocks int
	}{{false, 0}, {true, 0}, {false, 4}, {true, 4}} {
		nhd := c.nhd
		f := newBlocksFixtureTier(t, geo, 4, 8, nhd, c.tierBlocks)
		gone := layout.Key{Block: 1, Layer: 2, Head: 1, Kind: layout.K}
		bad := layout.Key{Block: 1, Layer: 5, Head: 3, Kind: layout.V}
		if err := f.st.Delete([]layout.Key{gone}); err != nil {
			t.Fatal(err)
		}
		gi, err := f.st.Stat(bad)
		if err != nil {
			t.Fatal(err)
		}
		sb := f.st.Superblock()
		off := sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + geo.Offset(geo.Index(bad)) + 9
		f.mem.Poke(off, []byte{f.mem.Image()[off] ^ 0x40})
		rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
		tensor := 8 * T * H * rb
		tile := func(k layout.Key, cb int) []byte {
			var b []byte
			for r := range T {
				o := (2*k.Layer+int(k.Kind))*tensor + ((cb*H+k.Head)*T+r)*rb
				if nhd {
					o = (2*k.Layer+int(k.Kind))*tensor + ((cb*T+r)*H+k.Head)*rb
				}
				b = append(b, f.cache[o:o+rb]...)
			}
			return b
		}
		for i := range f.cache[:2*geo.Layers*tensor] {
			f.cache[i] = 0x5A
		}
		if n := f.loadBlocks(t, geo, []uint64{1, 2}); n != 1 {
			t.Fatalf("nhd=%v: %d ok, want 1", nhd, n)
		}
		var e0, e1 abi.BlockEntry
		e0.Unmarshal(f.arr)
		e1.Unmarshal(f.arr[abi.BlockEntrySize:])
		if e0.Status != abi.Corrupt || int(e0.GroupsOK) != geo.GroupsPerBlock()-2 {
			t.Fatalf("nhd=%v: entry 0: %v, %d groups ok, want Corrupt, %d", nhd, e0.Status, e0.GroupsOK, geo.GroupsPerBlock()-2)
		}
		if e1.Status != abi.OK || int(e1.GroupsOK) != geo.GroupsPerBlock() {
			t.Fatalf("nhd=%v: entry 1: %+v", nhd, e1)
		}
		for cb, b := range []uint64{1, 2} {
			for i := range geo.GroupsPerBlock() {
				k := geo.KeyAt(b, i)
				got := tile(k, cb)
				switch k {
				case gone:
					if !bytes.Equal(got, bytes.Repeat([]byte{0x5A}, len(got))) {
						t.Fatalf("nhd=%v: the missing group's tile was written", nhd)
					}
				case bad:
					if !bytes.Equal(got, make([]byte, len(got))) {
						t.Fatalf("nhd=%v: the corrupt group's tile is not zeroed", nhd)
					}
				default:
					if tag := binary.LittleEndian.Uint64(got); tag != b<<16|uint64(i) {
						t.Fatalf("nhd=%v: %v at cache block %d: tag %#x", nhd, k, cb, tag)
					}
				}
			}
		}
	}
}

// TestBlocksInProcess: whole blocks land where the layout says, the entry
// array gets each outcome, and a shrunk cache file faults the call (EFAULT)
// while the server goes on.
func TestBlocksInProcess(t *testing.T) {
	geo := blocksGeo
	for _, nhd := range []bool{false, true} {
		f := newBlocksFixture(t, geo, 4, 8, nhd)
		ids := []uint64{3, 1, 99, 0}
		if n := f.loadBlocks(t, geo, ids); n != 3 {
			t.Fatalf("nhd=%v: %d ok", nhd, n)
		}
		rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
		tensor := 8 * T * H * rb
		for cb, b := range ids {
			var e abi.BlockEntry
			e.Unmarshal(f.arr[cb*abi.BlockEntrySize:])
			want := abi.OK
			if b == 99 {
				want = abi.Absent
			}
			if e.Status != want {
				t.Fatalf("entry %d: %+v", cb, e)
			}
			if b == 99 {
				continue
			}
			for i := range geo.GroupsPerBlock() {
				k := geo.KeyAt(b, i)
				// Row 0 of the tile starts with the group's tag.
				off := (2*k.Layer+int(k.Kind))*tensor + ((cb*H+k.Head)*T)*rb
				if nhd {
					off = (2*k.Layer+int(k.Kind))*tensor + (cb*T*H+k.Head)*rb
				}
				if got := binary.LittleEndian.Uint64(f.cache[off:]); got != b<<16|uint64(i) {
					t.Fatalf("nhd=%v: %v at cache block %d: tag %#x", nhd, k, cb, got)
				}
			}
		}
	}
	// Shrink the cache file under the daemon: the next load faults.
	f := newBlocksFixture(t, geo, 2, 4, false)
	if err := os.Truncate(f.cachePath, 0); err != nil {
		t.Fatal(err)
	}
	var in, out [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: 1, Buffer: f.arrID}).Marshal(in[:])
	(&abi.BlockEntry{Block: 1, LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads), Kinds: abi.KindsBoth}).Marshal(f.arr)
	if _, errno := f.ss.Ioctl(abi.CmdLoadBlocks, in[:], out[:]); errno != syscall.EFAULT {
		t.Fatalf("load into a shrunk file: %v", errno)
	}
	if f.srv.Metrics().Faults == 0 {
		t.Fatal("fault not counted")
	}
	// A STORE_BLOCKS of 64 blocks from a shrunk file: the tiles are
	// copied by several goroutines (4 MiB each), every one of them faults,
	// and the call still fails with EFAULT, the daemon alive.
	f = newBlocksFixture(t, geo, 2, 64, false)
	if err := os.Truncate(f.cachePath, 0); err != nil {
		t.Fatal(err)
	}
	for cb := range 64 {
		(&abi.BlockEntry{Block: uint64(1000 + cb), CacheBlock: uint32(cb), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
			Kinds: abi.KindsBoth}).Marshal(f.arr[cb*abi.BlockEntrySize:])
	}
	(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: 64, Buffer: f.arrID}).Marshal(in[:])
	if _, errno := f.ss.Ioctl(abi.CmdStoreBlocks, in[:], out[:]); errno != syscall.EFAULT {
		t.Fatalf("store from a shrunk file: %v", errno)
	}
	if f.srv.Metrics().Faults == 0 {
		t.Fatal("store fault not counted")
	}
}

// faultingIO is the store as ctl reads it, with the engine's read(2) of
// one request (the at-th over the store reads of a call) failing with
// EFAULT, as a read into client memory that faults does.
type faultingIO struct {
	groupIO
	at, seen, reads int
}

func (f *faultingIO) Read(reqs []store.ReadReq) error {
	f.reads++
	err := f.groupIO.Read(reqs)
	if i := f.at - f.seen; i >= 0 && i < len(reqs) {
		reqs[i].Err = &os.SyscallError{Syscall: "pread", Err: syscall.EFAULT}
	}
	f.seen += len(reqs)
	return err
}

// TestLoadBlocksReadFault: a LOAD_BLOCKS whose store read faults in
// client memory (the engine's read(2) answers EFAULT for one request)
// fails with EFAULT, counted, and issues no store read after the one that
// faulted, whichever of the call's store reads it is; without a fault the
// same call loads every block.
func TestLoadBlocksReadFault(t *testing.T) {
	geo := blocksGeo
	geo.HeadDim = 8
	// 320 blocks of 64 groups: two store reads (maxGroupsPerCall groups,
	// then the rest), of 4,096 and 1,024 requests (one per layer and kind).
	const nb, stored = 320, 4
	perRead := maxGroupsPerCall / geo.GroupsPerBlock() * 2 * geo.Layers
	ids := make([]uint64, nb)
	for i := range ids {
		ids[i] = uint64(i % stored)
	}
	for _, c := range []struct {
		at, reads int
		fault     bool
	}{{-1, 2, false}, {5, 1, true}, {perRead - 1, 1, true}, {perRead + 3, 2, true}} {
		f := newBlocksFixture(t, geo, stored, nb, false)
		fio := &faultingIO{groupIO: f.srv.io, at: c.at}
		f.srv.io = fio
		for i, b := range ids {
			(&abi.BlockEntry{Block: b, CacheBlock: uint32(i), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
				Kinds: abi.KindsBoth}).Marshal(f.arr[i*abi.BlockEntrySize:])
		}
		var in, out [abi.BlocksSize]byte
		(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: nb, Buffer: f.arrID}).Marshal(in[:])
		n, errno := f.ss.Ioctl(abi.CmdLoadBlocks, in[:], out[:])
		switch {
		case c.fault && errno != syscall.EFAULT:
			t.Fatalf("fault at request %d: %d ok, errno %v, want EFAULT", c.at, n, errno)
		case !c.fault && (errno != 0 || n != nb):
			t.Fatalf("no fault: %d ok, errno %v", n, errno)
		case fio.reads != c.reads:
			t.Fatalf("fault at request %d: %d store reads, want %d", c.at, fio.reads, c.reads)
		case c.fault != (f.srv.Metrics().Faults == 1):
			t.Fatalf("fault at request %d: %d faults counted", c.at, f.srv.Metrics().Faults)
		}
	}
}

// TestStoreBlocksWriteStraight: STORE_BLOCKS of whole blocks, head-major
// and token-major, writes every group to the device straight from the
// staging it was copied into (no bounce copy in the store), and the blocks
// load back byte for byte.
func TestStoreBlocksWriteStraight(t *testing.T) {
	geo := blocksGeo
	for _, nhd := range []bool{false, true} {
		const nb = 8
		f := newBlocksFixture(t, geo, nb, nb, nhd)
		rnd := rand.New(rand.NewPCG(9, uint64(len(f.cache))))
		for i := range f.cache {
			f.cache[i] = byte(rnd.UintN(256))
		}
		want := slices.Clone(f.cache)
		for cb := range nb {
			(&abi.BlockEntry{Block: uint64(500 + cb), CacheBlock: uint32(cb), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
				Kinds: abi.KindsBoth}).Marshal(f.arr[cb*abi.BlockEntrySize:])
		}
		var in, out [abi.BlocksSize]byte
		(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: nb, Buffer: f.arrID}).Marshal(in[:])
		m0 := f.st.Metrics()
		if _, errno := f.ss.Ioctl(abi.CmdStoreBlocks, in[:], out[:]); errno != 0 {
			t.Fatalf("nhd=%v: store: %v", nhd, errno)
		}
		m1 := f.st.Metrics()
		if w := m1.BytesWritten - m0.BytesWritten; w != uint64(nb*geo.GroupsPerBlock()*geo.GroupBytes()) || m1.WriteBounced != m0.WriteBounced {
			t.Fatalf("nhd=%v: %d bytes written, %d of them through bounce memory; want %d, none", nhd, w, m1.WriteBounced-m0.WriteBounced,
				nb*geo.GroupsPerBlock()*geo.GroupBytes())
		}
		clear(f.cache)
		ids := make([]uint64, nb)
		for cb := range ids {
			ids[cb] = uint64(500 + cb)
		}
		if n := f.loadBlocks(t, geo, ids); n != nb {
			t.Fatalf("nhd=%v: %d blocks loaded back", nhd, n)
		}
		if !bytes.Equal(f.cache, want) {
			t.Fatalf("nhd=%v: blocks loaded back differ from those stored", nhd)
		}
	}
}

// TestLoadBlocksWindows: a LOAD_BLOCKS of more groups than one store call
// takes (maxGroupsPerCall) reports every entry's outcome — landed, absent,
// refused — whatever window its groups went in, the second window larger
// than the first.
func TestLoadBlocksWindows(t *testing.T) {
	geo := blocksGeo
	geo.HeadDim = 8 // 256-byte groups: 512 cache blocks in 8 MiB
	const stored, n = 8, 512
	f := newBlocksFixture(t, geo, stored, n, false)
	gpb := geo.GroupsPerBlock()
	// 255 whole blocks and a half one (16,352 groups) fill the first
	// window; the next 256 whole blocks (16,384) the second.
	if 255*gpb+gpb/2 > maxGroupsPerCall || 256*gpb > maxGroupsPerCall || 255*gpb+gpb/2+gpb <= maxGroupsPerCall {
		t.Fatal("geometry does not split the call as the test assumes")
	}
	ents := make([]abi.BlockEntry, n)
	for i := range ents {
		ents[i] = abi.BlockEntry{Block: uint64(i % (stored + 2)), CacheBlock: uint32(i), LayerCount: uint16(geo.Layers),
			HeadCount: uint16(geo.KVHeads), Kinds: abi.KindsBoth}
	}
	ents[255].LayerCount /= 2
	ents[100].HeadCount = 0 // refused
	ents[400].Kinds = 0     // refused
	for i := range ents {
		ents[i].Marshal(f.arr[i*abi.BlockEntrySize:])
	}
	var in, out [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: n, Buffer: f.arrID}).Marshal(in[:])
	nok, errno := f.ss.Ioctl(abi.CmdLoadBlocks, in[:], out[:])
	if errno != 0 {
		t.Fatal(errno)
	}
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := n * T * H * rb
	wantOK := 0
	for cb, in := range ents {
		var e abi.BlockEntry
		e.Unmarshal(f.arr[cb*abi.BlockEntrySize:])
		groups := uint32(in.LayerCount) * uint32(in.HeadCount) * 2
		switch {
		case cb == 100 || cb == 400:
			if e.Status != abi.BadRequest || e.GroupsOK != 0 {
				t.Fatalf("entry %d: %+v", cb, e)
			}
		case in.Block >= stored:
			if e.Status != abi.Absent || e.GroupsOK != 0 {
				t.Fatalf("entry %d: %+v", cb, e)
			}
		default:
			if e.Status != abi.OK || e.GroupsOK != groups {
				t.Fatalf("entry %d (%d groups): %+v", cb, groups, e)
			}
			wantOK++
			for i := range int(groups) {
				k := geo.KeyAt(in.Block, i)
				off := (2*k.Layer+int(k.Kind))*tensor + ((cb*H+k.Head)*T)*rb
				if got := binary.LittleEndian.Uint64(f.cache[off:]); got != in.Block<<16|uint64(i) {
					t.Fatalf("%v at cache block %d: tag %#x", k, cb, got)
				}
			}
		}
	}
	if int(nok) != wantOK {
		t.Fatalf("n_ok %d, want %d", nok, wantOK)
	}
}

// BenchmarkLoadBlocks measures LOAD_BLOCKS of 1,024 whole 64-group blocks
// per call through an entry array, in process (no FUSE), on an in-memory
// store. ctl-ns/block is the control path per block entry: the call's time
// outside store.Read (decode, O(1) checks, overlap, request building,
// statuses). store-ns/block is store.Read's own (copy and CRC32C of 64
// groups). Both are wall time: on a shared machine compare runs with
// -test.cpu 1 and several counts.
func BenchmarkLoadBlocks(b *testing.B) {
	const perCall, stored = 1024, 64
	// rows=16B: the same 64 groups per block, of 256 bytes, so the
	// store's copy and checksum shrink and the control path, which costs
	// per entry and per group, not per byte, stands out.
	small := blocksGeo
	small.HeadDim = 8
	for _, c := range []struct {
		name string
		geo  layout.Geometry
		nhd  bool
	}{{"hnd", blocksGeo, false}, {"nhd", blocksGeo, true}, {"hnd/rows=16B", small, false}, {"nhd/rows=16B", small, true}} {
		geo := c.geo
		b.Run(fmt.Sprintf("%s/blocks=%d", c.name, perCall), func(b *testing.B) {
			f := newBlocksFixture(b, geo, stored, perCall, c.nhd)
			ids := make([]uint64, perCall)
			for i := range ids {
				ids[i] = uint64(i % stored)
			}
			runtime.GC()
			m0 := f.srv.Metrics()
			b.SetBytes(int64(perCall * geo.GroupsPerBlock() * geo.GroupBytes()))
			b.ResetTimer()
			for range b.N {
				if n := f.loadBlocks(b, geo, ids); n != perCall {
					b.Fatalf("%d ok", n)
				}
			}
			b.StopTimer()
			m1 := f.srv.Metrics()
			entries := float64(b.N * perCall)
			ctlNs := float64((m1.BatchNanos-m0.BatchNanos)-(m1.StoreNanos-m0.StoreNanos)) / entries
			b.ReportMetric(ctlNs, "ctl-ns/block")
			b.ReportMetric(float64(m1.StoreNanos-m0.StoreNanos)/entries, "store-ns/block")
		})
	}
}

// TestPutBlockScratchBoundsItems: an idle block scratch keeps its GPU items
// up to maxKeptItems and drops larger ones, so idle scratches cannot pin
// the memory of the largest calls ever made.
func TestPutBlockScratchBoundsItems(t *testing.T) {
	big := &blockScratch{items: make([]gpu.Item, 0, maxKeptItems+1), owner: make([]int32, 0, maxKeptItems+1)}
	putBlockScratch(big)
	if big.items != nil || big.owner != nil {
		t.Fatalf("kept %d items", cap(big.items))
	}
	small := &blockScratch{items: make([]gpu.Item, 0, 64), owner: make([]int32, 0, 64)}
	putBlockScratch(small)
	if cap(small.items) != 64 || cap(small.owner) != 64 {
		t.Fatalf("dropped a small scratch's items (%d, %d)", cap(small.items), cap(small.owner))
	}
}
