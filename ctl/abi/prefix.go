package abi

import (
	"errors"
	"fmt"
)

// ABI minor 3: prefix identity.
//
// A block is useful to an inference engine only as part of a prefix: the
// 64-bit id alone can alias two different token chains. Minor 3 lets a
// STORE_BLOCKS entry record a 16-byte tag (the caller's full hash of what
// the block stands for: model, dtype, shard, token chain) and the block's
// parent (the block before it in its sequence); a LOAD_BLOCKS entry names
// the tag it expects, and a block stored under another tag reads as ABSENT
// with detail TagMismatch. The tagged entry is a 64-byte form selected by
// BlocksTagged in the header's flags, so that minor-2 clients' 32-byte
// entries keep working unchanged. LOOKUP answers, for up to 65,536
// (block id, tag) pairs, whether each is present and how long the leading
// present run is, without touching any payload.

// TagSize is the bytes of a block tag.
const TagSize = 16

// Tag is a block's tag: all zeros means no tag (a STORE records none, a
// LOAD or LOOKUP checks none).
type Tag = [TagSize]byte

// Sizes and limits of minor 3.
const (
	// BlockEntryTaggedSize is struct kvfs_block_entry_tagged.
	BlockEntryTaggedSize = 64
	// BlocksInlineTaggedMax is the tagged entries of one inline
	// LOAD_BLOCKS/STORE_BLOCKS (the argument keeps its minor-2 size).
	BlocksInlineTaggedMax = (BlocksInlineSize - BlocksSize) / BlockEntryTaggedSize // 254

	LookupSize     = 64 // struct kvfs_lookup
	LookupPairSize = 32 // struct kvfs_lookup_pair
	// LookupMax is the most pairs of one LOOKUP.
	LookupMax = 65536
	// LookupInlineMax is the pairs that fit after the header in one
	// restricted ioctl argument.
	LookupInlineMax  = (MaxIoctlSize - LookupSize) / LookupPairSize // 509
	LookupInlineSize = LookupSize + LookupInlineMax*LookupPairSize  // 16352
)

// BlocksTagged in Blocks.Flags: the entries are struct
// kvfs_block_entry_tagged (64 bytes) rather than kvfs_block_entry.
const BlocksTagged uint32 = 1 << 0

// MetaParent in BlockEntryTagged.MetaFlags: the entry names a parent.
const MetaParent uint32 = 1 << 0

// CapPrefix: tagged block entries (BlocksTagged), the TagMismatch detail
// and LOOKUP (minor 3).
const CapPrefix uint64 = 1 << 8

// Details of minor 3.
const (
	// BadParent (status BadRequest): the entry's parent is the block
	// itself, or a parent is set without MetaParent.
	BadParent Detail = 7
	// BadMeta (status BadRequest): entries of one STORE_BLOCKS name the same
	// block with different tags or parents.
	BadMeta Detail = 8
	// TagMismatch (status Absent): the block is stored under another tag
	// than the entry expects; none of its bytes are delivered.
	TagMismatch Detail = 9
)

// The minor-3 ioctl commands.
var (
	CmdLookup       = ioc(dirRead|dirWrite, 0x26, LookupSize)
	CmdLookupInline = ioc(dirRead|dirWrite, 0x27, LookupInlineSize)
)

// OpLookup is LOOKUP (and its inline form).
const OpLookup Op = 0x26

// Errors of minor 3.
var (
	// ErrParent: a tagged entry's parent is the block itself, or set
	// without MetaParent (detail BadParent).
	ErrParent = errors.New("kvfs/abi: parent names the block itself or lacks its flag")
	// ErrMeta: entries of one call give one block different tags or
	// parents (detail BadMeta); the check is the server's.
	ErrMeta = errors.New("kvfs/abi: entries of one block disagree on tag or parent")
)

// BlockEntryTagged is struct kvfs_block_entry_tagged: a minor-2 block entry
// followed by the block's tag and parent.
type BlockEntryTagged struct {
	BlockEntry        // the 32-byte entry, unchanged
	Tag        Tag    // STORE: recorded; LOAD: expected (zeros: unchecked)
	Parent     uint64 // STORE: the block before this one in its sequence (with MetaParent)
	MetaFlags  uint32 // MetaParent
	Reserved2  uint32
}

