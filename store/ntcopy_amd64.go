package store

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// copyRowsNT copies rows rows of rowBytes bytes from the packed src to dst
// (row r at dst + r*pitch) with non-temporal stores: the destination's
// cache lines are written whole without being read first (no
// read-for-ownership), which halves the memory traffic of scattering a
// group into a cold token-major cache. rowBytes must be a multiple of 64,
// and dst and pitch multiples of 16. Ends with SFENCE.
//
//go:noescape
func copyRowsNT(dst, src unsafe.Pointer, rows, rowBytes, pitch int)

const haveNT = true

// crcCopyNT4 copies four segments of seg bytes each from the packed src to
// dst (segment k at dst + k*dseg, as rows rows of rowBytes whose starts are
// rowBytes+skip apart) with non-temporal stores, and returns in crcs the
// raw CRC32C of each segment (crcs[0] from an initial 0xFFFFFFFF, the
// others from 0; crcShift.combine4 joins them into the group's CRC32C):
// one pass over the source, four checksum chains in step. It prefetches
// the source from src+ahead on, 256 bytes per 64-byte step (a prefetch
// never faults). rowBytes must be a multiple of 64, dst, dseg and
// rowBytes+skip multiples of 16. Needs SSE4.2. Ends with SFENCE.
//
//go:noescape
func crcCopyNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32)

// haveCRCCopy: crcCopyNT4 runs here.
var haveCRCCopy = cpu.X86.HasSSE42
