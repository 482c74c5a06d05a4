// Package abi is the kvfs control ABI, version 1: the ioctl numbers, the
// fixed-size little-endian structs of include/kvfs.h, their encoders, and a
// decoder of requests that returns a sentinel error for each way a request
// can be wrong. The daemon (package ctl) and the Go client (package client)
// share it; docs/abi.md is the reference and include/kvfs.h the C view.
//
// Every struct here mirrors its C counterpart field for field (the tests
// compare sizes and offsets with a compiled C program). Encoding and decoding
// go through encoding/binary at the documented offsets, never through
// unsafe casts, so they are independent of the host's byte order.
package abi

import "encoding/binary"

// Version is the ABI version this package speaks.
const Version = 1

// Minor is the minor version of ABI 1 this package speaks, reported in
// Info.ABIMinor. Minor 1 added REGISTER_FD, the pinning limits of INFO, the
// per-entry BadOverlap detail and strict path registration; a daemon of
// minor 0 reports 0 there (the field was reserved). Minor 2 added KV-cache
// targets and block-granular LOAD/STORE (blocks.go, CapBlocks). Minor 3
// added block tags and parents, the TagMismatch detail and LOOKUP
// (prefix.go, CapPrefix).
const Minor = 3

// Magic is the ioctl type byte of kvfs.
const Magic = 0xB7

// ioctl direction bits (asm-generic/ioctl.h).
const (
	dirNone  = 0
	dirWrite = 1
	dirRead  = 2

	sizeBits = 14
	// MaxIoctlSize is the largest argument a restricted ioctl can carry.
	MaxIoctlSize = 1<<sizeBits - 1
)

func ioc(dir, nr, size uint32) uint32 {
	return dir<<30 | size<<16 | Magic<<8 | nr
}

// IoctlSize is _IOC_SIZE(cmd).
func IoctlSize(cmd uint32) int { return int(cmd >> 16 & MaxIoctlSize) }

// IoctlDir is _IOC_DIR(cmd): bit 0 write (user → daemon), bit 1 read.
func IoctlDir(cmd uint32) uint32 { return cmd >> 30 }

// Struct sizes.
const (
	InfoSize         = 192
	RegisterHostSize = 4096
	UnregisterSize   = 8
	RegisterFDSize   = 64
	BatchHeaderSize  = 16
	EntrySize        = 32
	PathMax          = RegisterHostSize - 32 // bytes of kvfs_register_host.path, NUL included

	// BatchMax and BatchSmallMax are the entries of the two batch sizes.
	BatchMax      = (MaxIoctlSize - BatchHeaderSize) / EntrySize // 511
	BatchSmallMax = 63
	BatchSize     = BatchHeaderSize + BatchMax*EntrySize      // 16368
	BatchSmallSz  = BatchHeaderSize + BatchSmallMax*EntrySize // 2032
)

// The ioctl commands.
var (
	CmdInfo         = ioc(dirRead, 0x01, InfoSize)
	CmdRegisterHost = ioc(dirRead|dirWrite, 0x02, RegisterHostSize)
	CmdUnregister   = ioc(dirWrite, 0x03, UnregisterSize)
	CmdRegisterFD   = ioc(dirRead|dirWrite, 0x05, RegisterFDSize)
	CmdLoad         = ioc(dirRead|dirWrite, 0x10, BatchSize)
	CmdStore        = ioc(dirRead|dirWrite, 0x11, BatchSize)
	CmdLoadSmall    = ioc(dirRead|dirWrite, 0x12, BatchSmallSz)
	CmdStoreSmall   = ioc(dirRead|dirWrite, 0x13, BatchSmallSz)
)

// Capabilities reported by INFO.
const (
	CapHost         uint64 = 1 << 0
	CapStore        uint64 = 1 << 1
	CapPitch        uint64 = 1 << 2
	CapFixedBuffers uint64 = 1 << 3
	CapCUDA         uint64 = 1 << 4
	// CapRegisterFD: REGISTER_FD (the daemon takes the caller's descriptor).
	CapRegisterFD uint64 = 1 << 5
	// CapLimits: INFO's ABIMinor and pinning-limit fields are filled in.
	CapLimits uint64 = 1 << 6
)

// Status is the outcome of one batch entry.
type Status uint8

// Entry statuses.
const (
	OK         Status = 0
	Absent     Status = 1
	Corrupt    Status = 2
	BadRequest Status = 3
	IOError    Status = 4
	NoSpace    Status = 5
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Absent:
		return "absent"
	case Corrupt:
		return "corrupt"
	case BadRequest:
		return "bad-request"
	case IOError:
		return "io-error"
	case NoSpace:
		return "no-space"
	}
	return "status(" + itoa(int(s)) + ")"
}

