package nvme

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// IdentifySize is the size of every Identify data structure.
const IdentifySize = 4096

// CTRATT bits of Identify Controller.
const (
	CtrattEnduranceGroups = 1 << 4
	CtrattFDP             = 1 << 19
)

// Controller is the part of Identify Controller (CNS 01h) kvfs uses.
type Controller struct {
	VID, SSVID uint16
	Serial     string
	Model      string
	Firmware   string
	// MDTS is the maximum data transfer size as a power of two in units of
	// the controller's minimum memory page size (CAP.MPSMIN, assumed 4 KiB);
	// 0 means no limit.
	MDTS   uint8
	CNTLID uint16
	Ver    uint32
	CTRATT uint32
	NN     uint32 // number of namespaces
	ONCS   uint16
	VWC    uint8 // bit 0: a volatile write cache is present
	SubNQN string
}

// FDP reports whether the controller supports Flexible Data Placement.
func (c *Controller) FDP() bool { return c.CTRATT&CtrattFDP != 0 }

// VolatileWriteCache reports whether writes need a Flush to be durable.
func (c *Controller) VolatileWriteCache() bool { return c.VWC&1 != 0 }

// MaxTransfer is MDTS in bytes for a 4 KiB minimum page size, 0 for no limit.
func (c *Controller) MaxTransfer() int64 {
	if c.MDTS == 0 {
		return 0
	}
	if c.MDTS > 20 { // beyond 4 GiB: treat as unlimited, the kernel limit applies
		return 0
	}
	return int64(4096) << c.MDTS
}

// DecodeController decodes an Identify Controller data structure.
func DecodeController(b []byte) (*Controller, error) {
	if len(b) < IdentifySize {
		return nil, fmt.Errorf("%w: identify controller of %d bytes, want %d", ErrShort, len(b), IdentifySize)
	}
	le := binary.LittleEndian
	c := &Controller{
		VID:      le.Uint16(b[0:]),
		SSVID:    le.Uint16(b[2:]),
		Serial:   ascii(b[4:24]),
		Model:    ascii(b[24:64]),
		Firmware: ascii(b[64:72]),
		MDTS:     b[77],
		CNTLID:   le.Uint16(b[78:]),
		Ver:      le.Uint32(b[80:]),
		CTRATT:   le.Uint32(b[96:]),
		NN:       le.Uint32(b[516:]),
		ONCS:     le.Uint16(b[520:]),
		VWC:      b[525],
		SubNQN:   ascii(b[768:1024]),
	}
	return c, nil
}

// LBAFormat is one entry of a namespace's LBA format list.
type LBAFormat struct {
	MetaSize uint16 // MS: metadata bytes per logical block
	DataSize uint32 // 1 << LBADS bytes
	RP       uint8  // relative performance
}

// Namespace is the part of Identify Namespace (CNS 00h, NVM) kvfs uses.
type Namespace struct {
	NSZE, NCAP, NUSE uint64 // in logical blocks
	NLBAF            int    // number of LBA formats (1-based count)
	FormatIndex      int    // the LBA format in use (FLBAS)
	ExtendedMeta     bool   // metadata transferred at the end of each LBA
	DPS              uint8  // end-to-end protection settings
	ENDGID           uint16 // endurance group id
	Formats          []LBAFormat
}

// Format is the LBA format in use.
func (n *Namespace) Format() LBAFormat { return n.Formats[n.FormatIndex] }

// LBASize is the size of one logical block as data moves to and from the
// host: the data size plus the metadata size when metadata is extended
// (interleaved); with separate metadata, the data size alone.
func (n *Namespace) LBASize() int {
	f := n.Format()
	if n.ExtendedMeta {
		return int(f.DataSize) + int(f.MetaSize)
	}
	return int(f.DataSize)
}

// Size is the namespace size in bytes of data.
func (n *Namespace) Size() int64 { return int64(n.NSZE) * int64(n.Format().DataSize) }

// DecodeNamespace decodes an Identify Namespace data structure.
func DecodeNamespace(b []byte) (*Namespace, error) {
	if len(b) < IdentifySize {
		return nil, fmt.Errorf("%w: identify namespace of %d bytes, want %d", ErrShort, len(b), IdentifySize)
	}
	le := binary.LittleEndian
	n := &Namespace{
		NSZE:   le.Uint64(b[0:]),
		NCAP:   le.Uint64(b[8:]),
		NUSE:   le.Uint64(b[16:]),
		NLBAF:  int(b[25]) + 1,
		DPS:    b[29],
		ENDGID: le.Uint16(b[102:]),
	}
	flbas := b[26]
	n.FormatIndex = int(flbas&0xF) | int(flbas>>5&3)<<4
	n.ExtendedMeta = flbas&0x10 != 0
	if n.NLBAF > 64 {
		return nil, fmt.Errorf("%w: %d LBA formats (max 64)", ErrFormat, n.NLBAF)
	}
	if n.FormatIndex >= n.NLBAF {
		return nil, fmt.Errorf("%w: LBA format %d in use of %d", ErrFormat, n.FormatIndex, n.NLBAF)
	}
	n.Formats = make([]LBAFormat, n.NLBAF)
	for i := range n.Formats {
		v := le.Uint32(b[128+4*i:])
		lbads := uint8(v >> 16)
		if i == n.FormatIndex && (lbads < 9 || lbads > 31) {
			return nil, fmt.Errorf("%w: LBA format %d has LBADS %d (want 9..31)", ErrFormat, i, lbads)
		}
		f := LBAFormat{MetaSize: uint16(v), RP: uint8(v>>24) & 3}
		if lbads >= 9 && lbads <= 31 {
			f.DataSize = 1 << lbads
		}
		n.Formats[i] = f
	}
	if n.NSZE == 0 {
		return nil, fmt.Errorf("%w: namespace of 0 blocks", ErrFormat)
	}
	if n.NSZE > 1<<62/uint64(n.Format().DataSize) {
		return nil, fmt.Errorf("%w: namespace of %d blocks overflows", ErrFormat, n.NSZE)
	}
	return n, nil
}

// ascii trims an Identify string field (space padded, maybe NUL padded).
func ascii(b []byte) string {
	s := strings.TrimRight(string(b), " \x00")
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7E {
			return '?'
		}
		return r
	}, s)
}
