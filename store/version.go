package store

// BlockVersion is a block's current version, as a cache of the store's
// blocks (package tier) needs it to tell whether a copy it holds is still
// the block's bytes.
type BlockVersion struct {
	// Stored is false when the block is absent; the other fields are then
	// zero.
	Stored bool
	// Gen is the generation of the block's current header. Every change
	// of a block (a write, a delete of some of its groups, a rename to or
	// from its id) commits a header with a generation never handed out
	// before, in this store's life or an earlier one's: two answers with
	// the same Gen for the same block describe the same groups, bytes and
	// checksums.
	Gen uint64
	// Meta is the block's tag and parent.
	Meta BlockMeta
}

// Versions answers, for each blocks[i], its current version into out[i]
// (it answers min(len(blocks), len(out)) ids), under one hold of the index
// lock, with no I/O. Each block present is touched in the eviction order
// as a read of it would be: a caller that serves the block from a copy of
// its own still uses it. The error is ErrClosed, or nil.
func (s *Store) Versions(blocks []uint64, out []BlockVersion) error {
	n := min(len(blocks), len(out))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return ErrClosed
	}
	last, lastSlot := uint64(0), int64(-1)
	for i := range n {
		b := blocks[i]
		slot, ok := s.mu.idx.Slot(b)
		if !ok {
			out[i] = BlockVersion{}
			continue
		}
		h := s.mu.slots[slot].hdr
		out[i] = BlockVersion{Stored: true, Gen: s.mu.slots[slot].gen, Meta: h.Meta}
		if lastSlot != slot || last != b {
			s.mu.idx.Touch(slot)
			last, lastSlot = b, slot
		}
	}
	return nil
}
