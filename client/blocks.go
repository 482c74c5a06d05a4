package client

import (
	"fmt"
	"sync"
	"syscall"

	"github.com/kvfs/kvfs/ctl/abi"
)

// TargetID names a registered KV-cache target.
type TargetID uint32

// Kinds of a block entry.
const (
	KindsK    = abi.KindsK
	KindsV    = abi.KindsV
	KindsBoth = abi.KindsBoth
)

// Region is where one (layer, kind) of a target lives: a registered buffer
// and the offset of cache block 0, head HeadFirst, row 0 in it.
type Region struct {
	Buffer BufferID
	Offset uint64
}

// Target describes a paged KV cache (docs/abi.md, "Targets"): the tile of
// cache block c, head h of layer l, kind k starts at
// Regions[2(l−LayerFirst)+k].Offset + c·BlockStride + (h−HeadFirst)·HeadStride
// and its token row r at + r·RowPitch, RowBytes long. NHD, HND and HF fill
// in the strides of the common layouts.
type Target struct {
	NumBlocks               int
	BlockStride, HeadStride int64
	RowPitch                int
	LayerFirst, LayerCount  int
	HeadFirst, HeadCount    int
	// Regions[2·(layer−LayerFirst)+kind], kind 0 K and 1 V.
	Regions []Region
}

// NHD is a token-major (vLLM / FlashAttention) cache of one tensor
// [numBlocks, block_tokens, heads, head_dim] per (layer, kind), holding
// heads [headFirst, headFirst+heads) of every layer. Fill in Regions.
func (i Info) NHD(numBlocks, headFirst, heads int) Target {
	rb := i.RowBytes
	return Target{NumBlocks: numBlocks, BlockStride: int64(i.Geometry.BlockTokens * heads * rb), HeadStride: int64(rb),
		RowPitch: heads * rb, LayerCount: i.Geometry.Layers, HeadFirst: headFirst, HeadCount: heads}
}

// HND is a head-major (FlashInfer) cache of one tensor [numBlocks, heads,
// block_tokens, head_dim] per (layer, kind). Fill in Regions.
func (i Info) HND(numBlocks, headFirst, heads int) Target {
	rb := i.RowBytes
	return Target{NumBlocks: numBlocks, BlockStride: int64(heads * i.Geometry.BlockTokens * rb), HeadStride: int64(i.Geometry.BlockTokens * rb),
		RowPitch: rb, LayerCount: i.Geometry.Layers, HeadFirst: headFirst, HeadCount: heads}
}

// HF is one sequence of a Hugging Face cache, [heads, seqTokens, head_dim]
// per (layer, kind) (a batch row of DynamicCache's [batch, heads, seq,
// head_dim]); cache block c is tokens [c·block_tokens, (c+1)·block_tokens).
// seqTokens must be a multiple of block_tokens. Fill in Regions.
func (i Info) HF(seqTokens, headFirst, heads int) Target {
	rb, bt := i.RowBytes, i.Geometry.BlockTokens
	return Target{NumBlocks: seqTokens / bt, BlockStride: int64(bt * rb), HeadStride: int64(seqTokens * rb),
		RowPitch: rb, LayerCount: i.Geometry.Layers, HeadFirst: headFirst, HeadCount: heads}
}

// RegionBytes is the bytes one (layer, kind) region of t spans.
func (t Target) RegionBytes(i Info) int64 {
	ext := int64(i.RowBytes)
	type d struct{ s, n int64 }
	ds := []d{{int64(t.RowPitch), int64(i.Geometry.BlockTokens)}, {t.HeadStride, int64(t.HeadCount)}, {t.BlockStride, int64(t.NumBlocks)}}
	for j := range ds {
		for k := j + 1; k < len(ds); k++ {
			if ds[k].s < ds[j].s {
				ds[j], ds[k] = ds[k], ds[j]
			}
		}
	}
	for _, x := range ds {
		if x.n > 1 {
			ext += (x.n - 1) * x.s
		}
	}
	return ext
}

