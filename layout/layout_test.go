package layout

import (
	"errors"
	"testing"
)

var llama = Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: BF16, Align: 4096}

func TestGeometrySizes(t *testing.T) {
	for _, c := range []struct {
		name          string
		g             Geometry
		groupBytes    int
		stride        int64
		groups        int
		payload       int64
		shape         string
		layerW, headW string
	}{
		{"llama bf16", llama, 4096, 4096, 512, 512 * 4096, "16x128", "layer-00", "head-0"},
		{"fp8 padded", Geometry{Layers: 2, KVHeads: 12, HeadDim: 64, BlockTokens: 16, DType: FP8, Align: 4096}, 1024, 4096, 48, 48 * 4096, "16x64", "layer-0", "head-00"},
		{"fp32 big", Geometry{Layers: 100, KVHeads: 1, HeadDim: 256, BlockTokens: 32, DType: FP32, Align: 512}, 32768, 32768, 200, 200 * 32768, "32x256", "layer-00", "head-0"},
		{"fp16 odd", Geometry{Layers: 1, KVHeads: 3, HeadDim: 96, BlockTokens: 7, DType: FP16, Align: 512}, 1344, 1536, 6, 6 * 1536, "7x96", "layer-0", "head-0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.g.Validate(); err != nil {
				t.Fatal(err)
			}
			if got := c.g.GroupBytes(); got != c.groupBytes {
				t.Errorf("GroupBytes = %d, want %d", got, c.groupBytes)
			}
			if got := c.g.GroupStride(); got != c.stride {
				t.Errorf("GroupStride = %d, want %d", got, c.stride)
			}
			if got := c.g.GroupsPerBlock(); got != c.groups {
				t.Errorf("GroupsPerBlock = %d, want %d", got, c.groups)
			}
			if got := c.g.PayloadBytes(); got != c.payload {
				t.Errorf("PayloadBytes = %d, want %d", got, c.payload)
			}
			if got := c.g.Shape(); got != c.shape {
				t.Errorf("Shape = %q, want %q", got, c.shape)
			}
			if got := c.g.LayerName(0); got != c.layerW {
				t.Errorf("LayerName(0) = %q, want %q", got, c.layerW)
			}
			if got := c.g.HeadName(0); got != c.headW {
				t.Errorf("HeadName(0) = %q, want %q", got, c.headW)
			}
		})
	}
}

func TestIndexOrder(t *testing.T) {
	g := llama
	// Layer, then K before V, then head: a layer's groups are contiguous.
	for _, c := range []struct {
		k   Key
		idx int
	}{
		{Key{Layer: 0, Kind: K, Head: 0}, 0},
		{Key{Layer: 0, Kind: K, Head: 7}, 7},
		{Key{Layer: 0, Kind: V, Head: 0}, 8},
		{Key{Layer: 0, Kind: V, Head: 7}, 15},
		{Key{Layer: 1, Kind: K, Head: 0}, 16},
		{Key{Layer: 31, Kind: V, Head: 7}, 511},
	} {
		if got := g.Index(c.k); got != c.idx {
			t.Errorf("Index(%v) = %d, want %d", c.k, got, c.idx)
		}
		if got := g.KeyAt(c.k.Block, c.idx); got != c.k {
			t.Errorf("KeyAt(%d) = %v, want %v", c.idx, got, c.k)
		}
		if got := g.Offset(c.idx); got != int64(c.idx)*4096 {
			t.Errorf("Offset(%d) = %d", c.idx, got)
		}
	}
}

func TestValidate(t *testing.T) {
	bad := []Geometry{
		{},
		{Layers: 0, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: BF16, Align: 4096},
		{Layers: 32, KVHeads: -1, HeadDim: 128, BlockTokens: 16, DType: BF16, Align: 4096},
		{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: 9, Align: 4096},
		{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: BF16, Align: 3000},
		{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: BF16, Align: 256},
		{Layers: 1024, KVHeads: 1024, HeadDim: 1, BlockTokens: 1, DType: FP8, Align: 4096},
		{Layers: 1, KVHeads: 1, HeadDim: 16384, BlockTokens: 65536, DType: FP32, Align: 4096},
	}
	for _, g := range bad {
		if err := g.Validate(); !errors.Is(err, ErrGeometry) {
			t.Errorf("Validate(%+v) = %v, want ErrGeometry", g, err)
		}
	}
}

