package store

import (
	"bytes"
	"testing"
	"unsafe"
)

// TestCopyRowsNT: the non-temporal row scatter writes exactly the rows, at
// their pitch, and nothing between or around them.
func TestCopyRowsNT(t *testing.T) {
	if !haveNT {
		t.Skip("skipping: no non-temporal copy on this architecture")
	}
	for _, c := range []struct{ rows, rb, pitch int }{{16, 256, 2048}, {1, 64, 64}, {3, 128, 144}, {16, 512, 512}, {0, 64, 64}} {
		src := make([]byte, c.rows*c.rb)
		for i := range src {
			src[i] = byte(i*7 + 3)
		}
		mem, dst := guardedRows(c.rows, c.rb, c.pitch)
		copyRowsNT(dst, unsafe.Pointer(unsafe.SliceData(src)), c.rows, c.rb, c.pitch)
		if !rowsPlaced(mem, src, c.rows, c.rb, c.pitch) {
			t.Fatalf("%+v: memory differs", c)
		}
	}
}

// guardedRows returns memory for rows rows of rb bytes, pitch apart, with
// a guard of 0xA5 bytes around them, and the 16-byte aligned start of the
// rows in it, past a guard of 49 to 64 bytes.
func guardedRows(rows, rb, pitch int) ([]byte, unsafe.Pointer) {
	mem := bytes.Repeat([]byte{0xA5}, 64+max(0, rows-1)*pitch+rb+64)
	return mem, unsafe.Pointer(&mem[64-int(uintptr(unsafe.Pointer(&mem[0]))%16)])
}

// rowsPlaced reports whether mem (from guardedRows) holds the packed rows
// of src, pitch apart, at its aligned start and 0xA5 everywhere else.
func rowsPlaced(mem, src []byte, rows, rb, pitch int) bool {
	base := 64 - int(uintptr(unsafe.Pointer(&mem[0]))%16)
	want := bytes.Repeat([]byte{0xA5}, len(mem))
	for r := range rows {
		copy(want[base+r*pitch:], src[r*rb:(r+1)*rb])
	}
	return bytes.Equal(mem, want)
}
