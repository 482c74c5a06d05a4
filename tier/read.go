package tier

import (
	"errors"
	"math"

	"github.com/kvfs/kvfs/store"
)

// How a read serves the requests of one block.
const (
	viaStore = iota // the store serves them (absent, being filled by another read, no slot free)
	viaHit          // the tier's copy is the store's current version
	viaFill         // read into the tier now, then landed from it
)

// plan is how one block of a Read is served.
type plan struct {
	how  uint8
	slot int64
	tag  store.Tag // the block's tag in the store's answer
	ok   bool      // viaFill: the fill succeeded
}

// scratch is the per-call working memory of Read, pooled.
type scratch struct {
	blocks []uint64
	where  map[uint64]int32
	vers   []store.BlockVersion
	plans  []plan
	of     []int32 // of[i]: the block of reqs[i], an index into blocks
	fills  []store.ReadReq
	del    []store.ReadReq
	delAt  []int
}

func (t *Tier) getScratch() *scratch {
	sc := t.scratch.Get().(*scratch)
	if sc.where == nil {
		sc.where = map[uint64]int32{}
	}
	return sc
}

func (t *Tier) putScratch(sc *scratch) {
	clear(sc.where)
	clear(sc.fills) // no references to callers' memory outlive the call
	clear(sc.del)
	sc.blocks, sc.vers, sc.plans, sc.of = sc.blocks[:0], sc.vers[:0], sc.plans[:0], sc.of[:0]
	sc.fills, sc.del, sc.delAt = sc.fills[:0], sc.del[:0], sc.delAt[:0]
	t.scratch.Put(sc)
}

// Read serves reqs as store.Read does (the same requests, outcomes and
// errors), from the tier's copy of a block where the store's version of it
// is the copy's, else from the store, keeping the blocks it read. See the
// package documentation for what a hit checks.
func (t *Tier) Read(reqs []store.ReadReq) error {
	t.life.RLock()
	defer t.life.RUnlock()
	if t.closed {
		return errClosed
	}
	sc := t.getScratch()
	defer t.putScratch(sc)
	for i := range reqs {
		b := reqs[i].Key.Block
		j, ok := int32(len(sc.blocks)-1), len(sc.blocks) > 0 && sc.blocks[len(sc.blocks)-1] == b
		if !ok {
			if j, ok = sc.where[b]; !ok {
				j = int32(len(sc.blocks))
				sc.where[b] = j
				sc.blocks = append(sc.blocks, b)
			}
		}
		sc.of = append(sc.of, j)
	}
	sc.vers = grow(sc.vers, len(sc.blocks))
	if err := t.st.Versions(sc.blocks, sc.vers); err != nil {
		return err
	}
	t.planLocked(sc)
	// The pins the plan took drop however the call ends: landing in a
	// client's memory may fault, and the fault may panic through Read
	// (see store.Read).
	defer t.unpinPlans(sc.plans)
	if err := t.fill(sc); err != nil {
		return err
	}
	var hits, misses uint64
	for i := range reqs {
		r := &reqs[i]
		p := &sc.plans[sc.of[i]]
		n := uint64(max(1, r.Heads))
		served := (p.how == viaHit || p.how == viaFill && p.ok) &&
			store.TagMatches(r.Tag, p.tag) && t.land(r, p.slot)
		switch {
		case !served:
			sc.del = append(sc.del, *r)
			sc.delAt = append(sc.delAt, i)
			misses += n
		case p.how == viaHit:
			hits += n
		default:
			misses += n
		}
	}
	t.m.hits.Add(hits)
	t.m.misses.Add(misses)
	if len(sc.del) == 0 {
		return nil
	}
	err := t.st.Read(sc.del)
	for k, i := range sc.delAt {
		reqs[i] = sc.del[k]
	}
	return err
}

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// planLocked decides how each block of the call is served, under t.mu:
// a copy of the store's current generation is a hit (pinned and touched);
// a stale copy is dropped; a block the store holds and the tier does not
// gets a slot (pinned, filling) unless another read is filling it or every
// slot is pinned.
func (t *Tier) planLocked(sc *scratch) {
	sc.plans = grow(sc.plans, len(sc.blocks))
	t.mu.Lock()
	defer t.mu.Unlock()
	for j, b := range sc.blocks {
		v := sc.vers[j]
		p := &sc.plans[j]
		*p = plan{how: viaStore, slot: -1, tag: v.Meta.Tag}
		if slot, ok := t.mu.idx.Slot(b); ok {
			e := &t.mu.ent[slot]
			if genCheck.hit(e.gen, v) {
				if !e.filling {
					e.pins++
					t.mu.idx.Touch(slot)
					p.how, p.slot = viaHit, slot
				}
				continue
			}
			t.m.invalidations.Add(1)
			t.releaseLocked(slot)
		}
		if !v.Stored {
			continue
		}
		slot := t.allocLocked()
		if slot < 0 {
			continue
		}
		t.mu.ent[slot] = entry{gen: v.Gen, pins: 1, filling: true}
		t.mu.idx.Insert(slot, b, v.Meta, true)
		p.how, p.slot = viaFill, slot
	}
}

