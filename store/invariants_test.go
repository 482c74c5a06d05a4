package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// brokenStore is a store of 4 slots holding two blocks, opened without the
// check at Close (its test breaks it on purpose).
func brokenStore(t *testing.T) (*store.Store, *storetest.Mem) {
	t.Helper()
	m := storetest.Formatted(t, testGeo, 4, 512)
	s := storetest.Open(t, m, store.Options{})
	put(t, s, keysOf(1, 0, 1), 1) // slot 0
	put(t, s, keysOf(2, 3), 1)    // slot 1
	put(t, s, keysOf(1, 0), 2)    // copy-on-write to slot 2: slot 0 becomes a free tombstone
	if _, err := get(s, keysOf(2, 3)[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatalf("before breaking it: %v", err)
	}
	return s, m
}

// TestCheckInvariantsCatches breaks each relation the check covers, one at
// a time, and expects the check to report it.
func TestCheckInvariantsCatches(t *testing.T) {
	for _, what := range store.Corruptions {
		t.Run(what, func(t *testing.T) {
			s, _ := brokenStore(t)
			if err := store.Corrupt(s, what); err != nil {
				t.Fatal(err)
			}
			err := s.CheckInvariants()
			if !errors.Is(err, store.ErrInvariant) {
				t.Fatalf("check after %s: %v", what, err)
			}
			t.Log(err)
		})
	}
	// On the device: both copies of a live slot's header damaged behind the
	// store's back, and a free slot given a live header.
	t.Run("device-header", func(t *testing.T) {
		s, m := brokenStore(t)
		gi, err := s.Stat(keysOf(2, 3)[0])
		if err != nil {
			t.Fatal(err)
		}
		sb := s.Superblock()
		for c := range int64(2) {
			off := sb.DataOffset + gi.Slot*sb.SlotBytes + c*sb.HeaderBytes + 70
			m.Poke(off, []byte{m.Image()[off] ^ 1})
		}
		err = s.CheckInvariants()
		if !errors.Is(err, store.ErrInvariant) || !strings.Contains(err.Error(), "not valid on the device") {
			t.Fatalf("check: %v", err)
		}
	})
	t.Run("device-free-slot-live", func(t *testing.T) {
		s, m := brokenStore(t)
		// Slot 0 is free: its current copy holds the tombstone. Put a live
		// header of a newer generation into its other copy, as a lost
		// tombstone write would leave it: a reopen would bring block 1
		// back from there.
		sb := s.Superblock()
		img := m.Image()
		h0 := sb.DataOffset
		other := h0 // the copy that is not the tombstone
		if img[h0+12]&1 == 0 {
			other = h0 + sb.HeaderBytes
		}
		n := testGeo.GroupsPerBlock()
		h := &store.Header{Slot: 0, Block: 1, Gen: 1 << 40, Live: true,
			Present: []uint64{1}, CRC: make([]uint32, n), MTime: make([]int64, n)}
		b := make([]byte, sb.HeaderBytes)
		store.MarshalHeader(b, sb.UUID, h)
		m.Poke(other, b)
		err := s.CheckInvariants()
		if !errors.Is(err, store.ErrInvariant) || !strings.Contains(err.Error(), "slot 0: free, but the device's current header") {
			t.Fatalf("check: %v", err)
		}
		t.Log(err)
	})
	t.Run("closed", func(t *testing.T) {
		s, _ := brokenStore(t)
		s.Close()
		if err := s.CheckInvariants(); !errors.Is(err, store.ErrClosed) {
			t.Fatalf("check of a closed store: %v", err)
		}
	})
}

// TestInvariantsAfterRepairOfFreeSlot: fsck's repair writes both header
// copies of a free slot with one generation; the check must accept either
// copy as current then.
func TestInvariantsAfterRepairOfFreeSlot(t *testing.T) {
	s, m := newMemStore(t, 4, testGeo)
	put(t, s, keysOf(1, 0, 1), 1) // slot 0, header copy 0
	put(t, s, keysOf(1, 0), 2)    // copy-on-write to slot 1; slot 0's tombstone goes to copy 1
	sb := s.Superblock()
	off := sb.DataOffset + 70 // slot 0, copy 0: the old live header
	m.Poke(off, []byte{m.Image()[off] ^ 1})
	rep, err := s.Fsck(true)
	if err != nil || len(rep.Problems) != 1 || rep.Problems[0].Slot != 0 {
		t.Fatalf("fsck: %+v, %v", rep, err)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
