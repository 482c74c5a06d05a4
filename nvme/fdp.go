package nvme

import (
	"encoding/binary"
	"fmt"
)

// FDP configurations log page (20h) layout.
const (
	fdpConfsHeaderSize = 16
	fdpDescrHeaderSize = 64
	fdpRUHDescrSize    = 4
	maxFDPLogSize      = 1 << 20 // a sanity limit for the reported size
)

// RUHType is the reclaim unit handle type of a configuration.
type RUHType uint8

// Reclaim unit handle types.
const (
	RUHInitiallyIsolated    RUHType = 1
	RUHPersistentlyIsolated RUHType = 2
)

func (t RUHType) String() string {
	switch t {
	case RUHInitiallyIsolated:
		return "initially-isolated"
	case RUHPersistentlyIsolated:
		return "persistently-isolated"
	}
	return fmt.Sprintf("ruh-type(%d)", uint8(t))
}

// FDPConfig is one FDP configuration descriptor.
type FDPConfig struct {
	Valid       bool   // FDPA bit 7
	VolatileWC  bool   // FDPA bit 6: FDP volatile write cache
	RGIF        uint8  // reclaim group identifier format: bits of the RG in a placement id
	NRG         uint32 // number of reclaim groups
	NRUH        uint16 // number of reclaim unit handles
	MaxPIDs     int    // maximum placement identifiers per namespace (1-based)
	NNSS        uint32 // number of namespaces supported
	RUNS        uint64 // reclaim unit nominal size, bytes
	ERUTL       uint32 // estimated reclaim unit time limit, seconds
	HandleTypes []RUHType
}

// DecodeFDPConfigs decodes the FDP configurations log page. b may be longer
// than the page.
func DecodeFDPConfigs(b []byte) ([]FDPConfig, error) {
	if len(b) < fdpConfsHeaderSize {
		return nil, fmt.Errorf("%w: FDP configurations log of %d bytes", ErrShort, len(b))
	}
	le := binary.LittleEndian
	n := int(le.Uint16(b[0:])) + 1
	size := le.Uint32(b[4:])
	if size < fdpConfsHeaderSize || size > maxFDPLogSize {
		return nil, fmt.Errorf("%w: FDP configurations log size %d", ErrFormat, size)
	}
	if int64(len(b)) < int64(size) {
		return nil, fmt.Errorf("%w: FDP configurations log of %d bytes, header says %d", ErrShort, len(b), size)
	}
	b = b[:size]
	off := fdpConfsHeaderSize
	cfgs := make([]FDPConfig, 0, min(n, 16))
	for i := 0; i < n; i++ {
		if off+fdpDescrHeaderSize > len(b) {
			return nil, fmt.Errorf("%w: FDP configuration %d at byte %d past the log's %d bytes", ErrFormat, i, off, len(b))
		}
		d := b[off:]
		dsze := int(le.Uint16(d[0:]))
		fdpa := d[2]
		vss := int(d[3])
		c := FDPConfig{
			Valid:      fdpa&0x80 != 0,
			VolatileWC: fdpa&0x40 != 0,
			RGIF:       fdpa & 0x0F,
			NRG:        le.Uint32(d[4:]),
			NRUH:       le.Uint16(d[8:]),
			MaxPIDs:    int(le.Uint16(d[10:])) + 1,
			NNSS:       le.Uint32(d[12:]),
			RUNS:       le.Uint64(d[16:]),
			ERUTL:      le.Uint32(d[24:]),
		}
		need := fdpDescrHeaderSize + int(c.NRUH)*fdpRUHDescrSize + vss
		if dsze < need || off+dsze > len(b) {
			return nil, fmt.Errorf("%w: FDP configuration %d: descriptor size %d, needs %d, %d left", ErrFormat, i, dsze, need, len(b)-off)
		}
		if c.RGIF > 15 {
			return nil, fmt.Errorf("%w: FDP configuration %d: RGIF %d", ErrFormat, i, c.RGIF)
		}
		c.HandleTypes = make([]RUHType, c.NRUH)
		for h := range c.HandleTypes {
			c.HandleTypes[h] = RUHType(d[fdpDescrHeaderSize+h*fdpRUHDescrSize])
		}
		cfgs = append(cfgs, c)
		off += dsze
	}
	return cfgs, nil
}

// RUHStatus is one reclaim unit handle status descriptor (I/O Management
// Receive, operation 1).
type RUHStatus struct {
	PID    uint16 // placement identifier: the DSPEC that writes to this handle use
	RUHID  uint16 // reclaim unit handle identifier
	EARUTR uint32 // estimated active reclaim unit time remaining, seconds
	RUAMW  uint64 // reclaim unit available media writes, logical blocks
}

// RUHS layout.
const (
	ruhsHeaderSize = 16
	ruhsDescrSize  = 32
)

// RUHStatusSize is the buffer size needed for n descriptors.
func RUHStatusSize(n int) int { return ruhsHeaderSize + n*ruhsDescrSize }

// DecodeRUHStatus decodes the reclaim unit handle status returned by I/O
// Management Receive. b may be longer than the data.
func DecodeRUHStatus(b []byte) ([]RUHStatus, error) {
	if len(b) < ruhsHeaderSize {
		return nil, fmt.Errorf("%w: reclaim unit handle status of %d bytes", ErrShort, len(b))
	}
	le := binary.LittleEndian
	n := int(le.Uint16(b[14:]))
	if need := RUHStatusSize(n); len(b) < need {
		return nil, fmt.Errorf("%w: reclaim unit handle status of %d bytes holds %d descriptors, want %d", ErrShort, len(b), (len(b)-ruhsHeaderSize)/ruhsDescrSize, n)
	}
	out := make([]RUHStatus, n)
	for i := range out {
		d := b[ruhsHeaderSize+i*ruhsDescrSize:]
		out[i] = RUHStatus{
			PID:    le.Uint16(d[0:]),
			RUHID:  le.Uint16(d[2:]),
			EARUTR: le.Uint32(d[4:]),
			RUAMW:  le.Uint64(d[8:]),
		}
	}
	return out, nil
}

// Placement maps the store's streams onto FDP placement identifiers.
// Stream 0 (the store's metadata stream) gets the first handle to itself; data streams
// 1..n are spread round-robin over the remaining handles. With a single
// handle every stream shares it.
type Placement struct {
	PIDs []uint16 // placement ids in the namespace's handle order
}

// PID returns the placement identifier for stream.
func (p Placement) PID(stream uint16) uint16 {
	switch n := len(p.PIDs); {
	case n == 0:
		return 0
	case n == 1 || stream == 0:
		return p.PIDs[0]
	default:
		return p.PIDs[1+int(stream-1)%(n-1)]
	}
}

// Handle returns the index into PIDs that stream maps to.
func (p Placement) Handle(stream uint16) int {
	switch n := len(p.PIDs); {
	case n <= 1 || stream == 0:
		return 0
	default:
		return 1 + int(stream-1)%(n-1)
	}
}
