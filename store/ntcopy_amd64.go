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

// crcCopyNT4 copies four segments of rows*rowBytes bytes each, segment k
// from src + k*seg, to dst + k*dseg (as rows rows of rowBytes whose starts
// are rowBytes+skip apart) with non-temporal stores, and takes the raw
// CRC32C (no inversions) of each segment, chain k from crcs[k] on, the
// results back in crcs: one pass over the source, four checksum chains in
// step. The four segments are the quarters of one group (seg = rows *
// rowBytes; crcs {0xFFFFFFFF, 0, 0, 0}, joined by crcShift.combine4), or
// four groups, one each (seg the group stride; crcs all 0xFFFFFFFF, each
// inverted at the end): crcLand and crcLand4. It prefetches the source
// from src+ahead on, 256 bytes per 64-byte step (a prefetch never faults).
// rowBytes must be a multiple of 64, dst, dseg and rowBytes+skip multiples
// of 16. Needs SSE4.2. Ends with SFENCE.
//
//go:noescape
func crcCopyNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32)

// crcGatherNT4 is crcCopyNT4 the other way round: segment k is read from
// src + k*seg as rows rows of rowBytes whose starts are rowBytes+skip
// apart, and stored packed at dst + k*dseg, with non-temporal stores, its
// raw CRC32C taken on the way (chain k from crcs[k] on, results back in
// crcs). Each 8 bytes is read once, into a register that is both
// checksummed and stored: the checksums are of the bytes stored even
// while the source changes under the copy. It prefetches, per 64-byte
// step, the line ahead bytes past each segment's current one. rowBytes
// must be a multiple of 64. Needs SSE4.2. Ends with SFENCE.
//
//go:noescape
func crcGatherNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32)

// haveCRCCopy: crcCopyNT4 and crcGatherNT4 run here.
var haveCRCCopy = cpu.X86.HasSSE42
