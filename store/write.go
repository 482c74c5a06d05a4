package store

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/layout"
)

// WriteReq stores one group. Data must be exactly GroupBytes long and must
// not change until Write returns (its checksum is computed first; a run of
// groups whose Data are adjacent slices of one aligned buffer, the first
// one's capacity spanning the run, is written straight from it).
type WriteReq struct {
	Key  layout.Key
	Data []byte
	// CRC, when Summed, is the CRC32C of Data as the caller computed it
	// (the GPU pipeline's kernel, over the staged bytes, so that no CPU
	// reads the payload); the store records it instead of computing it.
	// Only the daemon's own code sets it: a wrong one is caught as
	// corruption by every later read, never served.
	CRC    uint32
	Summed bool
	// Meta, when set, is the block's tag and parent, recorded in its
	// header. A block whose stored tag differs is replaced: none of its
	// groups is kept (they stand for another prefix). Nil keeps an
	// existing block's tag and parent, and gives a new block the zero tag
	// and no parent. The requests of one block in one Write that set Meta
	// must agree (those without take it); otherwise every request of that
	// block fails with ErrInvalid. A parent equal to the block itself is
	// no parent. A format version 1 store records neither: a nonzero Meta
	// fails there with ErrVersion. Write may point Meta at a normalised
	// copy.
	Meta *BlockMeta
	// Err is set by Write: nil once the group is durable.
	Err error
	// Gen is set by Write: the generation (BlockVersion.Gen) of the
	// block's header that this Write committed with this request's Data
	// in it; 0 when the group is not durable, or when a request of
	// another call committed with it replaced Data (naming the same group,
	// or the block under another tag). A cache of the store's blocks
	// labels a copy of Data with it (package tier).
	Gen uint64
}

// plan is the work of one Write batch on one block.
type plan struct {
	block  uint64
	reqs   []*WriteReq
	groups groupSet   // the groups written (the last request wins)
	crcs   []uint32   // group index → CRC32C of its data, where groups has it
	base   *Header    // header the new one starts from (nil: new block)
	meta   *BlockMeta // the block's new tag and parent; nil keeps the stored ones
	tag    Tag        // the tag the plan's groups are written under, once tagKnown
	// tagKnown: tag is set (by the first request with Meta, or looked up
	// when one follows groups queued without).
	tagKnown bool
	old      int64   // slot being replaced (copy-on-write), -1 when none
	target   int64   // slot receiving the payloads and the new header
	fresh    bool    // target came from the free list
	hdr      *Header // header to commit
	copy     int     // header copy to write
	err      error
	carry    groupSet // groups copied from the old slot (copy-on-write)
}

// groupSet is a block's groups by index, each group's bytes or nil: a
// slice as long as the block's groups, walked in index order (the order
// of the slot's payload runs), with no hashing or sorting on the way.
type groupSet struct {
	data [][]byte
	n    int // groups present
}

func newGroupSet(groups int) groupSet { return groupSet{data: make([][]byte, groups)} }

func (g *groupSet) put(idx int, d []byte) {
	if g.data[idx] == nil {
		g.n++
	}
	g.data[idx] = d
}

func (g *groupSet) has(idx int) bool { return g.data != nil && g.data[idx] != nil }

func (g *groupSet) reset() {
	clear(g.data)
	g.n = 0
}

func (p *plan) fail(err error) {
	if p.err == nil {
		p.err = err
	}
}

// writeCall is one Write call waiting for a committer (group commit).
// done and err are written by the committer with wmu held and read by the
// caller after it takes wmu.
type writeCall struct {
	reqs []WriteReq
	crcs []uint32 // per request; valid where the request's Err is nil
	done bool
	err  error
}

