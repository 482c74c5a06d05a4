package ctl

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// taggedCall issues LOAD_BLOCKS or STORE_BLOCKS (cmd) of 64-byte entries
// through the fixture's entry array and returns n_ok and the entries as
// the daemon wrote them back.
func (f *blocksFixture) taggedCall(tb testing.TB, cmd uint32, ents []abi.BlockEntryTagged) (int32, []abi.BlockEntryTagged) {
	tb.Helper()
	for i := range ents {
		ents[i].Marshal(f.arr[i*abi.BlockEntryTaggedSize:])
	}
	var in, out [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: f.target, Count: uint32(len(ents)), Buffer: f.arrID}).Marshal(in[:])
	n, errno := f.ss.Ioctl(cmd, in[:], out[:])
	if errno != 0 {
		tb.Fatalf("tagged blocks call: %v", errno)
	}
	got := make([]abi.BlockEntryTagged, len(ents))
	for i := range got {
		got[i].Unmarshal(f.arr[i*abi.BlockEntryTaggedSize:])
	}
	return n, got
}

// whole is a tagged entry for all of block id in cache block cb.
func whole(geo layout.Geometry, id uint64, cb uint32, tag byte, parent uint64) abi.BlockEntryTagged {
	e := abi.BlockEntryTagged{BlockEntry: abi.BlockEntry{Block: id, CacheBlock: cb, LayerCount: uint16(geo.Layers),
		HeadCount: uint16(geo.KVHeads), Kinds: abi.KindsBoth}}
	if tag != 0 {
		e.Tag[0] = tag
	}
	if parent != 0 {
		e.Parent, e.MetaFlags = parent, abi.MetaParent
	}
	return e
}

// cacheBlock returns a copy of cache block cb's bytes in every region of
// the fixture's HND cache.
func (f *blocksFixture) cacheBlock(geo layout.Geometry, cb int) []byte {
	bs := geo.KVHeads * geo.BlockTokens * geo.RowBytes()
	tensor := len(f.cache) / (2 * geo.Layers)
	var out []byte
	for r := range 2 * geo.Layers {
		out = append(out, f.cache[r*tensor+cb*bs:r*tensor+(cb+1)*bs]...)
	}
	return out
}

func (f *blocksFixture) fillCacheBlock(geo layout.Geometry, cb int, v byte) {
	bs := geo.KVHeads * geo.BlockTokens * geo.RowBytes()
	tensor := len(f.cache) / (2 * geo.Layers)
	for r := range 2 * geo.Layers {
		b := f.cache[r*tensor+cb*bs : r*tensor+(cb+1)*bs]
		for i := range b {
			b[i] = v ^ byte(i*7+r)
		}
	}
}

