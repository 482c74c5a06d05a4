package abi

import (
	"cmp"
	"errors"
	"fmt"
	"math/bits"
	"slices"
)

// ABI minor 2: KV-cache targets and block-granular LOAD/STORE.
//
// A client registers a target once: for each (layer, K|V) of a layer range
// a registered buffer and the offset of cache block 0, head 0, and the
// strides of its paged layout (block stride, head stride, token row pitch).
// The tile of (cache block c, head h) of that (layer, kind) starts at
// offset + c·BlockStride + (h−HeadFirst)·HeadStride, and its row r at
// + r·RowPitch, each row RowBytes long. A block entry then names (block id,
// cache block, layer range, head range, kinds): one entry per block.

// Sizes of the minor-2 structs.
const (
	TargetHeaderSize     = 64
	RegionSize           = 16
	TargetMaxRegions     = 1016 // (layer, kind) pairs of one target
	TargetMaxLayers      = TargetMaxRegions / 2
	TargetSize           = TargetHeaderSize + TargetMaxRegions*RegionSize // 16320
	UnregisterTargetSize = 8
	BlocksSize           = 64 // struct kvfs_blocks
	BlockEntrySize       = 32
	// BlocksMax is the most entries one LOAD_BLOCKS/STORE_BLOCKS names in
	// a registered buffer.
	BlocksMax = 65536
	// BlocksInlineMax is the entries that fit after the header in one
	// restricted ioctl argument.
	BlocksInlineMax  = (MaxIoctlSize - BlocksSize) / BlockEntrySize // 509
	BlocksInlineSize = BlocksSize + BlocksInlineMax*BlockEntrySize  // 16352
)

// The minor-2 ioctl commands.
var (
	CmdRegisterTarget    = ioc(dirRead|dirWrite, 0x20, TargetSize)
	CmdUnregisterTarget  = ioc(dirWrite, 0x21, UnregisterTargetSize)
	CmdLoadBlocks        = ioc(dirRead|dirWrite, 0x22, BlocksSize)
	CmdStoreBlocks       = ioc(dirRead|dirWrite, 0x23, BlocksSize)
	CmdLoadBlocksInline  = ioc(dirRead|dirWrite, 0x24, BlocksInlineSize)
	CmdStoreBlocksInline = ioc(dirRead|dirWrite, 0x25, BlocksInlineSize)
)

// CapBlocks: REGISTER_TARGET, UNREGISTER_TARGET, LOAD_BLOCKS, STORE_BLOCKS
// and their inline forms (minor 2).
const CapBlocks uint64 = 1 << 7

// Kinds of a block entry (bit mask).
const (
	KindsK    = 1
	KindsV    = 2
	KindsBoth = KindsK | KindsV
)

// Operations of minor 2 (values apart from the iota list of minor 0/1).
const (
	OpRegisterTarget Op = 0x20 + iota
	OpUnregisterTarget
	OpLoadBlocks
	OpStoreBlocks
)

func (o Op) blocksString() string {
	switch o {
	case OpRegisterTarget:
		return "register-target"
	case OpUnregisterTarget:
		return "unregister-target"
	case OpLoadBlocks:
		return "load-blocks"
	case OpStoreBlocks:
		return "store-blocks"
	}
	return ""
}

// Errors of minor 2. A REGISTER_TARGET that fails returns one of them (or
// ErrBuffer, ErrRange, ErrReserved, ErrFlags, ErrVersion).
var (
	// ErrTarget: the target's fields are inconsistent (a count of 0, a
	// layer or head range outside the store, row_bytes not the store's,
	// strides under which tiles or rows overlap). EINVAL.
	ErrTarget = errors.New("kvfs/abi: malformed target")
	// ErrTargetOverlap: two tiles of the target share a byte (regions of
	// one buffer too close). EINVAL.
	ErrTargetOverlap = errors.New("kvfs/abi: target regions overlap")
	// ErrNoTarget: LOAD_BLOCKS/STORE_BLOCKS name a target not registered on
	// this open file. ENOENT.
	ErrNoTarget = errors.New("kvfs/abi: target not registered on this handle")
	// ErrEntries: the entry array of a LOAD_BLOCKS/STORE_BLOCKS is not
	// inside its registered buffer (ERANGE), or is inside the target's
	// cache memory (EINVAL, reported as ErrEntriesInCache).
	ErrEntries        = errors.New("kvfs/abi: block entry array outside its buffer")
	ErrEntriesAt      = errors.New("kvfs/abi: block entry array needs a buffer id and an 8-aligned offset") // EINVAL
	ErrEntriesInCache = errors.New("kvfs/abi: block entry array inside the target's cache memory")
)

