package store

import (
	"github.com/kvfs/kvfs/layout"
)

// HostViewer is implemented by engines whose file lies in memory the
// process can map (a file in tmpfs or ramfs): HostView is the whole file,
// mapped shared and read-only (byte i of it is byte i of the file), or nil
// when the engine has none. The mapping lives until the engine closes.
type HostViewer interface {
	HostView() []byte
}

// HostView is the store's file in memory, read-only, when its engine offers
// one (HostViewer), else nil: a caller that moves groups itself (a GPU's
// DMA from host memory) copies them from there at the offsets Locate gives,
// with no read into a buffer first. The view is valid until Close.
func (s *Store) HostView() []byte {
	if v, ok := s.e.(HostViewer); ok {
		return v.HostView()
	}
	return nil
}

// LocateReq asks where one group lies.
type LocateReq struct {
	Key layout.Key
	// Off, set by Locate for a group present, is the byte offset of its
	// payload (GroupBytes long) in the store's file.
	Off int64
	// CRC, set with Off, is the CRC32C the group's header records: the
	// caller verifies the bytes it moved against it, and must not use
	// bytes that differ (Locate reads no payload).
	CRC uint32
	// Tag, when set and not zero, is the tag the block must be stored
	// under, as for ReadReq.Tag: another tag fails the request with
	// ErrTagMismatch. Nil checks none.
	Tag *Tag
	// Err is nil, ErrNotFound or ErrTagMismatch (sentinels, no
	// allocation) or ErrInvalid.
	Err error
}

// Locate finds reqs' groups (Off, CRC and Err of each) and pins the slots
// holding them, appending those slots to pins: until the caller hands them
// to Unpin, no write or eviction reuses a pinned slot, so the bytes at Off
// stay the group's. Like Read it takes one pin and one LRU touch per run
// of requests for the same block, and allocates nothing per group. The
// error is for the call as a whole (ErrClosed); then nothing is pinned.
func (s *Store) Locate(reqs []LocateReq, pins []int64) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return pins, ErrClosed
	}
	first := len(pins)
	bp := blockPinner{slot: -1}
	hits, misses, mismatches := 0, 0, 0
	for i := range reqs {
		r := &reqs[i]
		r.Off, r.CRC = 0, 0
		if r.Err = s.checkRequest(r.Key, s.geo.GroupBytes()); r.Err != nil {
			continue
		}
		pins = s.pinBlockLocked(&bp, r.Key.Block, pins)
		idx := s.geo.Index(r.Key)
		switch {
		case bp.hdr == nil:
			r.Err = ErrNotFound
		case !TagMatches(r.Tag, bp.hdr.Meta.Tag):
			// Checked against the header of the slot pinned here, under
			// the same hold of s.mu: the slot is not reused until Unpin,
			// so the bytes at Off stay those of the block whose tag
			// matched (see Read).
			r.Err = ErrTagMismatch
			mismatches++
		case !bp.hdr.Has(idx):
			r.Err = ErrNotFound
		}
		if r.Err != nil {
			misses++
			continue
		}
		r.Off, r.CRC = s.groupOffset(bp.slot, idx), bp.hdr.CRC[idx]
		hits++
	}
	if len(pins) > first {
		s.mu.readers++
	}
	// A located group counts as a read and a hit, as one Read finds
	// (its bytes are read, by whoever copies them from the host view);
	// one found corrupt there is the caller's to count (NoteCorrupt).
	if hits > 0 {
		s.m.reads.Add(uint64(hits))
		s.m.hits.Add(uint64(hits))
		s.m.bytesRead.Add(uint64(hits) * uint64(s.geo.GroupBytes()))
	}
	if misses > 0 {
		s.m.misses.Add(uint64(misses))
	}
	if mismatches > 0 {
		s.m.tagMismatch.Add(uint64(mismatches))
	}
	return pins, nil
}

// NoteCorrupt counts n groups found corrupt by a caller that checked them
// itself: groups it located, or read as Unverified requests (a GPU's
// checksums), which the store hands out unchecked. Metrics.Corrupt then
// counts every group found corrupt, whoever checked it.
func (s *Store) NoteCorrupt(n int) {
	if n > 0 {
		s.m.corrupt.Add(uint64(n))
	}
}

// Unpin drops the pins one Locate call appended (pass exactly those; an
// empty slice is a no-op).
func (s *Store) Unpin(pins []int64) {
	if len(pins) > 0 {
		s.unpin(pins, true)
	}
}
