package store

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestCRCCopyNT4: the one-pass copy lands every row at its pitch, nothing
// between or around them, and its four joined checksums are the group's
// CRC32C, for contiguous and pitched destinations of several sizes.
func TestCRCCopyNT4(t *testing.T) {
	if !haveNT || !haveCRCCopy {
		t.Skip("skipping: no one-pass checksum copy on this machine")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range []struct{ n, rows, rb, pitch int }{
		{256, 0, 0, 0}, {768, 0, 0, 0}, {4096, 0, 0, 0}, {65536, 0, 0, 0},
		{4096, 16, 256, 2048}, {4096, 16, 256, 256}, {1024, 4, 256, 272}, {256, 4, 64, 80}, {8192, 32, 256, 8192},
	} {
		src := make([]byte, c.n+64)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		src = src[:c.n]
		rows, rb, pitch := c.rows, c.rb, c.pitch
		if rows == 0 {
			rows, rb, pitch = 4, c.n/4, c.n/4
		}
		mem, dst := guardedRows(rows, rb, pitch)
		sh := newCRCShift(c.n / 4)
		var crcs [4]uint32
		crcCopyNT4(dst, unsafe.Pointer(&src[0]), c.n/4, rows/4*pitch, rows/4, rb, pitch-rb, c.n, &crcs)
		if got, want := sh.combine4(&crcs), CRC32C(src); got != want {
			t.Fatalf("%+v: crc %08x, want %08x", c, got, want)
		}
		if !rowsPlaced(mem, src, rows, rb, pitch) {
			t.Fatalf("%+v: memory differs", c)
		}
	}
}

// TestCRCShift: joining by table the checksums of consecutive segments
// gives the checksum of the whole, for random segments of several lengths.
func TestCRCShift(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 8, 64, 100, 1024, 4096} {
		sh := newCRCShift(n)
		b := make([]byte, 4*n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		var c [4]uint32
		for k := range c {
			s := uint32(0)
			if k == 0 {
				s = 0xFFFFFFFF
			}
			c[k] = ^crc32Update(^s, b[k*n:(k+1)*n])
		}
		if got, want := sh.combine4(&c), CRC32C(b); got != want {
			t.Fatalf("n=%d: %08x, want %08x", n, got, want)
		}
	}
}

func crc32Update(c uint32, p []byte) uint32 { return crc32.Update(c, castagnoli, p) }

// BenchmarkCRCCopy: the one-pass checksum copy of 4 KiB groups against
// the checksum, then the non-temporal copy, over 256 MiB (from memory, not
// cache) into a destination as large.
func BenchmarkCRCCopy(b *testing.B) {
	if !haveNT || !haveCRCCopy {
		b.Skip("skipping: no one-pass checksum copy on this machine")
	}
	const n, gb = 256 << 20, 4096
	src, dst := MakeAligned(n, 4096), MakeAligned(n, 4096)
	for i := 0; i < n; i += 64 {
		src[i], dst[i] = byte(i>>6), 1
	}
	sh := newCRCShift(gb / 4)
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(n)
		var c [4]uint32
		for range b.N {
			for o := 0; o < n; o += gb {
				crcCopyNT4(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), gb/4, gb/4, 1, gb/4, 0, gb, &c)
				sh.combine4(&c)
			}
		}
	})
	b.Run("checksum-then-copy", func(b *testing.B) {
		b.SetBytes(n)
		for range b.N {
			for o := 0; o < n; o += gb {
				CRC32C(src[o : o+gb])
				copyRowsNT(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), 1, gb, 0)
			}
		}
	})
}