// TargetRegion is struct kvfs_target_region: where one (layer, kind) of a
// target lives.
type TargetRegion struct {
	Offset   uint64 // of cache block 0, head HeadFirst, row 0
	Buffer   uint32
	Reserved uint32
}

// Target is struct kvfs_target (REGISTER_TARGET, in/out).
type Target struct {
	ABI         uint32
	Flags       uint32
	Target      uint32 // out: target id (never 0); 0 on input
	NumBlocks   uint32 // cache blocks: valid cache block indexes are 0..NumBlocks-1
	BlockStride uint64 // bytes from cache block c to c+1
	HeadStride  uint64 // bytes from head h to h+1
	RowPitch    uint32 // bytes from token row r to r+1
	RowBytes    uint32 // must equal INFO.row_bytes (head_dim × dtype)
	LayerFirst  uint16
	LayerCount  uint16
	HeadFirst   uint16
	HeadCount   uint16
	Reserved    [2]uint64
	// Regions[2·(layer−LayerFirst)+kind] for the LayerCount layers; the
	// rest must be zero.
	Regions [TargetMaxRegions]TargetRegion
}

// Marshal encodes t into b (TargetSize bytes).
func (t *Target) Marshal(b []byte) {
	_ = b[TargetSize-1]
	le.PutUint32(b[0:], t.ABI)
	le.PutUint32(b[4:], t.Flags)
	le.PutUint32(b[8:], t.Target)
	le.PutUint32(b[12:], t.NumBlocks)
	le.PutUint64(b[16:], t.BlockStride)
	le.PutUint64(b[24:], t.HeadStride)
	le.PutUint32(b[32:], t.RowPitch)
	le.PutUint32(b[36:], t.RowBytes)
	le.PutUint16(b[40:], t.LayerFirst)
	le.PutUint16(b[42:], t.LayerCount)
	le.PutUint16(b[44:], t.HeadFirst)
	le.PutUint16(b[46:], t.HeadCount)
	le.PutUint64(b[48:], t.Reserved[0])
	le.PutUint64(b[56:], t.Reserved[1])
	for i := range t.Regions {
		r := &t.Regions[i]
		o := TargetHeaderSize + i*RegionSize
		le.PutUint64(b[o:], r.Offset)
		le.PutUint32(b[o+8:], r.Buffer)
		le.PutUint32(b[o+12:], r.Reserved)
	}
}

// Unmarshal decodes b (TargetSize bytes) into t.
func (t *Target) Unmarshal(b []byte) {
	_ = b[TargetSize-1]
	t.ABI = le.Uint32(b[0:])
	t.Flags = le.Uint32(b[4:])
	t.Target = le.Uint32(b[8:])
	t.NumBlocks = le.Uint32(b[12:])
	t.BlockStride = le.Uint64(b[16:])
	t.HeadStride = le.Uint64(b[24:])
	t.RowPitch = le.Uint32(b[32:])
	t.RowBytes = le.Uint32(b[36:])
	t.LayerFirst = le.Uint16(b[40:])
	t.LayerCount = le.Uint16(b[42:])
	t.HeadFirst = le.Uint16(b[44:])
	t.HeadCount = le.Uint16(b[46:])
	t.Reserved[0] = le.Uint64(b[48:])
	t.Reserved[1] = le.Uint64(b[56:])
	for i := range t.Regions {
		r := &t.Regions[i]
		o := TargetHeaderSize + i*RegionSize
		r.Offset = le.Uint64(b[o:])
		r.Buffer = le.Uint32(b[o+8:])
		r.Reserved = le.Uint32(b[o+12:])
	}
}

// TargetOutOff is the offset of Target.Target, the one output field.
const TargetOutOff = 8

// UnregisterTarget is struct kvfs_unregister_target.
type UnregisterTarget struct {
	ABI    uint32
	Target uint32
}

// Marshal encodes u into b (UnregisterTargetSize bytes).
func (u *UnregisterTarget) Marshal(b []byte) {
	_ = b[UnregisterTargetSize-1]
	le.PutUint32(b[0:], u.ABI)
	le.PutUint32(b[4:], u.Target)
}

// Unmarshal decodes b (UnregisterTargetSize bytes) into u.
func (u *UnregisterTarget) Unmarshal(b []byte) {
	_ = b[UnregisterTargetSize-1]
	u.ABI = le.Uint32(b[0:])
	u.Target = le.Uint32(b[4:])
}