// unpinPlans drops the pins planLocked took.
func (t *Tier) unpinPlans(plans []plan) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for j := range plans {
		if plans[j].how != viaStore {
			t.unpinLocked(plans[j].slot)
		}
	}
}

// fill reads every group of the blocks planned viaFill from the store into
// their slots, in one store read, and verifies each against the checksum
// the store's header records before the copy is served to anyone: a block
// with a group that failed (corrupt, an I/O error) is not kept, and its
// requests go to the store, which reports the failure. A group the block
// lacks is absent from the copy too. The copy is labelled with the
// generation planLocked saw, taken before this read: if a write committed
// in between, the copy may hold the newer bytes under the older label,
// which no later hit matches (the store's generation moved on), so a copy
// never passes for a version newer than its bytes.
func (t *Tier) fill(sc *scratch) error {
	first := len(sc.fills)
	for j := range sc.plans {
		p := &sc.plans[j]
		if p.how != viaFill {
			continue
		}
		b := sc.blocks[j]
		for idx := range t.groups {
			sc.fills = append(sc.fills, store.ReadReq{Key: t.geo.KeyAt(b, idx), Buf: t.fillGroup(p.slot, idx), Unverified: true})
		}
	}
	if len(sc.fills) == first {
		return nil
	}
	err := t.st.Read(sc.fills)
	k := 0
	var promoted uint64
	for j := range sc.plans {
		p := &sc.plans[j]
		if p.how != viaFill {
			continue
		}
		p.ok = err == nil
		bits := t.present[int(p.slot)*t.words : int(p.slot+1)*t.words]
		clear(bits)
		crcs := t.crc[int(p.slot)*t.groups : int(p.slot+1)*t.groups]
		n := 0
		for idx := range t.groups {
			r := &sc.fills[k]
			k++
			switch {
			case !p.ok:
			case r.Err == nil && store.CRC32C(r.Buf) == r.CRC:
				bits[idx/64] |= 1 << (idx % 64)
				crcs[idx] = r.CRC
				n++
			case r.Err != nil && errors.Is(r.Err, store.ErrNotFound):
			default:
				p.ok = false
			}
		}
		if p.ok {
			promoted += uint64(n * t.gb)
		}
	}
	t.m.promoted.Add(promoted)
	t.publish(sc.plans)
	return err
}

// publish makes the blocks filled servable, and drops the ones whose fill
// failed. A block dropped meanwhile (a write) stays dropped: the read that
// filled it still lands from it, as a read that overlapped the write.
func (t *Tier) publish(plans []plan) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for j := range plans {
		p := &plans[j]
		if p.how != viaFill {
			continue
		}
		e := &t.mu.ent[p.slot]
		e.filling = false
		if !p.ok && !e.dead {
			t.releaseLocked(p.slot)
		}
	}
}

