package ctl

import (
	"cmp"
	"slices"

	"github.com/kvfs/kvfs/ctl/abi"
)

// span is the bytes a tile covers in its buffer: n rows of w bytes, row r at
// start + r·pitch (n = 1 for a packed tile).
type span struct {
	start, pitch, w, n uint64
}

func (s span) end() uint64 { return s.start + (s.n-1)*s.pitch + s.w }

// spanOf is the span of a valid entry (its range was checked, so nothing
// overflows).
func spanOf(e *ent, rows, rowBytes uint64) span {
	if !e.pitched {
		return span{start: e.e.Offset, w: rows * rowBytes, n: 1}
	}
	return span{start: e.e.Offset, pitch: uint64(e.e.Pitch), w: rowBytes, n: rows}
}

// rowsOverlap reports whether two spans share a byte.
func rowsOverlap(a, b span) bool {
	if a.start >= b.end() || b.start >= a.end() {
		return false
	}
	if a.n > 1 && b.n > 1 && a.pitch == b.pitch && a.w <= a.pitch && b.w <= a.pitch {
		return samePitchOverlap(a, b)
	}
	// A merge of the two row lists, each sorted and free of overlaps
	// within itself.
	var i, j uint64
	for i < a.n && j < b.n {
		as, bs := a.start+i*a.pitch, b.start+j*b.pitch
		switch {
		case as+a.w <= bs:
			i++
		case bs+b.w <= as:
			j++
		default:
			return true
		}
	}
	return false
}

// samePitchOverlap decides in O(1) whether two spans of the same pitch P,
// rows no wider than P (the heads of a paged layout), share a byte. With a
// starting first and δ = b.start − a.start = q·P + r, row j of b meets row
// i of a only for i = j + q (b's row starts r bytes into a's: overlap when
// r < a.w) or i = j + q + 1 (a's row starts P − r bytes into b's: overlap
// when P − r < b.w); any other pair is at least P apart. The row exists
// when i < a.n (j = 0 is the best choice).
func samePitchOverlap(a, b span) bool {
	if a.start > b.start {
		a, b = b, a
	}
	p := a.pitch
	delta := b.start - a.start
	q, r := delta/p, delta%p
	return (r < a.w && q < a.n) || (p-r < b.w && q+1 < a.n)
}

// markOverlaps refuses every valid entry of a LOAD whose destination
// shares a byte with another valid entry's destination in the same batch:
// both get BadRequest/BadOverlap and neither is touched. (Two loads into
// the same bytes would leave them holding either group, or a mix, and a
// checksum over them would fail for no fault of the store.) Interleaved
// pitched tiles that share no byte — the heads of a token-major paged
// layout — pass. It returns the number of entries refused.
//
// Cost: one sort of the valid entries by (buffer, offset) unless they
// already are in that order, then a sweep that compares each entry with
// the earlier ones whose extents reach it, row lists merged.
func markOverlaps(ents []ent, rows, rowBytes uint64, sc *scratch) int {
	order := sc.order[:0]
	sorted := true
	for i := range ents {
		if !ents[i].valid {
			continue
		}
		if n := len(order); n > 0 && sorted && lessEnt(&ents[i], &ents[order[n-1]]) {
			sorted = false
		}
		order = append(order, int32(i))
	}
	if !sorted {
		slices.SortFunc(order, func(a, b int32) int {
			x, y := &ents[a], &ents[b]
			if c := cmp.Compare(x.b.base(), y.b.base()); c != 0 {
				return c
			}
			return cmp.Compare(x.e.Offset, y.e.Offset)
		})
	}
	spans := sc.spans
	if cap(spans) < len(ents) {
		spans = make([]span, len(ents))
	}
	spans = spans[:len(ents)]
	for _, k := range order {
		spans[k] = spanOf(&ents[k], rows, rowBytes)
	}
	active := sc.active[:0]
	overlap := sc.overlap
	if cap(overlap) < len(ents) {
		overlap = make([]bool, len(ents))
	} else {
		overlap = overlap[:len(ents)]
		clear(overlap)
	}
	for _, k := range order {
		e := &ents[k]
		es := spans[k]
		w := 0
		for _, a := range active {
			if ents[a].b == e.b && spans[a].end() > es.start {
				active[w] = a
				w++
			}
		}
		active = active[:w]
		for _, a := range active {
			if rowsOverlap(spans[a], es) {
				overlap[a], overlap[k] = true, true
			}
		}
		active = append(active, k)
	}
	n := 0
	for i, o := range overlap {
		if o {
			e := &ents[i]
			e.valid, e.st, e.det = false, abi.BadRequest, abi.BadOverlap
			n++
		}
	}
	sc.order, sc.active, sc.overlap, sc.spans = order[:0], active[:0], overlap[:0], spans[:0]
	return n
}

func lessEnt(x, y *ent) bool {
	if bx, by := x.b.base(), y.b.base(); bx != by {
		return bx < by
	}
	return x.e.Offset < y.e.Offset
}