// Blocks is struct kvfs_blocks, the header of LOAD_BLOCKS/STORE_BLOCKS
// (whose Count entries live in registered buffer Buffer at Offset) and of
// their inline forms (entries follow the header; Buffer and Offset 0).
type Blocks struct {
	ABI      uint32
	Flags    uint32
	Target   uint32
	Count    uint32
	Buffer   uint32 // buffer holding the entry array (0 inline)
	NOK      uint32 // out: entries with status OK
	Offset   uint64 // of the entry array in Buffer, a multiple of 8 (0 inline)
	Groups   uint64 // out: groups moved with status OK, all entries
	Reserved [3]uint64
}

// Offsets of the output fields of Blocks.
const (
	BlocksNOKOff    = 20
	BlocksGroupsOff = 32
)

// Marshal encodes h into b (BlocksSize bytes).
func (h *Blocks) Marshal(b []byte) {
	_ = b[BlocksSize-1]
	le.PutUint32(b[0:], h.ABI)
	le.PutUint32(b[4:], h.Flags)
	le.PutUint32(b[8:], h.Target)
	le.PutUint32(b[12:], h.Count)
	le.PutUint32(b[16:], h.Buffer)
	le.PutUint32(b[20:], h.NOK)
	le.PutUint64(b[24:], h.Offset)
	le.PutUint64(b[32:], h.Groups)
	for k, v := range h.Reserved {
		le.PutUint64(b[40+8*k:], v)
	}
}

// Unmarshal decodes b (BlocksSize bytes) into h.
func (h *Blocks) Unmarshal(b []byte) {
	_ = b[BlocksSize-1]
	h.ABI = le.Uint32(b[0:])
	h.Flags = le.Uint32(b[4:])
	h.Target = le.Uint32(b[8:])
	h.Count = le.Uint32(b[12:])
	h.Buffer = le.Uint32(b[16:])
	h.NOK = le.Uint32(b[20:])
	h.Offset = le.Uint64(b[24:])
	h.Groups = le.Uint64(b[32:])
	for k := range h.Reserved {
		h.Reserved[k] = le.Uint64(b[40+8*k:])
	}
}

// BlockEntry is struct kvfs_block_entry: one block of the store to or from
// one cache block of the target.
type BlockEntry struct {
	Block      uint64 // block id in the store
	CacheBlock uint32 // cache block index in the target
	LayerFirst uint16
	LayerCount uint16
	HeadFirst  uint16
	HeadCount  uint16
	Kinds      uint8 // KindsK, KindsV or KindsBoth
	Status     Status
	Detail     Detail
	Reserved   uint8
	GroupsOK   uint32 // out: groups of the entry with status OK
	Reserved1  uint32
}

// Offsets of the output fields of BlockEntry.
const (
	BlockStatusOff   = 21
	BlockDetailOff   = 22
	BlockGroupsOKOff = 24
)

// Marshal encodes e into b (BlockEntrySize bytes).
func (e *BlockEntry) Marshal(b []byte) {
	_ = b[BlockEntrySize-1]
	le.PutUint64(b[0:], e.Block)
	le.PutUint32(b[8:], e.CacheBlock)
	le.PutUint16(b[12:], e.LayerFirst)
	le.PutUint16(b[14:], e.LayerCount)
	le.PutUint16(b[16:], e.HeadFirst)
	le.PutUint16(b[18:], e.HeadCount)
	b[20] = e.Kinds
	b[21] = uint8(e.Status)
	b[22] = uint8(e.Detail)
	b[23] = e.Reserved
	le.PutUint32(b[24:], e.GroupsOK)
	le.PutUint32(b[28:], e.Reserved1)
}

// Unmarshal decodes b (BlockEntrySize bytes) into e.
func (e *BlockEntry) Unmarshal(b []byte) {
	_ = b[BlockEntrySize-1]
	e.Block = le.Uint64(b[0:])
	e.CacheBlock = le.Uint32(b[8:])
	e.LayerFirst = le.Uint16(b[12:])
	e.LayerCount = le.Uint16(b[14:])
	e.HeadFirst = le.Uint16(b[16:])
	e.HeadCount = le.Uint16(b[18:])
	e.Kinds = b[20]
	e.Status = Status(b[21])
	e.Detail = Detail(b[22])
	e.Reserved = b[23]
	e.GroupsOK = le.Uint32(b[24:])
	e.Reserved1 = le.Uint32(b[28:])
}

