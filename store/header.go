package store

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/kvfs/kvfs/store/index"
)

// Slot header, one copy (HeaderBytes, zero padded):
//
//	0   magic "KVFSSLOT"
//	8   version u32 (1 or 2; a store writes its format version's)
//	12  flags u32 (bit 0: live; a header without it is a tombstone)
//	16  store UUID [16]
//	32  slot index u64
//	40  block id u64
//	48  generation u64
//	56  groups u32 (GroupsPerBlock)
//	60  present count u32
//	64  present bitmap, groups bits rounded up to 64
//	    CRC32C per group u32, rounded up to 8 bytes
//	    write time per group, unix ns i64
//	    version 2 only (hdrMetaBytes):
//	      tag [16]
//	      parent block id u64 (0 without a parent)
//	      meta flags u32 (bit 0: has a parent), then 4 zero bytes
//	    header CRC32C u32 over everything before it (then 4 zero bytes)
const (
	hdrFixed       = 64
	hdrFlagLive    = 1
	hdrMetaBytes   = 32
	hdrMetaParent  = 1
	headerVersion1 = 1
	headerVersion2 = 2
)

// hdrUsed is the bytes a header of version v for n groups uses, its CRC
// (and the 4 bytes after it) included.
func hdrUsed(n int, v uint32) int64 {
	used := int64(hdrFixed) + bitmapBytes(n) + int64(4*n+7)&^7 + 8*int64(n) + 8
	if v >= headerVersion2 {
		used += hdrMetaBytes
	}
	return used
}

func bitmapBytes(n int) int64 { return int64((n+63)/64) * 8 }

// Header is the decoded state of one slot.
type Header struct {
	Slot    int64
	Block   uint64
	Gen     uint64
	Live    bool
	Version uint32     // format version of the copy decoded (0: not decoded)
	Meta    index.Meta // the block's tag and parent
	Present []uint64   // bitmap, one bit per group index
	CRC     []uint32
	MTime   []int64
}

func newHeader(n int) *Header {
	return &Header{Present: make([]uint64, (n+63)/64), CRC: make([]uint32, n), MTime: make([]int64, n)}
}

// Has reports whether group idx is present.
func (h *Header) Has(idx int) bool { return h.Present[idx/64]&(1<<(idx%64)) != 0 }

func (h *Header) set(idx int, crc uint32, mtime int64) {
	h.Present[idx/64] |= 1 << (idx % 64)
	h.CRC[idx] = crc
	h.MTime[idx] = mtime
}

func (h *Header) clear(idx int) {
	h.Present[idx/64] &^= 1 << (idx % 64)
	h.CRC[idx] = 0
	h.MTime[idx] = 0
}

// Count is the number of present groups.
func (h *Header) Count() int {
	n := 0
	for _, w := range h.Present {
		n += bits.OnesCount64(w)
	}
	return n
}

func (h *Header) clone() *Header {
	c := *h
	c.Present = append([]uint64(nil), h.Present...)
	c.CRC = append([]uint32(nil), h.CRC...)
	c.MTime = append([]int64(nil), h.MTime...)
	return &c
}

// MarshalHeader encodes h as a header of the current format version for a
// store with the given UUID into b, which must be at least the header size
// for len(h.CRC) groups.
func MarshalHeader(b []byte, uuid [16]byte, h *Header) {
	MarshalHeaderVersion(b, uuid, h, FormatVersion)
}

// MarshalHeaderVersion encodes h as a header of format version v (1 or 2).
// Version 1 has no room for the tag and parent: they are not recorded (the
// store refuses a tag or parent for a version 1 store before it gets here).
func MarshalHeaderVersion(b []byte, uuid [16]byte, h *Header, v uint32) {
	n := len(h.CRC)
	clear(b)
	le := binary.LittleEndian
	copy(b, slotMagic)
	le.PutUint32(b[8:], v)
	if h.Live {
		le.PutUint32(b[12:], hdrFlagLive)
	}
	copy(b[16:32], uuid[:])
	le.PutUint64(b[32:], uint64(h.Slot))
	le.PutUint64(b[40:], h.Block)
	le.PutUint64(b[48:], h.Gen)
	le.PutUint32(b[56:], uint32(n))
	le.PutUint32(b[60:], uint32(h.Count()))
	o := hdrFixed
	for _, w := range h.Present {
		le.PutUint64(b[o:], w)
		o += 8
	}
	for _, c := range h.CRC {
		le.PutUint32(b[o:], c)
		o += 4
	}
	o = (o + 7) &^ 7
	for _, t := range h.MTime {
		le.PutUint64(b[o:], uint64(t))
		o += 8
	}
	if v >= headerVersion2 {
		copy(b[o:], h.Meta.Tag[:])
		if h.Meta.HasParent {
			le.PutUint64(b[o+16:], h.Meta.Parent)
			le.PutUint32(b[o+24:], hdrMetaParent)
		}
		o += hdrMetaBytes
	}
	le.PutUint32(b[o:], CRC32C(b[:o]))
}

