package ctl

import (
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
)

// overlapEnts builds n valid entries on one buffer: packed tiles one after
// another (pitched false), or the heads of a token-major paged layout
// (pitched true: heads interleave row by row, blocks follow each other).
func overlapEnts(n int, pitched bool, heads, rows, rowBytes int) []ent {
	b := &buffer{mem: make([]byte, 1)}
	ents := make([]ent, n)
	for i := range ents {
		e := &ents[i]
		e.b, e.valid = b, true
		if !pitched {
			e.e.Offset = uint64(i * rows * rowBytes)
			continue
		}
		blk, h := i/heads, i%heads
		pitch := heads * rowBytes
		e.e.Offset, e.e.Pitch, e.pitched = uint64(blk*rows*pitch+h*rowBytes), uint32(pitch), true
	}
	return ents
}

func TestOverlapLayouts(t *testing.T) {
	for _, pitched := range []bool{false, true} {
		ents := overlapEnts(abi.BatchMax, pitched, 8, 16, 256)
		if n := markOverlaps(ents, 16, 256, new(scratch)); n != 0 {
			t.Fatalf("pitched=%v: %d disjoint entries refused", pitched, n)
		}
		// Shift one entry by one byte into its neighbour.
		ents = overlapEnts(abi.BatchMax, pitched, 8, 16, 256)
		ents[100].e.Offset++
		if n := markOverlaps(ents, 16, 256, new(scratch)); n != 2 || ents[100].det != abi.BadOverlap {
			t.Fatalf("pitched=%v: %d refused, entry 100 %v", pitched, n, ents[100].det)
		}
	}
}

func BenchmarkOverlap(b *testing.B) {
	for _, c := range []struct {
		name    string
		pitched bool
	}{{"packed-511", false}, {"nhd-8heads-511", true}} {
		b.Run(c.name, func(b *testing.B) {
			ents := overlapEnts(abi.BatchMax, c.pitched, 8, 16, 256)
			sc := new(scratch)
			b.ReportAllocs()
			for b.Loop() {
				for i := range ents {
					ents[i].valid = true
				}
				markOverlaps(ents, 16, 256, sc)
			}
		})
	}
}

// TestRowsOverlapExhaustive compares rowsOverlap with a byte-by-byte check
// over small spans of every shape: same and different pitches, packed.
func TestRowsOverlapExhaustive(t *testing.T) {
	brute := func(a, b span) bool {
		for i := range a.n {
			for j := range b.n {
				as, bs := a.start+i*a.pitch, b.start+j*b.pitch
				if as < bs+b.w && bs < as+a.w {
					return true
				}
			}
		}
		return false
	}
	var shapes []span
	for _, n := range []uint64{1, 2, 3, 5} {
		for w := uint64(1); w <= 6; w += 2 {
			for p := w; p <= 9; p += 2 {
				if n == 1 {
					p = 0
				}
				shapes = append(shapes, span{pitch: p, w: w, n: n})
				if n == 1 {
					break
				}
			}
		}
	}
	for _, a := range shapes {
		for _, b := range shapes {
			for off := uint64(0); off < 40; off++ {
				x, y := a, b
				x.start, y.start = 7, off
				if got, want := rowsOverlap(x, y), brute(x, y); got != want {
					t.Fatalf("%+v vs %+v: %v, want %v", x, y, got, want)
				}
			}
		}
	}
}