// lookupBlocks is Lookup for the minor-2 commands.
func lookupBlocks(cmd uint32) (Command, bool) {
	switch cmd {
	case CmdRegisterTarget:
		return Command{Op: OpRegisterTarget}, true
	case CmdUnregisterTarget:
		return Command{Op: OpUnregisterTarget}, true
	case CmdLoadBlocks:
		return Command{Op: OpLoadBlocks, Max: BlocksMax}, true
	case CmdStoreBlocks:
		return Command{Op: OpStoreBlocks, Max: BlocksMax}, true
	case CmdLoadBlocksInline:
		return Command{Op: OpLoadBlocks, Max: BlocksInlineMax, Inline: true}, true
	case CmdStoreBlocksInline:
		return Command{Op: OpStoreBlocks, Max: BlocksInlineMax, Inline: true}, true
	}
	return Command{}, false
}

// BlocksRequest is the decoded input of a minor-2 command.
type BlocksRequest struct {
	Target           *Target          // OpRegisterTarget (allocated only for it)
	UnregisterTarget UnregisterTarget // OpUnregisterTarget
	Header           Blocks           // OpLoadBlocks, OpStoreBlocks
	// Entries: the inline entries (Count × Header.EntrySize() bytes of
	// the input); nil for the registered-buffer form.
	Entries []byte
}

// decodeBlocks decodes the input of a minor-2 command whose sizes Decode
// already checked.
func decodeBlocks(c Command, in []byte, r *BlocksRequest) error {
	switch c.Op {
	case OpRegisterTarget:
		t := new(Target)
		r.Target = t
		t.Unmarshal(in)
		if err := checkVersion(t.ABI); err != nil {
			return err
		}
		if t.Flags != 0 {
			return fmt.Errorf("%w: target flags %#x", ErrFlags, t.Flags)
		}
		if t.Target != 0 || t.Reserved != [2]uint64{} {
			return fmt.Errorf("%w: in target", ErrReserved)
		}
	case OpUnregisterTarget:
		r.UnregisterTarget.Unmarshal(in)
		return checkVersion(r.UnregisterTarget.ABI)
	case OpLoadBlocks, OpStoreBlocks:
		h := &r.Header
		h.Unmarshal(in)
		if err := checkVersion(h.ABI); err != nil {
			return err
		}
		if h.Flags&^BlocksTagged != 0 {
			return fmt.Errorf("%w: blocks flags %#x", ErrFlags, h.Flags)
		}
		if h.NOK != 0 || h.Groups != 0 || h.Reserved != [3]uint64{} {
			return fmt.Errorf("%w: in blocks header", ErrReserved)
		}
		limit := c.Max
		if c.Inline && h.Tagged() {
			limit = BlocksInlineTaggedMax
		}
		if h.Count > uint32(limit) {
			return fmt.Errorf("%w: %d block entries, at most %d", ErrCount, h.Count, limit)
		}
		if c.Inline {
			if h.Buffer != 0 || h.Offset != 0 {
				return fmt.Errorf("%w: inline blocks name buffer %d offset %d", ErrReserved, h.Buffer, h.Offset)
			}
			r.Entries = in[BlocksSize : BlocksSize+int(h.Count)*h.EntrySize()]
		} else if h.Count > 0 && (h.Buffer == 0 || h.Offset%8 != 0) {
			return fmt.Errorf("%w: buffer %d offset %d", ErrEntriesAt, h.Buffer, h.Offset)
		}
	}
	return nil
}

// Layout is a target's paged layout, validated: the strides under which no
// two tiles (or rows of one tile) of one region share a byte, and the
// extent of a region from its offset.
type Layout struct {
	NumBlocks             uint32
	BlockStride           uint64
	HeadStride            uint64
	RowPitch              uint64
	RowBytes              uint64
	LayerFirst, LayerEnd  uint32 // layers [LayerFirst, LayerEnd)
	HeadFirst, HeadEnd    uint32 // heads [HeadFirst, HeadEnd)
	Extent                uint64 // bytes a region spans from its offset
	dims                  [3]dim // sorted by stride, count > 1 only
	ndims                 int
	extents               [4]uint64 // extents[k]: extent of the lattice of dims[:k]
	Packed                bool      // RowPitch == RowBytes: a tile is group_bytes contiguous bytes
	TileBytes, GroupBytes uint64
}

type dim struct{ stride, count uint64 }