// Detail says why an entry is BadRequest (or, TagMismatch, why it is
// Absent).
type Detail uint8

// Entry details.
const (
	BadNone     Detail = 0
	BadKey      Detail = 1
	BadBuffer   Detail = 2
	BadRange    Detail = 3
	BadPitch    Detail = 4
	BadReserved Detail = 5
	BadOverlap  Detail = 6
)

func (d Detail) String() string {
	switch d {
	case BadNone:
		return ""
	case BadKey:
		return "layer, head or kind outside the geometry"
	case BadBuffer:
		return "buffer not registered on this handle"
	case BadRange:
		return "tile outside the registered buffer"
	case BadPitch:
		return "pitch smaller than a row"
	case BadReserved:
		return "reserved field not zero"
	case BadOverlap:
		return "destination overlaps another entry's in the same load"
	case BadParent:
		return "parent is the block itself or lacks its flag"
	case BadMeta:
		return "entries of one block disagree on tag or parent"
	case TagMismatch:
		return "block stored under another tag"
	}
	return "detail(" + itoa(int(d)) + ")"
}

func itoa(v int) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	neg := v < 0
	if neg {
		v = -v
	}
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if neg {
		i--
		b[i] = '-'
	}
	return string(b[i:])
}

var le = binary.LittleEndian

// Info is struct kvfs_info.
type Info struct {
	ABI                uint32
	Size               uint32
	Caps               uint64
	Layers             uint32
	KVHeads            uint32
	HeadDim            uint32
	BlockTokens        uint32
	DType              uint32
	DTypeBytes         uint32
	Align              uint32
	GroupBytes         uint32
	GroupStride        uint64
	GroupsPerBlock     uint32
	RowBytes           uint32
	MaxEntries         uint32
	MaxEntriesSmall    uint32
	MaxBuffers         uint32
	Reserved0          uint32
	MaxRegisteredBytes uint64
	Slots              uint64
	UsedSlots          uint64
	UUID               [16]byte
	Engine             [16]byte
	MaxPinnedBytes     uint64 // daemon-wide cap on pinned registered memory (0: the engine pins nothing)
	MaxPinnedPerUID    uint64 // share of one uid
	PinnedBytes        uint64 // pinned now, all callers
	ABIMinor           uint32 // Minor of the daemon (0 before minor 1)
	MaxBlockEntries    uint32 // minor 2: block entries per LOAD_BLOCKS/STORE_BLOCKS (0 before)
	Reserved           [3]uint64
}

// Marshal encodes i into b (InfoSize bytes).
func (i *Info) Marshal(b []byte) {
	_ = b[InfoSize-1]
	clear(b[:InfoSize])
	le.PutUint32(b[0:], i.ABI)
	le.PutUint32(b[4:], i.Size)
	le.PutUint64(b[8:], i.Caps)
	le.PutUint32(b[16:], i.Layers)
	le.PutUint32(b[20:], i.KVHeads)
	le.PutUint32(b[24:], i.HeadDim)
	le.PutUint32(b[28:], i.BlockTokens)
	le.PutUint32(b[32:], i.DType)
	le.PutUint32(b[36:], i.DTypeBytes)
	le.PutUint32(b[40:], i.Align)
	le.PutUint32(b[44:], i.GroupBytes)
	le.PutUint64(b[48:], i.GroupStride)
	le.PutUint32(b[56:], i.GroupsPerBlock)
	le.PutUint32(b[60:], i.RowBytes)
	le.PutUint32(b[64:], i.MaxEntries)
	le.PutUint32(b[68:], i.MaxEntriesSmall)
	le.PutUint32(b[72:], i.MaxBuffers)
	le.PutUint32(b[76:], i.Reserved0)
	le.PutUint64(b[80:], i.MaxRegisteredBytes)
	le.PutUint64(b[88:], i.Slots)
	le.PutUint64(b[96:], i.UsedSlots)
	copy(b[104:120], i.UUID[:])
	copy(b[120:136], i.Engine[:])
	le.PutUint64(b[136:], i.MaxPinnedBytes)
	le.PutUint64(b[144:], i.MaxPinnedPerUID)
	le.PutUint64(b[152:], i.PinnedBytes)
	le.PutUint32(b[160:], i.ABIMinor)
	le.PutUint32(b[164:], i.MaxBlockEntries)
	for k, v := range i.Reserved {
		le.PutUint64(b[168+8*k:], v)
	}
}

