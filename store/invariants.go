package store

import (
	"fmt"
	"slices"
	"strings"
)

// CheckInvariants checks the store's in-memory state against itself and
// against the slot headers on the device, and returns an error wrapping
// ErrInvariant that lists what does not hold (nil when all does). It waits
// for the write in progress, if any, and holds writers off while it reads
// every slot's two header copies; readers go on meanwhile. It is meant for
// tests and debugging: the store's tests run it whenever a store is closed.
//
// What it checks (mu is held for the in-memory part, wmu for all of it):
//
//   - index ⇄ slot: every indexed slot holds a live, non-empty header of
//     that block and slot, whose tag, parent and completeness the index
//     records; every slot with a header in memory is indexed, or
//     quarantined (a read-only open's stale copy).
//   - the index's own invariants (index.Index.Check): its eviction lists
//     hold exactly the indexed blocks, in order, and its children counts
//     are what the parents imply.
//   - slots are partitioned: each one is indexed, free, releasing (freed
//     while pinned) or quarantined, exactly one of these (an indexed slot may
//     also be quarantined: it leaves use at its next release).
//   - free list: distinct slots in range, none with a header, pinned,
//     releasing or quarantined.
//   - pins ⇄ readers: no pin count is negative; a releasing slot is pinned;
//     with no Read in flight (and writers held off) nothing is pinned.
//   - counters: the generation counter is at or above every slot's
//     generation, in memory and on the device; reads and hits, and the byte
//     counters, agree (with no Read in flight).
//   - slot headers ⇄ device: the header copy memory calls current holds,
//     on the device, exactly the header memory has (or a tombstone, for a
//     slot without one). A header is only ever written over the other copy,
//     so this holds after failed writes too. A free or releasing slot's
//     current copy on the device is its tombstone, never a live header a
//     reopen would bring back. Quarantined slots that are not indexed have
//     unknown contents and are not read.
func (s *Store) CheckInvariants() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if err := s.checkOpen(); err != nil {
		return err
	}
	return s.checkInvariants(true)
}

// slotSnap is what the device check needs of one slot, copied under mu.
type slotSnap struct {
	hdr   *Header // headers in memory are replaced, never modified
	cur   int
	gen   uint64
	skip  bool // quarantined and not indexed: contents unknown
	freed bool // free or releasing: the device's current copy must be a tombstone
}

// checkInvariants is CheckInvariants with wmu held; disk false checks the
// in-memory state only (for a store whose device crashed under it).
func (s *Store) checkInvariants(disk bool) error {
	var p problems
	snaps, maxGen := s.checkMemory(&p)
	if disk && len(snaps) == int(s.sb.Slots) {
		s.checkDevice(&p, snaps, maxGen)
	}
	return p.err()
}

// problems collects invariant violations, keeping the first few.
type problems struct {
	list []string
	n    int
}

const maxProblems = 20

func (p *problems) addf(format string, args ...any) {
	p.n++
	if len(p.list) < maxProblems {
		p.list = append(p.list, fmt.Sprintf(format, args...))
	}
}

func (p *problems) err() error {
	if p.n == 0 {
		return nil
	}
	more := ""
	if p.n > len(p.list) {
		more = fmt.Sprintf("; and %d more", p.n-len(p.list))
	}
	return fmt.Errorf("%w: %s%s", ErrInvariant, strings.Join(p.list, "; "), more)
}

