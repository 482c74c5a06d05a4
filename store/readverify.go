package store

import (
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"unsafe"

	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/layout"
)

// failWants reports the I/O error err to each group of ws and marks it
// done.
func (s *Store) failWants(ws []want, err error) {
	s.m.ioErrors.Add(1)
	for j := range ws {
		w := &ws[j]
		s.fail(w, fmt.Errorf("store: read %v: %w", s.keyOf(w), err))
		w.r = nil // done
	}
}

// failRun reports err (the I/O error of run r, if any) to each of its
// groups and marks them done; it reports whether there was one.
func (s *Store) failRun(r *run, err error, wants []want) bool {
	if err == nil {
		return false
	}
	s.failWants(wants[r.lo:r.hi], err)
	return true
}

// verifyWindow is how many bytes of groups one goroutine verifies at a time.
const verifyWindow = 4 << 20

// verify checks (and, for bounced runs, copies) the groups ws of one window
// of runs, the first of which is the call's run number first. Large windows
// are spread over the cores in verifyWindow pieces.
func (s *Store) verify(runs []run, first int, ws []want) {
	par.Pieces(len(ws), verifyWindow/s.geo.GroupBytes(), runtime.GOMAXPROCS(0), func(lo, hi int) {
		s.verifyRange(runs, first, ws[lo:hi])
	})
}

// verifyRange verifies ws, a part of a window of runs whose first is the
// call's run number first.
func (s *Store) verifyRange(runs []run, first int, ws []want) { s.verifyFrom(runs, first, ws, nil, 0) }

// verifyFrom is verifyRange, with the bounced groups of ws read from src
// (group g of their slot at (g-srcFirst)*GroupStride) when src is not nil,
// else from their run's bounce memory. Four bounced groups in a row are
// landed at once where crcLand4 can.
func (s *Store) verifyFrom(runs []run, first int, ws []want, src []byte, srcFirst int) {
	gb := s.geo.GroupBytes()
	var hits, bounced uint64
	var four [4][]byte
	var got [4]uint32
	inStep := s.onePass() // crcLand4 can run here
	for i := 0; i < len(ws); i++ {
		w := &ws[i]
		q := w.r
		if q == nil {
			continue // its I/O failed
		}
		r := &runs[w.run-first]
		if inStep && i+4 <= len(ws) && s.bounced4(runs, first, ws[i:i+4], src, srcFirst, &four) && s.crcLand4(ws[i:i+4], &four, &got, s.ahead4(runs, first, &ws[i+3])) {
			for k := range 4 {
				if v := &ws[i+k]; got[k] != v.crc {
					s.fail(v, s.corruptReq(v, got[k]))
					continue
				}
				hits++
				bounced += uint64(gb)
			}
			i += 3
			continue
		}
		var b []byte // a bounced group's bytes
		if r.mode == landBounce {
			b = s.bouncedSrc(r, w, src, srcFirst)
		}
		if q.Unverified {
			if q.Heads <= 1 {
				q.CRC = w.crc
			} else {
				q.CRCs[s.head(w)] = w.crc
			}
			if r.mode == landBounce {
				s.land(w, b)
				bounced += uint64(gb)
			}
			hits++
			continue
		}
		if r.mode == landBounce {
			// Verify the bytes in the bounce buffer or the file's
			// mapping, which only the store writes, as they are copied.
			if got := s.crcLand(w, b); got != w.crc {
				s.fail(w, s.corruptReq(w, got))
				continue
			}
			bounced += uint64(gb)
		} else if got := s.destCRC(w); got != w.crc {
			// The group landed in the caller's memory, which another
			// process may write meanwhile (a client's shared mapping):
			// verify again from a private copy before calling it
			// corrupt.
			if err := s.reverify(w); err != nil {
				s.fail(w, err)
				continue
			}
			bounced += uint64(gb)
		}
		hits++
	}
	if hits > 0 {
		s.m.reads.Add(hits)
		s.m.hits.Add(hits)
		s.m.bytesRead.Add(hits * uint64(gb))
	}
	if bounced > 0 {
		s.m.bounced.Add(bounced)
	}
}