// CheckTarget validates a target against the store's geometry and the
// buffers it names, once, so that each block entry needs only O(1) checks.
// bufLen returns the length of a buffer registered on the handle (ok false
// when it is not). Nothing overflows: every bound is checked in exact
// integers. The error wraps ErrTarget, ErrReserved, ErrBuffer, ErrRange or
// ErrTargetOverlap.
//
// Rules: 1 ≤ LayerCount ≤ TargetMaxLayers with the range inside the
// store's layers; 1 ≤ HeadCount with the range inside the store's heads;
// NumBlocks ≥ 1; RowBytes = the store's; regions past 2·LayerCount zero.
// The three dimensions (rows: RowPitch × block_tokens, heads: HeadStride
// × HeadCount, cache blocks: BlockStride × NumBlocks), those of count > 1
// sorted by stride, must nest: each stride at least the extent of the
// dimensions below it (RowBytes for the first). That is what NHD
// ([blocks, tokens, heads, dim]), HND ([blocks, heads, tokens, dim]) and
// Hugging Face ([heads, seq, dim] of one sequence) layouts satisfy, and it
// makes a region's map (block, head, row, byte) → address one-to-one.
// Every region must lie inside its buffer, and regions sharing a buffer
// must not share a byte (decided exactly for the lattices, so K and V
// interleaved per block, as in FlashInfer's [pages, 2, …], pass).
func (t Tile) CheckTarget(tg *Target, bufLen func(id uint32) (uint64, bool)) (Layout, error) {
	var l Layout
	if tg.Reserved != [2]uint64{} {
		return l, fmt.Errorf("%w: in target", ErrReserved)
	}
	if tg.RowBytes != t.RowBytes {
		return l, fmt.Errorf("%w: row_bytes %d, the store's rows are %d bytes", ErrTarget, tg.RowBytes, t.RowBytes)
	}
	if tg.LayerCount == 0 || tg.LayerCount > TargetMaxLayers || uint32(tg.LayerFirst)+uint32(tg.LayerCount) > t.Layers {
		return l, fmt.Errorf("%w: layers %d+%d (store has %d, at most %d per target)", ErrTarget, tg.LayerFirst, tg.LayerCount, t.Layers, TargetMaxLayers)
	}
	if tg.HeadCount == 0 || uint32(tg.HeadFirst)+uint32(tg.HeadCount) > t.KVHeads {
		return l, fmt.Errorf("%w: heads %d+%d (store has %d)", ErrTarget, tg.HeadFirst, tg.HeadCount, t.KVHeads)
	}
	if tg.NumBlocks == 0 {
		return l, fmt.Errorf("%w: num_blocks 0", ErrTarget)
	}
	if t.Rows == 0 || t.RowBytes == 0 {
		return l, fmt.Errorf("%w: empty geometry", ErrTarget)
	}
	nreg := 2 * int(tg.LayerCount)
	for i := nreg; i < TargetMaxRegions; i++ {
		if tg.Regions[i] != (TargetRegion{}) {
			return l, fmt.Errorf("%w: region %d past the target's %d layers", ErrReserved, i, tg.LayerCount)
		}
	}
	l = Layout{
		NumBlocks: tg.NumBlocks, BlockStride: tg.BlockStride, HeadStride: tg.HeadStride,
		RowPitch: uint64(tg.RowPitch), RowBytes: uint64(tg.RowBytes),
		LayerFirst: uint32(tg.LayerFirst), LayerEnd: uint32(tg.LayerFirst) + uint32(tg.LayerCount),
		HeadFirst: uint32(tg.HeadFirst), HeadEnd: uint32(tg.HeadFirst) + uint32(tg.HeadCount),
		GroupBytes: uint64(t.Rows) * uint64(t.RowBytes),
	}
	for _, d := range []dim{{l.RowPitch, uint64(t.Rows)}, {l.HeadStride, uint64(tg.HeadCount)}, {l.BlockStride, uint64(tg.NumBlocks)}} {
		if d.count > 1 {
			l.dims[l.ndims] = d
			l.ndims++
		}
	}
	slices.SortFunc(l.dims[:l.ndims], func(a, b dim) int { return cmp.Compare(a.stride, b.stride) })
	ext := l.RowBytes
	l.extents[0] = ext
	for k, d := range l.dims[:l.ndims] {
		if d.stride < ext {
			return l, fmt.Errorf("%w: stride %d below the extent %d of the dimensions inside it (tiles or rows would overlap)", ErrTarget, d.stride, ext)
		}
		hi, lo := bits.Mul64(d.count-1, d.stride)
		var carry uint64
		ext, carry = bits.Add64(lo, ext, 0)
		if hi != 0 || carry != 0 {
			return l, fmt.Errorf("%w: region extent overflows", ErrTarget)
		}
		l.extents[k+1] = ext
	}
	l.Extent = ext
	l.Packed = l.RowPitch == l.RowBytes || t.Rows == 1
	if t.Rows == 1 {
		l.TileBytes = l.RowBytes
	} else {
		l.TileBytes = uint64(t.Rows-1)*l.RowPitch + l.RowBytes
	}
	type reg struct {
		buf uint32
		off uint64
		i   int
	}
	regs := make([]reg, 0, nreg)
	for i := range nreg {
		r := &tg.Regions[i]
		if r.Reserved != 0 {
			return l, fmt.Errorf("%w: region %d", ErrReserved, i)
		}
		n, ok := bufLen(r.Buffer)
		if !ok {
			return l, fmt.Errorf("%w: region %d names buffer %d", ErrBuffer, i, r.Buffer)
		}
		if r.Offset > n || l.Extent > n-r.Offset {
			return l, fmt.Errorf("%w: region %d: %d bytes at offset %d in a buffer of %d", ErrRange, i, l.Extent, r.Offset, n)
		}
		regs = append(regs, reg{r.Buffer, r.Offset, i})
	}
	slices.SortFunc(regs, func(a, b reg) int {
		if c := cmp.Compare(a.buf, b.buf); c != 0 {
			return c
		}
		return cmp.Compare(a.off, b.off)
	})
	// Sweep: a region can only meet the later ones that start inside its
	// extent.
	for i := range regs {
		for j := i + 1; j < len(regs) && regs[j].buf == regs[i].buf && regs[j].off-regs[i].off < l.Extent; j++ {
			if l.overlapAt(regs[j].off-regs[i].off, l.ndims) {
				return l, fmt.Errorf("%w: regions %d and %d of buffer %d", ErrTargetOverlap, regs[i].i, regs[j].i, regs[i].buf)
			}
		}
	}
	return l, nil
}