// Write stores a batch of groups durably. Crash safety, per block:
//
//   - A block's new groups go into positions its current header marks
//     absent, or (when they replace present groups, or readers are using the
//     slot) into a fresh slot together with the block's other groups
//     (copy-on-write).
//   - Payloads are written and synced before the header; the header goes to
//     the slot's other header copy with a higher generation and is synced
//     before Write returns. A slot taken from an evicted block is tombstoned
//     and synced before its payloads are overwritten.
//
// After a crash at any point every group reads as its old value, its new
// value, or absent. The returned error is for the batch as a whole; each
// request's Err says whether that group is durable.
//
// Group commit: checksums are computed by the caller's goroutine before it
// queues its call; the first caller to take wmu commits every call queued
// by then as one batch (one payload sync, one header sync for all), and
// the callers it served find their calls done when they get wmu. Calls
// naming the same group in one commit: the one queued last wins.
func (s *Store) Write(reqs []WriteReq) error {
	start := time.Now()
	if err := s.checkOpen(); err != nil {
		return err
	}
	crcs := make([]uint32, len(reqs))
	valid, toSum := 0, 0
	for i := range reqs {
		r := &reqs[i]
		r.Gen = 0
		if r.Err = s.checkRequest(r.Key, len(r.Data)); r.Err != nil {
			continue
		}
		if r.Summed {
			crcs[i] = r.CRC
		} else {
			toSum++
		}
		valid++
	}
	// The checksums of a large batch are spread over the cores, in pieces
	// of sumWindow bytes (a fault on client memory is raised here).
	if toSum > 0 {
		per := max(1, sumWindow/s.geo.GroupBytes())
		par.Pieces(len(reqs), per, runtime.GOMAXPROCS(0), func(lo, hi int) {
			for i := lo; i < hi; i++ {
				if r := &reqs[i]; r.Err == nil && !r.Summed {
					crcs[i] = CRC32C(r.Data)
				}
			}
		})
	}
	if valid > 0 {
		valid -= s.checkMeta(reqs)
	}
	if valid == 0 {
		return nil
	}
	c := &writeCall{reqs: reqs, crcs: crcs}
	s.wq.Lock()
	s.wq.pending = append(s.wq.pending, c)
	s.wq.Unlock()
	s.wmu.Lock()
	if !c.done {
		s.wq.Lock()
		calls := s.wq.pending
		s.wq.pending = nil
		s.wq.Unlock()
		s.commit(calls)
	}
	s.wmu.Unlock()
	if s.opts.Observe != nil {
		s.opts.Observe(OpWrite, len(reqs), time.Since(start))
	}
	return c.err
}

// minWritePiece is the fewest I/Os of a write phase one goroutine submits
// when the phase is split over the cores.
const minWritePiece = 4

// sumWindow is how many bytes of groups one goroutine checksums at a time
// in Write.
const sumWindow = 4 << 20

// commitHook, when set (by the store's tests), runs as a commit starts,
// with wmu held, and is told how many calls it commits.
var commitHook func(s *Store, calls int)

// commit writes the queued calls as one batch. Called with wmu held.
func (s *Store) commit(calls []*writeCall) {
	if commitHook != nil {
		commitHook(s, len(calls))
	}
	var err error
	defer func() {
		for _, c := range calls {
			c.err, c.done = err, true
		}
	}()
	if err = s.checkOpen(); err != nil {
		return
	}
	gb := s.geo.GroupBytes()
	byBlock := map[uint64]*plan{}
	var plans []*plan
	for _, c := range calls {
		for i := range c.reqs {
			r := &c.reqs[i]
			if r.Err != nil {
				continue
			}
			p := byBlock[r.Key.Block]
			if p == nil {
				g := s.geo.GroupsPerBlock()
				p = &plan{block: r.Key.Block, groups: newGroupSet(g), crcs: make([]uint32, g), old: -1, target: -1}
				byBlock[r.Key.Block] = p
				plans = append(plans, p)
			}
			if m := r.Meta; m != nil {
				if !p.tagKnown {
					// Groups queued before under no meta go under the
					// stored tag; with none queued there is nothing to
					// replace.
					p.tag, p.tagKnown = m.Tag, true
					if p.groups.n > 0 {
						p.tag = s.storedTag(p.block)
					}
				}
				if m.Tag != p.tag {
					// A call queued later replaces the block: the
					// groups queued before it under the old tag go.
					p.groups.reset()
					p.tag = m.Tag
				}
				mc := *m
				p.meta = &mc
			}
			idx := s.geo.Index(r.Key)
			p.reqs = append(p.reqs, r)
			p.groups.put(idx, r.Data)
			p.crcs[idx] = c.crcs[i]
		}
	}
	err = s.writePlans(plans)
	var n uint64
	for _, p := range plans {
		for _, r := range p.reqs {
			r.Err = p.err
			if p.err == nil {
				n++
				if d := p.groups.data[s.geo.Index(r.Key)]; len(d) > 0 && &d[0] == &r.Data[0] {
					r.Gen = p.hdr.Gen
				}
			}
		}
	}
	s.m.writes.Add(n)
	s.m.bytesWritten.Add(n * uint64(gb))
	s.m.commits.Add(1)
}