// Two prefixes forced onto one block id through STORE_BLOCKS and
// LOAD_BLOCKS of tagged entries into a host target: a LOAD expecting one
// tag of a block stored under the other is ABSENT with detail
// TAG_MISMATCH and leaves its tiles as they were; a STORE under the other
// tag replaces the block; entries of one STORE disagreeing on a block's
// tag, or naming the block as its own parent, are refused.
func TestTaggedBlocksCollision(t *testing.T) {
	geo := blocksGeo
	f := newBlocksFixture(t, geo, 0, 6, false)
	f.fillCacheBlock(geo, 0, 0xa0)
	f.fillCacheBlock(geo, 1, 0xb0)
	wantA, wantB := f.cacheBlock(geo, 0), f.cacheBlock(geo, 1)

	if n, got := f.taggedCall(t, abi.CmdStoreBlocks, []abi.BlockEntryTagged{whole(geo, 100, 0, 0xa, 0), whole(geo, 101, 0, 0xa, 100)}); n != 2 {
		t.Fatalf("store: n_ok %d: %+v", n, got)
	}
	if bi, ok := f.st.Block(101); !ok || bi.Meta.Tag[0] != 0xa || !bi.Meta.HasParent || bi.Meta.Parent != 100 {
		t.Fatalf("block 101 stored as %+v", bi.Meta)
	}
	load := func(id uint64, tag byte, cb int) abi.BlockEntryTagged {
		t.Helper()
		f.fillCacheBlock(geo, cb, 0x5a)
		_, got := f.taggedCall(t, abi.CmdLoadBlocks, []abi.BlockEntryTagged{whole(geo, id, uint32(cb), tag, 0)})
		return got[0]
	}
	if e := load(100, 0xa, 2); e.Status != abi.OK || !bytes.Equal(f.cacheBlock(geo, 2), wantA) {
		t.Fatalf("load with its tag: %v %v", e.Status, e.Detail)
	}
	if e := load(100, 0, 2); e.Status != abi.OK { // zero tag: unchecked
		t.Fatalf("load without a tag: %v %v", e.Status, e.Detail)
	}
	f.fillCacheBlock(geo, 3, 0x5a)
	before := f.cacheBlock(geo, 3)
	if e := load(100, 0xb, 3); e.Status != abi.Absent || e.Detail != abi.TagMismatch || e.GroupsOK != 0 ||
		!bytes.Equal(f.cacheBlock(geo, 3), before) {
		t.Fatalf("load with another tag: %v %v, %d groups, tiles changed %v", e.Status, e.Detail, e.GroupsOK, !bytes.Equal(f.cacheBlock(geo, 3), before))
	}

	// The other prefix stores under the same id: the block is replaced.
	if n, got := f.taggedCall(t, abi.CmdStoreBlocks, []abi.BlockEntryTagged{whole(geo, 100, 1, 0xb, 0)}); n != 1 {
		t.Fatalf("store under another tag: %+v", got)
	}
	if e := load(100, 0xa, 4); e.Status != abi.Absent || e.Detail != abi.TagMismatch {
		t.Fatalf("load of the replaced prefix: %v %v", e.Status, e.Detail)
	}
	if e := load(100, 0xb, 4); e.Status != abi.OK || !bytes.Equal(f.cacheBlock(geo, 4), wantB) {
		t.Fatalf("load of the new prefix: %v %v", e.Status, e.Detail)
	}
	if f.st.Metrics().TagMismatch == 0 {
		t.Fatal("no tag mismatch counted")
	}

	// Refusals: two tags for one block in one STORE, a block its own parent.
	_, got := f.taggedCall(t, abi.CmdStoreBlocks, []abi.BlockEntryTagged{
		whole(geo, 200, 0, 0x1, 0), whole(geo, 200, 1, 0x2, 0), whole(geo, 201, 0, 0x1, 201), whole(geo, 202, 0, 0x1, 0)})
	for i, want := range []abi.Detail{abi.BadMeta, abi.BadMeta, abi.BadParent} {
		if got[i].Status != abi.BadRequest || got[i].Detail != want {
			t.Errorf("entry %d: %v %v, want BadRequest %v", i, got[i].Status, got[i].Detail, want)
		}
	}
	if got[3].Status != abi.OK {
		t.Errorf("entry 3: %v %v", got[3].Status, got[3].Detail)
	}
	if _, ok := f.st.Block(200); ok {
		t.Error("block 200 stored despite its two tags")
	}

	// A 32-byte STORE keeps the stored block's tag.
	(&abi.BlockEntry{Block: 100, CacheBlock: 0, LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads), Kinds: abi.KindsBoth}).Marshal(f.arr)
	var in, out [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: 1, Buffer: f.arrID}).Marshal(in[:])
	if n, errno := f.ss.Ioctl(abi.CmdStoreBlocks, in[:], out[:]); errno != 0 || n != 1 {
		t.Fatalf("untagged store: %d %v", n, errno)
	}
	if e := load(100, 0xb, 4); e.Status != abi.OK || !bytes.Equal(f.cacheBlock(geo, 4), wantA) {
		t.Fatalf("load after an untagged store: %v %v", e.Status, e.Detail)
	}
}

