//go:build !amd64

package store

import "unsafe"

func copyRowsNT(dst, src unsafe.Pointer, rows, rowBytes, pitch int) {
	panic("store: copyRowsNT without amd64")
}

const haveNT = false