// checkMemory checks the in-memory relations and returns a snapshot of the
// slots for the device check, and the generation counter.
func (s *Store) checkMemory(p *problems) ([]slotSnap, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.sb.Slots
	if int64(len(s.mu.slots)) != n {
		p.addf("%d slot states for %d slots", len(s.mu.slots), n)
		return nil, s.mu.gen
	}
	indexed := make([]bool, n)
	if s.mu.idx.Slots() != n {
		p.addf("index covers %d slots of %d", s.mu.idx.Slots(), n)
		return nil, s.mu.gen
	}
	for _, bad := range s.mu.idx.Check() {
		p.addf("index: %s", bad)
	}
	for slot := range n {
		block, ok := s.mu.idx.Block(slot)
		if !ok {
			continue
		}
		if s2, _ := s.mu.idx.Slot(block); s2 != slot {
			p.addf("index: slot %d holds block %016x, indexed in slot %d", slot, block, s2)
		}
		indexed[slot] = true
		st := &s.mu.slots[slot]
		h := st.hdr
		switch {
		case h == nil:
			p.addf("index: block %016x in slot %d, which has no header", block, slot)
			continue
		case h.Block != block || h.Slot != slot:
			p.addf("index: block %016x in slot %d, whose header is block %016x of slot %d", block, slot, h.Block, h.Slot)
		case !h.Live || h.Count() == 0:
			p.addf("index: block %016x in slot %d, whose header is a tombstone or empty", block, slot)
		case s.mu.idx.Meta(slot) != h.Meta || s.mu.idx.Full(slot) != s.fullLocked(h):
			p.addf("index: block %016x in slot %d: meta %+v full %v, header says %+v full %v",
				block, slot, s.mu.idx.Meta(slot), s.mu.idx.Full(slot), h.Meta, s.fullLocked(h))
		}
		if h.Gen != st.gen {
			p.addf("slot %d: header generation %d, slot state says %d", slot, h.Gen, st.gen)
		}
		if st.cur != 0 && st.cur != 1 {
			p.addf("slot %d: indexed with no current header copy (%d)", slot, st.cur)
		}
		if st.releasing {
			p.addf("slot %d: indexed and releasing", slot)
		}
	}

	// Free list.
	free := make([]bool, n)
	for _, slot := range s.mu.free {
		if slot < 0 || slot >= n {
			p.addf("free list: slot %d of %d", slot, n)
			continue
		}
		if free[slot] {
			p.addf("free list: slot %d twice", slot)
		}
		free[slot] = true
		st := &s.mu.slots[slot]
		if st.hdr != nil || st.pins != 0 || st.releasing || st.quarantined {
			p.addf("free list: slot %d has header %v, %d pins, releasing %v, quarantined %v", slot, st.hdr != nil, st.pins, st.releasing, st.quarantined)
		}
	}

	// Every slot: its own fields, its one place, pins.
	snaps := make([]slotSnap, n)
	pinned := 0
	for slot := range n {
		st := &s.mu.slots[slot]
		if st.pins < 0 {
			p.addf("slot %d: %d pins", slot, st.pins)
		}
		if st.pins != 0 {
			pinned++
		}
		if st.cur < -1 || st.cur > 1 {
			p.addf("slot %d: current header copy %d", slot, st.cur)
		}
		if st.gen > s.mu.gen {
			p.addf("slot %d: generation %d above the counter %d", slot, st.gen, s.mu.gen)
		}
		if st.hdr != nil && !indexed[slot] && !st.quarantined {
			p.addf("slot %d: header of block %016x in memory, but not indexed", slot, st.hdr.Block)
		}
		if st.releasing && (st.hdr != nil || st.pins <= 0 || st.quarantined) {
			p.addf("slot %d: releasing with header %v, %d pins, quarantined %v", slot, st.hdr != nil, st.pins, st.quarantined)
		}
		places := 0
		for _, in := range []bool{indexed[slot], free[slot], st.releasing, st.quarantined && !indexed[slot]} {
			if in {
				places++
			}
		}
		if places != 1 {
			p.addf("slot %d: in %d of index, free list, releasing, quarantine (want exactly one)", slot, places)
		}
		snaps[slot] = slotSnap{hdr: st.hdr, cur: st.cur, gen: st.gen,
			skip: st.quarantined && !indexed[slot], freed: free[slot] || st.releasing}
	}
	if s.mu.readers < 0 {
		p.addf("%d readers", s.mu.readers)
	}
	if s.mu.readers == 0 {
		if pinned > 0 {
			p.addf("%d slots pinned with no reader or writer", pinned)
		}
		reads, hits := s.m.reads.Load(), s.m.hits.Load()
		gb := uint64(s.geo.GroupBytes())
		if reads != hits || s.m.bytesRead.Load() != reads*gb {
			p.addf("counters: %d reads, %d hits, %d bytes read of %d-byte groups", reads, hits, s.m.bytesRead.Load(), gb)
		}
	}
	if w, b := s.m.writes.Load(), s.m.bytesWritten.Load(); b != w*uint64(s.geo.GroupBytes()) {
		p.addf("counters: %d groups written, %d bytes", w, b)
	}
	return snaps, s.mu.gen
}

// checkDevice compares the snapshot with both header copies of every slot
// on the device. Called with wmu held and mu not held.
func (s *Store) checkDevice(p *problems, snaps []slotSnap, maxGen uint64) {
	for first := int64(0); first < s.sb.Slots; first += scanChunk {
		scans, err := s.scanHeaders(first, min(scanChunk, s.sb.Slots-first))
		if err != nil {
			p.addf("reading slot headers: %v", err)
			return
		}
		for i, sc := range scans {
			slot := first + int64(i)
			sn := snaps[slot]
			for c, h := range sc.hdr {
				if h != nil && h.Gen > maxGen {
					p.addf("slot %d: header copy %d has generation %d, above the counter %d", slot, c, h.Gen, maxGen)
				}
			}
			if sn.skip {
				continue
			}
			if sn.cur < 0 {
				if sn.hdr != nil || sc.cur >= 0 {
					p.addf("slot %d: no current header copy in memory, device has copy %d", slot, sc.cur)
				}
				continue
			}
			dh := sc.hdr[sn.cur]
			switch {
			case dh == nil:
				p.addf("slot %d: current header copy %d is not valid on the device: %v", slot, sn.cur, sc.err[sn.cur])
				continue
			case dh.Gen != sn.gen:
				p.addf("slot %d: current header copy %d has generation %d on the device, %d in memory", slot, sn.cur, dh.Gen, sn.gen)
			case sn.hdr != nil && !sameHeader(dh, sn.hdr):
				p.addf("slot %d: header of block %016x differs between memory and device (copy %d)", slot, sn.hdr.Block, sn.cur)
			case sn.hdr == nil && dh.Live && dh.Count() > 0:
				p.addf("slot %d: no header in memory, but copy %d on the device is live (block %016x)", slot, sn.cur, dh.Block)
			}
			// A free slot's tombstone must be what a reopen finds: the
			// device's newest copy (fsck's repair writes both copies with
			// one generation, so compare generations, not copy numbers).
			if sn.freed && sc.cur >= 0 && sc.hdr[sc.cur].Gen != sn.gen {
				p.addf("slot %d: free, but the device's current header is copy %d of generation %d (memory: copy %d of %d)",
					slot, sc.cur, sc.hdr[sc.cur].Gen, sn.cur, sn.gen)
			}
		}
	}
}

func sameHeader(a, b *Header) bool {
	return a.Slot == b.Slot && a.Block == b.Block && a.Gen == b.Gen && a.Live == b.Live && a.Meta == b.Meta &&
		slices.Equal(a.Present, b.Present) && slices.Equal(a.CRC, b.CRC) && slices.Equal(a.MTime, b.MTime)
}
