package store

import (
	"fmt"
	"sync"
)

// The store's tests check every store's invariants when it is closed (see
// openStore in store_test.go, which also closes the stores a test leaves
// open): closeHook runs CheckInvariants' check, while the engine is still
// open, and keeps the outcome for CheckedAtClose.
var (
	memoryOnly  sync.Map // *Store → struct{}: its device crashed under it
	closeChecks sync.Map // *Store → error (nil: checked, all held)
)

func init() {
	closeHook = func(s *Store) {
		_, memOnly := memoryOnly.Load(s)
		closeChecks.Store(s, s.checkInvariants(!memOnly))
	}
}

// CheckMemoryOnly limits the check at Close to the in-memory state, for a
// store whose device crashed (and answers nothing) under it.
func CheckMemoryOnly(s *Store) { memoryOnly.Store(s, struct{}{}) }

// CheckedAtClose reports whether the invariants check ran when s was closed,
// and what it found.
func CheckedAtClose(s *Store) (ran bool, err error) {
	v, ok := closeChecks.Load(s)
	if !ok {
		return false, nil
	}
	err, _ = v.(error)
	return true, err
}

// HeaderUsed is the bytes a slot header of version v for n groups uses (the
// rest of its copy is zero padding).
func HeaderUsed(n int, v uint32) int { return int(hdrUsed(n, v)) - 4 }

// Corruptions lists what Corrupt can break.
var Corruptions = []string{
	"index-drop", "index-wrong-slot", "index-meta", "index-full", "free-twice", "free-leak",
	"free-indexed", "pin", "reader", "gen", "header", "hits", "releasing",
}

// Corrupt breaks one relation of s's in-memory state on purpose, for the
// test that shows CheckInvariants catches it. s must hold at least two
// blocks and one free slot.
func Corrupt(s *Store, what string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []uint64
	s.mu.idx.Each(func(_ int64, id uint64) bool {
		ids = append(ids, id)
		return true
	})
	if len(ids) < 2 || len(s.mu.free) == 0 {
		return fmt.Errorf("corrupt: need two blocks and a free slot, have %d and %d", len(ids), len(s.mu.free))
	}
	id := ids[0]
	slot, _ := s.mu.idx.Slot(id)
	st := &s.mu.slots[slot]
	switch what {
	case "index-drop": // a block the index forgets, still in its slot
		s.mu.idx.Remove(slot)
	case "index-wrong-slot": // the index sends a block to another block's slot
		other, _ := s.mu.idx.Slot(ids[1])
		s.mu.idx.Remove(slot)
		s.mu.idx.Remove(other)
		s.mu.idx.Insert(other, id, st.hdr.Meta, false)
	case "index-meta": // the index's tag no longer the header's
		m := st.hdr.Meta
		m.Tag[0] ^= 1
		s.mu.idx.Update(slot, m, s.mu.idx.Full(slot))
	case "index-full": // the index's completeness no longer the header's
		s.mu.idx.SetFull(slot, !s.mu.idx.Full(slot))
	case "free-twice":
		s.mu.free = append(s.mu.free, s.mu.free[0])
	case "free-leak": // a slot in no place at all
		s.mu.free = s.mu.free[1:]
	case "free-indexed": // a slot both in use and free
		s.mu.free = append(s.mu.free, slot)
	case "pin": // a pin no reader or writer holds
		st.pins++
	case "reader": // a reader that never unpins
		s.mu.readers--
	case "gen": // the counter behind the generations it handed out
		s.mu.gen = st.gen - 1
	case "header": // memory's header no longer the device's
		h := st.hdr.clone()
		for i := range h.CRC {
			h.CRC[i] ^= 1
		}
		st.hdr = h
	case "hits":
		s.m.hits.Add(1)
	case "releasing": // a free slot marked as freed while pinned
		s.mu.slots[s.mu.free[0]].releasing = true
	default:
		return fmt.Errorf("corrupt: unknown %q", what)
	}
	return nil
}

var commitHooks sync.Map // *Store → func(calls int)

func init() {
	commitHook = func(s *Store, calls int) {
		if f, ok := commitHooks.Load(s); ok {
			f.(func(int))(calls)
		}
	}
}

// OnCommit makes f run at the start of each of s's write commits (with the
// writer lock held), told how many Write calls the commit serves.
func OnCommit(s *Store, f func(calls int)) { commitHooks.Store(s, f) }

// PendingWrites is the number of Write calls queued for the next commit.
func PendingWrites(s *Store) int {
	s.wq.Lock()
	defer s.wq.Unlock()
	return len(s.wq.pending)
}
