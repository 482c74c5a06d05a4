//go:build !amd64

package store

import "unsafe"

func copyRowsNT(dst, src unsafe.Pointer, rows, rowBytes, pitch int) {
	panic("store: copyRowsNT without amd64")
}

const haveNT = false

func crcCopyNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32) {
	panic("store: crcCopyNT4 without amd64")
}

func crcGatherNT4(dst, src unsafe.Pointer, seg, dseg, rows, rowBytes, skip, ahead int, crcs *[4]uint32) {
	panic("store: crcGatherNT4 without amd64")
}

const haveCRCCopy = false
