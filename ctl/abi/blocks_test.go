package abi

import (
	"encoding/binary"
	"errors"
	"testing"
)

// small is a geometry small enough to check targets byte by byte.
var small = Tile{Layers: 3, KVHeads: 4, Rows: 4, RowBytes: 8}

// cover marks every byte of every tile of every region of a validated
// target in per-buffer maps; it reports a byte outside its buffer or
// covered twice.
func cover(t *testing.T, tile Tile, tg *Target, lens map[uint32]uint64) (outside, twice bool) {
	t.Helper()
	maps := map[uint32][]uint8{}
	for id, n := range lens {
		maps[id] = make([]uint8, n)
	}
	for i := range 2 * int(tg.LayerCount) {
		r := tg.Regions[i]
		m := maps[r.Buffer]
		for c := uint64(0); c < uint64(tg.NumBlocks); c++ {
			for h := uint64(0); h < uint64(tg.HeadCount); h++ {
				for row := uint64(0); row < uint64(tile.Rows); row++ {
					base := r.Offset + c*tg.BlockStride + h*tg.HeadStride + row*uint64(tg.RowPitch)
					for x := uint64(0); x < uint64(tile.RowBytes); x++ {
						a := base + x
						if a >= uint64(len(m)) {
							outside = true
							continue
						}
						if m[a]++; m[a] > 1 {
							twice = true
						}
					}
				}
			}
		}
	}
	return outside, twice
}

func lensOf(lens map[uint32]uint64) func(uint32) (uint64, bool) {
	return func(id uint32) (uint64, bool) {
		n, ok := lens[id]
		return n, ok
	}
}

