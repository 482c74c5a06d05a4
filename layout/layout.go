package layout

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
)

// Sentinel errors. Every error returned by this package wraps one of them.
var (
	ErrGeometry = errors.New("layout: invalid geometry")
	ErrName     = errors.New("layout: invalid name")
	ErrRange    = errors.New("layout: out of range")
)

// DType is the element type of the KV cache.
type DType uint8

// Supported dtypes. The numeric values are stored on disk: never renumber.
const (
	BF16 DType = 1
	FP16 DType = 2
	FP32 DType = 3
	FP8  DType = 4
)

// ParseDType parses bf16, fp16, fp32 or fp8 (case-insensitive).
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "bf16":
		return BF16, nil
	case "fp16", "f16":
		return FP16, nil
	case "fp32", "f32":
		return FP32, nil
	case "fp8", "f8":
		return FP8, nil
	}
	return 0, fmt.Errorf("%w: unknown dtype %q (want bf16, fp16, fp32 or fp8)", ErrGeometry, s)
}

// Size is the size of one element in bytes, 0 for an unknown dtype.
func (d DType) Size() int {
	switch d {
	case BF16, FP16:
		return 2
	case FP32:
		return 4
	case FP8:
		return 1
	}
	return 0
}

func (d DType) String() string {
	switch d {
	case BF16:
		return "bf16"
	case FP16:
		return "fp16"
	case FP32:
		return "fp32"
	case FP8:
		return "fp8"
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// Kind says whether a group holds keys or values.
type Kind uint8

// K and V. The numeric values give the order inside a slot: K before V.
const (
	K Kind = 0
	V Kind = 1
)

// ParseKind parses "K" or "V" (also lower case).
func ParseKind(s string) (Kind, error) {
	switch s {
	case "K", "k":
		return K, nil
	case "V", "v":
		return V, nil
	}
	return 0, fmt.Errorf("%w: kind %q is not K or V", ErrName, s)
}

func (k Kind) String() string {
	switch k {
	case K:
		return "K"
	case V:
		return "V"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Limits on geometry fields. They keep every derived size far from overflow
// and the slot header within a few sectors.
const (
	MaxLayers      = 1024
	MaxKVHeads     = 1024
	MaxHeadDim     = 16384
	MaxBlockTokens = 65536
	MaxGroups      = 65536 // layers × kv_heads × 2
	MaxGroupBytes  = 64 << 20
	MinAlign       = 512
	MaxAlign       = 1 << 20
	DefaultAlign   = 4096
)

// Geometry describes the KV cache of one model and how it is laid out.
type Geometry struct {
	Layers      int   `json:"layers"`
	KVHeads     int   `json:"kv_heads"`
	HeadDim     int   `json:"head_dim"`
	BlockTokens int   `json:"block_tokens"`
	DType       DType `json:"-"`
	Align       int   `json:"align"`
}

// Validate reports the first inconsistency of g, wrapped in ErrGeometry.
func (g Geometry) Validate() error {
	check := func(name string, v, max int) error {
		if v < 1 || v > max {
			return fmt.Errorf("%w: %s = %d, want 1..%d", ErrGeometry, name, v, max)
		}
		return nil
	}
	for _, c := range []struct {
		name   string
		v, max int
	}{{"layers", g.Layers, MaxLayers}, {"kv-heads", g.KVHeads, MaxKVHeads}, {"head-dim", g.HeadDim, MaxHeadDim}, {"block-tokens", g.BlockTokens, MaxBlockTokens}} {
		if err := check(c.name, c.v, c.max); err != nil {
			return err
		}
	}
	if g.DType.Size() == 0 {
		return fmt.Errorf("%w: unknown dtype %d", ErrGeometry, g.DType)
	}
	if g.Align < MinAlign || g.Align > MaxAlign || bits.OnesCount(uint(g.Align)) != 1 {
		return fmt.Errorf("%w: align = %d, want a power of two in %d..%d", ErrGeometry, g.Align, MinAlign, MaxAlign)
	}
	if n := g.Layers * g.KVHeads * 2; n > MaxGroups {
		return fmt.Errorf("%w: layers × kv-heads × 2 = %d groups per block, at most %d", ErrGeometry, n, MaxGroups)
	}
	if n := g.BlockTokens * g.HeadDim * g.DType.Size(); n > MaxGroupBytes {
		return fmt.Errorf("%w: group of %d bytes, at most %d", ErrGeometry, n, MaxGroupBytes)
	}
	return nil
}

// GroupBytes is the size of one group: block_tokens × head_dim × dtype size.
func (g Geometry) GroupBytes() int { return g.BlockTokens * g.HeadDim * g.DType.Size() }

// RowBytes is the size of one token's row of a group: head_dim × dtype size.
func (g Geometry) RowBytes() int { return g.HeadDim * g.DType.Size() }

// GroupStride is the distance between consecutive groups in a slot: GroupBytes
// rounded up to Align.
func (g Geometry) GroupStride() int64 { return RoundUp(int64(g.GroupBytes()), int64(g.Align)) }

// GroupsPerBlock is layers × kv_heads × 2.
func (g Geometry) GroupsPerBlock() int { return g.Layers * g.KVHeads * 2 }

// Shape is the tile shape as tokens x head_dim, e.g. "16x128".
func (g Geometry) Shape() string { return fmt.Sprintf("%dx%d", g.BlockTokens, g.HeadDim) }

func (g Geometry) String() string {
	return fmt.Sprintf("layers=%d kv-heads=%d head-dim=%d block-tokens=%d dtype=%s align=%d",
		g.Layers, g.KVHeads, g.HeadDim, g.BlockTokens, g.DType, g.Align)
}

// Key names one group.
type Key struct {
	Block uint64
	Layer int
	Head  int
	Kind  Kind
}

func (k Key) String() string {
	return fmt.Sprintf("block %016x layer %d head %d %s", k.Block, k.Layer, k.Head, k.Kind)
}

// CheckKey reports whether k lies inside the geometry (ErrRange otherwise).
func (g Geometry) CheckKey(k Key) error {
	if k.Layer < 0 || k.Layer >= g.Layers {
		return fmt.Errorf("%w: layer %d (store has %d)", ErrRange, k.Layer, g.Layers)
	}
	if k.Head < 0 || k.Head >= g.KVHeads {
		return fmt.Errorf("%w: head %d (store has %d)", ErrRange, k.Head, g.KVHeads)
	}
	if k.Kind != K && k.Kind != V {
		return fmt.Errorf("%w: kind %d", ErrRange, k.Kind)
	}
	return nil
}

// Index is the position of the group inside its block's slot: layer, then K
// before V, then head. The key must be valid (CheckKey).
func (g Geometry) Index(k Key) int {
	return (k.Layer*2+int(k.Kind))*g.KVHeads + k.Head
}

// KeyAt is the inverse of Index for the given block.
func (g Geometry) KeyAt(block uint64, idx int) Key {
	h := idx % g.KVHeads
	lk := idx / g.KVHeads
	return Key{Block: block, Layer: lk / 2, Kind: Kind(lk % 2), Head: h}
}

// Offset is the byte offset of group idx from the start of a slot's payload area.
func (g Geometry) Offset(idx int) int64 { return int64(idx) * g.GroupStride() }

// PayloadBytes is the size of a slot's payload area.
func (g Geometry) PayloadBytes() int64 { return int64(g.GroupsPerBlock()) * g.GroupStride() }

// RoundUp rounds v up to a multiple of a (a > 0).
func RoundUp(v, a int64) int64 { return (v + a - 1) / a * a }

// Names --------------------------------------------------------------------

func width(max int) int { return len(strconv.Itoa(max - 1)) }

// LayerName is "layer-<L>", L zero-padded to the width of the largest layer.
func (g Geometry) LayerName(l int) string { return fmt.Sprintf("layer-%0*d", width(g.Layers), l) }

// HeadName is "head-<H>", H zero-padded to the width of the largest head.
func (g Geometry) HeadName(h int) string { return fmt.Sprintf("head-%0*d", width(g.KVHeads), h) }

// BlockName is "block-<16 lowercase hex digits>".
func BlockName(b uint64) string { return fmt.Sprintf("block-%016x", b) }

// Name is the path of a group relative to the mount point:
// layer-<L>/block-<id>/head-<H>/K|V.
func (g Geometry) Name(k Key) string {
	return g.LayerName(k.Layer) + "/" + BlockName(k.Block) + "/" + g.HeadName(k.Head) + "/" + k.Kind.String()
}

func parseIndex(prefix, s string, w, max int) (int, error) {
	digits, ok := strings.CutPrefix(s, prefix)
	if !ok || len(digits) != w {
		return 0, fmt.Errorf("%w: %q is not %s<%d digits>", ErrName, s, prefix, w)
	}
	v := 0
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("%w: %q is not %s<%d digits>", ErrName, s, prefix, w)
		}
		v = v*10 + int(c-'0')
	}
	if v >= max {
		return 0, fmt.Errorf("%w: %q beyond %d", ErrRange, s, max-1)
	}
	return v, nil
}

// ParseLayerName parses the canonical "layer-<L>" of this geometry.
func (g Geometry) ParseLayerName(s string) (int, error) {
	return parseIndex("layer-", s, width(g.Layers), g.Layers)
}

// ParseHeadName parses the canonical "head-<H>" of this geometry.
func (g Geometry) ParseHeadName(s string) (int, error) {
	return parseIndex("head-", s, width(g.KVHeads), g.KVHeads)
}

// ParseBlockName parses "block-<16 lowercase hex digits>".
func ParseBlockName(s string) (uint64, error) {
	hex, ok := strings.CutPrefix(s, "block-")
	if !ok || len(hex) != 16 {
		return 0, fmt.Errorf("%w: %q is not block-<16 hex digits>", ErrName, s)
	}
	return parseHex(hex, s)
}

// ParseBlockID parses a block id given by a user: 1 to 16 hex digits, with an
// optional 0x prefix.
func ParseBlockID(s string) (uint64, error) {
	hex := strings.TrimPrefix(strings.TrimPrefix(s, "0x"), "0X")
	if len(hex) < 1 || len(hex) > 16 {
		return 0, fmt.Errorf("%w: block id %q is not 1 to 16 hex digits", ErrName, s)
	}
	return parseHex(strings.ToLower(hex), s)
}

func parseHex(hex, orig string) (uint64, error) {
	var v uint64
	for _, c := range hex {
		var d uint64
		switch {
		case c >= '0' && c <= '9':
			d = uint64(c - '0')
		case c >= 'a' && c <= 'f':
			d = uint64(c-'a') + 10
		default:
			return 0, fmt.Errorf("%w: %q is not lowercase hex", ErrName, orig)
		}
		v = v<<4 | d
	}
	return v, nil
}

// ParseName parses the path of a group, "layer-<L>/block-<id>/head-<H>/K|V",
// as produced by Name. A leading "/" is allowed.
func (g Geometry) ParseName(p string) (Key, error) {
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	if len(parts) != 4 {
		return Key{}, fmt.Errorf("%w: %q is not layer-<L>/block-<id>/head-<H>/K|V", ErrName, p)
	}
	var k Key
	var err error
	if k.Layer, err = g.ParseLayerName(parts[0]); err != nil {
		return Key{}, err
	}
	if k.Block, err = ParseBlockName(parts[1]); err != nil {
		return Key{}, err
	}
	if k.Head, err = g.ParseHeadName(parts[2]); err != nil {
		return Key{}, err
	}
	if parts[3] != "K" && parts[3] != "V" {
		return Key{}, fmt.Errorf("%w: %q is not K or V", ErrName, parts[3])
	}
	k.Kind, _ = ParseKind(parts[3])
	return k, nil
}
