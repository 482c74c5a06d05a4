package store

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"time"

	"github.com/kvfs/kvfs/layout"
)

// On-disk format, version 2 (version 1 is still read and written: see
// FormatVersion). All integers little-endian.
//
//	offset 0          superblock copy 0   (SuperblockSize bytes)
//	offset 64 KiB     superblock copy 1
//	DataOffset        slot 0, slot 1, …   (SlotBytes each)
//
// A slot is two header copies (HeaderBytes each, the current one is the valid
// copy with the highest generation) followed by the group payloads
// (GroupsPerBlock × GroupStride bytes, in layout.Index order).
const (
	// FormatVersion is the format new stores get. Version 2 slot headers
	// record each block's tag and parent; a version 1 store (headers
	// without them, one header-size rounding smaller) opens and serves,
	// its blocks untagged and without parents, and keeps writing version
	// 1 headers, so that an older kvfs still reads it.
	FormatVersion = 2
	// MinFormatVersion is the oldest format this kvfs opens.
	MinFormatVersion = 1
	SuperblockSize   = 4096
	superblockCopy1  = 64 << 10
	superMagic       = "KVFSSUPR"
	slotMagic        = "KVFSSLOT"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C is the checksum kvfs uses for groups and metadata.
func CRC32C(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Superblock describes a store; two copies are kept.
type Superblock struct {
	Version     uint32
	Copy        uint32
	UUID        [16]byte
	Geometry    layout.Geometry
	HeaderBytes int64 // one header copy
	SlotBytes   int64
	DataOffset  int64
	Slots       int64
	Size        int64 // bytes of the device the store uses
	Created     time.Time
}

// UUIDString formats the store's UUID.
func (sb *Superblock) UUIDString() string {
	u := sb.UUID
	return fmt.Sprintf("%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

// headerBytes is the size of one slot header copy for g in format
// version v.
func headerBytes(g layout.Geometry, v uint32) int64 {
	return layout.RoundUp(hdrUsed(g.GroupsPerBlock(), v), int64(g.Align))
}

// planLayout fills the derived fields of sb from its version, geometry and
// size.
func planLayout(sb *Superblock) error {
	g := sb.Geometry
	sb.HeaderBytes = headerBytes(g, sb.Version)
	sb.SlotBytes = 2*sb.HeaderBytes + g.PayloadBytes()
	sb.DataOffset = layout.RoundUp(superblockCopy1+SuperblockSize, int64(g.Align))
	if sb.Size < sb.DataOffset+sb.SlotBytes {
		return fmt.Errorf("%w: %d bytes, one slot needs %d (superblocks %d + slot %d)",
			ErrTooSmall, sb.Size, sb.DataOffset+sb.SlotBytes, sb.DataOffset, sb.SlotBytes)
	}
	sb.Slots = (sb.Size - sb.DataOffset) / sb.SlotBytes
	return nil
}

// SlotBytes is the size of one slot of geometry g (in the current format):
// two header copies and the payloads.
func SlotBytes(g layout.Geometry) int64 { return 2*headerBytes(g, FormatVersion) + g.PayloadBytes() }

// SizeFor is the device size that holds exactly slots slots of geometry g.
func SizeFor(g layout.Geometry, slots int64) int64 { return MinSize(g) + (slots-1)*SlotBytes(g) }

// MinSize is the smallest device that holds one slot of geometry g.
func MinSize(g layout.Geometry) int64 {
	sb := Superblock{Geometry: g}
	sb.HeaderBytes = headerBytes(g, FormatVersion)
	return layout.RoundUp(superblockCopy1+SuperblockSize, int64(g.Align)) + 2*sb.HeaderBytes + g.PayloadBytes()
}

// MarshalSuperblock encodes sb into SuperblockSize bytes.
func MarshalSuperblock(sb *Superblock) []byte {
	b := make([]byte, SuperblockSize)
	copy(b, superMagic)
	le := binary.LittleEndian
	le.PutUint32(b[8:], sb.Version)
	le.PutUint32(b[12:], sb.Copy)
	copy(b[16:32], sb.UUID[:])
	g := sb.Geometry
	le.PutUint32(b[32:], uint32(g.Layers))
	le.PutUint32(b[36:], uint32(g.KVHeads))
	le.PutUint32(b[40:], uint32(g.HeadDim))
	le.PutUint32(b[44:], uint32(g.BlockTokens))
	le.PutUint32(b[48:], uint32(g.DType))
	le.PutUint32(b[52:], uint32(g.Align))
	le.PutUint64(b[56:], uint64(sb.HeaderBytes))
	le.PutUint64(b[64:], uint64(sb.SlotBytes))
	le.PutUint64(b[72:], uint64(sb.DataOffset))
	le.PutUint64(b[80:], uint64(sb.Slots))
	le.PutUint64(b[88:], uint64(sb.Size))
	le.PutUint64(b[96:], uint64(sb.Created.UnixNano()))
	le.PutUint32(b[SuperblockSize-4:], CRC32C(b[:SuperblockSize-4]))
	return b
}

// UnmarshalSuperblock decodes and validates a superblock. It returns
// ErrNoStore for bytes that are not a superblock at all, ErrSuperblock for a
// damaged one and ErrVersion for another format version.
func UnmarshalSuperblock(b []byte) (*Superblock, error) {
	if len(b) < SuperblockSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrSuperblock, len(b))
	}
	b = b[:SuperblockSize]
	if !bytes.Equal(b[:8], []byte(superMagic)) {
		return nil, fmt.Errorf("%w: no superblock magic", ErrNoStore)
	}
	le := binary.LittleEndian
	if got, want := le.Uint32(b[SuperblockSize-4:]), CRC32C(b[:SuperblockSize-4]); got != want {
		return nil, fmt.Errorf("%w: checksum %08x, want %08x", ErrSuperblock, got, want)
	}
	sb := &Superblock{Version: le.Uint32(b[8:]), Copy: le.Uint32(b[12:])}
	if sb.Version < MinFormatVersion || sb.Version > FormatVersion {
		return nil, fmt.Errorf("%w: version %d, this kvfs reads versions %d to %d", ErrVersion, sb.Version, MinFormatVersion, FormatVersion)
	}
	copy(sb.UUID[:], b[16:32])
	u32 := func(o int) int { return int(le.Uint32(b[o:])) }
	sb.Geometry = layout.Geometry{Layers: u32(32), KVHeads: u32(36), HeadDim: u32(40), BlockTokens: u32(44),
		DType: layout.DType(le.Uint32(b[48:])), Align: u32(52)}
	if le.Uint32(b[48:]) > 255 {
		sb.Geometry.DType = 0
	}
	if err := sb.Geometry.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrSuperblock, err)
	}
	sb.HeaderBytes = int64(le.Uint64(b[56:]))
	sb.SlotBytes = int64(le.Uint64(b[64:]))
	sb.DataOffset = int64(le.Uint64(b[72:]))
	sb.Slots = int64(le.Uint64(b[80:]))
	sb.Size = int64(le.Uint64(b[88:]))
	sb.Created = time.Unix(0, int64(le.Uint64(b[96:])))
	want := Superblock{Version: sb.Version, Geometry: sb.Geometry, Size: sb.Size}
	if sb.Size <= 0 || planLayout(&want) != nil || want.HeaderBytes != sb.HeaderBytes ||
		want.SlotBytes != sb.SlotBytes || want.DataOffset != sb.DataOffset || want.Slots != sb.Slots {
		return nil, fmt.Errorf("%w: layout fields disagree with the geometry", ErrSuperblock)
	}
	return sb, nil
}

