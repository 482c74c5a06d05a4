package store

import "fmt"

// formatVersion is the store's format version now: the superblock's at
// Open, FormatVersion after UpgradeFormat. Headers are written in it.
func (s *Store) formatVersion() uint32 { return s.ver.Load() }

// UpgradeFormat moves a format version 1 store to version 2 in place,
// where version 2's slot headers (32 bytes longer) fit the header copies
// the store has (HeaderBytes is rounded up to the alignment, which absorbs
// them for most geometries). Only the two superblock copies are written
// (in one batch, then synced): the slot headers stay version 1, which
// version 2 reads as blocks without tags or parents, and each block's
// header becomes version 2 when the block is next written. From then on
// writes may carry tags and parents, and an older kvfs refuses the store
// (a torn superblock write leaves one copy of either version, each a valid
// store). It reports whether it changed the store; a store of version 2
// already is left alone. It fails with ErrVersion where the headers do
// not fit (format a new store and copy the blocks over; see
// docs/format.md), ErrInvalid on a read-only store, and as a write does
// once the ownership lease is lost.
func (s *Store) UpgradeFormat() (bool, error) {
	if err := s.checkOpen(); err != nil {
		return false, err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.formatVersion() >= FormatVersion {
		return false, nil
	}
	if s.opts.ReadOnly {
		return false, fmt.Errorf("%w: upgrade of a store opened read-only", ErrInvalid)
	}
	sb := s.Superblock()
	if need := headerBytes(s.geo, FormatVersion); need != sb.HeaderBytes {
		return false, fmt.Errorf("%w: version %d headers of this geometry take %d bytes, the store's copies have %d: format a new store and copy the blocks over (docs/format.md, 'Moving a store to version 2')",
			ErrVersion, FormatVersion, need, sb.HeaderBytes)
	}
	sb.Version = FormatVersion
	if err := s.failpoint("before-superblocks"); err != nil {
		return false, err
	}
	if err := writeSuperblocks(s.e, &sb, []int{0, 1}); err != nil {
		return false, err
	}
	s.ver.Store(FormatVersion)
	return true, nil
}