// bouncedSrc is the bytes of w, a group of bounced run r: in src (see
// verifyFrom) when it is not nil, else in r's bounce memory.
func (s *Store) bouncedSrc(r *run, w *want, src []byte, srcFirst int) []byte {
	stride, gb := int(s.geo.GroupStride()), s.geo.GroupBytes()
	if src != nil {
		g := w.idx - srcFirst
		return src[g*stride : g*stride+gb]
	}
	g := w.idx - r.first
	return r.buf[g*stride : g*stride+gb]
}

// ahead4 is how far past the first of four groups in step crcLand4
// prefetches, given the last of them, w: the next four groups of the slot
// while w's run goes on past it. At the run's end the next groups of the
// slot are not read (a run of one layer of a block: a layer-by-layer
// loader's), and prefetching them took a quarter more bytes from memory
// than such a run reads: there it is 0, the four's own lines, loaded
// anyway.
func (s *Store) ahead4(runs []run, first int, w *want) int {
	r := &runs[w.run-first]
	if w.idx+1 >= r.first+r.n {
		return 0
	}
	return 4 * int(s.geo.GroupStride())
}

// bounced4 reports whether the four groups of ws are all bounced, still
// wanted and verified (not Unverified), and puts their bytes in four.
func (s *Store) bounced4(runs []run, first int, ws []want, src []byte, srcFirst int, four *[4][]byte) bool {
	for k := range four {
		w := &ws[k]
		if w.r == nil || w.r.Unverified {
			return false
		}
		r := &runs[w.run-first]
		if r.mode != landBounce {
			return false
		}
		four[k] = s.bouncedSrc(r, w, src, srcFirst)
	}
	return true
}

// destCRC is the CRC32C of the group as it lies in w's destination.
func (s *Store) destCRC(w *want) uint32 {
	q := w.r
	if w.rows == 0 {
		return CRC32C(s.dst(w))
	}
	var c uint32
	dst := s.dst(w)
	for row := range w.rows {
		o := row * q.Pitch
		c = crc32.Update(c, castagnoli, dst[o:o+q.RowBytes])
	}
	return c
}

// land copies a group's bytes into w's destination, with non-temporal
// stores (copyRowsNT) where sizes and alignment allow: the destination is
// cold, and a whole-line write need not read it first, which halves the
// memory traffic of scattering pitched rows (see docs/performance.md,
// 'Store batched reads').
func (s *Store) land(w *want, src []byte) {
	q, dst := w.r, s.dst(w)
	rows, rb, pitch := w.rows, q.RowBytes, q.Pitch
	if rows == 0 { // contiguous: one row
		rows, rb, pitch = 1, len(dst), 0
	}
	if ntFits(dst, rows, rb, pitch) && len(src) >= rows*rb {
		copyRowsNT(unsafe.Pointer(unsafe.SliceData(dst)), unsafe.Pointer(unsafe.SliceData(src)), rows, rb, pitch)
		return
	}
	for row := range rows {
		copy(dst[row*pitch:row*pitch+rb], src[row*rb:(row+1)*rb])
	}
}

// ntFits reports whether rows of rb bytes, pitch apart from dst's start,
// lie within dst and may be written with non-temporal stores (the machine
// has them, and the sizes and alignment suit copyRowsNT and crcCopyNT4).
func ntFits(dst []byte, rows, rb, pitch int) bool {
	return haveNT && rb%64 == 0 && pitch%16 == 0 &&
		uintptr(unsafe.Pointer(unsafe.SliceData(dst)))%16 == 0 && len(dst) >= (rows-1)*pitch+rb
}

// corruptReq zeroes w's destination, counts the group corrupt and returns
// its error.
func (s *Store) corruptReq(w *want, got uint32) error {
	q, dst := w.r, s.dst(w)
	if w.rows == 0 {
		clear(dst)
	} else {
		for row := range w.rows {
			clear(dst[row*q.Pitch : row*q.Pitch+q.RowBytes])
		}
	}
	s.m.corrupt.Add(1)
	return fmt.Errorf("%w: %v: crc32c %08x, header says %08x", ErrCorrupt, s.keyOf(w), got, w.crc)
}