// Marshal encodes e into b (BlockEntryTaggedSize bytes).
func (e *BlockEntryTagged) Marshal(b []byte) {
	_ = b[BlockEntryTaggedSize-1]
	e.BlockEntry.Marshal(b)
	copy(b[32:48], e.Tag[:])
	le.PutUint64(b[48:], e.Parent)
	le.PutUint32(b[56:], e.MetaFlags)
	le.PutUint32(b[60:], e.Reserved2)
}

// Unmarshal decodes b (BlockEntryTaggedSize bytes) into e.
func (e *BlockEntryTagged) Unmarshal(b []byte) {
	_ = b[BlockEntryTaggedSize-1]
	e.BlockEntry.Unmarshal(b)
	copy(e.Tag[:], b[32:48])
	e.Parent = le.Uint64(b[48:])
	e.MetaFlags = le.Uint32(b[56:])
	e.Reserved2 = le.Uint32(b[60:])
}

// UnmarshalSized decodes an entry of size bytes (BlockEntrySize or
// BlockEntryTaggedSize, as Blocks.EntrySize says): a 32-byte entry gets a
// zero tag and no parent.
func (e *BlockEntryTagged) UnmarshalSized(b []byte, size int) {
	if size == BlockEntryTaggedSize {
		e.Unmarshal(b)
		return
	}
	e.BlockEntry.Unmarshal(b)
	e.Tag, e.Parent, e.MetaFlags, e.Reserved2 = Tag{}, 0, 0, 0
}

// MarshalSized encodes e as an entry of size bytes; a 32-byte entry drops
// the tag and parent.
func (e *BlockEntryTagged) MarshalSized(b []byte, size int) {
	if size == BlockEntryTaggedSize {
		e.Marshal(b)
		return
	}
	e.BlockEntry.Marshal(b)
}

// HasParent reports whether the entry names a parent.
func (e *BlockEntryTagged) HasParent() bool { return e.MetaFlags&MetaParent != 0 }

// CheckMeta validates the minor-3 fields in O(1): Reserved2 and unknown
// MetaFlags bits zero (ErrReserved); a parent only with MetaParent and
// never the block itself (ErrParent). A LOAD entry may carry a parent (so
// one array can serve STORE and LOAD); LOAD does not use it.
func (e *BlockEntryTagged) CheckMeta() error {
	if e.Reserved2 != 0 || e.MetaFlags&^MetaParent != 0 {
		return fmt.Errorf("%w: tagged entry meta_flags %#x reserved2 %#x", ErrReserved, e.MetaFlags, e.Reserved2)
	}
	if !e.HasParent() && e.Parent != 0 {
		return fmt.Errorf("%w: parent %#x without KVFS_META_PARENT", ErrParent, e.Parent)
	}
	if e.HasParent() && e.Parent == e.Block {
		return fmt.Errorf("%w: block %#x is its own parent", ErrParent, e.Block)
	}
	return nil
}

// CheckTagged is CheckBlock and then CheckMeta: the whole O(1) check of an
// entry of either size (a 32-byte entry's meta fields are zero).
func (l *Layout) CheckTagged(e *BlockEntryTagged) (groups int, err error) {
	if groups, err = l.CheckBlock(&e.BlockEntry); err != nil {
		return 0, err
	}
	if err = e.CheckMeta(); err != nil {
		return 0, err
	}
	return groups, nil
}

// EntrySize is the bytes of one entry of the call: BlockEntryTaggedSize
// with BlocksTagged, else BlockEntrySize.
func (h *Blocks) EntrySize() int {
	if h.Flags&BlocksTagged != 0 {
		return BlockEntryTaggedSize
	}
	return BlockEntrySize
}

// Tagged reports whether the call's entries are the 64-byte form.
func (h *Blocks) Tagged() bool { return h.Flags&BlocksTagged != 0 }

