package store

import (
	"errors"
	"fmt"

	"github.com/kvfs/kvfs/layout"
)

// Problem is one thing fsck found wrong.
type Problem struct {
	Slot   int64       `json:"slot"` // -1 for the superblock
	Block  uint64      `json:"block"`
	Key    *layout.Key `json:"key,omitempty"` // the group, when the problem is one group
	Reason string      `json:"reason"`
	Fixed  bool        `json:"fixed"`
}

func (p Problem) String() string {
	fixed := ""
	if p.Fixed {
		fixed = " (repaired)"
	}
	switch {
	case p.Key != nil:
		return fmt.Sprintf("block %016x layer %d head %d kind %s: %s%s", p.Key.Block, p.Key.Layer, p.Key.Head, p.Key.Kind, p.Reason, fixed)
	case p.Slot < 0:
		return "superblock: " + p.Reason + fixed
	}
	return fmt.Sprintf("slot %d: %s%s", p.Slot, p.Reason, fixed)
}

// FsckReport is the outcome of Fsck.
type FsckReport struct {
	// FormatVersion is the store's on-disk format version.
	FormatVersion uint32    `json:"format_version"`
	Slots         int64     `json:"slots"`
	Blocks        int       `json:"blocks"`
	Groups        int       `json:"groups"`
	Problems      []Problem `json:"problems"`
}

// Clean reports whether fsck found nothing wrong.
func (r *FsckReport) Clean() bool { return len(r.Problems) == 0 }

// Fsck checks both superblock copies, every slot's header copies and every
// present group's checksum. With repair it rewrites a damaged superblock or
// header copy from the good one and drops groups whose checksum fails. It
// runs while the store is open; writes wait for it.
func (s *Store) Fsck(repair bool) (*FsckReport, error) {
	return s.FsckProgress(repair, nil)
}

// FsckProgress is Fsck that reports, when progress is not nil, the bytes
// checked so far of the total: every slot's header copies, then every
// present group. It is called from Fsck's goroutine after each chunk.
func (s *Store) FsckProgress(repair bool, progress func(done, total int64)) (*FsckReport, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	var done, total int64
	report := func(n int64) {
		done += n
		if progress != nil && n > 0 {
			progress(done, total)
		}
	}
	if progress != nil {
		total = s.sb.Slots * 2 * s.sb.HeaderBytes
		for _, b := range s.Blocks() {
			for idx := range s.geo.GroupsPerBlock() {
				if b.Has(idx) {
					total += int64(s.geo.GroupBytes())
				}
			}
		}
	}
	rep := &FsckReport{FormatVersion: s.sb.Version, Slots: s.sb.Slots}
	for _, msg := range s.sbProblems {
		p := Problem{Slot: -1, Reason: msg}
		if repair {
			if err := writeSuperblocks(s.e, &s.sb, []int{0, 1}); err != nil {
				return nil, err
			}
			p.Fixed = true
		}
		rep.Problems = append(rep.Problems, p)
	}
	if repair {
		s.sbProblems = nil
	}
	var bad []layout.Key
	var rewrite []int64
	for first := int64(0); first < s.sb.Slots; first += scanChunk {
		n := min(scanChunk, s.sb.Slots-first)
		scans, err := s.scanHeaders(first, n)
		if err != nil {
			return nil, err
		}
		report(n * 2 * s.sb.HeaderBytes)
		for i, sc := range scans {
			slot := first + int64(i)
			for _, c := range sc.damaged {
				rep.Problems = append(rep.Problems, Problem{Slot: slot, Reason: fmt.Sprintf("header copy %d: %v", c, sc.err[c]), Fixed: repair})
				rewrite = append(rewrite, slot)
			}
		}
	}
	// Every present group of every block: read and verify.
	blocks := s.Blocks()
	rep.Blocks = len(blocks)
	var reqs []ReadReq
	flush := func() error {
		if err := s.Read(reqs); err != nil {
			return err
		}
		for _, r := range reqs {
			switch {
			case r.Err == nil:
			case errors.Is(r.Err, ErrCorrupt):
				bad = append(bad, r.Key)
				k := r.Key
				rep.Problems = append(rep.Problems, Problem{Slot: s.slotOf(k.Block), Block: k.Block, Key: &k, Reason: "checksum mismatch", Fixed: repair})
			case errors.Is(r.Err, ErrNotFound):
				// Deleted meanwhile.
			default:
				k := r.Key
				rep.Problems = append(rep.Problems, Problem{Slot: s.slotOf(k.Block), Block: k.Block, Key: &k, Reason: r.Err.Error()})
			}
		}
		report(int64(len(reqs) * s.geo.GroupBytes()))
		reqs = reqs[:0]
		return nil
	}
	for _, b := range blocks {
		for idx := range s.geo.GroupsPerBlock() {
			if !b.Has(idx) {
				continue
			}
			rep.Groups++
			reqs = append(reqs, ReadReq{Key: s.geo.KeyAt(b.ID, idx), Buf: make([]byte, s.geo.GroupBytes())})
		}
		if len(reqs) >= 1024 {
			if err := flush(); err != nil {
				return nil, err
			}
		}
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if !repair {
		return rep, nil
	}
	if err := s.rewriteHeaders(rewrite); err != nil {
		return nil, err
	}
	if len(bad) > 0 {
		s.wmu.Unlock()
		err := s.Delete(bad)
		s.wmu.Lock()
		if err != nil {
			return nil, fmt.Errorf("store: fsck repair: %w", err)
		}
	}
	return rep, nil
}

// rewriteHeaders writes each slot's current header (or a tombstone) over its
// damaged copy, so both copies are valid again. Called with wmu held.
func (s *Store) rewriteHeaders(slots []int64) error {
	if len(slots) == 0 {
		return nil
	}
	hb := int(s.sb.HeaderBytes)
	buf, err := s.alloc(hb)
	if err != nil {
		return err
	}
	defer s.freeBuf(buf)
	for _, slot := range slots {
		s.mu.Lock()
		st := &s.mu.slots[slot]
		h := st.hdr
		if h == nil {
			h = newHeader(s.geo.GroupsPerBlock())
			h.Slot = slot
		} else {
			h = h.clone()
		}
		s.mu.gen++
		h.Gen = s.mu.gen
		c := 1 - max(st.cur, 0)
		s.mu.Unlock()
		// Write the non-current copy first, then (after a sync) the other,
		// so a crash in between leaves one valid copy.
		for _, cp := range []int{c, 1 - c} {
			s.marshalHeader(buf, h)
			if err := doAll(s.e, []IO{{Op: OpWrite, Off: s.headerOffset(slot, cp), Buf: buf, Stream: StreamMeta}}); err != nil {
				return fmt.Errorf("store: fsck repair slot %d: %w", slot, err)
			}
			if err := s.sync(); err != nil {
				return err
			}
			s.mu.Lock()
			st.cur, st.gen = cp, h.Gen
			if st.hdr != nil {
				st.hdr = h
			}
			s.mu.Unlock()
		}
	}
	return nil
}

// slotOf is the slot holding block id, -1 when absent.
func (s *Store) slotOf(id uint64) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot, ok := s.mu.idx.Slot(id); ok {
		return slot
	}
	return -1
}
