package nvme

import (
	"encoding/binary"
	"fmt"
)

// I/O command opcodes (NVM command set).
const (
	OpFlush      uint8 = 0x00
	OpWrite      uint8 = 0x01
	OpRead       uint8 = 0x02
	OpIOMgmtRecv uint8 = 0x12 // I/O Management Receive
)

// Admin command opcodes.
const (
	AdminGetLogPage  uint8 = 0x02
	AdminIdentify    uint8 = 0x06
	AdminGetFeatures uint8 = 0x0A
)

// Identify CNS values.
const (
	CNSNamespace  = 0x00
	CNSController = 0x01
)

// Log page and feature identifiers.
const (
	LogFDPConfigs  = 0x20 // FDP configurations, scoped to an endurance group
	FeatureFDP     = 0x1D // Flexible Data Placement, scoped to an endurance group
	IOMgmtRUHS     = 0x01 // I/O Management Receive: reclaim unit handle status
	DTypePlacement = 2    // directive type of FDP data placement
)

// Command dword 12 and 13 fields of read and write.
const (
	cdw12FUA        = 1 << 30
	cdw12DTypeShift = 20
	cdw13DSpecShift = 16
	maxNLB          = 1 << 16 // NLB is a 16-bit 0's based count
)

// ioctl and io_uring command numbers (include/uapi/linux/nvme_ioctl.h).
const (
	ioctlID           = 0x4E40     // _IO('N', 0x40): namespace id of the fd
	ioctlAdminCmd     = 0xC0484E41 // _IOWR('N', 0x41, struct nvme_admin_cmd)
	ioctlIOCmd        = 0xC0484E43 // _IOWR('N', 0x43, struct nvme_passthru_cmd)
	URingCmdIO        = 0xC0484E80 // _IOWR('N', 0x80, struct nvme_uring_cmd)
	URingCmdAdmin     = 0xC0484E82 // _IOWR('N', 0x82, struct nvme_uring_cmd)
	URingCmdIOVec     = 0xC0484E81 // vectored variant, unused
	URingCmdAdminVec  = 0xC0484E83 // vectored variant, unused
	CmdSize           = 72         // sizeof(struct nvme_uring_cmd) == sizeof(struct nvme_passthru_cmd)
	uringCmdSQEOffset = 48         // where the command sits in a 128-byte SQE
)

// Command is struct nvme_uring_cmd (and, with Result in place of the
// reserved last word, struct nvme_passthru_cmd of the ioctls): 72 bytes.
// Addr is the user address of the data buffer; for fixed-buffer
// io_uring submissions it is an address inside the registered buffer.
type Command struct {
	Opcode      uint8
	Flags       uint8
	Rsvd1       uint16
	NSID        uint32
	CDW2        uint32
	CDW3        uint32
	Metadata    uint64
	Addr        uint64
	MetadataLen uint32
	DataLen     uint32
	CDW10       uint32
	CDW11       uint32
	CDW12       uint32
	CDW13       uint32
	CDW14       uint32
	CDW15       uint32
	TimeoutMS   uint32
	Result      uint32 // rsvd2 in nvme_uring_cmd; dword 0 of the CQE for ioctls
}

// Encode writes c in the kernel's little-endian layout into b[:CmdSize].
func (c *Command) Encode(b []byte) {
	_ = b[CmdSize-1]
	le := binary.LittleEndian
	b[0] = c.Opcode
	b[1] = c.Flags
	le.PutUint16(b[2:], c.Rsvd1)
	le.PutUint32(b[4:], c.NSID)
	le.PutUint32(b[8:], c.CDW2)
	le.PutUint32(b[12:], c.CDW3)
	le.PutUint64(b[16:], c.Metadata)
	le.PutUint64(b[24:], c.Addr)
	le.PutUint32(b[32:], c.MetadataLen)
	le.PutUint32(b[36:], c.DataLen)
	le.PutUint32(b[40:], c.CDW10)
	le.PutUint32(b[44:], c.CDW11)
	le.PutUint32(b[48:], c.CDW12)
	le.PutUint32(b[52:], c.CDW13)
	le.PutUint32(b[56:], c.CDW14)
	le.PutUint32(b[60:], c.CDW15)
	le.PutUint32(b[64:], c.TimeoutMS)
	le.PutUint32(b[68:], c.Result)
}

