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
		mem := bytes.Repeat([]byte{0xA5}, 64+max(0, c.rows-1)*c.pitch+c.rb+64)
		base := 64 - int(uintptr(unsafe.Pointer(&mem[0]))%16) // a 16-byte aligned start past a guard
		dst := mem[base:]
		copyRowsNT(unsafe.Pointer(&dst[0]), unsafe.Pointer(unsafe.SliceData(src)), c.rows, c.rb, c.pitch)
		want := bytes.Repeat([]byte{0xA5}, len(mem))
		for r := range c.rows {
			copy(want[base+r*c.pitch:], src[r*c.rb:(r+1)*c.rb])
		}
		if !bytes.Equal(mem, want) {
			t.Fatalf("%+v: memory differs", c)
		}
	}
}
