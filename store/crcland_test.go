package store

import (
	"bytes"
	"hash/crc32"
	"math/rand/v2"
	"sync/atomic"
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

// TestCRCGatherNT4: the one-pass gather packs each segment's rows, read
// at their pitch (the bytes between rows neither copied nor checksummed),
// to its destination, writes nothing around the destinations, and returns
// each segment's raw CRC32C; joined, the four are the group's CRC32C.
func TestCRCGatherNT4(t *testing.T) {
	if !haveNT || !haveCRCCopy {
		t.Skip("skipping: no one-pass checksum copy on this machine")
	}
	rng := rand.New(rand.NewPCG(7, 8))
	for _, c := range []struct{ rows, rb, pitch int }{
		{16, 256, 2048}, // token-major rows of 8 heads (vLLM's cache)
		{16, 256, 256},  // rows that follow each other
		{4, 64, 80},     // short rows, a short gap
		{32, 512, 8192}, // long rows far apart
		{8, 128, 528},   // a pitch no multiple of 64
	} {
		src := make([]byte, c.rows*c.pitch+64)
		for i := range src {
			src[i] = byte(rng.Uint32())
		}
		n := c.rows * c.rb
		want := make([]byte, 0, n)
		for r := range c.rows {
			want = append(want, src[r*c.pitch:r*c.pitch+c.rb]...)
		}
		mem := bytes.Repeat([]byte{0xA5}, 64+n+64)
		base := 64 - int(uintptr(unsafe.Pointer(&mem[0]))%16)
		crcs := [4]uint32{0xFFFFFFFF}
		crcGatherNT4(unsafe.Pointer(&mem[base]), unsafe.Pointer(&src[0]), c.rows/4*c.pitch, n/4, c.rows/4, c.rb, c.pitch-c.rb, c.pitch, &crcs)
		if got, w := newCRCShift(n/4).combine4(&crcs), CRC32C(want); got != w {
			t.Fatalf("%+v: crc %08x, want %08x", c, got, w)
		}
		if !bytes.Equal(mem[base:base+n], want) {
			t.Fatalf("%+v: gathered bytes differ", c)
		}
		if bytes.Count(mem[:base], []byte{0xA5}) != base || bytes.Count(mem[base+n:], []byte{0xA5}) != len(mem)-base-n {
			t.Fatalf("%+v: memory around the destination written", c)
		}
	}
}

// TestCRCGatherNT4Racing: the checksums are of the bytes stored while
// another thread rewrites the source under the copy (a client changing
// its cache during its own STORE): the store must never record a
// checksum that its bytes fail.
func TestCRCGatherNT4Racing(t *testing.T) {
	if !haveNT || !haveCRCCopy {
		t.Skip("skipping: no one-pass checksum copy on this machine")
	}
	const rows, rb, pitch, n = 16, 256, 2048, 4096
	src := make([]uint64, 16*pitch/8)
	dst := MakeAligned(4*n, 4096)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for v := uint64(1); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			for i := range src {
				atomic.StoreUint64(&src[i], v*0x9E3779B97F4A7C15+uint64(i))
			}
		}
	}()
	defer func() { close(stop); <-done }()
	base := unsafe.Pointer(&src[0])
	for it := range 3000 {
		c := [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
		crcGatherNT4(unsafe.Pointer(&dst[0]), base, rb, n, rows, rb, pitch-rb, pitch, &c)
		for k := range 4 {
			if got, want := ^c[k], CRC32C(dst[k*n:(k+1)*n]); got != want {
				t.Fatalf("iteration %d, group %d: checksum %08x of bytes whose checksum is %08x", it, k, got, want)
			}
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

// BenchmarkGather: a store call's copy of 4 KiB groups out of a
// token-major cache (16 rows of 256 bytes, 2 KiB apart: 8 heads' groups
// per 32 KiB) into packed staging, with their checksums: the one-pass
// non-temporal gather against row copies, then the checksum of the
// copy; 256 MiB of groups from a source twice as large, not in cache.
func BenchmarkGather(b *testing.B) {
	if !haveNT || !haveCRCCopy {
		b.Skip("skipping: no one-pass checksum copy on this machine")
	}
	const n, gb, rows, rb, pitch = 256 << 20, 4096, 16, 256, 2048
	src, dst := MakeAligned(n, 4096), MakeAligned(n, 4096)
	for i := 0; i < n; i += 64 {
		src[i], dst[i] = byte(i>>6), 1
	}
	sh := newCRCShift(gb / 4)
	// each: group g is head g%8 of the tile g/8 (32 KiB of src)
	each := func(f func(d, s []byte)) {
		for g := range n / gb {
			o := g / 8 * 8 * gb
			f(dst[g*gb:(g+1)*gb], src[o+g%8*rb:])
		}
	}
	b.Run("one-pass", func(b *testing.B) {
		b.SetBytes(n)
		for range b.N {
			each(func(d, s []byte) {
				c := [4]uint32{0xFFFFFFFF}
				crcGatherNT4(unsafe.Pointer(&d[0]), unsafe.Pointer(&s[0]), rows/4*pitch, gb/4, rows/4, rb, pitch-rb, pitch, &c)
				sh.combine4(&c)
			})
		}
	})
	b.Run("four-groups", func(b *testing.B) {
		b.SetBytes(n)
		for range b.N {
			for g := 0; g < n/gb; g += 4 {
				o := g/8*8*gb + g%8*rb
				c := [4]uint32{0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF}
				crcGatherNT4(unsafe.Pointer(&dst[g*gb]), unsafe.Pointer(&src[o]), rb, gb, rows, rb, pitch-rb, pitch, &c)
			}
		}
	})
	b.Run("copy-then-checksum", func(b *testing.B) {
		b.SetBytes(n)
		for range b.N {
			each(func(d, s []byte) {
				for r := range rows {
					copy(d[r*rb:(r+1)*rb], s[r*pitch:r*pitch+rb])
				}
				CRC32C(d)
			})
		}
	})
}

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