// DecodeCommand is the inverse of Encode (used by tests and tracing).
func DecodeCommand(b []byte) (Command, error) {
	if len(b) < CmdSize {
		return Command{}, fmt.Errorf("%w: command of %d bytes, want %d", ErrShort, len(b), CmdSize)
	}
	le := binary.LittleEndian
	return Command{
		Opcode: b[0], Flags: b[1], Rsvd1: le.Uint16(b[2:]), NSID: le.Uint32(b[4:]),
		CDW2: le.Uint32(b[8:]), CDW3: le.Uint32(b[12:]), Metadata: le.Uint64(b[16:]),
		Addr: le.Uint64(b[24:]), MetadataLen: le.Uint32(b[32:]), DataLen: le.Uint32(b[36:]),
		CDW10: le.Uint32(b[40:]), CDW11: le.Uint32(b[44:]), CDW12: le.Uint32(b[48:]),
		CDW13: le.Uint32(b[52:]), CDW14: le.Uint32(b[56:]), CDW15: le.Uint32(b[60:]),
		TimeoutMS: le.Uint32(b[64:]), Result: le.Uint32(b[68:]),
	}, nil
}

// RW describes one read or write.
type RW struct {
	NSID uint32
	SLBA uint64 // first logical block
	NLB  uint32 // number of logical blocks, 1..65536
	Addr uint64 // user address of the buffer
	Len  uint32 // buffer length in bytes (NLB × LBA size)
	FUA  bool   // force unit access (writes and reads)
	// Placement: when DType is DTypePlacement, DSpec is the FDP placement
	// identifier the write is tagged with. Zero DType means no directive.
	DType uint8
	DSpec uint16
}

func (r RW) command(op uint8) (Command, error) {
	if r.NLB == 0 || r.NLB > maxNLB {
		return Command{}, fmt.Errorf("%w: %d logical blocks in one command (1..%d)", ErrInvalidCommand, r.NLB, maxNLB)
	}
	if r.DType > 0xF {
		return Command{}, fmt.Errorf("%w: directive type %d", ErrInvalidCommand, r.DType)
	}
	c := Command{
		Opcode:  op,
		NSID:    r.NSID,
		Addr:    r.Addr,
		DataLen: r.Len,
		CDW10:   uint32(r.SLBA),
		CDW11:   uint32(r.SLBA >> 32),
		CDW12:   (r.NLB - 1) | uint32(r.DType)<<cdw12DTypeShift,
	}
	if r.FUA {
		c.CDW12 |= cdw12FUA
	}
	if r.DType != 0 {
		c.CDW13 = uint32(r.DSpec) << cdw13DSpecShift
	}
	return c, nil
}

// ReadCmd builds an NVM Read. Directives are ignored on reads.
func ReadCmd(r RW) (Command, error) {
	r.DType, r.DSpec = 0, 0
	return r.command(OpRead)
}

// WriteCmd builds an NVM Write, with an FDP placement directive when
// r.DType is DTypePlacement.
func WriteCmd(r RW) (Command, error) { return r.command(OpWrite) }

// FlushCmd builds a Flush of the namespace's volatile write cache.
func FlushCmd(nsid uint32) Command { return Command{Opcode: OpFlush, NSID: nsid} }

// IdentifyCmd builds an admin Identify for cns into a 4096-byte buffer.
func IdentifyCmd(cns uint8, nsid uint32, addr uint64) Command {
	return Command{Opcode: AdminIdentify, NSID: nsid, Addr: addr, DataLen: 4096, CDW10: uint32(cns)}
}

// GetLogPageCmd builds an admin Get Log Page of n bytes (a multiple of 4)
// of log lid with log specific identifier lsi, starting at byte offset off.
func GetLogPageCmd(lid uint8, lsi uint16, nsid uint32, off uint64, addr uint64, n uint32) Command {
	numd := n/4 - 1
	return Command{
		Opcode: AdminGetLogPage, NSID: nsid, Addr: addr, DataLen: n,
		CDW10: uint32(lid) | (numd&0xFFFF)<<16,
		CDW11: numd>>16 | uint32(lsi)<<16,
		CDW12: uint32(off),
		CDW13: uint32(off >> 32),
	}
}

// GetFeaturesCmd builds an admin Get Features of the current value of fid
// with cdw11 (for FDP: the endurance group id).
func GetFeaturesCmd(fid uint8, nsid uint32, cdw11 uint32) Command {
	return Command{Opcode: AdminGetFeatures, NSID: nsid, CDW10: uint32(fid), CDW11: cdw11}
}

// IOMgmtRecvCmd builds an I/O Management Receive with management
// operation mo into an n-byte buffer (n a multiple of 4).
func IOMgmtRecvCmd(mo uint8, nsid uint32, addr uint64, n uint32) Command {
	return Command{Opcode: OpIOMgmtRecv, NSID: nsid, Addr: addr, DataLen: n, CDW10: uint32(mo), CDW11: n/4 - 1}
}

// FDPFeature is the decoded dword 0 of Get Features 1Dh.
type FDPFeature struct {
	Enabled     bool  // FDPE
	ConfigIndex uint8 // FDPCIDX: the FDP configuration in use
}

// DecodeFDPFeature decodes the completion dword 0 of Get Features 1Dh.
func DecodeFDPFeature(dw0 uint32) FDPFeature {
	return FDPFeature{Enabled: dw0&1 != 0, ConfigIndex: uint8(dw0 >> 8)}
}