// writePlans runs the write protocol, step by step. Called with wmu held.
func (s *Store) writePlans(plans []*plan) error {
	// 1. Decide, per block, where its groups go; take slots, evicting the
	// least recently used blocks that no one is using.
	victims, evicted, writerPins := s.placePlans(plans)
	defer func() { s.unpin(writerPins, false) }()

	// 2. Tombstone evicted slots and make that durable before their payloads
	// are overwritten.
	if len(evicted) > 0 {
		writerPins = s.tombstoneEvicted(plans, evicted, victims, writerPins)
	}

	// 3. Copy-on-write: read the groups the new slot keeps from the old one.
	s.carryGroups(plans)

	// 4. Payloads, then sync. An error returned here (no memory for a
	// bounce buffer) comes before any payload I/O: it fails every plan
	// still live, and step 6 gives their slots back.
	var batchErr error
	if err := s.writePayloads(plans); err != nil {
		failAll(plans, err)
		batchErr = err
	}

	// 5. Headers, then sync. An error returned here (no memory for the
	// headers) comes before any header I/O, as in step 4.
	if err := s.writeHeaders(plans); err != nil {
		batchErr = err
	}

	// 6. Commit in memory; tombstone the slots that copy-on-write replaced.
	s.commitPlans(plans)
	return batchErr
}

// placePlans is step 1 of writePlans: it gives each plan its target slot
// (in place when the block's slot holds none of the plan's groups and no
// reader pins it; otherwise a free slot, or one evicted from the least
// recently used blocks outside the batch) and its placement stream. It
// returns the evicted slots, those of them no plan took, and the slots this
// writer pinned (evicted ones, and old slots that copy-on-write replaces),
// which writePlans unpins when it returns.
func (s *Store) placePlans(plans []*plan) (victims, evicted, writerPins []int64) {
	s.mu.Lock()
	inBatch := map[uint64]bool{}
	for _, p := range plans {
		inBatch[p.block] = true
	}
	need := 0
	for _, p := range plans {
		slot, ok := s.mu.idx.Slot(p.block)
		if !ok {
			need++
			continue
		}
		st := &s.mu.slots[slot]
		// A block written under another tag is replaced: nothing of the
		// stored one is kept (base nil), in place or in a fresh slot by
		// the usual rule, so that no reader sees a mix of the two.
		if p.meta == nil || p.meta.Tag == st.hdr.Meta.Tag {
			p.base = st.hdr.clone()
		}
		overlap := false
		for idx, d := range p.groups.data {
			if d != nil && st.hdr.Has(idx) {
				overlap = true
				break
			}
		}
		if !overlap && st.pins == 0 {
			p.target = slot
			continue
		}
		p.old = slot
		st.pins++
		writerPins = append(writerPins, slot)
		need++
	}
	// A victim is a block no one uses that is not part of this batch, in
	// the index's eviction order.
	skip := func(slot int64) bool {
		b, _ := s.mu.idx.Block(slot)
		return s.mu.slots[slot].pins > 0 || inBatch[b]
	}
	for need > len(s.mu.free) {
		victim := s.mu.idx.Victim(skip)
		if victim < 0 {
			break
		}
		st := &s.mu.slots[victim]
		s.log.Debug("store: evict", zap.String("block", fmt.Sprintf("%016x", st.hdr.Block)))
		s.mu.idx.Remove(victim)
		st.pins++ // held by this writer until the tombstone is durable
		writerPins = append(writerPins, victim)
		victims = append(victims, victim)
		s.m.evictions.Add(1)
		need--
	}
	evicted = append([]int64(nil), victims...)
	var fresh []int64
	for _, p := range plans {
		if p.target >= 0 || p.err != nil {
			continue
		}
		if len(s.mu.free) == 0 {
			if len(victims) > 0 {
				// Reuse an evicted slot once its tombstone is durable.
				fresh, victims = append(fresh, victims[len(victims)-1]), victims[:len(victims)-1]
				p.fresh = true
				continue
			}
			p.fail(fmt.Errorf("%w: %d slots, all in use", ErrFull, s.sb.Slots))
			continue
		}
		fresh = append(fresh, s.mu.free[len(s.mu.free)-1])
		s.mu.free = s.mu.free[:len(s.mu.free)-1]
		p.fresh = true
	}
	// The batch's blocks take its fresh slots in ascending order: blocks
	// stored in one call (a prefix) lie in the file in their order, a
	// constant stride apart where the slots are consecutive, so a direct
	// GPU load copies a head of theirs with one 2D copy (gpu's
	// acrossBlocks), and a disk writes and reads them in one direction.
	slices.Sort(fresh)
	for _, p := range plans {
		if p.fresh {
			p.target, fresh = fresh[0], fresh[1:]
		}
	}
	// Streams: slots allocated around the same time are evicted around the
	// same time, so they share a placement stream.
	for _, p := range plans {
		if p.fresh {
			s.mu.allocs++
			s.mu.slots[p.target].stream = StreamData + uint16((s.mu.allocs/streamWindow(s.sb.Slots))%DataStreams)
		}
	}
	s.mu.Unlock()
	return victims, evicted, writerPins
}