// RegisterTarget registers t (needs abi.CapBlocks). The daemon validates
// the whole target once; its buffers cannot be unregistered while it is.
func (c *Client) RegisterTarget(t Target) (TargetID, error) {
	if !c.info.Has(abi.CapBlocks) {
		return 0, &Error{Op: "register-target", Errno: syscall.ENOTTY}
	}
	bad := func() (TargetID, error) { return 0, &Error{Op: "register-target", Errno: syscall.EINVAL} }
	if t.NumBlocks < 0 || t.NumBlocks > 1<<32-1 || t.BlockStride < 0 || t.HeadStride < 0 || t.RowPitch < 0 || t.RowPitch > 1<<32-1 ||
		t.LayerFirst < 0 || t.LayerFirst > 0xffff || t.LayerCount < 0 || t.LayerCount > abi.TargetMaxLayers ||
		t.HeadFirst < 0 || t.HeadFirst > 0xffff || t.HeadCount < 0 || t.HeadCount > 0xffff || len(t.Regions) != 2*t.LayerCount {
		return bad()
	}
	a := new(abi.Target)
	*a = abi.Target{ABI: abi.Version, NumBlocks: uint32(t.NumBlocks), BlockStride: uint64(t.BlockStride), HeadStride: uint64(t.HeadStride),
		RowPitch: uint32(t.RowPitch), RowBytes: uint32(c.info.RowBytes), LayerFirst: uint16(t.LayerFirst), LayerCount: uint16(t.LayerCount),
		HeadFirst: uint16(t.HeadFirst), HeadCount: uint16(t.HeadCount)}
	for i, r := range t.Regions {
		a.Regions[i] = abi.TargetRegion{Buffer: uint32(r.Buffer), Offset: r.Offset}
	}
	raw := make([]byte, abi.TargetSize)
	a.Marshal(raw)
	if err := c.ioctl("register-target", abi.CmdRegisterTarget, raw); err != nil {
		return 0, err
	}
	a.Unmarshal(raw)
	id := TargetID(a.Target)
	c.blk.Lock()
	if c.blk.targets == nil {
		c.blk.targets = map[TargetID]bool{}
	}
	c.blk.targets[id] = true
	c.blk.Unlock()
	return id, nil
}

// UnregisterTarget drops a target.
func (c *Client) UnregisterTarget(id TargetID) error {
	var raw [abi.UnregisterTargetSize]byte
	(&abi.UnregisterTarget{ABI: abi.Version, Target: uint32(id)}).Marshal(raw[:])
	err := c.ioctl("unregister-target", abi.CmdUnregisterTarget, raw[:])
	c.blk.Lock()
	delete(c.blk.targets, id)
	c.blk.Unlock()
	return err
}

// closeTargets unregisters the targets, so Close can unregister their
// buffers.
func (c *Client) closeTargets() {
	c.blk.Lock()
	ids := c.blk.targets
	c.blk.targets = nil
	c.blk.Unlock()
	for id := range ids {
		_ = c.UnregisterTarget(id)
	}
}

// blockState is the client's targets and its pool of entry arrays.
type blockState struct {
	sync.Mutex
	targets map[TargetID]bool
	arrays  []*HostBuffer // free entry arrays of abi.BlocksMax entries
}

// BlockEntry is one block to move: the groups of Block in layers
// [LayerFirst, LayerFirst+LayerCount), heads [HeadFirst,
// HeadFirst+HeadCount) and Kinds, to or from cache block CacheBlock of the
// target. Status, Detail and GroupsOK are set by the call.
//
// Tag and Parent (minor 3, abi.CapPrefix): a STORE records them in the
// block; a LOAD serves the block only if it is stored under Tag (zero:
// unchecked), else the entry is Absent with Detail TagMismatch. A call
// whose entries all have a zero Tag and no parent uses the minor-2 form,
// which leaves a stored block's tag and parent as they are; a call with
// any tag or parent sends every entry's (zeros included).
type BlockEntry struct {
	Block                  uint64
	CacheBlock             uint32
	LayerFirst, LayerCount uint16
	HeadFirst, HeadCount   uint16
	Kinds                  uint8
	Status                 Status
	Detail                 Detail
	GroupsOK               uint32
	Tag                    Tag
	Parent                 uint64 // with HasParent: the block before this one in its sequence
	HasParent              bool
}