// Unmarshal decodes b (InfoSize bytes) into i.
func (i *Info) Unmarshal(b []byte) {
	_ = b[InfoSize-1]
	i.ABI = le.Uint32(b[0:])
	i.Size = le.Uint32(b[4:])
	i.Caps = le.Uint64(b[8:])
	i.Layers = le.Uint32(b[16:])
	i.KVHeads = le.Uint32(b[20:])
	i.HeadDim = le.Uint32(b[24:])
	i.BlockTokens = le.Uint32(b[28:])
	i.DType = le.Uint32(b[32:])
	i.DTypeBytes = le.Uint32(b[36:])
	i.Align = le.Uint32(b[40:])
	i.GroupBytes = le.Uint32(b[44:])
	i.GroupStride = le.Uint64(b[48:])
	i.GroupsPerBlock = le.Uint32(b[56:])
	i.RowBytes = le.Uint32(b[60:])
	i.MaxEntries = le.Uint32(b[64:])
	i.MaxEntriesSmall = le.Uint32(b[68:])
	i.MaxBuffers = le.Uint32(b[72:])
	i.Reserved0 = le.Uint32(b[76:])
	i.MaxRegisteredBytes = le.Uint64(b[80:])
	i.Slots = le.Uint64(b[88:])
	i.UsedSlots = le.Uint64(b[96:])
	copy(i.UUID[:], b[104:120])
	copy(i.Engine[:], b[120:136])
	i.MaxPinnedBytes = le.Uint64(b[136:])
	i.MaxPinnedPerUID = le.Uint64(b[144:])
	i.PinnedBytes = le.Uint64(b[152:])
	i.ABIMinor = le.Uint32(b[160:])
	i.MaxBlockEntries = le.Uint32(b[164:])
	for k := range i.Reserved {
		i.Reserved[k] = le.Uint64(b[168+8*k:])
	}
}

// EngineName is the Engine field without its NUL padding.
func (i *Info) EngineName() string {
	n := 0
	for n < len(i.Engine) && i.Engine[n] != 0 {
		n++
	}
	return string(i.Engine[:n])
}

// RegisterHost is struct kvfs_register_host.
type RegisterHost struct {
	ABI       uint32
	Flags     uint32
	Length    uint64
	Buffer    uint32
	Reserved0 uint32
	Reserved1 uint64
	Path      [PathMax]byte
}

// SetPath stores p, NUL terminated; it reports false when p does not fit.
func (r *RegisterHost) SetPath(p string) bool {
	if len(p) >= PathMax {
		return false
	}
	clear(r.Path[:])
	copy(r.Path[:], p)
	return true
}

// Marshal encodes r into b (RegisterHostSize bytes).
func (r *RegisterHost) Marshal(b []byte) {
	_ = b[RegisterHostSize-1]
	le.PutUint32(b[0:], r.ABI)
	le.PutUint32(b[4:], r.Flags)
	le.PutUint64(b[8:], r.Length)
	le.PutUint32(b[16:], r.Buffer)
	le.PutUint32(b[20:], r.Reserved0)
	le.PutUint64(b[24:], r.Reserved1)
	copy(b[32:RegisterHostSize], r.Path[:])
}

// Unmarshal decodes b (RegisterHostSize bytes) into r.
func (r *RegisterHost) Unmarshal(b []byte) {
	_ = b[RegisterHostSize-1]
	r.ABI = le.Uint32(b[0:])
	r.Flags = le.Uint32(b[4:])
	r.Length = le.Uint64(b[8:])
	r.Buffer = le.Uint32(b[16:])
	r.Reserved0 = le.Uint32(b[20:])
	r.Reserved1 = le.Uint64(b[24:])
	copy(r.Path[:], b[32:RegisterHostSize])
}

// RegisterFD is struct kvfs_register_fd: register a descriptor the caller
// holds (the daemon takes it with pidfd_getfd, so the kernel decided the
// caller may open the file read-write).
type RegisterFD struct {
	ABI       uint32
	Flags     uint32
	Length    uint64 // in: bytes from offset 0, 0 = the whole file; out: registered
	Buffer    uint32 // out: buffer id; 0 on input
	FD        int32  // in: the caller's descriptor, open O_RDWR
	Pinned    uint32 // out: 1 when the engine pinned the memory for fixed-buffer I/O; 0 on input
	Reserved0 uint32
	Reserved  [4]uint64
}

