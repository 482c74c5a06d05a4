package store

import (
	"fmt"
	"sort"
	"time"
	"unsafe"

	"github.com/kvfs/kvfs/layout"
)

// ReadReq asks for one group. Buf must be exactly GroupBytes long.
type ReadReq struct {
	Key layout.Key
	Buf []byte
	// Err is set by Read: nil (Buf holds the group, its checksum verified),
	// ErrNotFound, ErrCorrupt (Buf zeroed), ErrInvalid, ErrSize or an I/O error.
	Err error
}

// run is a set of groups of one slot that sit next to each other on disk and
// are read with one I/O.
type run struct {
	slot  int64
	first int // group index of the first group
	n     int // distinct groups covered
	reqs  []*ReadReq
	rel   []int // group of each request, relative to first
	crcs  []uint32
	io    IO
	// direct: the destination buffers are contiguous and aligned, and the
	// I/O lands in them; otherwise it lands in a bounce buffer.
	direct bool
}

// Read reads a batch of groups. Groups adjacent on disk are coalesced into
// single I/Os of up to MaxIO bytes, and the whole batch is handed to the
// engine at once. Every group's CRC32C is verified before Read returns; a
// group that fails is zeroed and reported as ErrCorrupt, never served. The
// returned error is for the batch as a whole (store closed, engine broken);
// per-group outcomes are in each request's Err.
func (s *Store) Read(reqs []ReadReq) error {
	start := time.Now()
	if err := s.checkOpen(); err != nil {
		return err
	}
	type want struct {
		r    *ReadReq
		slot int64
		idx  int
		crc  uint32
	}
	wants := make([]want, 0, len(reqs))
	var pinned []int64
	s.mu.Lock()
	for i := range reqs {
		r := &reqs[i]
		if r.Err = s.checkRequest(r.Key, len(r.Buf)); r.Err != nil {
			continue
		}
		idx := s.geo.Index(r.Key)
		slot, ok := s.mu.index[r.Key.Block]
		if !ok || !s.mu.slots[slot].hdr.Has(idx) {
			r.Err = fmt.Errorf("%w: %v", ErrNotFound, r.Key)
			s.m.misses.Add(1)
			continue
		}
		st := &s.mu.slots[slot]
		st.pins++
		pinned = append(pinned, slot)
		s.touchLocked(slot)
		wants = append(wants, want{r, slot, idx, st.hdr.CRC[idx]})
	}
	reader := len(pinned) > 0
	if reader {
		s.mu.readers++
	}
	s.mu.Unlock()
	defer s.unpin(pinned, reader)
	if len(wants) == 0 {
		return nil
	}
	sort.SliceStable(wants, func(i, j int) bool {
		if wants[i].slot != wants[j].slot {
			return wants[i].slot < wants[j].slot
		}
		return wants[i].idx < wants[j].idx
	})
	stride := int(s.geo.GroupStride())
	maxGroups := max(1, s.opts.MaxIO/stride)
	var runs []*run
	for _, w := range wants {
		if n := len(runs); n > 0 {
			r := runs[n-1]
			last := r.first + r.n - 1
			// The same group asked for twice is read once and copied twice.
			if r.slot == w.slot && (w.idx == last || (w.idx == last+1 && r.n < maxGroups)) {
				r.n = w.idx - r.first + 1
				r.reqs = append(r.reqs, w.r)
				r.rel = append(r.rel, w.idx-r.first)
				r.crcs = append(r.crcs, w.crc)
				continue
			}
		}
		runs = append(runs, &run{slot: w.slot, first: w.idx, n: 1, reqs: []*ReadReq{w.r}, rel: []int{0}, crcs: []uint32{w.crc}})
	}
	// Issue the runs in windows whose bounce buffers stay bounded.
	const window = 64 << 20
	for lo := 0; lo < len(runs); {
		hi, bytes := lo, 0
		for hi < len(runs) && (hi == lo || bytes+runs[hi].n*stride <= window) {
			bytes += runs[hi].n * stride
			hi++
		}
		if err := s.readRuns(runs[lo:hi]); err != nil {
			return err
		}
		lo = hi
	}
	if s.opts.Observe != nil {
		s.opts.Observe(OpRead, len(wants), time.Since(start))
	}
	return nil
}