// tombstoneEvicted is step 2 of writePlans: it tombstones the evicted slots
// and syncs before any payload overwrites them, unpins them from writerPins
// (returned), and gives back to the free list the victims no plan took. If
// that fails, the slots are quarantined and the plans that were to reuse
// them fail.
func (s *Store) tombstoneEvicted(plans []*plan, evicted, victims, writerPins []int64) []int64 {
	err := s.tombstone(evicted)
	if err == nil {
		err = s.sync()
	}
	s.mu.Lock()
	for _, v := range evicted {
		st := &s.mu.slots[v]
		st.hdr = nil
		st.pins--
		writerPins = removeOne(writerPins, v)
		if err != nil {
			st.quarantined = true
		}
	}
	// Victims no plan took go back to the free list.
	for _, v := range victims {
		if err == nil {
			s.mu.free = append(s.mu.free, v)
		}
	}
	s.mu.Unlock()
	if err != nil {
		for _, p := range plans {
			if p.fresh && slices.Contains(evicted, p.target) {
				p.fail(err)
			}
		}
	}
	return writerPins
}

// writeHeaders is step 5 of writePlans: it builds each live plan's new
// header (the old slot's groups it keeps, the carried ones, the written
// ones, a new generation), writes it to the header copy not in use, and
// syncs. It returns an error only when the headers' buffer could not be
// had; then no header was written and the live plans are failed.
func (s *Store) writeHeaders(plans []*plan) error {
	n := s.geo.GroupsPerBlock()
	now := s.now().UnixNano()
	hb := int(s.sb.HeaderBytes)
	live := livePlans(plans)
	if len(live) == 0 {
		return nil
	}
	buf, err := s.alloc(len(live) * hb)
	if err != nil {
		// No header was written: as in step 4.
		failAll(live, err)
		return err
	}
	defer s.freeBuf(buf)
	ios := make([]IO, len(live))
	s.mu.Lock()
	for i, p := range live {
		h := newHeader(n)
		if p.base != nil {
			if p.target == p.old || p.old < 0 {
				h = p.base.clone()
			}
			for idx, d := range p.carry.data {
				if d != nil {
					h.set(idx, p.base.CRC[idx], p.base.MTime[idx])
				}
			}
		}
		for idx, d := range p.groups.data {
			if d != nil {
				h.set(idx, p.crcs[idx], now) // computed before wmu
			}
		}
		switch {
		case p.meta != nil:
			h.Meta = *p.meta
		case p.base != nil:
			h.Meta = p.base.Meta
		default:
			h.Meta = BlockMeta{}
		}
		s.mu.gen++
		h.Slot, h.Block, h.Gen, h.Live = p.target, p.block, s.mu.gen, true
		st := &s.mu.slots[p.target]
		p.copy = 0
		if st.cur >= 0 {
			p.copy = 1 - st.cur
		}
		p.hdr = h
		b := buf[i*hb : (i+1)*hb]
		s.marshalHeader(b, h)
		ios[i] = IO{Op: OpWrite, Off: s.headerOffset(p.target, p.copy), Buf: b, Stream: StreamMeta}
	}
	s.mu.Unlock()
	s.writePhase("before-headers", live, ios)
	s.syncPhase(live)
	return nil
}