func TestNames(t *testing.T) {
	g := llama
	k := Key{Block: 0xdeadbeef, Layer: 3, Head: 5, Kind: V}
	if got, want := g.Name(k), "layer-03/block-00000000deadbeef/head-5/V"; got != want {
		t.Fatalf("Name = %q, want %q", got, want)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"layer-03/block-00000000deadbeef/head-5/V", nil},
		{"/layer-31/block-ffffffffffffffff/head-7/K", nil},
		{"layer-3/block-00000000deadbeef/head-5/V", ErrName},   // not padded
		{"layer-32/block-00000000deadbeef/head-5/V", ErrRange}, // out of range
		{"layer-03/block-00000000DEADBEEF/head-5/V", ErrName},  // upper case
		{"layer-03/block-deadbeef/head-5/V", ErrName},          // short id
		{"layer-03/block-00000000deadbeef/head-8/V", ErrRange},
		{"layer-03/block-00000000deadbeef/head-5/X", ErrName},
		{"layer-03/block-00000000deadbeef/head-5", ErrName},
		{"layer-+3/block-00000000deadbeef/head-5/V", ErrName},
	} {
		_, err := g.ParseName(c.name)
		if c.err == nil && err != nil || c.err != nil && !errors.Is(err, c.err) {
			t.Errorf("ParseName(%q) = %v, want %v", c.name, err, c.err)
		}
	}
}

func TestParseBlockID(t *testing.T) {
	for _, c := range []struct {
		s  string
		v  uint64
		ok bool
	}{{"0", 0, true}, {"abc", 0xabc, true}, {"0xABC", 0xabc, true}, {"ffffffffffffffff", ^uint64(0), true},
		{"", 0, false}, {"1ffffffffffffffff", 0, false}, {"xyz", 0, false}, {"0x", 0, false}} {
		v, err := ParseBlockID(c.s)
		if (err == nil) != c.ok || c.ok && v != c.v {
			t.Errorf("ParseBlockID(%q) = %x, %v", c.s, v, err)
		}
	}
}

func TestDType(t *testing.T) {
	for _, s := range []string{"bf16", "fp16", "fp32", "fp8"} {
		d, err := ParseDType(s)
		if err != nil || d.String() != s {
			t.Errorf("ParseDType(%q) = %v, %v", s, d, err)
		}
	}
	if _, err := ParseDType("int4"); !errors.Is(err, ErrGeometry) {
		t.Errorf("int4: %v", err)
	}
}

// FuzzNameRoundTrip: every key in range has a name that parses back to it,
// and every name that parses is the canonical name of its key.
func FuzzNameRoundTrip(f *testing.F) {
	f.Add(uint64(0xdeadbeef), 3, 5, true, 32, 8, "layer-03/block-00000000deadbeef/head-5/V")
	f.Add(uint64(0), 0, 0, false, 1, 1, "layer-0/block-0000000000000000/head-0/K")
	f.Add(^uint64(0), 99, 10, true, 100, 11, "x")
	f.Fuzz(func(t *testing.T, block uint64, layer, head int, v bool, layers, heads int, name string) {
		g := Geometry{Layers: layers, KVHeads: heads, HeadDim: 8, BlockTokens: 8, DType: FP8, Align: 512}
		if g.Validate() != nil {
			return
		}
		k := Key{Block: block, Layer: layer, Head: head}
		if v {
			k.Kind = V
		}
		if g.CheckKey(k) == nil {
			got, err := g.ParseName(g.Name(k))
			if err != nil || got != k {
				t.Fatalf("round trip of %v via %q: %v, %v", k, g.Name(k), got, err)
			}
			idx := g.Index(k)
			if idx < 0 || idx >= g.GroupsPerBlock() || g.KeyAt(block, idx) != k {
				t.Fatalf("index %d of %v", idx, k)
			}
		}
		if pk, err := g.ParseName(name); err == nil {
			if g.CheckKey(pk) != nil {
				t.Fatalf("%q parsed to out-of-range %v", name, pk)
			}
			if canon := g.Name(pk); canon != name && "/"+canon != name {
				t.Fatalf("%q parsed to %v whose name is %q", name, pk, canon)
			}
		}
	})
}
