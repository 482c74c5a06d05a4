package tier

import (
	"errors"

	"github.com/kvfs/kvfs/store"
)

// GPU loads from the arena. With a GPU whose checker verifies loads on
// the device, the daemon registers the arena with CUDA (cuMemHostRegister,
// once, in the background) and a hit reaches GPU memory by DMA straight
// from its slot, with no staging copy (gpu.Cache, which the tier
// implements): Locate pins the slots of the blocks the tier holds as the
// store's current version and says where each group lies and the CRC32C
// it was verified against when it entered the tier; the GPU copies the
// groups and checks them where they landed (a copy that fails is never
// served: Corrupt drops the block and the groups are read again through
// the store); Changed then asks the store, after the copies, whether each
// block's generation is still the copy's, and the groups of a block that
// changed meanwhile (a write, delete or rename that completed during the
// copy) are read again too, so a load that ends after a write never hands
// out the version the write replaced; Unpin releases the slots. Groups
// Locate does not serve (ErrNotHeld) take the staged route through Read,
// which reads a miss into the tier as for any load.

// ErrNotHeld is Locate's answer for a request the tier does not serve
// from its memory: its block is not held (or is being filled, or its copy
// is stale), the request's tag is not the block's, the copy lacks the
// group, or the key is invalid. The caller reads it through Read, which
// answers it in the store's terms.
var ErrNotHeld = errors.New("tier: not held in DRAM")

// pinWords is how many elements of Locate's pins one pinned slot takes:
// the slot, its block, the store generation of its copy, and how many
// groups Locate located in it (Changed counts them as hits).
const pinWords = 4

// Arena is the tier's memory, one mapping of every slot (nil once
// closed): what a GPU registers to copy hits from (Locate's offsets are
// into it). The caller only reads it, and unregisters it before Close.
func (t *Tier) Arena() []byte {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return nil
	}
	return t.ar.b
}

// Locate finds where reqs' groups lie in the arena (Off, and CRC: the
// checksum each was verified against when it entered the tier) for every
// request whose block the tier holds as the store's current version, and
// pins those blocks' slots, appending their pins to pins: until Unpin, no
// eviction or other block reuses a pinned slot, so the bytes at Off stay
// the copy's. Requests it does not serve get ErrNotHeld. It takes the
// store's versions in one call (store.Versions, no I/O), one pin per run
// of requests for the same block. The error is for the call as a whole
// (store.ErrClosed); then nothing is pinned. The pins are opaque: pass
// them to Changed and Unpin.
func (t *Tier) Locate(reqs []store.LocateReq, pins []int64) ([]int64, error) {
	// Only Close takes life exclusively, and it waits for the slots
	// located before to be unpinned: a load that still holds some and
	// locates more must not queue behind it, but end (ErrClosed).
	if !t.life.TryRLock() {
		return pins, errClosed
	}
	defer t.life.RUnlock()
	if t.closed {
		return pins, errClosed
	}
	sc := t.getScratch()
	defer t.putScratch(sc)
	for i := range reqs {
		b := reqs[i].Key.Block
		if n := len(sc.blocks); n > 0 && sc.blocks[n-1] == b {
			continue
		}
		if _, ok := sc.where[b]; !ok {
			sc.where[b] = int32(len(sc.blocks))
			sc.blocks = append(sc.blocks, b)
		}
	}
	sc.vers = grow(sc.vers, len(sc.blocks))
	if err := t.st.Versions(sc.blocks, sc.vers); err != nil {
		return pins, err
	}
	first := len(pins)
	t.mu.Lock()
	last, have, slot := uint64(0), false, int64(-1)
	var v store.BlockVersion
	for i := range reqs {
		r := &reqs[i]
		r.Off, r.CRC, r.Err = 0, 0, ErrNotHeld
		if t.geo.CheckKey(r.Key) != nil {
			continue
		}
		if b := r.Key.Block; !have || b != last {
			last, have = b, true
			v = sc.vers[sc.where[b]]
			if slot = t.pinHitLocked(b, v); slot >= 0 {
				pins = append(pins, slot, int64(b), int64(v.Gen), 0)
			}
		}
		idx := t.geo.Index(r.Key)
		if slot < 0 || !store.TagMatches(r.Tag, v.Meta.Tag) || !t.has(slot, idx) {
			continue
		}
		r.Off = slot*t.sb + int64(idx)*t.stride
		r.CRC = t.crc[int(slot)*t.groups+idx]
		r.Err = nil
		pins[len(pins)-1]++
	}
	t.mu.Unlock()
	if n := (len(pins) - first) / pinWords; n > 0 {
		// Under life's read lock: Close, which waits for these, has not
		// started to.
		t.ar.located.Add(n)
	}
	return pins, nil
}