// commitPlans is step 6 of writePlans: it commits in memory the plans whose
// headers are durable, quarantines or frees the slots of those that failed,
// and tombstones (without a sync) the slots that copy-on-write replaced.
func (s *Store) commitPlans(plans []*plan) {
	var replaced []int64
	s.mu.Lock()
	for _, p := range plans {
		switch {
		case p.err == nil:
			st := &s.mu.slots[p.target]
			st.hdr, st.cur, st.gen = p.hdr, p.copy, p.hdr.Gen
			s.indexCommitLocked(p)
			if p.old >= 0 && p.old != p.target {
				replaced = append(replaced, p.old)
			}
		case p.hdr != nil:
			// The header write failed or was not synced: its copy holds
			// unknown bytes. A fresh slot stays out of use until reopen; an
			// in-place target keeps its old header, and the next header
			// goes to the same copy again, overwriting the unknown one.
			if p.fresh {
				s.mu.slots[p.target].quarantined = true
			}
		case p.fresh && p.target >= 0:
			// Nothing reached the header: the slot is still a tombstone.
			if !s.mu.slots[p.target].quarantined {
				s.mu.free = append(s.mu.free, p.target)
			}
		}
	}
	s.mu.Unlock()
	if len(replaced) > 0 {
		// Not synced here: the next sync (of any later operation, or Close)
		// makes them durable, and a replaced slot is tombstoned again, with a
		// sync, before it is reused. A crash before then leaves two slots
		// claiming the block; recovery keeps the higher generation.
		err := s.tombstone(replaced)
		s.mu.Lock()
		for _, slot := range replaced {
			s.releaseLocked(slot)
		}
		s.mu.Unlock()
		if err != nil {
			s.log.Warn("store: tombstone of replaced slots failed; they stay unused until reopen", zap.Error(err))
		}
	}
}

// failAll fails every plan (those that failed already keep their error).
func failAll(plans []*plan, err error) {
	for _, p := range plans {
		p.fail(err)
	}
}

// streamWindow is how many consecutive slot allocations share a stream.
func streamWindow(slots int64) uint64 { return uint64(max(1, slots/int64(4*DataStreams))) }

func removeOne(s []int64, v int64) []int64 {
	for i, x := range s {
		if x == v {
			return append(s[:i], s[i+1:]...)
		}
	}
	return s
}

func livePlans(plans []*plan) []*plan {
	var out []*plan
	for _, p := range plans {
		if p.err == nil {
			out = append(out, p)
		}
	}
	return out
}

// checkMeta fails the requests of every block whose requests' Meta
// disagree, or that carry a tag or parent a version 1 store cannot record,
// and normalises the rest (a block is not its own parent; a request
// without Meta takes its block's Meta in the call). It returns how many
// requests it failed.
func (s *Store) checkMeta(reqs []WriteReq) int {
	var meta map[uint64]*BlockMeta
	var bad map[uint64]error
	for i := range reqs {
		r := &reqs[i]
		if r.Err != nil || r.Meta == nil {
			continue
		}
		m := r.Meta
		if m.HasParent && m.Parent == r.Key.Block || !m.HasParent && m.Parent != 0 {
			r.Meta = &BlockMeta{Tag: m.Tag} // no parent
			m = r.Meta
		}
		if meta == nil {
			meta = map[uint64]*BlockMeta{}
		}
		switch first, ok := meta[r.Key.Block]; {
		case !ok:
			meta[r.Key.Block] = m
			if v := s.formatVersion(); v < headerVersion2 && *m != (BlockMeta{}) {
				if bad == nil {
					bad = map[uint64]error{}
				}
				bad[r.Key.Block] = fmt.Errorf("%w: block %016x: a format version %d store records no tag or parent (see docs/format.md, 'Moving a store to version 2')",
					ErrVersion, r.Key.Block, v)
			}
		case *first != *m:
			if bad == nil {
				bad = map[uint64]error{}
			}
			if bad[r.Key.Block] == nil {
				bad[r.Key.Block] = fmt.Errorf("%w: block %016x written with two tags or parents in one call", ErrInvalid, r.Key.Block)
			}
		}
	}
	if meta == nil {
		return 0 // no request carries meta
	}
	failed := 0
	for i := range reqs {
		r := &reqs[i]
		if r.Err != nil {
			continue
		}
		if err := bad[r.Key.Block]; err != nil {
			r.Err = err
			failed++
		} else if r.Meta == nil {
			r.Meta = meta[r.Key.Block] // the block's meta in this call, if any
		}
	}
	return failed
}