// land lands r from slot, as store.Read would land it from the store:
// every head of r the copy holds is copied to its destination and, unless
// r is Unverified, checked against the CRC32C it was verified against when
// it entered the tier; a head the copy lacks fails with ErrNotFound (the
// copy is the store's current version, so the store lacks it too). It
// returns false, having landed nothing, when the store must serve r
// instead: a request the tier does not check the shape of in the store's
// terms (an invalid one: the store says why), or a copy that failed its
// checksum (counted, the block dropped; its destinations are zeroed, and
// the store's read then lands or fails them).
func (t *Tier) land(r *store.ReadReq, slot int64) bool {
	rows, span, ok := t.shape(r)
	if !ok {
		return false
	}
	heads := max(1, r.Heads)
	failed, bad := 0, uint64(0)
	for j := range heads {
		k := r.Key
		k.Head += j
		idx := t.geo.Index(k)
		if !t.has(slot, idx) {
			failed++
			if j < store.MaxBadHeads {
				bad |= 1 << j
			}
			continue
		}
		dst := r.Buf[j*r.HeadStride : j*r.HeadStride+span]
		var sum uint32
		if r.Unverified {
			copyGroup(dst, t.group(slot, idx), rows, r.RowBytes, r.Pitch)
		} else {
			// One pass where the machine allows: the copy's read of the
			// arena also checksums it (store.CopyGroup).
			sum = t.st.CopyGroup(dst, t.group(slot, idx), rows, r.RowBytes, r.Pitch)
		}
		want := t.crc[int(slot)*t.groups+idx]
		switch {
		case r.Unverified && r.Heads <= 1:
			r.CRC = want
		case r.Unverified:
			r.CRCs[j] = want
		case sum != want:
			t.corrupt(r, slot, j, rows, span)
			return false
		}
	}
	r.Err, r.Failed, r.Bad = nil, failed, bad
	if failed > 0 {
		r.Err = store.ErrNotFound
	}
	return true
}

// corrupt handles a copy of r's head j in slot that failed its checksum:
// the destinations of heads 0..j are zeroed and the block dropped.
func (t *Tier) corrupt(r *store.ReadReq, slot int64, j, rows, span int) {
	t.m.corrupt.Add(1)
	t.log.Warn("tier: a group's copy in DRAM failed its checksum; dropped, read from the store")
	for h := 0; h <= j; h++ {
		zeroGroup(r.Buf[h*r.HeadStride:h*r.HeadStride+span], rows, r.RowBytes, r.Pitch)
	}
	t.mu.Lock()
	if b, ok := t.mu.idx.Block(slot); ok && !t.mu.ent[slot].dead {
		t.dropBlockLocked(b)
	}
	t.mu.Unlock()
}

// shape checks r's key and destination as the store does (store.ReadReq)
// and returns the rows of a pitched destination (0: contiguous) and the
// span of one head's destination; ok is false for a request the store
// would refuse.
func (t *Tier) shape(r *store.ReadReq) (rows, span int, ok bool) {
	if t.geo.CheckKey(r.Key) != nil {
		return 0, 0, false
	}
	gb := t.gb
	span = gb
	if r.Pitch != 0 && (r.Pitch != r.RowBytes || r.Pitch <= 0) {
		if r.RowBytes <= 0 || r.RowBytes > gb || gb%r.RowBytes != 0 || r.Pitch < r.RowBytes {
			return 0, 0, false
		}
		rows = gb / r.RowBytes
		if rows > 1 && r.Pitch > (math.MaxInt-r.RowBytes)/(rows-1) {
			return 0, 0, false
		}
		span = (rows-1)*r.Pitch + r.RowBytes
	}
	if r.Heads <= 1 {
		return rows, span, len(r.Buf) == span
	}
	last := r.Key
	last.Head += r.Heads - 1
	switch {
	case r.HeadStride <= 0 || last.Head < r.Key.Head || t.geo.CheckKey(last) != nil:
		return 0, 0, false
	case r.Unverified && (r.Heads > store.MaxBadHeads || len(r.CRCs) != r.Heads):
		return 0, 0, false
	case r.HeadStride > (math.MaxInt-span)/(r.Heads-1):
		return 0, 0, false
	}
	return rows, span, len(r.Buf) == (r.Heads-1)*r.HeadStride+span
}

// copyGroup copies one group from src (contiguous, as stored) to dst,
// contiguous (rows 0) or rows rowBytes long pitch apart, unchecked (a copy
// that is checked goes through store.CopyGroup).
func copyGroup(dst, src []byte, rows, rowBytes, pitch int) {
	if rows == 0 {
		copy(dst, src)
		return
	}
	for i := range rows {
		copy(dst[i*pitch:i*pitch+rowBytes], src[i*rowBytes:(i+1)*rowBytes])
	}
}

// zeroGroup zeroes one group's destination, contiguous or pitched rows.
func zeroGroup(dst []byte, rows, rowBytes, pitch int) {
	if rows == 0 {
		clear(dst)
		return
	}
	for i := range rows {
		clear(dst[i*pitch : i*pitch+rowBytes])
	}
}