// FormatOptions control Format.
type FormatOptions struct {
	// Force overwrites an existing store.
	Force bool
	// Size is the number of bytes to use; 0 means the whole engine.
	Size int64
	// UUID of the new store; zero means random.
	UUID [16]byte
	// Now stamps the superblock; nil means time.Now.
	Now func() time.Time
	// Version is the format version to write, MinFormatVersion to
	// FormatVersion; 0 means FormatVersion. An older version is for a
	// store an older kvfs must read too (and for tests of the upgrade).
	Version uint32
}

// Format writes a new, empty store with geometry g through e. It refuses to
// overwrite an existing store (either superblock copy valid) unless Force.
// Old slot headers are invalidated by the new UUID, so format is O(1).
func Format(e Engine, g layout.Geometry, o FormatOptions) (*Superblock, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if a := e.Align(); a > SuperblockSize || g.Align%a != 0 {
		return nil, fmt.Errorf("%w: the device needs %d-byte alignment, the geometry aligns to %d", layout.ErrGeometry, a, g.Align)
	}
	if !o.Force {
		found, err := HoldsStore(e)
		if err != nil {
			return nil, err
		}
		if found {
			return nil, ErrExists
		}
	}
	size := o.Size
	if size == 0 || size > e.Size() {
		size = e.Size()
	}
	v := o.Version
	if v == 0 {
		v = FormatVersion
	}
	if v < MinFormatVersion || v > FormatVersion {
		return nil, fmt.Errorf("%w: version %d, this kvfs writes versions %d to %d", ErrVersion, v, MinFormatVersion, FormatVersion)
	}
	sb := &Superblock{Version: v, UUID: o.UUID, Geometry: g, Size: size}
	if sb.UUID == ([16]byte{}) {
		if _, err := rand.Read(sb.UUID[:]); err != nil {
			return nil, fmt.Errorf("store: uuid: %w", err)
		}
		sb.UUID[6] = sb.UUID[6]&0x0f | 0x40
		sb.UUID[8] = sb.UUID[8]&0x3f | 0x80
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	sb.Created = now()
	if err := planLayout(sb); err != nil {
		return nil, err
	}
	if err := writeSuperblocks(e, sb, []int{0, 1}); err != nil {
		return nil, err
	}
	return sb, nil
}

// HoldsStore reports whether e holds a kvfs store, or something that might
// be one: either superblock copy is valid, damaged, or of another version.
// Only bytes without the superblock magic in both places count as free. A
// device too small for a copy holds none there.
func HoldsStore(e Engine) (bool, error) {
	for _, off := range []int64{0, superblockCopy1} {
		if off+SuperblockSize > e.Size() {
			break
		}
		b, err := readAligned(e, off, SuperblockSize)
		if err != nil {
			return false, fmt.Errorf("store: read superblock at %d: %w", off, err)
		}
		if _, err := UnmarshalSuperblock(b); err == nil || !errors.Is(err, ErrNoStore) {
			return true, nil
		}
	}
	return false, nil
}

func writeSuperblocks(e Engine, sb *Superblock, copies []int) error {
	buf, err := AllocAligned(SuperblockSize * len(copies))
	if err != nil {
		return err
	}
	defer FreeAligned(buf)
	ios := make([]IO, 0, len(copies))
	for i, c := range copies {
		s := *sb
		s.Copy = uint32(c)
		b := buf[i*SuperblockSize : (i+1)*SuperblockSize]
		copy(b, MarshalSuperblock(&s))
		off := int64(0)
		if c == 1 {
			off = superblockCopy1
		}
		ios = append(ios, IO{Op: OpWrite, Off: off, Buf: b, Stream: StreamMeta})
	}
	if err := doAll(e, ios); err != nil {
		return fmt.Errorf("store: write superblock: %w", err)
	}
	if err := e.Sync(); err != nil {
		return fmt.Errorf("store: sync superblock: %w", err)
	}
	return nil
}

// readAligned reads n bytes at off into a fresh aligned buffer.
func readAligned(e Engine, off int64, n int) ([]byte, error) {
	buf, err := AllocAligned(n)
	if err != nil {
		return nil, err
	}
	defer FreeAligned(buf)
	if err := doAll(e, []IO{{Op: OpRead, Off: off, Buf: buf, Stream: StreamMeta}}); err != nil {
		return nil, err
	}
	return append([]byte(nil), buf...), nil
}

// doAll runs ios and returns the first error, engine-wide or per request.
func doAll(e Engine, ios []IO) error {
	if err := e.Do(ios); err != nil {
		return err
	}
	for i := range ios {
		if ios[i].Err != nil {
			return ios[i].Err
		}
	}
	return nil
}