// Header decoding outcomes besides success.
var (
	errHeaderEmpty = fmt.Errorf("%w: never written", ErrHeader)
	errHeaderOther = fmt.Errorf("%w: belongs to another store or slot", ErrHeader)
)

// UnmarshalHeader decodes a header copy of a slot of a store with the given
// UUID and groups per block. It returns errHeaderEmpty (wrapping ErrHeader)
// for bytes that were never a header, errHeaderOther for a valid header of
// another store (an old format) or slot, and ErrHeader for a damaged one.
func UnmarshalHeader(b []byte, uuid [16]byte, slot int64, groups int) (*Header, error) {
	if len(b) < hdrFixed || !bytes.Equal(b[:8], []byte(slotMagic)) {
		return nil, errHeaderEmpty
	}
	le := binary.LittleEndian
	n := int(le.Uint32(b[56:]))
	if n != groups {
		if !bytes.Equal(b[16:32], uuid[:]) {
			return nil, errHeaderOther
		}
		return nil, fmt.Errorf("%w: %d groups, store has %d", ErrHeader, n, groups)
	}
	v := le.Uint32(b[8:])
	if v != headerVersion1 && v != headerVersion2 {
		return nil, fmt.Errorf("%w: header version %d", ErrHeader, v)
	}
	end := int(hdrUsed(n, v)) - 8
	if end+4 > len(b) {
		return nil, fmt.Errorf("%w: %d bytes, need %d", ErrHeader, len(b), end+4)
	}
	if got, want := le.Uint32(b[end:]), CRC32C(b[:end]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrHeader, got, want)
	}
	if !bytes.Equal(b[16:32], uuid[:]) || int64(le.Uint64(b[32:])) != slot {
		return nil, errHeaderOther
	}
	h := newHeader(n)
	h.Slot, h.Version = slot, v
	h.Live = le.Uint32(b[12:])&hdrFlagLive != 0
	h.Block = le.Uint64(b[40:])
	h.Gen = le.Uint64(b[48:])
	o := hdrFixed
	for i := range h.Present {
		h.Present[i] = le.Uint64(b[o:])
		o += 8
	}
	if extra := len(h.Present)*64 - n; extra > 0 && h.Present[len(h.Present)-1]>>(64-extra) != 0 {
		return nil, fmt.Errorf("%w: bitmap bits beyond the last group", ErrHeader)
	}
	for i := range h.CRC {
		h.CRC[i] = le.Uint32(b[o:])
		o += 4
	}
	o = (o + 7) &^ 7
	for i := range h.MTime {
		h.MTime[i] = int64(le.Uint64(b[o:]))
		o += 8
	}
	if v >= headerVersion2 {
		if err := decodeMeta(b[o:o+hdrMetaBytes], h); err != nil {
			return nil, err
		}
	}
	if int(le.Uint32(b[60:])) != h.Count() {
		return nil, fmt.Errorf("%w: present count %d, bitmap has %d", ErrHeader, le.Uint32(b[60:]), h.Count())
	}
	if !h.Live && h.Count() != 0 {
		return nil, fmt.Errorf("%w: tombstone with %d groups", ErrHeader, h.Count())
	}
	return h, nil
}

// decodeMeta reads a version 2 header's tag and parent into h. Only what
// MarshalHeaderVersion writes is accepted: a parent id without the flag,
// unknown flags, nonzero padding, or a block naming itself as its parent is
// damage.
func decodeMeta(b []byte, h *Header) error {
	le := binary.LittleEndian
	copy(h.Meta.Tag[:], b[:16])
	parent, flags := le.Uint64(b[16:]), le.Uint32(b[24:])
	switch {
	case flags&^hdrMetaParent != 0 || le.Uint32(b[28:]) != 0:
		return fmt.Errorf("%w: meta flags %#x", ErrHeader, flags)
	case flags == 0 && parent != 0:
		return fmt.Errorf("%w: parent %016x without the parent flag", ErrHeader, parent)
	case flags != 0 && parent == h.Block:
		return fmt.Errorf("%w: block %016x is its own parent", ErrHeader, parent)
	}
	h.Meta.Parent, h.Meta.HasParent = parent, flags != 0
	return nil
}

// marshalHeader encodes h into b in the store's format version.
func (s *Store) marshalHeader(b []byte, h *Header) {
	MarshalHeaderVersion(b, s.sb.UUID, h, s.sb.Version)
}