// dst is w's destination: its request's, or its head's in a range (which
// keeps the capacity to the end of the request's, as a one-group
// request's does). Not kept in want: a want is sorted, and moved, with
// every group of a call.
func (s *Store) dst(w *want) []byte {
	q := w.r
	if q.Heads <= 1 {
		return q.Buf
	}
	off := s.head(w) * q.HeadStride
	return q.Buf[off : off+len(q.Buf)-(q.Heads-1)*q.HeadStride]
}

// keyOf is the key of w's group.
func (s *Store) keyOf(w *want) layout.Key {
	if w.r.Heads <= 1 {
		return w.r.Key
	}
	return s.geo.KeyAt(w.r.Key.Block, w.idx)
}

// fail records that w's group did not land, with err. The groups of a
// range may be verified on several goroutines at once: their failures
// (rare: a corruption or an I/O error) take failMu.
func (s *Store) fail(w *want, err error) {
	q := w.r
	if q.Heads <= 1 {
		q.Err, q.Failed, q.Bad = err, 1, 1
		return
	}
	s.failMu.Lock()
	defer s.failMu.Unlock()
	q.Failed++
	q.Bad |= s.headBit(w)
	if q.Err == nil || FailRank(err) > FailRank(q.Err) {
		q.Err = err
	}
}

// headBit is w's bit in its request's Bad: 1<<j for head Key.Head+j, 0
// past MaxBadHeads.
func (s *Store) headBit(w *want) uint64 {
	if w.r.Heads <= 1 {
		return 1
	}
	if j := s.head(w); j < MaxBadHeads {
		return 1 << j
	}
	return 0
}

// head is w's head in its request: j for head Key.Head+j (0 for a
// one-group request). A range's heads are consecutive groups of its slot.
func (s *Store) head(w *want) int { return w.idx - s.geo.Index(w.r.Key) }

// AllBad is ReadReq.Bad with every head of a request of heads heads set
// (the first MaxBadHeads).
func AllBad(heads int) uint64 {
	if heads >= MaxBadHeads {
		return ^uint64(0)
	}
	return 1<<max(1, heads) - 1
}

// FailRank orders the failures of a range's groups, the one reported
// ranking highest: a missing group, then a corrupt one, then an I/O
// error (the order in which a caller must not overlook them). A caller
// that reports several groups' failures as one (a GPU tile) ranks them
// the same way.
func FailRank(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return 0
	case errors.Is(err, ErrCorrupt):
		return 1
	}
	return 2
}

// reverify reads w's group (its slot pinned by the caller) into a bounce
// buffer and checks it there. When it verifies, its bytes are copied into
// the destination and the group is not corrupt: the mismatch was in memory
// someone else wrote. Otherwise the group is corrupt (destination zeroed,
// counted), or the read failed (the error is returned).
func (s *Store) reverify(w *want) error {
	gb, stride := s.geo.GroupBytes(), int(s.geo.GroupStride())
	b, err := s.getBounce()
	if err != nil {
		return fmt.Errorf("store: read %v: %w", s.keyOf(w), err)
	}
	defer s.putBounce(b)
	io := []IO{{Op: OpRead, Off: s.groupOffset(w.slot, w.idx), Stream: StreamData, Buf: b[:stride]}}
	if err := s.e.Do(io); err == nil {
		err = io[0].Err
	}
	if err != nil {
		s.m.ioErrors.Add(1)
		return fmt.Errorf("store: read %v: %w", s.keyOf(w), err)
	}
	if got := CRC32C(b[:gb]); got != w.crc {
		return s.corruptReq(w, got)
	}
	s.land(w, b[:gb])
	return nil
}

// checkRequest validates one group request of a write: key within the
// geometry and data of exactly one group.
func (s *Store) checkRequest(k layout.Key, n int) error {
	if err := s.geo.CheckKey(k); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if gb := s.geo.GroupBytes(); n != gb {
		return fmt.Errorf("%w: %d bytes for a %d-byte group", ErrSize, n, gb)
	}
	return nil
}
