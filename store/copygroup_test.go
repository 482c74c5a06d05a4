package store_test

import (
	"bytes"
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// CopyGroup lands a group's bytes where asked (contiguous, or rows at a
// pitch, nothing between the rows touched) and returns their CRC32C, for
// groups of 4 KiB (the one-pass copy where the machine has it) and of
// 512 bytes (copy, then checksum).
func TestCopyGroup(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, geo := range []layout.Geometry{
		{Layers: 2, KVHeads: 2, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096},
		testGeo,
	} {
		s, _ := newMemStore(t, 4, geo)
		gb, rb := geo.GroupBytes(), geo.RowBytes()
		src := make([]byte, gb)
		for i := range src {
			src[i] = byte(r.Uint32())
		}
		want := store.CRC32C(src)
		dst := make([]byte, gb+64)[32:][:gb] // 16-byte aligned in Go's allocations, not 64
		if got := s.CopyGroup(dst, src, 0, 0, 0); got != want || !bytes.Equal(dst, src) {
			t.Fatalf("%d-byte group, contiguous: crc %08x want %08x, bytes equal %v", gb, got, want, bytes.Equal(dst, src))
		}
		rows, pitch := geo.BlockTokens, 3*rb
		mem := bytes.Repeat([]byte{0xEE}, rows*pitch)
		if got := s.CopyGroup(mem, src, rows, rb, pitch); got != want {
			t.Fatalf("%d-byte group, pitched: crc %08x want %08x", gb, got, want)
		}
		for i := range rows {
			row := mem[i*pitch : (i+1)*pitch]
			if !bytes.Equal(row[:rb], src[i*rb:(i+1)*rb]) || bytes.Count(row[rb:], []byte{0xEE}) != pitch-rb {
				t.Fatalf("%d-byte group, pitched: row %d misplaced or the gap written", gb, i)
			}
		}
	}
}
