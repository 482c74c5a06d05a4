package store

import (
	"fmt"

	"go.uber.org/zap"
)

// RenameBlock gives block from the id to, durably, without moving or
// copying a payload: the slot's header is rewritten with the new block id
// (same groups, checksums and write times, a higher generation) into its
// non-current copy and synced, the same commit as any header change. A
// block holds every layer, so every layer's groups move. After a crash at
// any point the block is found under exactly one of the two ids, with all
// its groups: the old header stays in force until the new copy is durable
// and valid (a torn copy fails its CRC and loses to the old one).
//
// It fails with ErrNotFound when from is absent, ErrBlockExists when to is
// present (nothing changes), and ErrClosed after Close. Renaming a block to
// itself is a no-op. A failed header write or sync leaves the block under
// from in memory; the store then writes the old header back over the copy
// it may have reached (logged if that fails too), so a reopen finds from.
func (s *Store) RenameBlock(from, to uint64) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	s.mu.Lock()
	slot, ok := s.mu.idx.Slot(from)
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("%w: block %016x", ErrNotFound, from)
	}
	if from == to {
		s.mu.Unlock()
		return nil
	}
	if _, taken := s.mu.idx.Slot(to); taken {
		s.mu.Unlock()
		return fmt.Errorf("%w: block %016x", ErrBlockExists, to)
	}
	st := &s.mu.slots[slot]
	old := st.hdr
	h := old.clone()
	s.mu.gen++
	h.Block, h.Gen = to, s.mu.gen
	if h.Meta.HasParent && h.Meta.Parent == to {
		h.Meta.HasParent, h.Meta.Parent = false, 0 // a block is not its own parent
	}
	copyNo := 1 - max(st.cur, 0)
	s.mu.Unlock()

	err := s.writeHeader(slot, copyNo, h)
	if err == nil {
		err = s.sync()
	}
	if err != nil {
		s.restoreHeader(slot, copyNo, old)
		return fmt.Errorf("store: rename block %016x to %016x: %w", from, to, err)
	}
	s.mu.Lock()
	st.hdr, st.cur, st.gen = h, copyNo, h.Gen
	s.mu.idx.Rename(slot, to)
	s.mu.idx.Touch(slot)
	s.mu.Unlock()
	return nil
}

// writeHeader writes h into header copy c of slot (no sync). Called with
// wmu held.
func (s *Store) writeHeader(slot int64, c int, h *Header) error {
	hb := int(s.sb.HeaderBytes)
	buf, err := s.alloc(hb)
	if err != nil {
		return err
	}
	defer s.freeBuf(buf)
	s.marshalHeader(buf, h)
	if err := s.failpoint("before-headers"); err != nil {
		return err
	}
	if err := doAll(s.e, []IO{{Op: OpWrite, Off: s.headerOffset(slot, c), Buf: buf, Stream: StreamMeta}}); err != nil {
		s.m.ioErrors.Add(1)
		return err
	}
	return nil
}

// restoreHeader rewrites a slot's current header (old), with a new
// generation, over copy c, which a failed header change may have reached
// with a header the store did not commit; on success copy c becomes the
// current one. Called with wmu held.
func (s *Store) restoreHeader(slot int64, c int, old *Header) {
	h := old.clone()
	s.mu.Lock()
	s.mu.gen++
	h.Gen = s.mu.gen
	s.mu.Unlock()
	err := s.writeHeader(slot, c, h)
	if err == nil {
		err = s.sync()
	}
	if err != nil {
		s.log.Warn("store: could not restore a slot header after a failed change; a reopen may find either version",
			zap.Int64("slot", slot), zap.Error(err))
		return
	}
	s.mu.Lock()
	st := &s.mu.slots[slot]
	st.hdr, st.cur, st.gen = h, c, h.Gen
	s.mu.Unlock()
}
