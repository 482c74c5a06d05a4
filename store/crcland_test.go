package store

import (
	"bytes"
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
		crcs := [4]uint32{0xFFFFFFFF}
		crcCopyNT4(dst, unsafe.Pointer(&src[0]), c.n/4, rows/4*pitch, rows/4, rb, pitch-rb, c.n, &crcs)
		if got, want := sh.combine4(&crcs), CRC32C(src); got != want {
			t.Fatalf("%+v: crc %08x, want %08x", c, got, want)
		}
		if !rowsPlaced(mem, src, rows, rb, pitch) {
			t.Fatalf("%+v: memory differs", c)
		}
	}
}

// TestCRCCopyNT4Groups: the one-pass copy of four groups in step (each
// chain one group, as crcLand4 runs it) lands each group's rows at its
// destination, destinations dseg apart (after, before or between one
// another), nothing else in the memory around them, and returns each
// group's CRC32C; the groups lie a stride apart in the source, with
// bytes between them that must not be copied or checksummed.
func TestCRCCopyNT4Groups(t *testing.T) {
	if !haveNT || !haveCRCCopy {
		t.Skip("skipping: no one-pass checksum copy on this machine")
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range []struct{ gb, stride, rows, rb, pitch, dseg int }{
		{4096, 4096, 1, 4096, 4096, 4096},  // head-major tiles
		{4096, 4096, 1, 4096, 4096, -4096}, // tiles in reverse order
		{4096, 4096, 16, 256, 2048, 256},   // token-major rows of 8 heads
		{4096, 8192, 16, 256, 1024, 256},   // groups apart in the source
		{256, 4096, 1, 256, 256, 512},      // small groups, gaps between
		{1024, 1024, 8, 128, 528, 128},     // rows of four heads, a gap
		{8192, 8192, 16, 512, 2048, 512},   // token-major rows of 4 heads
	} {
		src := make([]byte, 4*c.stride+64)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		span := (c.rows-1)*c.pitch + c.rb // one group's destination
		lo, hi := 0, 3*c.dseg             // first and last group's start
		if c.dseg < 0 {
			lo, hi = hi, lo
		}
		mem := bytes.Repeat([]byte{0xA5}, 64+hi-lo+span+64)
		base := 64 - int(uintptr(unsafe.Pointer(&mem[0]))%16) - lo // group 0's start
		want := bytes.Clone(mem)
		crcs := [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
		crcCopyNT4(unsafe.Pointer(&mem[base]), unsafe.Pointer(&src[0]), c.stride, c.dseg, c.rows, c.rb, c.pitch-c.rb, 4*c.stride, &crcs)
		for k := range 4 {
			g := src[k*c.stride : k*c.stride+c.gb]
			if got, w := ^crcs[k], CRC32C(g); got != w {
				t.Fatalf("%+v: group %d crc %08x, want %08x", c, k, got, w)
			}
			for r := range c.rows {
				copy(want[base+k*c.dseg+r*c.pitch:], g[r*c.rb:(r+1)*c.rb])
			}
		}
		if !bytes.Equal(mem, want) {
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

// BenchmarkCRCCopy: the one-pass checksum copy of 4 KiB groups, a group's
// quarters in step (crcLand) or four groups in step (crcLand4), against
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
		for range b.N {
			for o := 0; o < n; o += gb {
				c := [4]uint32{0xFFFFFFFF}
				crcCopyNT4(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), gb/4, gb/4, 1, gb/4, 0, gb, &c)
				sh.combine4(&c)
			}
		}
	})
	b.Run("four-groups", func(b *testing.B) {
		b.SetBytes(n)
		for range b.N {
			for o := 0; o < n; o += 4 * gb {
				c := [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
				crcCopyNT4(unsafe.Pointer(&dst[o]), unsafe.Pointer(&src[o]), gb, gb, 1, gb, 0, 4*gb, &c)
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