// pinHitLocked pins block b's slot when its copy is the store's version v
// (not being filled), touching it in the eviction order, and returns the
// slot; -1 when the tier holds no such copy (a stale one is dropped, as a
// read drops it). t.mu is held.
func (t *Tier) pinHitLocked(b uint64, v store.BlockVersion) int64 {
	slot, ok := t.mu.idx.Slot(b)
	if !ok {
		return -1
	}
	e := &t.mu.ent[slot]
	if !v.Stored || e.gen != v.Gen {
		t.m.invalidations.Add(1)
		t.releaseLocked(slot)
		return -1
	}
	if e.filling {
		return -1
	}
	e.pins++
	t.mu.idx.Touch(slot)
	return slot
}

// Changed appends to stale the blocks of pins (Locate's, not yet
// unpinned) whose copy is no longer the store's current version: the
// store's generation of the block now is not the one the copy was read
// under (a write, delete or rename committed since Locate). Called after
// the copies from the slots completed, it tells the caller which copies
// may hold a version the store replaced while they were in flight (the
// caller reads those again); the groups located in the others are counted
// as hits. One store call (store.Versions, no I/O); its error
// (store.ErrClosed) means none can be vouched for.
func (t *Tier) Changed(pins []int64, stale []uint64) ([]uint64, error) {
	n := len(pins) / pinWords
	if n == 0 {
		return stale, nil
	}
	sc := t.getScratch()
	defer t.putScratch(sc)
	for k := range n {
		sc.blocks = append(sc.blocks, uint64(pins[k*pinWords+1]))
	}
	sc.vers = grow(sc.vers, n)
	if err := t.st.Versions(sc.blocks, sc.vers); err != nil {
		return stale, err
	}
	var hits uint64
	for k, v := range sc.vers {
		if !v.Stored || v.Gen != uint64(pins[k*pinWords+2]) {
			stale = append(stale, sc.blocks[k])
			continue
		}
		hits += uint64(pins[k*pinWords+3])
	}
	t.m.hits.Add(hits)
	return stale, nil
}

// Unpin releases the slots Locate pinned: a slot dropped meanwhile (a
// write, a corrupt copy) is freed now.
func (t *Tier) Unpin(pins []int64) {
	n := len(pins) / pinWords
	if n == 0 {
		return
	}
	t.mu.Lock()
	for k := range n {
		t.unpinLocked(pins[k*pinWords])
	}
	t.mu.Unlock()
	t.ar.located.Add(-n)
}

// Corrupt reports that a group loaded from block b failed its checksum
// where it landed (the device checked it, after a copy from the arena or
// from staging that Read filled from the arena): the tier's copy, if it
// holds one, is counted (Metrics.Corrupt) and dropped, and the caller
// reads the group again through Read, which reads the block from the
// store. A block it does not hold was the store's own (Read handed the
// request to the store): nothing to drop.
func (t *Tier) Corrupt(b uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	slot, ok := t.mu.idx.Slot(b)
	if !ok || t.mu.ent[slot].filling {
		return
	}
	t.m.corrupt.Add(1)
	t.log.Warn("tier: a group copied from DRAM to a GPU failed its checksum; dropped, read from the store")
	t.dropBlockLocked(b)
}
