package ctl

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/store"
)

// TestTierBlocks: with a DRAM tier, STORE_BLOCKS writes through it
// (keeping whole blocks it wrote, up to half the tier per call) and
// LOAD_BLOCKS lands from it, promoting what it lacks (a call of more
// blocks than the tier holds lands them all), serving repeats from memory,
// and never a version the store replaced, even by a write that did not pass
// through the tier (the GPU path's stores).
func TestTierBlocks(t *testing.T) {
	geo := blocksGeo
	for _, nhd := range []bool{false, true} {
		const nb = 8
		f := newBlocksFixtureTier(t, geo, nb, nb, nhd, 2)
		tr := f.srv.opts.Tier
		rnd := rand.New(rand.NewPCG(3, 4))
		for i := range f.cache {
			f.cache[i] = byte(rnd.UintN(256))
		}
		want := slices.Clone(f.cache)
		ids := make([]uint64, nb)
		for cb := range ids {
			ids[cb] = uint64(700 + cb)
			(&abi.BlockEntry{Block: ids[cb], CacheBlock: uint32(cb), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
				Kinds: abi.KindsBoth}).Marshal(f.arr[cb*abi.BlockEntrySize:])
		}
		var in, out [abi.BlocksSize]byte
		(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: nb, Buffer: f.arrID}).Marshal(in[:])
		if n, errno := f.ss.Ioctl(abi.CmdStoreBlocks, in[:], out[:]); errno != 0 || n != nb {
			t.Fatalf("nhd=%v: store: %d, %v", nhd, n, errno)
		}
		clear(f.cache)
		if n := f.loadBlocks(t, geo, ids); n != nb {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		if !bytes.Equal(f.cache, want) {
			t.Fatalf("nhd=%v: blocks loaded through the tier differ from those stored", nhd)
		}
		m := tr.Metrics()
		if m.Blocks != 2 || m.Hits+m.Misses != uint64(nb*geo.GroupsPerBlock()) || m.WrittenBytes == 0 {
			t.Fatalf("nhd=%v: after the first load: %+v", nhd, m)
		}

		// The two blocks the tier holds, again: hits, the same bytes.
		var held []uint64
		for _, b := range ids {
			if tr.Holds(b) {
				held = append(held, b)
			}
		}
		if len(held) != 2 {
			t.Fatalf("nhd=%v: tier holds %v", nhd, held)
		}
		clear(f.cache)
		if n := f.loadBlocks(t, geo, held); n != 2 {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		if m2 := tr.Metrics(); m2.Hits != m.Hits+uint64(2*geo.GroupsPerBlock()) {
			t.Fatalf("nhd=%v: a repeat load missed: %+v", nhd, m2)
		}
		blockBytes := geo.BlockTokens * geo.KVHeads * geo.RowBytes()
		tensor := nb * blockBytes
		for r := range 2 * geo.Layers {
			for cb, b := range held {
				src := int(b-700) * blockBytes
				if !bytes.Equal(f.cache[r*tensor+cb*blockBytes:][:blockBytes], want[r*tensor+src:][:blockBytes]) {
					t.Fatalf("nhd=%v: block %d differs from the tier", nhd, b)
				}
			}
		}

		// Replaced in the store behind the tier's back: the new bytes.
		b := held[0]
		reqs := make([]store.WriteReq, geo.GroupsPerBlock())
		for i := range reqs {
			reqs[i] = store.WriteReq{Key: geo.KeyAt(b, i), Data: bytes.Repeat([]byte{byte(i + 1)}, geo.GroupBytes())}
		}
		if err := f.st.Write(reqs); err != nil {
			t.Fatal(err)
		}
		if n := f.loadBlocks(t, geo, []uint64{b}); n != 1 {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		for i := range geo.GroupsPerBlock() {
			k := geo.KeyAt(b, i)
			o := (2*k.Layer+int(k.Kind))*tensor + k.Head*geo.BlockTokens*geo.RowBytes()
			if nhd {
				o = (2*k.Layer+int(k.Kind))*tensor + k.Head*geo.RowBytes()
			}
			if f.cache[o] != byte(i+1) {
				t.Fatalf("nhd=%v: group %v: %#x, want the store's new %#x", nhd, k, f.cache[o], i+1)
			}
		}
	}
}

// TestTierV1: v1 STORE writes through the tier, which keeps the whole
// block it wrote, so that v1 LOAD lands it from memory at once, and a
// version replaced in the store is never served.
func TestTierV1(t *testing.T) {
	f := newFixtureTier(t, 8, Options{}, 4)
	tr := f.srv.opts.Tier
	ss := f.open(0, 0)
	keys := blockKeys(0x10)
	s := newShm(t, len(keys)*f.gb, 4096)
	id := mustRegister(t, ss, s)
	defer unregister(ss, id)
	var es []abi.Entry
	for i, k := range keys {
		copy(s.mem[i*f.gb:], groupData(k, 1))
		es = append(es, entry(k, id, uint64(i*f.gb), 0))
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %+v", e)
		}
	}
	for round, version := range []int{1, 1, 2} {
		if round == 2 {
			f.put(keys, 2) // straight to the store
		}
		clear(s.mem[:s.n])
		hits := tr.Metrics().Hits
		for _, e := range mustBatch(t, ss, true, es) {
			if e.Status != abi.OK {
				t.Fatalf("load: %+v", e)
			}
		}
		for i, k := range keys {
			if !bytes.Equal(s.mem[i*f.gb:(i+1)*f.gb], groupData(k, version)) {
				t.Fatalf("round %d: %v: loaded bytes are not version %d", round, k, version)
			}
		}
		if hit := tr.Metrics().Hits > hits; hit != (round < 2) {
			t.Fatalf("round %d: served from the tier: %v", round, hit)
		}
	}
	s.checkGuard(t)
}

// TestTierGPU: loads into GPU memory from a store whose file is not in
// memory read through the tier (the repeat is a hit), never a version the
// store replaced; stores from GPU memory write through it and drop its
// copy of the block.
func TestTierGPU(t *testing.T) {
	o, fakes := fakeGPUOptions(t, 1, fakeArena)
	f := newFixtureTier(t, 16, Options{GPU: o}, 4)
	tr := f.srv.opts.Tier
	dev := fakes[0]
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(3)
	f.put(keys, 1)
	base := gputest.Base
	n := uint64(len(keys)) * gb
	id := mustRegisterCUDA(t, ss, 0, base, 2*n, 0, 2*n)
	load := func(block uint64, at uint64, version int, src uint64) {
		t.Helper()
		var es []abi.Entry
		for i, k := range blockKeys(block) {
			es = append(es, entry(k, id, at+uint64(i)*gb, 0))
		}
		dev.Fill(base+at, bytes.Repeat([]byte{0xAB}, int(n)))
		for i, e := range mustBatch(t, ss, true, es) {
			k := blockKeys(src)[i]
			if e.Status != abi.OK || !bytes.Equal(dev.Mem(base+at+uint64(i)*gb, int(gb)), groupData(k, version)) {
				t.Fatalf("block %d entry %d: %v, or not version %d", block, i, e.Status, version)
			}
		}
	}
	for round, version := range []int{1, 1, 2} {
		if round == 2 {
			f.put(keys, 2) // straight to the store
		}
		hits := tr.Metrics().Hits
		load(3, 0, version, 3)
		if hit := tr.Metrics().Hits > hits; hit != (round == 1) {
			t.Fatalf("round %d: served from the tier: %v", round, hit)
		}
	}
	// Store the device's tiles of block 3 as block 9, load them back.
	var es []abi.Entry
	for i, k := range keys {
		k.Block = 9
		es = append(es, entry(k, id, uint64(i)*gb, 0))
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %v", e.Status)
		}
	}
	load(9, n, 2, 3)
	if !tr.Holds(9) {
		t.Fatal("a GPU load did not bring block 9 into the tier")
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %v", e.Status)
		}
	}
	if tr.Holds(9) {
		t.Fatal("a GPU store of block 9 left the tier's copy")
	}
	if v := dev.Violations(); len(v) != 0 {
		t.Fatalf("fake device violations: %v", v)
	}
}