// LookupStatus is LOOKUP's answer for one pair. Zero is never written: a
// pair still zero after a successful call was not answered.
type LookupStatus uint8

// Pair statuses.
const (
	// LookupPresent: the block is stored whole, under the pair's tag (or
	// the pair's tag is zero).
	LookupPresent LookupStatus = 1
	// LookupAbsent: no such block, or not every group of it is stored.
	LookupAbsent LookupStatus = 2
	// LookupTagMismatch: the block is stored under another tag.
	LookupTagMismatch LookupStatus = 3
)

func (s LookupStatus) String() string {
	switch s {
	case LookupPresent:
		return "present"
	case LookupAbsent:
		return "absent"
	case LookupTagMismatch:
		return "tag-mismatch"
	}
	return "lookup-status(" + itoa(int(s)) + ")"
}

// LookupHeader is struct kvfs_lookup, the header of LOOKUP (whose Count pairs
// live in registered buffer Buffer at Offset) and of its inline form
// (pairs follow the header; Buffer and Offset 0).
type LookupHeader struct {
	ABI      uint32
	Flags    uint32
	Count    uint32 // pairs, 1..LookupMax (inline: LookupInlineMax)
	Buffer   uint32 // buffer holding the pair array (0 inline)
	Offset   uint64 // of the pair array in Buffer, a multiple of 8 (0 inline)
	Present  uint32 // out: pairs LookupPresent
	Absent   uint32 // out: pairs LookupAbsent
	Mismatch uint32 // out: pairs LookupTagMismatch
	Run      uint32 // out: leading pairs LookupPresent (also the return value)
	Reserved [3]uint64
}

// Offsets of the output fields of LookupHeader.
const (
	LookupPresentOff  = 24
	LookupAbsentOff   = 28
	LookupMismatchOff = 32
	LookupRunOff      = 36
)

// Marshal encodes h into b (LookupSize bytes).
func (h *LookupHeader) Marshal(b []byte) {
	_ = b[LookupSize-1]
	le.PutUint32(b[0:], h.ABI)
	le.PutUint32(b[4:], h.Flags)
	le.PutUint32(b[8:], h.Count)
	le.PutUint32(b[12:], h.Buffer)
	le.PutUint64(b[16:], h.Offset)
	le.PutUint32(b[24:], h.Present)
	le.PutUint32(b[28:], h.Absent)
	le.PutUint32(b[32:], h.Mismatch)
	le.PutUint32(b[36:], h.Run)
	for k, v := range h.Reserved {
		le.PutUint64(b[40+8*k:], v)
	}
}

// Unmarshal decodes b (LookupSize bytes) into h.
func (h *LookupHeader) Unmarshal(b []byte) {
	_ = b[LookupSize-1]
	h.ABI = le.Uint32(b[0:])
	h.Flags = le.Uint32(b[4:])
	h.Count = le.Uint32(b[8:])
	h.Buffer = le.Uint32(b[12:])
	h.Offset = le.Uint64(b[16:])
	h.Present = le.Uint32(b[24:])
	h.Absent = le.Uint32(b[28:])
	h.Mismatch = le.Uint32(b[32:])
	h.Run = le.Uint32(b[36:])
	for k := range h.Reserved {
		h.Reserved[k] = le.Uint64(b[40+8*k:])
	}
}

// PutResult writes the output fields of a LOOKUP into its header b.
func (h *LookupHeader) PutResult(b []byte) {
	le.PutUint32(b[LookupPresentOff:], h.Present)
	le.PutUint32(b[LookupAbsentOff:], h.Absent)
	le.PutUint32(b[LookupMismatchOff:], h.Mismatch)
	le.PutUint32(b[LookupRunOff:], h.Run)
}

// LookupPair is struct kvfs_lookup_pair.
type LookupPair struct {
	Block    uint64
	Tag      Tag          // expected tag (zeros: unchecked)
	Status   LookupStatus // out; ignored on input
	Reserved [7]byte
}

// LookupStatusOff is the offset of LookupPair.Status.
const LookupStatusOff = 24