// Marshal encodes r into b (RegisterFDSize bytes).
func (r *RegisterFD) Marshal(b []byte) {
	_ = b[RegisterFDSize-1]
	le.PutUint32(b[0:], r.ABI)
	le.PutUint32(b[4:], r.Flags)
	le.PutUint64(b[8:], r.Length)
	le.PutUint32(b[16:], r.Buffer)
	le.PutUint32(b[20:], uint32(r.FD))
	le.PutUint32(b[24:], r.Pinned)
	le.PutUint32(b[28:], r.Reserved0)
	for k, v := range r.Reserved {
		le.PutUint64(b[32+8*k:], v)
	}
}

// Unmarshal decodes b (RegisterFDSize bytes) into r.
func (r *RegisterFD) Unmarshal(b []byte) {
	_ = b[RegisterFDSize-1]
	r.ABI = le.Uint32(b[0:])
	r.Flags = le.Uint32(b[4:])
	r.Length = le.Uint64(b[8:])
	r.Buffer = le.Uint32(b[16:])
	r.FD = int32(le.Uint32(b[20:]))
	r.Pinned = le.Uint32(b[24:])
	r.Reserved0 = le.Uint32(b[28:])
	for k := range r.Reserved {
		r.Reserved[k] = le.Uint64(b[32+8*k:])
	}
}

// Unregister is struct kvfs_unregister.
type Unregister struct {
	ABI    uint32
	Buffer uint32
}

// Marshal encodes u into b (UnregisterSize bytes).
func (u *Unregister) Marshal(b []byte) {
	_ = b[UnregisterSize-1]
	le.PutUint32(b[0:], u.ABI)
	le.PutUint32(b[4:], u.Buffer)
}

// Unmarshal decodes b (UnregisterSize bytes) into u.
func (u *Unregister) Unmarshal(b []byte) {
	_ = b[UnregisterSize-1]
	u.ABI = le.Uint32(b[0:])
	u.Buffer = le.Uint32(b[4:])
}

// BatchHeader is struct kvfs_batch_hdr.
type BatchHeader struct {
	ABI   uint32
	Count uint32
	Flags uint32
	NOK   uint32
}

// Marshal encodes h into b (BatchHeaderSize bytes).
func (h *BatchHeader) Marshal(b []byte) {
	_ = b[BatchHeaderSize-1]
	le.PutUint32(b[0:], h.ABI)
	le.PutUint32(b[4:], h.Count)
	le.PutUint32(b[8:], h.Flags)
	le.PutUint32(b[12:], h.NOK)
}

// Unmarshal decodes b (BatchHeaderSize bytes) into h.
func (h *BatchHeader) Unmarshal(b []byte) {
	_ = b[BatchHeaderSize-1]
	h.ABI = le.Uint32(b[0:])
	h.Count = le.Uint32(b[4:])
	h.Flags = le.Uint32(b[8:])
	h.NOK = le.Uint32(b[12:])
}

// Entry is struct kvfs_entry.
type Entry struct {
	Block    uint64
	Offset   uint64
	Buffer   uint32
	Pitch    uint32
	Layer    uint16
	Head     uint16
	Kind     uint8
	Status   Status
	Detail   Detail
	Reserved uint8
}

// Marshal encodes e into b (EntrySize bytes).
func (e *Entry) Marshal(b []byte) {
	_ = b[EntrySize-1]
	le.PutUint64(b[0:], e.Block)
	le.PutUint64(b[8:], e.Offset)
	le.PutUint32(b[16:], e.Buffer)
	le.PutUint32(b[20:], e.Pitch)
	le.PutUint16(b[24:], e.Layer)
	le.PutUint16(b[26:], e.Head)
	b[28] = e.Kind
	b[29] = uint8(e.Status)
	b[30] = uint8(e.Detail)
	b[31] = e.Reserved
}

// Unmarshal decodes b (EntrySize bytes) into e.
func (e *Entry) Unmarshal(b []byte) {
	_ = b[EntrySize-1]
	e.Block = le.Uint64(b[0:])
	e.Offset = le.Uint64(b[8:])
	e.Buffer = le.Uint32(b[16:])
	e.Pitch = le.Uint32(b[20:])
	e.Layer = le.Uint16(b[24:])
	e.Head = le.Uint16(b[26:])
	e.Kind = b[28]
	e.Status = Status(b[29])
	e.Detail = Detail(b[30])
	e.Reserved = b[31]
}

// Offsets of the per-entry output fields, for writing statuses in place.
const (
	EntryStatusOff = 29
	EntryDetailOff = 30
	HeaderNOKOff   = 12
)