// overlapAt reports whether the lattice of the first k dimensions (with
// rows RowBytes wide) and its copy shifted by d bytes share a byte. With
// stride s and count n of dimension k−1 and d = q·s + r, sub-lattice j of
// the copy can meet sub-lattice i of the original only for i = j+q (the
// copy r bytes further) or i = j+q+1 (the original s−r bytes further),
// since each sub-lattice's extent is at most s. The relation is symmetric,
// so both cases recurse on a non-negative shift. At most 2^k leaves.
func (l *Layout) overlapAt(d uint64, k int) bool {
	if k == 0 {
		return d < l.RowBytes
	}
	s, n := l.dims[k-1].stride, l.dims[k-1].count
	q, r := d/s, d%s
	if q < n && r < l.extents[k-1] && l.overlapAt(r, k-1) {
		return true
	}
	return q+1 < n && s-r < l.extents[k-1] && l.overlapAt(s-r, k-1)
}

// TileOffset is the offset, from its region's offset, of the tile of cache
// block c and head h (both inside the target: c < NumBlocks, HeadFirst ≤ h <
// HeadEnd), which CheckTarget proved inside the region.
func (l *Layout) TileOffset(c uint32, h uint32) uint64 {
	return uint64(c)*l.BlockStride + uint64(h-l.HeadFirst)*l.HeadStride
}

// CheckBlock validates one block entry against a validated target in O(1):
// reserved fields (ErrReserved), kinds, non-empty layer and head ranges
// inside the target's (ErrKey), cache block index below NumBlocks
// (ErrRange). It returns the number of groups the entry moves.
func (l *Layout) CheckBlock(e *BlockEntry) (groups int, err error) {
	if e.Reserved != 0 || e.Reserved1 != 0 {
		return 0, ErrReserved
	}
	lf, hf := uint32(e.LayerFirst), uint32(e.HeadFirst)
	if e.Kinds == 0 || e.Kinds > KindsBoth || e.LayerCount == 0 || e.HeadCount == 0 ||
		lf < l.LayerFirst || lf+uint32(e.LayerCount) > l.LayerEnd ||
		hf < l.HeadFirst || hf+uint32(e.HeadCount) > l.HeadEnd {
		return 0, ErrKey
	}
	if e.CacheBlock >= l.NumBlocks {
		return 0, ErrRange
	}
	kinds := 1
	if e.Kinds == KindsBoth {
		kinds = 2
	}
	return int(e.LayerCount) * int(e.HeadCount) * kinds, nil
}