// Marshal encodes p into b (LookupPairSize bytes).
func (p *LookupPair) Marshal(b []byte) {
	_ = b[LookupPairSize-1]
	le.PutUint64(b[0:], p.Block)
	copy(b[8:24], p.Tag[:])
	b[24] = uint8(p.Status)
	copy(b[25:32], p.Reserved[:])
}

// Unmarshal decodes b (LookupPairSize bytes) into p.
func (p *LookupPair) Unmarshal(b []byte) {
	_ = b[LookupPairSize-1]
	p.Block = le.Uint64(b[0:])
	copy(p.Tag[:], b[8:24])
	p.Status = LookupStatus(b[24])
	copy(p.Reserved[:], b[25:32])
}

// DecodePairs decodes len(blocks) pairs of src (LookupPairSize bytes each)
// into blocks and tags (both len(blocks) long). It fails with ErrReserved
// naming the first pair whose reserved bytes are not zero; the output
// fields are ignored. The server copies the pairs with it before answering,
// so a client changing them during the call changes nothing.
func DecodePairs[T ~[TagSize]byte](src []byte, blocks []uint64, tags []T) error {
	tags = tags[:len(blocks)]
	src = src[:len(blocks)*LookupPairSize]
	for i := range blocks {
		p := src[i*LookupPairSize : (i+1)*LookupPairSize]
		if le.Uint64(p[24:])&^0xff != 0 {
			return fmt.Errorf("%w: lookup pair %d", ErrReserved, i)
		}
		blocks[i] = le.Uint64(p[0:])
		copy(tags[i][:], p[8:24])
	}
	return nil
}

// PutLookupStatus writes pair i's status into the pair array dst.
func PutLookupStatus(dst []byte, i int, s LookupStatus) {
	dst[i*LookupPairSize+LookupStatusOff] = uint8(s)
}

// LookupRequest is the decoded input of LOOKUP.
type LookupRequest struct {
	Header LookupHeader
	// Pairs: the inline pairs (Count × LookupPairSize bytes of the input);
	// nil for the registered-buffer form.
	Pairs []byte
}

// lookupPrefix is Lookup for the minor-3 commands.
func lookupPrefix(cmd uint32) (Command, bool) {
	switch cmd {
	case CmdLookup:
		return Command{Op: OpLookup, Max: LookupMax}, true
	case CmdLookupInline:
		return Command{Op: OpLookup, Max: LookupInlineMax, Inline: true}, true
	}
	return Command{}, false
}

// decodeLookup decodes the input of LOOKUP whose sizes Decode already
// checked: version, flags 0, output and reserved fields 0, 1 ≤ count ≤
// the form's maximum (ErrCount), and for the registered-buffer form
// a nonzero buffer id and an 8-aligned offset (ErrEntriesAt); whether the
// array lies inside the buffer is the server's check (ErrEntries).
func decodeLookup(c Command, in []byte, r *LookupRequest) error {
	h := &r.Header
	h.Unmarshal(in)
	if err := checkVersion(h.ABI); err != nil {
		return err
	}
	if h.Flags != 0 {
		return fmt.Errorf("%w: lookup flags %#x", ErrFlags, h.Flags)
	}
	if h.Present != 0 || h.Absent != 0 || h.Mismatch != 0 || h.Run != 0 || h.Reserved != [3]uint64{} {
		return fmt.Errorf("%w: in lookup header", ErrReserved)
	}
	if h.Count == 0 || h.Count > uint32(c.Max) {
		return fmt.Errorf("%w: %d pairs, 1 to %d", ErrCount, h.Count, c.Max)
	}
	if c.Inline {
		if h.Buffer != 0 || h.Offset != 0 {
			return fmt.Errorf("%w: inline lookup names buffer %d offset %d", ErrReserved, h.Buffer, h.Offset)
		}
		r.Pairs = in[LookupSize : LookupSize+int(h.Count)*LookupPairSize]
		return nil
	}
	if h.Buffer == 0 || h.Offset%8 != 0 {
		return fmt.Errorf("%w: lookup pairs in buffer %d offset %d", ErrEntriesAt, h.Buffer, h.Offset)
	}
	return nil
}