// The layouts of the inference engines, on the small geometry.
func TestCheckTargetLayouts(t *testing.T) {
	const nb, h, T, w = 5, 4, 4, 8 // cache blocks, heads, tokens, row bytes
	tile := small
	block := uint64(T * h * w)
	cases := []struct {
		name string
		tg   Target
		lens map[uint32]uint64
	}{
		{"nhd", Target{NumBlocks: nb, BlockStride: block, HeadStride: w, RowPitch: h * w}, map[uint32]uint64{1: nb * block, 2: nb * block}},
		{"hnd", Target{NumBlocks: nb, BlockStride: block, HeadStride: T * w, RowPitch: w}, map[uint32]uint64{1: nb * block, 2: nb * block}},
		// Hugging Face [kv_heads, seq, head_dim], seq = nb·T tokens.
		{"hf", Target{NumBlocks: nb, BlockStride: T * w, HeadStride: nb * T * w, RowPitch: w}, map[uint32]uint64{1: nb * block, 2: nb * block}},
	}
	for _, c := range cases {
		c.tg.RowBytes, c.tg.LayerCount, c.tg.HeadCount = w, 3, h
		for l := range 3 {
			// K in buffer 1, V in buffer 2, one layer after the other.
			c.tg.Regions[2*l] = TargetRegion{Buffer: 1, Offset: 0}
			c.tg.Regions[2*l+1] = TargetRegion{Buffer: 2, Offset: 0}
		}
		// Three layers need three times the memory.
		for id := range c.lens {
			c.lens[id] *= 3
		}
		for l := range 3 {
			c.tg.Regions[2*l].Offset = uint64(l) * nb * block
			c.tg.Regions[2*l+1].Offset = uint64(l) * nb * block
		}
		lay, err := tile.CheckTarget(&c.tg, lensOf(c.lens))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if lay.Extent != nb*block {
			t.Errorf("%s: extent %d, want %d", c.name, lay.Extent, nb*block)
		}
		if out, twice := cover(t, tile, &c.tg, c.lens); out || twice {
			t.Errorf("%s: accepted a target with outside=%v twice=%v", c.name, out, twice)
		}
		// One byte less of buffer: refused with ErrRange.
		c.lens[2]--
		if _, err := tile.CheckTarget(&c.tg, lensOf(c.lens)); !errors.Is(err, ErrRange) {
			t.Errorf("%s: short buffer: %v", c.name, err)
		}
		c.lens[2]++
		// Two layers at the same place: refused.
		c.tg.Regions[2].Offset = 0
		if _, err := tile.CheckTarget(&c.tg, lensOf(c.lens)); !errors.Is(err, ErrTargetOverlap) {
			t.Errorf("%s: layers 0 and 1 at one offset: %v", c.name, err)
		}
	}

	// FlashInfer [pages, 2, kv_heads, page, head_dim]: K and V of a layer
	// interleaved page by page in one buffer — accepted; V shifted by one
	// row into K — refused.
	tg := Target{NumBlocks: nb, BlockStride: 2 * block, HeadStride: T * w, RowPitch: w, RowBytes: w, LayerCount: 1, HeadCount: h}
	tg.Regions[0] = TargetRegion{Buffer: 1, Offset: 0}
	tg.Regions[1] = TargetRegion{Buffer: 1, Offset: block}
	lens := map[uint32]uint64{1: 2 * nb * block}
	if _, err := tile.CheckTarget(&tg, lensOf(lens)); err != nil {
		t.Fatalf("flashinfer: %v", err)
	}
	tg.Regions[1].Offset = block - w
	if _, err := tile.CheckTarget(&tg, lensOf(lens)); !errors.Is(err, ErrTargetOverlap) {
		t.Fatalf("flashinfer, V one row into K: %v", err)
	}
	// NHD heads of K and V interleaved (V = K + one head): the rows share
	// no byte when the pitch leaves room — here it does not.
	tg = Target{NumBlocks: nb, BlockStride: block, HeadStride: w, RowPitch: h * w, RowBytes: w, LayerCount: 1, HeadCount: h}
	tg.Regions[0] = TargetRegion{Buffer: 1, Offset: 0}
	tg.Regions[1] = TargetRegion{Buffer: 1, Offset: w}
	if _, err := tile.CheckTarget(&tg, lensOf(map[uint32]uint64{1: 2 * nb * block})); !errors.Is(err, ErrTargetOverlap) {
		t.Fatalf("nhd, V one head into K: %v", err)
	}
	// Shard: heads 2..3 of the store, a cache holding only those.
	tg = Target{NumBlocks: nb, BlockStride: T * 2 * w, HeadStride: w, RowPitch: 2 * w, RowBytes: w, LayerFirst: 1, LayerCount: 2, HeadFirst: 2, HeadCount: 2}
	for i := range 4 {
		tg.Regions[i] = TargetRegion{Buffer: 7, Offset: uint64(i) * nb * T * 2 * w}
	}
	lay, err := tile.CheckTarget(&tg, lensOf(map[uint32]uint64{7: 4 * nb * T * 2 * w}))
	if err != nil {
		t.Fatalf("shard: %v", err)
	}
	for _, c := range []struct {
		e    BlockEntry
		want error
	}{
		{BlockEntry{CacheBlock: 4, LayerFirst: 1, LayerCount: 2, HeadFirst: 2, HeadCount: 2, Kinds: KindsBoth}, nil},
		{BlockEntry{CacheBlock: 5, LayerFirst: 1, LayerCount: 2, HeadFirst: 2, HeadCount: 2, Kinds: KindsBoth}, ErrRange},
		{BlockEntry{CacheBlock: 0, LayerFirst: 0, LayerCount: 1, HeadFirst: 2, HeadCount: 1, Kinds: KindsK}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 2, LayerCount: 2, HeadFirst: 2, HeadCount: 1, Kinds: KindsK}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 1, HeadCount: 1, Kinds: KindsV}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 3, HeadCount: 2, Kinds: KindsV}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 2, HeadCount: 0, Kinds: KindsV}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 2, HeadCount: 1, Kinds: 0}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 2, HeadCount: 1, Kinds: 4}, ErrKey},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 2, HeadCount: 1, Kinds: 1, Reserved: 1}, ErrReserved},
		{BlockEntry{CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 2, HeadCount: 1, Kinds: 1, Reserved1: 1}, ErrReserved},
	} {
		n, err := lay.CheckBlock(&c.e)
		if !errors.Is(err, c.want) || (c.want == nil && n != 8) {
			t.Errorf("%+v: %d %v, want %v", c.e, n, err, c.want)
		}
	}
}