// Tag is a block's tag: the caller's hash of what the block stands for
// (model, dtype, shard, token chain); all zeros is no tag.
type Tag = abi.Tag

// TagMismatch is the Detail of a LOAD entry (status Absent) whose block is
// stored under another tag.
const TagMismatch = abi.TagMismatch

// taggedForm reports whether es need the 64-byte entries: some entry has a
// tag or a parent.
func taggedForm(es []BlockEntry) bool {
	for i := range es {
		if es[i].Tag != (Tag{}) || es[i].HasParent || es[i].Parent != 0 {
			return true
		}
	}
	return false
}

// WholeBlock is the entry for every group of block id in the target's
// layers and heads.
func (t Target) WholeBlock(id uint64, cacheBlock int) BlockEntry {
	return BlockEntry{Block: id, CacheBlock: uint32(cacheBlock), LayerFirst: uint16(t.LayerFirst), LayerCount: uint16(t.LayerCount),
		HeadFirst: uint16(t.HeadFirst), HeadCount: uint16(t.HeadCount), Kinds: KindsBoth}
}

// LoadBlocks loads the entries' groups into the target; each entry gets
// its outcome. It returns the entries with status OK. Up to
// abi.BlocksInlineMax entries (abi.BlocksInlineTaggedMax with tags or
// parents) go inline in one ioctl; more go through an entry array in a
// registered buffer, abi.BlocksMax entries per ioctl (half as many with
// tags or parents). Entries with tags or parents need abi.CapPrefix
// (EOPNOTSUPP without).
func (c *Client) LoadBlocks(t TargetID, es []BlockEntry) (int, error) {
	return c.blocks(true, t, es)
}

// StoreBlocks stores the entries' groups from the target, durably.
func (c *Client) StoreBlocks(t TargetID, es []BlockEntry) (int, error) {
	return c.blocks(false, t, es)
}

func (c *Client) blocks(load bool, t TargetID, es []BlockEntry) (int, error) {
	if !c.info.Has(abi.CapBlocks) {
		return 0, &Error{Op: "blocks", Errno: syscall.ENOTTY}
	}
	op := "store-blocks"
	if load {
		op = "load-blocks"
	}
	flags, size, inlineMax := c.blocksForm(es)
	if size == 0 {
		return 0, &Error{Op: op, Errno: syscall.EOPNOTSUPP}
	}
	if len(es) <= inlineMax {
		raw := make([]byte, abi.BlocksInlineSize)
		(&abi.Blocks{ABI: abi.Version, Flags: flags, Target: uint32(t), Count: uint32(len(es))}).Marshal(raw)
		encodeBlocks(raw[abi.BlocksSize:], es, size)
		cmd := abi.CmdStoreBlocksInline
		if load {
			cmd = abi.CmdLoadBlocksInline
		}
		if _, err := c.Ioctl(cmd, raw); err != nil {
			return 0, &Error{Op: op, Errno: err.(syscall.Errno)}
		}
		return unmarshalBlocks(es, raw[abi.BlocksSize:], size), nil
	}
	arr, err := c.entryArray()
	if err != nil {
		return 0, err
	}
	defer c.putEntryArray(arr)
	nok := 0
	per := min(abi.BlocksMax, len(arr.Mem)/size)
	for lo := 0; lo < len(es); lo += per {
		part := es[lo:min(len(es), lo+per)]
		n, err := c.BlocksIn(load, t, arr, 0, part)
		nok += n
		if err != nil {
			return nok, err
		}
	}
	return nok, nil
}