// LOOKUP answers each (block, tag) pair from the index, in a registered
// buffer and inline, with the counts and the leading present run.
func TestLookup(t *testing.T) {
	geo := blocksGeo
	f := newBlocksFixture(t, geo, 2, 4, false) // blocks 0 and 1, untagged, in 4 slots: block 9 evicts 0
	if n, got := f.taggedCall(t, abi.CmdStoreBlocks, []abi.BlockEntryTagged{whole(geo, 7, 0, 0x7, 0), whole(geo, 8, 1, 0x8, 7)}); n != 2 {
		t.Fatalf("store: %+v", got)
	}
	// Block 9 partly stored: absent to LOOKUP.
	e := whole(geo, 9, 2, 0x9, 8)
	e.LayerCount = 1
	f.taggedCall(t, abi.CmdStoreBlocks, []abi.BlockEntryTagged{e})

	pairs := []abi.LookupPair{{Block: 7, Tag: abi.Tag{0x7}}, {Block: 8}, {Block: 1}, {Block: 8, Tag: abi.Tag{0x7}}, {Block: 9, Tag: abi.Tag{0x9}}, {Block: 1234}}
	want := []abi.LookupStatus{abi.LookupPresent, abi.LookupPresent, abi.LookupPresent, abi.LookupTagMismatch, abi.LookupAbsent, abi.LookupAbsent}
	check := func(what string, n int32, hdr []byte, pairOut []byte) {
		t.Helper()
		var h abi.LookupHeader
		h.Unmarshal(hdr)
		if n != 3 || h.Run != 3 || h.Present != 3 || h.Mismatch != 1 || h.Absent != 2 {
			t.Fatalf("%s: returned %d, header %+v", what, n, h)
		}
		for i := range pairs {
			var p abi.LookupPair
			p.Unmarshal(pairOut[i*abi.LookupPairSize:])
			if p.Status != want[i] || p.Block != pairs[i].Block {
				t.Errorf("%s: pair %d: %v, want %v", what, i, p.Status, want[i])
			}
		}
	}
	// Registered buffer, at an offset.
	const off = 64
	for i := range pairs {
		pairs[i].Marshal(f.arr[off+i*abi.LookupPairSize:])
	}
	in := make([]byte, abi.LookupSize)
	out := make([]byte, abi.LookupSize)
	(&abi.LookupHeader{ABI: abi.Version, Count: uint32(len(pairs)), Buffer: f.arrID, Offset: off}).Marshal(in)
	n, errno := f.ss.Ioctl(abi.CmdLookup, in, out)
	if errno != 0 {
		t.Fatal(errno)
	}
	check("registered", n, out, f.arr[off:])
	// Inline.
	in = make([]byte, abi.LookupInlineSize)
	out = make([]byte, abi.LookupInlineSize)
	(&abi.LookupHeader{ABI: abi.Version, Count: uint32(len(pairs))}).Marshal(in)
	for i := range pairs {
		pairs[i].Marshal(in[abi.LookupSize+i*abi.LookupPairSize:])
	}
	if n, errno = f.ss.Ioctl(abi.CmdLookupInline, in, out); errno != 0 {
		t.Fatal(errno)
	}
	check("inline", n, out, out[abi.LookupSize:])
	// Pairs past the end of the buffer fail the call.
	(&abi.LookupHeader{ABI: abi.Version, Count: 2, Buffer: f.arrID, Offset: uint64(len(f.arr) - abi.LookupPairSize)}).Marshal(in[:abi.LookupSize])
	if _, errno := f.ss.Ioctl(abi.CmdLookup, in[:abi.LookupSize], out[:abi.LookupSize]); errno == 0 {
		t.Fatal("a pair array past its buffer's end was served")
	}
	if m := f.srv.Metrics(); m.Lookups != 2 || m.LookedUp != 12 || m.LookupHits != 6 {
		t.Fatalf("metrics: %d lookups, %d pairs, %d present", m.Lookups, m.LookedUp, m.LookupHits)
	}
}

// taggedInline makes the LOAD_BLOCKS or STORE_BLOCKS call cmd of 64-byte
// entries es, inline, on target tid, and returns them as answered.
func taggedInline(t testing.TB, ss *Session, tid, cmd uint32, es []abi.BlockEntryTagged) []abi.BlockEntryTagged {
	t.Helper()
	in := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: tid, Count: uint32(len(es))}).Marshal(in)
	for i := range es {
		es[i].Marshal(in[abi.BlocksSize+i*abi.BlockEntryTaggedSize:])
	}
	out := make([]byte, len(in))
	if _, errno := ss.Ioctl(cmd, in, out); errno != 0 {
		t.Fatalf("tagged blocks ioctl: %v", errno)
	}
	got := make([]abi.BlockEntryTagged, len(es))
	for i := range got {
		got[i].Unmarshal(out[abi.BlocksSize+i*abi.BlockEntryTaggedSize:])
	}
	return got
}