func TestCheckTargetRejects(t *testing.T) {
	good := func() (Target, map[uint32]uint64) {
		tg := Target{NumBlocks: 2, BlockStride: 128, HeadStride: 32, RowPitch: 8, RowBytes: 8, LayerCount: 1, HeadCount: 4}
		tg.Regions[0] = TargetRegion{Buffer: 1}
		tg.Regions[1] = TargetRegion{Buffer: 1, Offset: 256}
		return tg, map[uint32]uint64{1: 512}
	}
	tg, lens := good()
	if _, err := small.CheckTarget(&tg, lensOf(lens)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		mod  func(*Target)
		want error
	}{
		{"row bytes", func(t *Target) { t.RowBytes = 16 }, ErrTarget},
		{"no layers", func(t *Target) { t.LayerCount = 0 }, ErrTarget},
		{"layers past the store", func(t *Target) { t.LayerFirst = 3 }, ErrTarget},
		{"heads past the store", func(t *Target) { t.HeadFirst = 1 }, ErrTarget},
		{"no heads", func(t *Target) { t.HeadCount = 0 }, ErrTarget},
		{"no blocks", func(t *Target) { t.NumBlocks = 0 }, ErrTarget},
		{"rows overlap", func(t *Target) { t.RowPitch = 7 }, ErrTarget},
		{"heads overlap", func(t *Target) { t.HeadStride = 24 }, ErrTarget},
		{"blocks overlap", func(t *Target) { t.BlockStride = 120 }, ErrTarget},
		{"zero strides", func(t *Target) { t.BlockStride, t.HeadStride = 0, 0 }, ErrTarget},
		{"huge stride", func(t *Target) { t.BlockStride = 1 << 63 }, ErrRange},
		{"extent overflows", func(t *Target) { t.BlockStride, t.NumBlocks = 1<<63, 3 }, ErrTarget},
		{"huge offset", func(t *Target) { t.Regions[1].Offset = ^uint64(0) - 10 }, ErrRange},
		{"unknown buffer", func(t *Target) { t.Regions[1].Buffer = 9 }, ErrBuffer},
		{"region reserved", func(t *Target) { t.Regions[0].Reserved = 1 }, ErrReserved},
		{"region past the layers", func(t *Target) { t.Regions[2].Buffer = 1 }, ErrReserved},
		{"header reserved", func(t *Target) { t.Reserved[1] = 1 }, ErrReserved},
		{"K and V overlap", func(t *Target) { t.Regions[1].Offset = 248 }, ErrTargetOverlap},
	} {
		tg, lens := good()
		c.mod(&tg)
		if _, err := small.CheckTarget(&tg, lensOf(lens)); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
}

// FuzzValidateTarget: a target the validator accepts keeps every byte of
// every tile inside its buffer and covers no byte twice; and among targets
// whose strides nest, it refuses exactly the ones whose regions share a
// byte (compared with a byte map).
func FuzzValidateTarget(f *testing.F) {
	f.Add(uint8(4), uint8(3), uint16(128), uint16(8), uint16(32), uint8(4), uint16(0), uint16(256), uint16(512), uint8(1))
	f.Add(uint8(2), uint8(4), uint16(256), uint16(32), uint16(8), uint8(2), uint16(0), uint16(128), uint16(512), uint8(2))
	f.Add(uint8(3), uint8(2), uint16(64), uint16(16), uint16(8), uint8(1), uint16(64), uint16(8), uint16(400), uint8(3))
	f.Fuzz(func(t *testing.T, nb, nh uint8, bs, hs, rp uint16, rows uint8, offK, offV, blen uint16, flags uint8) {
		tile := Tile{Layers: 2, KVHeads: 8, Rows: uint32(rows%5) + 1, RowBytes: 8}
		tg := Target{
			NumBlocks: uint32(nb % 6), BlockStride: uint64(bs % 1024), HeadStride: uint64(hs % 256), RowPitch: uint32(rp % 128),
			RowBytes: 8, LayerCount: 1, HeadCount: uint16(nh % 9), HeadFirst: uint16(flags>>4) % 8,
		}
		tg.Regions[0] = TargetRegion{Buffer: 1, Offset: uint64(offK % 2048)}
		vbuf := uint32(1)
		if flags&1 != 0 {
			vbuf = 2
		}
		tg.Regions[1] = TargetRegion{Buffer: vbuf, Offset: uint64(offV % 2048)}
		lens := map[uint32]uint64{1: uint64(blen % 4096), 2: uint64(blen % 4096)}
		lay, err := tile.CheckTarget(&tg, lensOf(lens))
		if err == nil {
			if out, twice := cover(t, tile, &tg, lens); out || twice {
				t.Fatalf("accepted %+v (lens %v): outside=%v twice=%v", tg, lens, out, twice)
			}
			// The O(1) tile offsets stay within the extent.
			for c := range tg.NumBlocks {
				for h := lay.HeadFirst; h < lay.HeadEnd; h++ {
					if lay.TileOffset(c, h)+lay.TileBytes > lay.Extent {
						t.Fatalf("tile (%d,%d) past the extent", c, h)
					}
				}
			}
			return
		}
		if errors.Is(err, ErrTargetOverlap) {
			// Refused for an overlap: there is one (with unlimited buffers).
			big := map[uint32]uint64{1: 1 << 16, 2: 1 << 16}
			if _, twice := cover(t, tile, &tg, big); !twice {
				t.Fatalf("refused %+v for an overlap that a byte map does not find", tg)
			}
		}
	})
}

// FuzzBlocks: the decoder of the minor-2 commands never panics, accepts
// only requests whose fixed fields are valid, and CheckBlock accepts only
// entries inside the target.
func FuzzBlocks(f *testing.F) {
	var h [BlocksInlineSize]byte
	b := Blocks{ABI: Version, Target: 1, Count: 2}
	b.Marshal(h[:])
	e := BlockEntry{Block: 7, CacheBlock: 1, LayerCount: 2, HeadCount: 4, Kinds: KindsBoth}
	e.Marshal(h[BlocksSize:])
	e.CacheBlock = 9
	e.Marshal(h[BlocksSize+BlockEntrySize:])
	f.Add(uint8(0), h[:])
	f.Add(uint8(4), h[:BlocksSize])
	var tg [TargetSize]byte
	(&Target{ABI: Version, NumBlocks: 3, RowBytes: 8, LayerCount: 1, HeadCount: 1}).Marshal(tg[:])
	f.Add(uint8(2), tg[:])
	lay, err := small.CheckTarget(&Target{NumBlocks: 4, BlockStride: 128, HeadStride: 32, RowPitch: 8, RowBytes: 8, LayerCount: 3, HeadCount: 4,
		Regions: [TargetMaxRegions]TargetRegion{{Buffer: 1}, {Buffer: 1, Offset: 512}, {Buffer: 1, Offset: 1024}, {Buffer: 1, Offset: 1536},
			{Buffer: 1, Offset: 2048}, {Buffer: 1, Offset: 2560}}}, func(uint32) (uint64, bool) { return 4096, true })
	if err != nil {
		f.Fatal(err)
	}
	cmds := []uint32{CmdLoadBlocksInline, CmdStoreBlocksInline, CmdRegisterTarget, CmdUnregisterTarget, CmdLoadBlocks, CmdStoreBlocks}
	f.Fuzz(func(t *testing.T, which uint8, in []byte) {
		cmd := cmds[int(which)%len(cmds)]
		size := IoctlSize(cmd)
		if len(in) > size {
			in = in[:size]
		}
		arg := make([]byte, size)
		copy(arg, in)
		r, err := Decode(cmd, arg, size)
		if cmd == CmdUnregisterTarget {
			r, err = Decode(cmd, arg, 0)
		}
		if err != nil {
			return
		}
		switch r.Op {
		case OpRegisterTarget:
			tg := r.Blocks.Target
			if tg == nil || tg.ABI != Version || tg.Flags != 0 || tg.Target != 0 || tg.Reserved != [2]uint64{} {
				t.Fatalf("accepted target %+v", tg)
			}
			_, _ = small.CheckTarget(tg, func(uint32) (uint64, bool) { return 1 << 20, true })
		case OpLoadBlocks, OpStoreBlocks:
			hd := r.Blocks.Header
			if hd.ABI != Version || hd.Flags&^BlocksTagged != 0 || hd.NOK != 0 || hd.Groups != 0 || hd.Count > uint32(r.Max) {
				t.Fatalf("accepted header %+v", hd)
			}
			sz := hd.EntrySize()
			if r.Inline {
				if hd.Buffer != 0 || hd.Offset != 0 || len(r.Blocks.Entries) != int(hd.Count)*sz || BlocksSize+len(r.Blocks.Entries) > len(arg) {
					t.Fatalf("inline header %+v, %d entry bytes", hd, len(r.Blocks.Entries))
				}
			} else if hd.Count > 0 && (hd.Buffer == 0 || hd.Offset%8 != 0) {
				t.Fatalf("entry array %+v", hd)
			}
			for i := 0; i < len(r.Blocks.Entries); i += sz {
				var et BlockEntryTagged
				et.UnmarshalSized(r.Blocks.Entries[i:], sz)
				e := et.BlockEntry
				n, err := lay.CheckTagged(&et)
				if err != nil {
					continue
				}
				if et.Reserved2 != 0 || et.MetaFlags&^MetaParent != 0 || (et.HasParent() && et.Parent == et.Block) ||
					(!et.HasParent() && et.Parent != 0) {
					t.Fatalf("accepted tagged entry %+v", et)
				}
				if e.CacheBlock >= lay.NumBlocks || uint32(e.LayerFirst) < lay.LayerFirst ||
					uint32(e.LayerFirst)+uint32(e.LayerCount) > lay.LayerEnd || uint32(e.HeadFirst) < lay.HeadFirst ||
					uint32(e.HeadFirst)+uint32(e.HeadCount) > lay.HeadEnd || n <= 0 || e.Kinds == 0 || e.Kinds > 3 {
					t.Fatalf("accepted entry %+v", e)
				}
				if lay.TileOffset(e.CacheBlock, uint32(e.HeadFirst+e.HeadCount-1))+lay.TileBytes > lay.Extent {
					t.Fatalf("entry %+v reaches past the region", e)
				}
			}
		case OpUnregisterTarget:
			if binary.LittleEndian.Uint32(arg) != Version {
				t.Fatal("unregister-target with another version accepted")
			}
		default:
			t.Fatalf("op %v", r.Op)
		}
	})
}