// BlocksIn is LOAD_BLOCKS (load) or STORE_BLOCKS with the entry array at
// offset off (a multiple of 8) of a registered buffer buf the caller owns
// (not inside the target's memory): the entries are written there, the
// daemon reads them and writes each outcome back, and es gets them.
func (c *Client) BlocksIn(load bool, t TargetID, buf *HostBuffer, off int, es []BlockEntry) (int, error) {
	op, cmd := "store-blocks", abi.CmdStoreBlocks
	if load {
		op, cmd = "load-blocks", abi.CmdLoadBlocks
	}
	flags, size, _ := c.blocksForm(es)
	if size == 0 {
		return 0, &Error{Op: op, Errno: syscall.EOPNOTSUPP}
	}
	if off < 0 || off+len(es)*size > len(buf.Mem) {
		return 0, &Error{Op: op, Errno: syscall.ERANGE}
	}
	mem := buf.Mem[off:]
	encodeBlocks(mem, es, size)
	var raw [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Flags: flags, Target: uint32(t), Count: uint32(len(es)), Buffer: uint32(buf.ID), Offset: uint64(off)}).Marshal(raw[:])
	if _, err := c.Ioctl(cmd, raw[:]); err != nil {
		return 0, &Error{Op: op, Errno: err.(syscall.Errno)}
	}
	return unmarshalBlocks(es, mem, size), nil
}

// blocksForm is the entry form of a call with es: the header flags, the
// entry size and the inline limit. size is 0 when es need tagged entries
// and the daemon has none (abi.CapPrefix): sending them as 32-byte entries
// would drop the tags a LOAD must check.
func (c *Client) blocksForm(es []BlockEntry) (flags uint32, size, inlineMax int) {
	if !taggedForm(es) {
		return 0, abi.BlockEntrySize, abi.BlocksInlineMax
	}
	if !c.info.Has(abi.CapPrefix) {
		return 0, 0, 0
	}
	return abi.BlocksTagged, abi.BlockEntryTaggedSize, abi.BlocksInlineTaggedMax
}

// encodeBlocks writes es into b as entries of size bytes.
func encodeBlocks(b []byte, es []BlockEntry, size int) {
	for i := range es {
		e := &es[i]
		a := abi.BlockEntryTagged{BlockEntry: abi.BlockEntry{Block: e.Block, CacheBlock: e.CacheBlock, LayerFirst: e.LayerFirst,
			LayerCount: e.LayerCount, HeadFirst: e.HeadFirst, HeadCount: e.HeadCount, Kinds: e.Kinds},
			Tag: e.Tag, Parent: e.Parent}
		if e.HasParent {
			a.MetaFlags = abi.MetaParent
		}
		a.MarshalSized(b[i*size:], size)
	}
}

func unmarshalBlocks(es []BlockEntry, b []byte, size int) int {
	nok := 0
	for i := range es {
		var a abi.BlockEntry
		a.Unmarshal(b[i*size:])
		es[i].Status, es[i].Detail, es[i].GroupsOK = a.Status, a.Detail, a.GroupsOK
		if a.Status == OK {
			nok++
		}
	}
	return nok
}

// entryArray is a registered buffer for abi.BlocksMax entries, from the
// client's pool (a memfd, created on first use; Close frees them).
func (c *Client) entryArray() (*HostBuffer, error) {
	c.blk.Lock()
	if n := len(c.blk.arrays); n > 0 {
		b := c.blk.arrays[n-1]
		c.blk.arrays = c.blk.arrays[:n-1]
		c.blk.Unlock()
		return b, nil
	}
	c.blk.Unlock()
	b, err := c.NewHostBuffer("kvfs-block-entries", abi.BlocksMax*abi.BlockEntrySize)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: entry array: %w", err)
	}
	return b, nil
}

func (c *Client) putEntryArray(b *HostBuffer) {
	c.blk.Lock()
	if len(c.blk.arrays) < 4 {
		c.blk.arrays = append(c.blk.arrays, b)
		c.blk.Unlock()
		return
	}
	c.blk.Unlock()
	b.Close()
}