// A GPU target sees tags as a host one does: a LOAD_BLOCKS entry expecting
// another tag than the stored block's is ABSENT with TAG_MISMATCH and its
// device tiles stay as they were, on the direct route (Locate from the
// store's file in memory) and through staging as tiles checked on the
// device; a STORE_BLOCKS from GPU memory records the entry's tag and
// parent.
func TestGPUTaggedBlocks(t *testing.T) {
	geo := testGeo
	const nb = 4
	bs := geo.BlockTokens * geo.KVHeads * geo.RowBytes()
	size := 2 * geo.Layers * nb * bs
	for _, name := range []string{"staged", "direct", "tiles", "direct/hf", "tiles/hf"} {
		t.Run(name, func(t *testing.T) {
			// "/hf": into a Hugging Face target, heads a sequence apart.
			mode, hf := strings.CutSuffix(name, "/hf")
			lay := "hnd"
			if hf {
				lay = "hf"
			}
			var f *fixture
			var fakes []*fakeGPU
			switch mode {
			case "staged":
				f, fakes = gpuFixture(t, 1)
			case "direct":
				verified := 0
				f, fakes = gpuFixture(t, 1, func(o *GPUOptions, fakes []*fakeGPU) {
					o.VerifyOnGPU = true
					o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
						return &fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}, nil
					}
				})
				f.mem.SetHostView(true)
			default:
				defer func(v bool) { noTiles = v }(noTiles)
				noTiles = false
				verified := 0
				f, fakes = gpuFixtureSized(t, 1, 16, size+129<<20, func(o *GPUOptions, fakes []*fakeGPU) {
					o.VerifyOnGPU = true
					o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
						return &fakeLander{fakeChecker: fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}}, nil
					}
				})
			}
			dev := fakes[0]
			ss := f.open(0, 0)
			id := mustRegisterCUDA(t, ss, 0, gputest.Base, uint64(size), 0, uint64(size))
			deadline := time.Now().Add(10 * time.Second)
			for mode == "direct" && !f.srv.Metrics().GPUHostRegistered {
				if time.Now().After(deadline) {
					t.Fatal("the store file was never registered with the device")
				}
				time.Sleep(time.Millisecond)
			}
			dev.Fill(gputest.Base, bytes.Repeat([]byte{0x5A}, size))
			reqs := make([]store.WriteReq, geo.GroupsPerBlock())
			for i, k := range blockKeys(100) {
				reqs[i] = store.WriteReq{Key: k, Data: groupData(k, 1), Meta: &store.BlockMeta{Tag: store.Tag{0xa}}}
			}
			if err := f.st.Write(reqs); err != nil {
				t.Fatal(err)
			}
			tid, errno := registerTarget(ss, layoutTarget(id, nb, lay))
			if errno != 0 {
				t.Fatalf("register target: %v", errno)
			}
			before := dev.Mem(gputest.Base, size)
			got := taggedInline(t, ss, tid, abi.CmdLoadBlocksInline, []abi.BlockEntryTagged{whole(geo, 100, 0, 0xa, 0), whole(geo, 100, 1, 0xb, 0)})
			if got[0].Status != abi.OK || int(got[0].GroupsOK) != geo.GroupsPerBlock() {
				t.Fatalf("load with its tag: %+v", got[0].BlockEntry)
			}
			if got[1].Status != abi.Absent || got[1].Detail != abi.TagMismatch || got[1].GroupsOK != 0 {
				t.Fatalf("load with another tag: %+v", got[1].BlockEntry)
			}
			after := dev.Mem(gputest.Base, size)
			gb := f.gb
			// at is where head h of cache block c of region r lies.
			at := func(r, h, c int) int { return r*nb*bs + c*bs + h*gb }
			if hf {
				at = func(r, h, c int) int { return r*nb*bs + h*nb*gb + c*gb }
			}
			for r := range 2 * geo.Layers {
				for h := range geo.KVHeads {
					if o := at(r, h, 1); !bytes.Equal(after[o:o+gb], before[o:o+gb]) {
						t.Fatalf("region %d head %d: the mismatched entry's tile was written", r, h)
					}
					if o := at(r, h, 0); bytes.Equal(after[o:o+gb], before[o:o+gb]) {
						t.Fatalf("region %d head %d: the matching entry's tile was not written", r, h)
					}
				}
			}
			if mode == "direct" && f.srv.Metrics().GPUDirect == 0 {
				t.Fatal("the load did not take the direct route")
			}
			st := taggedInline(t, ss, tid, abi.CmdStoreBlocksInline, []abi.BlockEntryTagged{whole(geo, 101, 0, 0xb, 100)})
			if st[0].Status != abi.OK {
				t.Fatalf("store from the GPU: %+v", st[0].BlockEntry)
			}
			if bi, ok := f.st.Block(101); !ok || bi.Meta != (store.BlockMeta{Tag: store.Tag{0xb}, Parent: 100, HasParent: true}) {
				t.Fatalf("block stored from the GPU: %+v", bi.Meta)
			}
			if v := dev.Violations(); len(v) != 0 {
				t.Fatal(v)
			}
		})
	}
}

