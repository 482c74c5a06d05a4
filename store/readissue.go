package store

import (
	"fmt"
	"runtime"
	"sync/atomic"

	"github.com/kvfs/kvfs/internal/par"
)

// readNotified issues one window of runs on a NotifyEngine and verifies
// each run as soon as it has landed, on up to GOMAXPROCS goroutines, while
// the others are in flight: the checksum overlaps the I/O and reads bytes
// still in the CPU's caches instead of memory.
func (s *Store) readNotified(runs []run, ios []IO, wants []want) error {
	first := wants[runs[0].lo].run
	ready := make(chan int, len(runs)) // never blocks the engine's goroutine
	var started atomic.Bool
	var derr error
	par.Run(min(len(runs), runtime.GOMAXPROCS(0))+1, func() {
		if started.CompareAndSwap(false, true) {
			func() {
				defer close(ready)
				derr = s.notify.DoNotify(ios, func(i int) { ready <- i })
			}()
		}
		for i := range ready {
			r := &runs[i]
			if s.failRun(r, ios[i].Err, wants) {
				continue
			}
			s.verifyRange(runs, first, wants[r.lo:r.hi])
		}
	})
	if derr != nil {
		return fmt.Errorf("store: read: %w", derr)
	}
	return nil
}

// readInline reads and verifies one window of runs on an InlineReader: up
// to GOMAXPROCS goroutines each take the next run and read it in chunks of
// about inlineChunk bytes, verifying each chunk's groups right after its
// read, while the bytes are in that core's cache.
func (s *Store) readInline(runs []run, ios []IO, wants []want) {
	first := wants[runs[0].lo].run
	per := max(1, s.inlineChunk/int(s.geo.GroupStride())) // groups per chunk
	var next atomic.Int64
	par.Run(min(len(runs), runtime.GOMAXPROCS(0)), func() {
		var vec [][]byte // this goroutine's chunk segments
		var io IO        // and chunk request (one allocation per goroutine)
		for {
			i := int(next.Add(1) - 1)
			if i >= len(runs) {
				return
			}
			cb := <-s.inlineSlots
			cb = s.readInlineRun(runs, ios, wants, i, first, per, &vec, &io, cb)
			s.inlineSlots <- cb
		}
	})
}

// chunkBounced reports whether bounced run r is read inline chunk by chunk
// into the chunk buffer of the inline slot its goroutine holds, verified
// and landed from there while the chunk is in that core's cache, instead
// of into bounce memory of its own: every run on an inline engine but one
// naming a group twice (its wants do not map one to one onto its groups,
// so it is read whole). A call then needs no bounce memory for its window
// (it was 64 MiB per NHD call, drawn from the pool by every caller), and
// the kernel's copy lands in cache lines already there.
func (s *Store) chunkBounced(r *run) bool {
	return s.inline != nil && r.mode == landBounce && r.hi-r.lo == r.n
}

// chunkBuf returns cb if it holds n bytes, else a new buffer of n bytes
// aligned for the engine (Go memory: an inline read is a system call on
// this goroutine, no DMA into it outlives the call).
func (s *Store) chunkBuf(cb []byte, n int) []byte {
	if len(cb) >= n {
		return cb
	}
	return MakeAligned(n, s.e.Align())
}

// readInlineRun reads run i in chunks of per groups, verifying each
// chunk's groups right after its read; vec and io are the goroutine's
// scratch. The caller holds an inline slot (Store.inlineSlots), whose chunk
// buffer cb a bounced run is read into (grown here when short; the buffer
// to give back with the slot is returned). When a fault on a caller's
// memory panics through here (and out of Read), the slot is given back on
// the way.
func (s *Store) readInlineRun(runs []run, ios []IO, wants []want, i, first, per int, vec *[][]byte, io *IO, cb []byte) []byte {
	done := false
	defer func() {
		if !done {
			s.inlineSlots <- cb
		}
	}()
	stride := int(s.geo.GroupStride())
	r := &runs[i]
	if r.hi-r.lo != r.n {
		// A group asked for twice: its wants do not map one to one onto
		// the run's groups, so the run is read whole (into its own bounce
		// memory when bounced).
		ios[i].Err = s.inline.ReadInline(&ios[i])
		if !s.failRun(r, ios[i].Err, wants) {
			s.verifyRange(runs, first, wants[r.lo:r.hi])
		}
		done = true
		return cb
	}
	view := s.view
	for g0 := 0; g0 < r.n; g0 += per {
		g1 := min(g0+per, r.n)
		ws := wants[r.lo+g0 : r.lo+g1]
		off := ios[i].Off + int64(g0*stride)
		if n := int64((g1 - g0) * stride); r.mode == landBounce && view != nil && off >= 0 && off <= int64(len(view))-n {
			// Verified where the file lies in memory and landed from
			// there: no copy into a chunk buffer first. Where the
			// one-pass checksum copy (crcLand) does not run, the chunk
			// is brought into this core's cache first with one load per
			// line, all independent, so the checksum, group by group,
			// does not wait on memory at each page; the one-pass copy
			// prefetches ahead itself, and is faster without (see
			// docs/performance.md, 'Store batched reads').
			src := view[off : off+n : off+n]
			if !s.onePass() {
				touchLines(src)
			}
			s.verifyFrom(runs, first, ws, src, r.first+g0)
			continue
		}
		if r.mode == landBounce {
			cb = s.chunkBuf(cb, min(per, r.n)*stride) // cb itself once it has the room
		}
		*io = IO{Op: OpRead, Off: off, Stream: ios[i].Stream}
		switch r.mode {
		case landVec:
			*vec = s.appendVec((*vec)[:0], 0, ws)
			io.Vec = *vec
		case landBounce:
			io.Buf = cb[:(g1-g0)*stride]
		default: // landDirect: one range
			io.Buf = ios[i].Buf[g0*stride : g1*stride]
		}
		err := s.inline.ReadInline(io)
		clear(*vec)
		if err != nil {
			ios[i].Err = err
			s.failWants(ws, err)
			continue
		}
		if r.mode == landBounce {
			s.verifyFrom(runs, first, ws, io.Buf, r.first+g0)
		} else {
			s.verifyRange(runs, first, ws)
		}
	}
	done = true
	return cb
}

// touchLines loads one byte of each 64-byte line of b: the loads are
// independent, so the core has many misses in flight and the lines arrive
// at the memory's pace, not one page's prefetch at a time.
func touchLines(b []byte) {
	var x byte
	for i := 0; i < len(b); i += 64 {
		x += b[i]
	}
	touchSink.Store(uint32(x))
}

// touchSink keeps touchLines' loads from being optimized away.
var touchSink atomic.Uint32

// appendVec appends to vec the destination segments of ws (consecutive
// groups of a run that lands by vector read): a contiguous destination, or
// each row of a pitched one. A contiguous destination that continues the
// previous segment past vec[base] (in the same slice's capacity: one range
// of one allocation) extends it, so head-major tiles of one layer and kind
// are one segment.
func (s *Store) appendVec(vec [][]byte, base int, ws []want) [][]byte {
	for i := range ws {
		w := &ws[i]
		dst := s.dst(w)
		if w.rows == 0 {
			if n := len(vec); n > base {
				last := vec[n-1]
				if follows(last, dst) && cap(last) >= len(last)+len(dst) {
					vec[n-1] = last[:len(last)+len(dst)]
					continue
				}
			}
			vec = append(vec, dst)
			continue
		}
		q := w.r
		for row := range w.rows {
			o := row * q.Pitch
			vec = append(vec, dst[o:o+q.RowBytes:o+q.RowBytes])
		}
	}
	return vec
}