// storedTag is the tag of block as stored, zero when absent. Called with
// wmu held (the stored tag changes only under it).
func (s *Store) storedTag(block uint64) Tag {
	s.mu.Lock()
	defer s.mu.Unlock()
	if slot, ok := s.mu.idx.Slot(block); ok {
		return s.mu.idx.Meta(slot).Tag
	}
	return Tag{}
}

// indexCommitLocked indexes the block of a committed plan in its target
// slot as just used: in place, the entry is updated; a block that moved
// (copy-on-write) leaves its old slot's entry for the new one; a new block
// is inserted.
func (s *Store) indexCommitLocked(p *plan) {
	m, full := p.hdr.Meta, s.fullLocked(p.hdr)
	if slot, ok := s.mu.idx.Slot(p.block); ok {
		if slot == p.target {
			s.mu.idx.Update(slot, m, full)
			return
		}
		s.mu.idx.Remove(slot)
	}
	s.mu.idx.Insert(p.target, p.block, m, full)
}

// carryGroups reads, for copy-on-write plans, the old slot's groups that the
// new slot keeps. A group whose checksum fails is dropped (and logged).
func (s *Store) carryGroups(plans []*plan) {
	var reqs []ReadReq
	var owners []*plan
	for _, p := range plans {
		if p.err != nil || p.old < 0 || p.old == p.target || p.base == nil {
			continue
		}
		for idx := range s.geo.GroupsPerBlock() {
			if p.groups.has(idx) || !p.base.Has(idx) {
				continue
			}
			reqs = append(reqs, ReadReq{Key: s.geo.KeyAt(p.block, idx), Buf: make([]byte, s.geo.GroupBytes())})
			owners = append(owners, p)
		}
	}
	if len(reqs) == 0 {
		return
	}
	if err := s.readFromSlots(reqs, owners); err != nil {
		for _, p := range owners {
			p.fail(err)
		}
		return
	}
	for i, r := range reqs {
		p := owners[i]
		switch {
		case r.Err == nil:
			if p.carry.data == nil {
				p.carry = newGroupSet(s.geo.GroupsPerBlock())
			}
			p.carry.put(s.geo.Index(r.Key), r.Buf)
		case errors.Is(r.Err, ErrCorrupt):
			s.log.Warn("store: dropping corrupt group on copy-on-write", zap.Error(r.Err))
		default:
			p.fail(r.Err)
		}
	}
}

// readFromSlots reads groups from the plans' old slots (pinned by the
// writer), verifying checksums against the plans' base headers.
func (s *Store) readFromSlots(reqs []ReadReq, owners []*plan) error {
	sc := s.getScratch()
	defer s.putScratch(sc)
	for i := range reqs {
		p := owners[i]
		idx := s.geo.Index(reqs[i].Key)
		sc.wants = append(sc.wants, want{r: &reqs[i], slot: p.old, idx: idx, crc: p.base.CRC[idx]})
	}
	return s.readWants(sc, sc.wants)
}

