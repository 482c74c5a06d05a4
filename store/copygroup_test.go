package store_test

import (
	"bytes"
	"math/rand/v2"
	"slices"
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

// GatherWrites packs each group from a cache's rows (token-major, with a
// gap after each token; head-major, contiguous) into its request's Data,
// nothing else of the staging written, with the group's CRC32C recorded;
// four requests go in step where they line up, one by one where they do
// not (sources in reverse or uneven, Data apart, a count not a multiple of
// four); and what Write stores from them reads back, checksums verified.
// For groups of 4 KiB (the one-pass copy where the machine has it) and of
// 512 bytes (rows too short for it: copy, then checksum; head-major
// sources still in one pass).
func TestGatherWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	for _, geo := range []layout.Geometry{
		{Layers: 2, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096},
		testGeo,
	} {
		s, _ := newMemStore(t, 8, geo)
		gb, rb, T, H := geo.GroupBytes(), geo.RowBytes(), geo.BlockTokens, geo.KVHeads
		pitch := H*rb + 64 // token-major rows of every head, and a gap
		cache := make([]byte, 2*T*pitch)
		for i := range cache {
			cache[i] = byte(r.Uint32())
		}
		// group (tile, h): rows at tile*T*pitch + h*rb, pitch apart
		tokenMajor := func(tile, h int) []byte { return cache[tile*T*pitch+h*rb:][:(T-1)*pitch+rb] }
		headMajor := func(tile, h int) []byte { return cache[(tile*H+h)*gb:][:gb] }
		for _, c := range []struct {
			name    string
			heads   []int // the source head of each request, tile 0 then 1
			rows    int   // 0: head-major (contiguous) sources
			dataGap int   // bytes between one request's Data and the next
		}{
			{"token-major, in order", seq(H), T, 0},
			{"head-major, in order", seq(H), 0, 0},
			{"token-major, reversed", reversed(H), T, 0},
			{"token-major, uneven", uneven(H), T, 0},
			{"token-major, data apart", seq(H), T, 64},
			{"head-major, five", seq(H)[:min(5, H)], 0, 0},
		} {
			n := 2 * len(c.heads)
			stride := gb + c.dataGap
			staging := store.MakeAligned(n*stride+64, 4096)
			for i := range staging {
				staging[i] = 0xEE
			}
			reqs := make([]store.WriteReq, n)
			srcs := make([][]byte, n)
			want := make([][]byte, n)
			for i := range n {
				tile, h := i/len(c.heads), c.heads[i%len(c.heads)]
				k := layout.Key{Block: uint64(100 + tile), Layer: 1, Kind: layout.V, Head: h}
				reqs[i] = store.WriteReq{Key: k, Data: staging[i*stride : i*stride+gb]}
				if c.rows == 0 {
					srcs[i] = headMajor(tile, h)
					want[i] = srcs[i]
				} else {
					srcs[i] = tokenMajor(tile, h)
					for row := range T {
						want[i] = append(want[i], srcs[i][row*pitch:row*pitch+rb]...)
					}
				}
			}
			s.GatherWrites(reqs, srcs, c.rows, rb, pitch)
			for i := range reqs {
				q := &reqs[i]
				if !bytes.Equal(q.Data, want[i]) || !q.Summed || q.CRC != store.CRC32C(want[i]) {
					t.Fatalf("%d-byte groups, %s: request %d: bytes equal %v, summed %v, crc %08x want %08x",
						gb, c.name, i, bytes.Equal(q.Data, want[i]), q.Summed, q.CRC, store.CRC32C(want[i]))
				}
				if gap := staging[i*stride+gb : (i+1)*stride]; bytes.Count(gap, []byte{0xEE}) != len(gap) {
					t.Fatalf("%d-byte groups, %s: staging after request %d written", gb, c.name, i)
				}
			}
			if err := s.Write(reqs); err != nil {
				t.Fatalf("%s: write: %v", c.name, err)
			}
			for i := range reqs {
				got := make([]byte, gb)
				rr := []store.ReadReq{{Key: reqs[i].Key, Buf: got}}
				if err := s.Read(rr); err != nil || rr[0].Err != nil || !bytes.Equal(got, want[i]) {
					t.Fatalf("%d-byte groups, %s: read back %v: %v, %v, equal %v", gb, c.name, reqs[i].Key, err, rr[0].Err, bytes.Equal(got, want[i]))
				}
			}
		}
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func reversed(n int) []int {
	s := seq(n)
	slices.Reverse(s)
	return s
}

// uneven is 0..n-1 with the second and third swapped: no four sources of
// a tile equally far apart from the first.
func uneven(n int) []int {
	s := seq(n)
	if n > 2 {
		s[1], s[2] = s[2], s[1]
	}
	return s
}
