package tier

import (
	"runtime"

	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/store"
)

// wblock is one block of a Write.
type wblock struct {
	block uint64
	n     int   // requests naming it
	whole bool  // every group named once, by well-formed requests
	slot  int64 // the reserved slot its written version is copied into; -1: none
	// gen is the generation the store gave every request of the block
	// (store.WriteReq.Gen); 0 when one has none or they differ.
	gen    uint64
	genSet bool
}

// wscratch is the per-call working memory of Write, pooled.
type wscratch struct {
	where  map[uint64]int32
	blocks []wblock
	of     []int32  // of[i]: the block of reqs[i], an index into blocks
	seen   []uint64 // per block, a bitmap of the groups its requests name
	wr     []store.WriteReq
	crcs   []uint32 // CRC32C of each request's copy in the tier
	ids    []uint64
	vers   []store.BlockVersion
}

// writeSumWindow is how many bytes of groups one goroutine copies into the
// tier at a time in Write (store.Write spreads its checksums the same
// way).
const writeSumWindow = 4 << 20

// genCheck holds the tier's two generation checks (see the package
// documentation, "Versions"): hit says whether a copy labelled label is
// the store's current version v of its block; written is the label of the
// copy of a whole block a Write kept, given the generation the store gave
// each of its requests (gen, 0 where they differ or one has none) and the
// block's version once the write returned; 0 keeps no copy. They are
// variables only so that the model test can break each on purpose and see
// the model catch it.
var genCheck = struct {
	hit     func(label uint64, v store.BlockVersion) bool
	written func(gen uint64, v store.BlockVersion) uint64
}{
	hit: func(label uint64, v store.BlockVersion) bool { return v.Stored && label == v.Gen },
	written: func(gen uint64, v store.BlockVersion) uint64 {
		if gen != 0 && v.Stored && v.Gen == gen {
			return gen
		}
		return 0
	},
}

func (t *Tier) getWScratch() *wscratch {
	sc, _ := t.wscratch.Get().(*wscratch)
	if sc == nil {
		sc = &wscratch{where: map[uint64]int32{}}
	}
	return sc
}

func (t *Tier) putWScratch(sc *wscratch) {
	clear(sc.where)
	clear(sc.wr) // no references to callers' memory outlive the call
	sc.blocks, sc.of, sc.seen, sc.wr, sc.crcs = sc.blocks[:0], sc.of[:0], sc.seen[:0], sc.wr[:0], sc.crcs[:0]
	sc.ids, sc.vers = sc.ids[:0], sc.vers[:0]
	t.wscratch.Put(sc)
}

// Write writes reqs through to the store: it returns when the store has
// them durably, with the store's outcomes and error, as store.Write does.
// A whole block the call writes (every group, once) is copied into a slot
// of the tier first and written to the store from there; once the store
// acknowledged it, the copy is kept under the generation the store gave
// the write, when that is still the block's (see the package
// documentation, "Writes"). The tier's copies of the other blocks written
// are dropped.
func (t *Tier) Write(reqs []store.WriteReq) error {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return t.st.Write(reqs)
	}
	sc := t.getWScratch()
	defer t.putWScratch(sc)
	t.groupWrites(reqs, sc)
	t.reserve(sc)
	// The reserved slots are settled however the call ends.
	settled := false
	defer func() {
		if !settled {
			t.settle(sc)
		}
	}()
	t.stageWrites(reqs, sc)
	err := t.st.Write(sc.wr)
	for i := range reqs {
		reqs[i].Err, reqs[i].Gen = sc.wr[i].Err, sc.wr[i].Gen
	}
	settled = true
	t.settle(sc)
	return err
}

// groupWrites sorts reqs by block into sc.blocks and finds the whole ones.
func (t *Tier) groupWrites(reqs []store.WriteReq, sc *wscratch) {
	for i := range reqs {
		r := &reqs[i]
		j, ok := sc.where[r.Key.Block]
		if !ok {
			j = int32(len(sc.blocks))
			sc.where[r.Key.Block] = j
			sc.blocks = append(sc.blocks, wblock{block: r.Key.Block, whole: true, slot: -1})
			for range t.words {
				sc.seen = append(sc.seen, 0)
			}
		}
		sc.of = append(sc.of, j)
		wb := &sc.blocks[j]
		wb.n++
		if !wb.whole {
			continue
		}
		if t.geo.CheckKey(r.Key) != nil || len(r.Data) != t.gb {
			wb.whole = false
			continue
		}
		idx := t.geo.Index(r.Key)
		w := &sc.seen[int(j)*t.words+idx/64]
		if *w&(1<<(idx%64)) != 0 {
			wb.whole = false // a group named twice: the store keeps the last
			continue
		}
		*w |= 1 << (idx % 64)
	}
	for j := range sc.blocks {
		if sc.blocks[j].n != t.groups {
			sc.blocks[j].whole = false
		}
	}
}

// reserve takes a slot for each whole block, outside the index (no read
// finds it) and pinned (no eviction takes it), up to half the tier per
// call, so that a store larger than the tier neither pins all of it while
// it is written nor keeps blocks only to evict them before the call ends.
func (t *Tier) reserve(sc *wscratch) {
	budget := max(1, t.slots/2)
	t.mu.Lock()
	defer t.mu.Unlock()
	for j := range sc.blocks {
		wb := &sc.blocks[j]
		if !wb.whole || budget == 0 {
			continue
		}
		slot := t.allocLocked()
		if slot < 0 {
			return
		}
		t.mu.ent[slot] = entry{pins: 1, filling: true}
		wb.slot = slot
		budget--
	}
}

