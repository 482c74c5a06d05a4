package store

import (
	"fmt"

	"github.com/kvfs/kvfs/layout"
)

// Delete removes groups, durably. A block left without groups disappears.
// Keys that are absent are skipped; the error then wraps ErrNotFound (after
// the present ones are removed).
func (s *Store) Delete(keys []layout.Key) error {
	for _, k := range keys {
		if err := s.geo.CheckKey(k); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalid, err)
		}
	}
	byBlock := map[uint64][]int{}
	var order []uint64
	for _, k := range keys {
		if _, ok := byBlock[k.Block]; !ok {
			order = append(order, k.Block)
		}
		byBlock[k.Block] = append(byBlock[k.Block], s.geo.Index(k))
	}
	return s.dropGroups(order, func(h *Header, block uint64) (int, int) {
		dropped, missing := 0, 0
		for _, idx := range byBlock[block] {
			if h.Has(idx) {
				h.clear(idx)
				dropped++
			} else {
				missing++
			}
		}
		return dropped, missing
	})
}

// DeleteBlock removes every group of a block, durably.
func (s *Store) DeleteBlock(id uint64) error {
	return s.dropGroups([]uint64{id}, func(h *Header, _ uint64) (int, int) {
		n := h.Count()
		clear(h.Present)
		clear(h.CRC)
		clear(h.MTime)
		return n, 0
	})
}

// dropGroups applies edit to the headers of blocks and commits the new
// headers (or tombstones, for blocks left empty) with one sync.
func (s *Store) dropGroups(blocks []uint64, edit func(h *Header, block uint64) (dropped, missing int)) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	type change struct {
		slot int64
		hdr  *Header
		copy int
	}
	var changes []change
	var empties []int64
	missing := 0
	s.mu.Lock()
	for _, b := range blocks {
		slot, ok := s.mu.idx.Slot(b)
		if !ok {
			missing++
			continue
		}
		st := &s.mu.slots[slot]
		h := st.hdr.clone()
		d, m := edit(h, b)
		missing += m
		if d == 0 {
			continue
		}
		if h.Count() == 0 {
			empties = append(empties, slot)
			continue
		}
		s.mu.gen++
		h.Gen = s.mu.gen
		changes = append(changes, change{slot, h, 1 - max(st.cur, 0)})
	}
	s.mu.Unlock()
	hb := int(s.sb.HeaderBytes)
	if len(changes) > 0 {
		buf, err := s.alloc(len(changes) * hb)
		if err != nil {
			return err
		}
		defer s.freeBuf(buf)
		ios := make([]IO, len(changes))
		for i, c := range changes {
			b := buf[i*hb : (i+1)*hb]
			s.marshalHeader(b, c.hdr)
			ios[i] = IO{Op: OpWrite, Off: s.headerOffset(c.slot, c.copy), Buf: b, Stream: StreamMeta}
		}
		if err := s.failpoint("before-headers"); err != nil {
			return err
		}
		if err := doAll(s.e, ios); err != nil {
			return fmt.Errorf("store: delete: %w", err)
		}
	}
	if err := s.tombstone(empties); err != nil {
		return fmt.Errorf("store: delete: %w", err)
	}
	if len(changes)+len(empties) > 0 {
		if err := s.sync(); err != nil {
			return fmt.Errorf("store: delete: %w", err)
		}
	}
	s.mu.Lock()
	for _, c := range changes {
		st := &s.mu.slots[c.slot]
		st.hdr, st.cur, st.gen = c.hdr, c.copy, c.hdr.Gen
		s.mu.idx.SetFull(c.slot, s.fullLocked(c.hdr))
	}
	for _, slot := range empties {
		s.mu.idx.Remove(slot)
		s.releaseLocked(slot)
	}
	s.mu.Unlock()
	if missing > 0 {
		return fmt.Errorf("%w: %d of the groups or blocks asked for", ErrNotFound, missing)
	}
	return nil
}