// writePayloads writes the new and carried groups of every live plan, then
// syncs. Plans whose writes fail are marked failed.
func (s *Store) writePayloads(plans []*plan) error {
	stride, gb, align := int(s.geo.GroupStride()), s.geo.GroupBytes(), s.e.Align()
	maxGroups := max(1, s.opts.MaxIO/stride)
	var ios []IO
	var owners []*plan
	var bufs [][]byte
	defer func() {
		for _, b := range bufs {
			s.putBounce(b)
		}
	}()
	var cur []byte // the unused rest of the last bounce buffer
	var idxs []int
	var all [][]byte
	for _, p := range livePlans(plans) {
		// The plan's groups, written and carried (never both), in index
		// order; all[k] is group idxs[k]'s data.
		idxs, all = idxs[:0], all[:0]
		for idx, d := range p.groups.data {
			if d == nil && p.carry.data != nil {
				d = p.carry.data[idx]
			}
			if d != nil {
				idxs, all = append(idxs, idx), append(all, d)
			}
		}
		s.mu.Lock()
		stream := s.mu.slots[p.target].stream
		s.mu.Unlock()
		for lo := 0; lo < len(idxs); {
			hi := lo + 1
			for hi < len(idxs) && idxs[hi] == idxs[hi-1]+1 && hi-lo < maxGroups {
				hi++
			}
			// Direct: the run's data follows each other in memory, the
			// first slice's capacity spanning the run (one range of one
			// allocation, as for reads), aligned for the engine. The
			// checksums were computed from this memory, which the caller
			// leaves unchanged until Write returns.
			need := (hi - lo) * stride
			if d := all[lo]; stride == gb && cap(d) >= need && Aligned(d[:need], align) && followsAll(all[lo:hi]) {
				ios = append(ios, IO{Op: OpWrite, Off: s.groupOffset(p.target, idxs[lo]), Buf: d[:need:need], Stream: stream})
				owners = append(owners, p)
				lo = hi
				continue
			}
			// Bounce memory sized to the data: runs are carved one
			// after another out of MaxIO-sized buffers.
			if len(cur) < need {
				b, err := s.getBounce()
				if err != nil {
					return err
				}
				bufs = append(bufs, b)
				cur = b
			}
			var buf []byte
			buf, cur = cur[:need:need], cur[need:]
			clear(buf)
			for k := lo; k < hi; k++ {
				copy(buf[(k-lo)*stride:], all[k])
			}
			s.m.writeBounced.Add(uint64((hi - lo) * gb))
			ios = append(ios, IO{Op: OpWrite, Off: s.groupOffset(p.target, idxs[lo]), Buf: buf, Stream: stream})
			owners = append(owners, p)
			lo = hi
		}
	}
	if len(ios) == 0 {
		return nil
	}
	s.writePhase("before-payloads", owners, ios)
	s.syncPhase(livePlans(plans))
	return nil
}

// followsAll reports whether the data follow each other in memory, in
// order.
func followsAll(data [][]byte) bool {
	for k := 1; k < len(data); k++ {
		if !follows(data[k-1], data[k]) {
			return false
		}
	}
	return true
}

// writePhase passes failpoint fp, then runs ios; owners[i] is the plan of
// ios[i]. A failure marks the plans it touches failed; the batch goes on
// with the rest.
func (s *Store) writePhase(fp string, owners []*plan, ios []IO) {
	if err := s.failpoint(fp); err != nil {
		for _, p := range owners {
			p.fail(err)
		}
		return
	}
	// A large phase is split over the cores: a buffered write the kernel
	// completes inline (a store file on tmpfs, in the page cache) is a
	// copy done by the submitting thread, one after another for the whole
	// commit otherwise.
	n := len(ios)
	per, workers := max(n, 1), 1
	if n >= 2*minWritePiece {
		workers = min(runtime.GOMAXPROCS(0), n/minWritePiece)
		per = (n + workers - 1) / workers
	}
	errs := make([]error, (n+per-1)/per)
	par.Pieces(n, per, workers, func(lo, hi int) { errs[lo/per] = s.e.Do(ios[lo:hi]) })
	for k, err := range errs {
		lo, hi := k*per, min((k+1)*per, n)
		if err != nil {
			for _, p := range owners[lo:hi] {
				p.fail(fmt.Errorf("store: write: %w", err))
			}
			continue
		}
		for i := lo; i < hi; i++ {
			if ios[i].Err != nil {
				s.m.ioErrors.Add(1)
				owners[i].fail(fmt.Errorf("store: write block %016x: %w", owners[i].block, ios[i].Err))
			}
		}
	}
}

// syncPhase syncs after a write phase of plans (those still live). A
// failed sync fails every one of them: nothing they wrote is known durable,
// so none is acknowledged. The batch itself goes on (step 6 of writePlans
// sorts out each failed plan's slot).
func (s *Store) syncPhase(plans []*plan) {
	if len(plans) == 0 {
		return
	}
	if err := s.sync(); err != nil {
		for _, p := range plans {
			p.fail(err)
		}
	}
}

func (s *Store) sync() error {
	if err := s.failpoint("before-sync"); err != nil {
		return err
	}
	if err := s.e.Sync(); err != nil {
		s.m.ioErrors.Add(1)
		return fmt.Errorf("store: sync: %w", err)
	}
	return nil
}
