package store

import "unsafe"

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