// On a format version 1 store INFO does not offer tags (no CapPrefix),
// LOOKUP is still served, and a tag the store cannot record is reported
// as a bad request of the entry (BAD_META), a mismatch as ABSENT.
func TestVersion1StoreCaps(t *testing.T) {
	m := storetest.NewMem(store.SizeFor(testGeo, 4), 512)
	if _, err := store.Format(m, testGeo, store.FormatOptions{Version: 1}); err != nil {
		t.Fatal(err)
	}
	st := storetest.Open(t, m, store.Options{})
	srv := NewServer(st, Options{})
	defer srv.Close()
	ss, errno := srv.Open(0, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	defer ss.Release()
	out := make([]byte, abi.InfoSize)
	if _, errno := ss.Ioctl(abi.CmdInfo, nil, out); errno != 0 {
		t.Fatal(errno)
	}
	var in abi.Info
	in.Unmarshal(out)
	if in.Caps&abi.CapPrefix != 0 || in.Caps&abi.CapBlocks == 0 {
		t.Fatalf("caps %#x on a version 1 store", in.Caps)
	}
	lk := make([]byte, abi.LookupInlineSize)
	(&abi.LookupHeader{ABI: abi.Version, Count: 1}).Marshal(lk)
	(&abi.LookupPair{Block: 5}).Marshal(lk[abi.LookupSize:])
	lo := make([]byte, len(lk))
	if n, errno := ss.Ioctl(abi.CmdLookupInline, lk, lo); errno != 0 || n != 0 || abi.LookupStatus(lo[abi.LookupSize+abi.LookupStatusOff]) != abi.LookupAbsent {
		t.Fatalf("lookup on a version 1 store: %d %v", n, errno)
	}
	if st, det := storeStatus(fmt.Errorf("x: %w", store.ErrVersion)); st != abi.BadRequest || det != abi.BadMeta {
		t.Fatalf("a tag for a version 1 store: %v %v", st, det)
	}
	if st, det := loadStatus(store.ErrTagMismatch); st != abi.Absent || det != abi.TagMismatch {
		t.Fatalf("a tag mismatch: %v %v", st, det)
	}
}

// BenchmarkLookupIoctl is LOOKUP of 4,096 (block, tag) pairs of stored,
// tagged whole blocks, from a registered buffer, through the session as
// the FUSE server calls it: the daemon's whole cost of the call (decode,
// copy of the pairs, the store's index, the statuses written back). The
// figure per id is ns/op over 4,096.
func BenchmarkLookupIoctl(b *testing.B) {
	const n = 4096
	f := newFixture(b, n, Options{})
	ids := make([]uint64, n)
	for lo := 0; lo < n; lo += 256 {
		var reqs []store.WriteReq
		for i := lo; i < lo+256; i++ {
			ids[i] = uint64(i+1) * 0x9e3779b97f4a7c15
			m := &store.BlockMeta{Tag: store.Tag{byte(i), byte(i >> 8), 3}}
			for _, k := range blockKeys(ids[i]) {
				reqs = append(reqs, store.WriteReq{Key: k, Data: make([]byte, f.gb), Meta: m})
			}
		}
		if err := f.st.Write(reqs); err != nil {
			b.Fatal(err)
		}
	}
	ss := f.open(0, 0)
	s := newShm(b, n*abi.LookupPairSize, 0)
	id := mustRegister(b, ss, s)
	b.Cleanup(func() { unregister(ss, id) })
	for i := range ids {
		(&abi.LookupPair{Block: ids[i], Tag: abi.Tag{byte(i), byte(i >> 8), 3}}).Marshal(s.mem[i*abi.LookupPairSize:])
	}
	in, out := make([]byte, abi.LookupSize), make([]byte, abi.LookupSize)
	(&abi.LookupHeader{ABI: abi.Version, Count: n, Buffer: id}).Marshal(in)
	b.ResetTimer()
	for range b.N {
		if r, errno := ss.Ioctl(abi.CmdLookup, in, out); errno != 0 || r != n {
			b.Fatalf("lookup: run %d, %v", r, errno)
		}
	}
}