func (s *Store) readRuns(runs []*run) error {
	gb := s.geo.GroupBytes()
	stride := int(s.geo.GroupStride())
	align := s.e.Align()
	ios := make([]IO, len(runs))
	var bounces [][]byte
	defer func() {
		for _, b := range bounces {
			s.putBounce(b)
		}
	}()
	for i, r := range runs {
		n := r.n
		r.io = IO{Op: OpRead, Off: s.groupOffset(r.slot, r.first), Stream: StreamData}
		// Direct landing: one request per group, groups packed without
		// padding, destinations contiguous and aligned for the engine.
		if stride == gb && n == len(r.reqs) && cap(r.reqs[0].Buf) >= n*gb && contiguous(r.reqs) {
			dst := r.reqs[0].Buf[: n*gb : n*gb]
			if Aligned(dst, align) {
				r.io.Buf, r.direct = dst, true
			}
		}
		if !r.direct {
			b, err := s.getBounce()
			if err != nil {
				return err
			}
			bounces = append(bounces, b)
			r.io.Buf = b[:n*stride]
		}
		ios[i] = r.io
	}
	if err := s.e.Do(ios); err != nil {
		return fmt.Errorf("store: read: %w", err)
	}
	for i, r := range runs {
		if err := ios[i].Err; err != nil {
			s.m.ioErrors.Add(1)
			for _, q := range r.reqs {
				q.Err = fmt.Errorf("store: read %v: %w", q.Key, err)
			}
			continue
		}
		for j, q := range r.reqs {
			g := r.rel[j]
			if !r.direct {
				// Verify in the bounce buffer, which only the store
				// writes, then copy.
				src := ios[i].Buf[g*stride : g*stride+gb]
				if got := CRC32C(src); got != r.crcs[j] {
					s.corruptReq(q, got, r.crcs[j])
					continue
				}
				copy(q.Buf, src)
			} else if got := CRC32C(q.Buf); got != r.crcs[j] {
				// The group landed in the caller's memory, which another
				// process may write meanwhile (a client's shared mapping):
				// verify again from a private copy before calling it
				// corrupt.
				if err := s.reverify(r.slot, r.first+g, q, r.crcs[j]); err != nil {
					q.Err = err
					continue
				}
			}
			s.m.reads.Add(1)
			s.m.hits.Add(1)
			s.m.bytesRead.Add(uint64(gb))
		}
	}
	return nil
}

// corruptReq zeroes a request's buffer and reports the group corrupt.
func (s *Store) corruptReq(q *ReadReq, got, want uint32) {
	clear(q.Buf)
	q.Err = fmt.Errorf("%w: %v: crc32c %08x, header says %08x", ErrCorrupt, q.Key, got, want)
	s.m.corrupt.Add(1)
}

// reverify reads group idx of slot (pinned by the caller) into a bounce
// buffer and checks it there. When it verifies, its bytes are copied into
// q.Buf and the group is not corrupt: the mismatch was in memory someone
// else wrote. Otherwise the group is corrupt (q.Buf zeroed, counted), or
// the read failed (the error is returned).
func (s *Store) reverify(slot int64, idx int, q *ReadReq, want uint32) error {
	gb, stride := s.geo.GroupBytes(), int(s.geo.GroupStride())
	b, err := s.getBounce()
	if err != nil {
		return fmt.Errorf("store: read %v: %w", q.Key, err)
	}
	defer s.putBounce(b)
	io := []IO{{Op: OpRead, Off: s.groupOffset(slot, idx), Stream: StreamData, Buf: b[:stride]}}
	if err := s.e.Do(io); err == nil {
		err = io[0].Err
	}
	if err != nil {
		s.m.ioErrors.Add(1)
		return fmt.Errorf("store: read %v: %w", q.Key, err)
	}
	if got := CRC32C(b[:gb]); got != want {
		s.corruptReq(q, got, want)
		return q.Err
	}
	copy(q.Buf, b[:gb])
	return nil
}

// contiguous reports whether the requests' buffers follow each other in
// memory in order. Callers also check that the first buffer's capacity spans
// them all, so they are parts of one allocation.
func contiguous(reqs []*ReadReq) bool {
	for i := 1; i < len(reqs); i++ {
		prev := reqs[i-1].Buf
		if uintptr(unsafe.Pointer(&reqs[i].Buf[0])) != uintptr(unsafe.Pointer(&prev[0]))+uintptr(len(prev)) {
			return false
		}
	}
	return true
}

// checkRequest validates one group request: key within the geometry and a
// buffer of exactly one group.
func (s *Store) checkRequest(k layout.Key, n int) error {
	if err := s.geo.CheckKey(k); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if gb := s.geo.GroupBytes(); n != gb {
		return fmt.Errorf("%w: %d bytes for a %d-byte group", ErrSize, n, gb)
	}
	return nil
}