// stageWrites builds sc.wr, the requests given to the store: reqs, except
// that the groups of each block with a reserved slot are first copied
// there, their CRC32C computed as they are copied (from the core's cache),
// and written to the store from the copy with that checksum, so that the
// store holds exactly the bytes the tier does, with the checksum they
// were verified against. A request that came with its checksum (Summed)
// must match it: a block with one that does not keeps no copy and is
// written from the caller's bytes as given, so that the store sees the
// mismatch as it would without the tier.
func (t *Tier) stageWrites(reqs []store.WriteReq, sc *wscratch) {
	sc.wr = append(sc.wr[:0], reqs...)
	sc.crcs = grow(sc.crcs, len(reqs))
	kept := false
	for j := range sc.blocks {
		kept = kept || sc.blocks[j].slot >= 0
	}
	if !kept {
		return
	}
	par.Pieces(len(reqs), max(1, writeSumWindow/t.gb), runtime.GOMAXPROCS(0), func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if slot := sc.blocks[sc.of[i]].slot; slot >= 0 {
				sc.crcs[i] = t.st.CopyGroup(t.group(slot, t.geo.Index(reqs[i].Key)), reqs[i].Data, 0, 0, 0)
			}
		}
	})
	for i := range reqs {
		if r := &reqs[i]; r.Summed && r.CRC != sc.crcs[i] && sc.blocks[sc.of[i]].slot >= 0 {
			t.freeReserved(&sc.blocks[sc.of[i]])
		}
	}
	for i := range sc.wr {
		slot := sc.blocks[sc.of[i]].slot
		if slot < 0 {
			continue
		}
		idx := t.geo.Index(reqs[i].Key)
		off := slot*t.sb + int64(idx)*t.stride
		// Capacity to the slot's end: a block's groups adjacent in the
		// slot are written to the device straight from it (store.WriteReq).
		w := &sc.wr[i]
		w.Data = t.ar.b[off : off+int64(t.gb) : (slot+1)*t.sb]
		w.CRC, w.Summed = sc.crcs[i], true
		t.crc[int(slot)*t.groups+idx] = sc.crcs[i]
	}
}

// freeReserved gives back wb's reserved slot.
func (t *Tier) freeReserved(wb *wblock) {
	t.mu.Lock()
	t.freeReservedLocked(wb.slot)
	t.mu.Unlock()
	wb.slot = -1
}

// freeReservedLocked gives back a slot reserve took. t.mu is held.
func (t *Tier) freeReservedLocked(slot int64) {
	t.mu.ent[slot] = entry{}
	t.mu.free = append(t.mu.free, slot)
}

// settle ends a Write in the tier: each block with a reserved slot whose
// requests the store made durable under one generation that is still the
// block's (genCheck.written; asked of the store in one call, no I/O) is
// kept under that generation in place of any older copy; every other
// block's copy is dropped, and its reserved slot given back.
func (t *Tier) settle(sc *wscratch) {
	for j := range sc.blocks {
		if sc.blocks[j].slot >= 0 {
			sc.ids = append(sc.ids, sc.blocks[j].block)
		}
	}
	for i := range sc.wr {
		wb := &sc.blocks[sc.of[i]]
		switch w := &sc.wr[i]; {
		case wb.slot < 0:
		case w.Err != nil || w.Gen == 0 || wb.genSet && w.Gen != wb.gen:
			wb.gen, wb.genSet = 0, true
		case !wb.genSet:
			wb.gen, wb.genSet = w.Gen, true
		}
	}
	sc.vers = grow(sc.vers, len(sc.ids))
	if len(sc.ids) > 0 && t.st.Versions(sc.ids, sc.vers) != nil {
		clear(sc.vers) // a closed store: keep nothing
	}
	var written uint64
	t.mu.Lock()
	defer t.mu.Unlock()
	k := 0
	for j := range sc.blocks {
		wb := &sc.blocks[j]
		if wb.slot < 0 {
			t.dropBlockLocked(wb.block)
			continue
		}
		v := sc.vers[k]
		k++
		label := genCheck.written(wb.gen, v)
		if label == 0 {
			t.freeReservedLocked(wb.slot)
			t.dropBlockLocked(wb.block)
			continue
		}
		if old, ok := t.mu.idx.Slot(wb.block); ok {
			if e := &t.mu.ent[old]; e.gen == label && !e.filling {
				// A read already brought this version in.
				t.freeReservedLocked(wb.slot)
				t.mu.idx.Touch(old)
				continue
			}
			t.m.invalidations.Add(1)
			t.releaseLocked(old)
		}
		bits := t.present[int(wb.slot)*t.words : int(wb.slot+1)*t.words]
		clear(bits)
		for idx := range t.groups {
			bits[idx/64] |= 1 << (idx % 64)
		}
		t.mu.ent[wb.slot] = entry{gen: label}
		t.mu.idx.Insert(wb.slot, wb.block, v.Meta, true)
		written += uint64(t.groups * t.gb)
	}
	t.m.written.Add(written)
}
