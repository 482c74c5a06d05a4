package ctl

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/internal/freelist"
	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// maxGroupsPerCall bounds the groups of one store.Read/store.Write a
// LOAD_BLOCKS/STORE_BLOCKS issues (besides the staging budget), so the
// store's per-call working memory stays bounded.
const maxGroupsPerCall = 16384

// blockEnt is one decoded block entry and its outcome. A tagged entry's
// tag and parent are not here but in the call's table of metas (see
// blockScratch.metas): the entries of every call, tagged or not, are
// passed over several times, and 48 bytes each keep those passes short.
type blockEnt struct {
	e      abi.BlockEntry
	valid  bool
	groups int32 // groups the entry moves
	ok     uint32
	st     abi.Status
	det    abi.Detail
}

// reqs is how many store requests a valid entry's load makes: one per
// (layer, kind), for all its heads.
func (e *blockEnt) reqs() int { return int(e.groups) / int(e.e.HeadCount) }

// tiles reports whether a valid entry of a tiled GPU load moves as tiles:
// it has several heads, no more than a tile holds.
func (e *blockEnt) tiles(tiled bool) bool {
	return tiled && e.e.HeadCount > 1 && int(e.e.HeadCount) <= store.MaxBadHeads
}

// items is how many pipeline items a valid entry's GPU call makes: one per
// (layer, kind) as tiles, else one per group.
func (e *blockEnt) items(tiled bool) int {
	if e.tiles(tiled) {
		return e.reqs()
	}
	return int(e.groups)
}

// blockScratch is per-call working memory, kept for the next call: a call
// allocates nothing proportional to its entries or groups once one as
// large has run.
type blockScratch struct {
	ents []blockEnt
	// metas is, for a call of tagged entries (ABI minor 3), entry i's tag
	// and parent at i: a STORE records them (WriteReq.Meta points here), a
	// LOAD expects the tag (ReadReq.Tag points here, nil for a zero tag).
	// A call of 32-byte entries uses none: its STORE keeps the stored
	// blocks' and its LOAD checks none.
	metas entMetas
	rreqs []store.ReadReq
	wreqs []store.WriteReq
	srcs  [][]byte // per write request: the client tile it copies
	owner []int32  // entry of each request (or GPU item)
	items []gpu.Item
	crcs  []uint32   // a GPU load's tiles' checksums (gpu.Tile.CRCs)
	tiles []gpu.Tile // and its tiles (gpu.Item.Tile)
	parts []entPart  // of a GPU call's entries (splitGroups)
	stage []int32    // per request: staging slot, or -1 when it lands directly
	order []int32
	cells []int32
}

// blockScratches keeps the idle scratch. Not a sync.Pool: that drops its
// items at every collection, and a GPU load of 1,000 blocks then made its
// 40 MiB of items again, which brought the next collection sooner: the
// collector became a large share of the daemon's CPU under GPU loads.
// Up to 16 idle: one per caller of a busy daemon; items beyond
// maxKeptItems (one call's GPU items, 96 B each, and their owners) are
// not kept.
var blockScratches = freelist.List[blockScratch]{Max: 16}

// maxKeptItems bounds the GPU items an idle scratch keeps: 1 Mi items (100
// MiB with their owners, a 2,048-block call of a Llama-3-8B shape). A
// larger call's go to the collector, so 16 idle scratches hold at most
// 1.6 GiB of items.
const maxKeptItems = 1 << 20

// putBlockScratch keeps sc for the next call, without items past
// maxKeptItems.
func putBlockScratch(sc *blockScratch) {
	if cap(sc.items) > maxKeptItems {
		sc.items, sc.owner = nil, nil
	}
	blockScratches.Put(sc)
}

// entMetas is a call's table of its entries' tags and parents, entry i's
// at i; nil for a call of 32-byte entries.
type entMetas []store.BlockMeta

// meta is the store meta of entry i to store: nil for a call of 32-byte
// entries (the stored block keeps its tag and parent).
func (m entMetas) meta(i int) *store.BlockMeta {
	if m == nil {
		return nil
	}
	return &m[i]
}

// tag is the tag entry i expects of its block: nil where it checks none
// (a 32-byte entry, or a zero tag), so a store request of an unchecked
// entry carries no tag to compare.
func (m entMetas) tag(i int) *store.Tag {
	if m == nil || m[i].Tag.IsZero() {
		return nil
	}
	return &m[i].Tag
}

// blocks serves LOAD_BLOCKS and STORE_BLOCKS (and their inline forms):
// look up the target and the entry array, copy the entries into daemon
// memory (a client changing them during the call changes nothing), check
// each in O(1) against the target validated at registration, refuse LOAD
// entries that share a group of a cache block (and STORE entries that give
// one block two tags or parents), then move the groups of the valid entries
// in as few store calls as the staging budget allows and write each entry's
// outcome back. Entries are 32 bytes, or 64 with a tag and parent
// (abi.BlocksTagged, minor 3).
func (ss *Session) blocks(req *abi.Request, in, out []byte) (int32, error) {
	h := &req.Blocks.Header
	load := req.Op == abi.OpLoadBlocks
	esz, tagged := h.EntrySize(), h.Tagged()
	start, err := ss.admit(load, in, out)
	if err != nil {
		return 0, err
	}
	defer ss.took(start)
	n := int(h.Count)

	ss.io.RLock()
	defer ss.io.RUnlock()
	ss.mu.Lock()
	if ss.mu.closed {
		ss.mu.Unlock()
		return 0, ErrClosed
	}
	t := ss.blk.targets[h.Target]
	var eb *buffer
	if !req.Inline && n > 0 {
		eb = ss.mu.bufs[h.Buffer]
	}
	ss.mu.Unlock()
	if t == nil {
		return 0, fmt.Errorf("%w: %d", ErrNoTarget, h.Target)
	}
	var arr []byte // the entry array in the registered buffer
	if !req.Inline && n > 0 {
		if eb == nil {
			return 0, fmt.Errorf("%w: %d", ErrEntryBuffer, h.Buffer)
		}
		size := uint64(n) * uint64(esz)
		if l := uint64(len(eb.mem)); h.Offset > l || size > l-h.Offset {
			return 0, fmt.Errorf("%w: %d entries at offset %d of a buffer of %d bytes", abi.ErrEntries, n, h.Offset, l)
		}
		if t.inCache(eb, h.Offset, size) {
			return 0, fmt.Errorf("%w: buffer %d offset %d", abi.ErrEntriesInCache, h.Buffer, h.Offset)
		}
		arr = eb.mem[h.Offset : h.Offset+size]
	}

	sc := blockScratches.Get()
	defer putBlockScratch(sc)
	if cap(sc.ents) < n {
		sc.ents = make([]blockEnt, n)
	}
	ents := sc.ents[:n]
	var metas entMetas
	if tagged {
		if cap(sc.metas) < n {
			sc.metas = make(entMetas, n)
		}
		metas = sc.metas[:n]
	}
	src := req.Blocks.Entries
	if arr != nil {
		src = arr
	}
	if err := ss.guard(t.ownsOr(eb), func() error {
		if tagged {
			decodeTagged(ents, metas, src)
			return nil
		}
		for i := range ents {
			ents[i] = blockEnt{}
			ents[i].e.Unmarshal(src[i*abi.BlockEntrySize:])
		}
		return nil
	}); err != nil {
		return 0, err
	}
	bad := 0
	for i := range ents {
		e := &ents[i]
		if e.st != abi.OK { // a tagged entry's meta refused it
			bad++
			continue
		}
		g, err := t.lay.CheckBlock(&e.e)
		if err != nil {
			e.st, e.det = abi.BadRequest, abi.DetailOf(err)
			bad++
			continue
		}
		e.valid, e.groups = true, int32(g)
	}
	if load {
		bad += markBlockOverlaps(ents, &t.lay, sc)
	} else if tagged {
		bad += markMetaConflicts(ents, metas)
	}

	switch {
	case t.dev != nil:
		err = ss.gpuBlocks(t, ents, metas, load, sc)
	case load:
		err = ss.loadBlocks(t, ents, metas, sc)
	default:
		err = ss.storeBlocks(t, ents, metas, sc)
	}
	if err != nil {
		return 0, err
	}

	nok, groups := 0, uint64(0)
	put := func(b []byte, e *blockEnt) {
		b[abi.BlockStatusOff] = uint8(e.st)
		b[abi.BlockDetailOff] = uint8(e.det)
		binary.LittleEndian.PutUint32(b[abi.BlockGroupsOKOff:], e.ok)
	}
	for i := range ents {
		if ents[i].st == abi.OK {
			nok++
		}
		groups += uint64(ents[i].ok)
	}
	if arr != nil {
		if err := ss.guard(t.ownsOr(eb), func() error {
			for i := range ents {
				put(arr[i*esz:], &ents[i])
			}
			return nil
		}); err != nil {
			return 0, err
		}
	} else {
		for i := range ents {
			put(out[abi.BlocksSize+i*esz:], &ents[i])
		}
	}
	binary.LittleEndian.PutUint32(out[abi.BlocksNOKOff:], uint32(nok))
	binary.LittleEndian.PutUint64(out[abi.BlocksGroupsOff:], groups)
	ss.count(load, bad, groups)
	return int32(min(nok, 1<<31-1)), nil
}

// decodeTagged decodes 64-byte entries from src into ents and their tags
// and parents into metas, refusing (BadRequest with its detail) each whose
// tag-and-parent fields are not valid (abi.BlockEntryTagged.CheckMeta). A
// LOAD entry's parent is checked alike but not used.
func decodeTagged(ents []blockEnt, metas entMetas, src []byte) {
	var te abi.BlockEntryTagged
	for i := range ents {
		e := &ents[i]
		te.Unmarshal(src[i*abi.BlockEntryTaggedSize:])
		*e = blockEnt{e: te.BlockEntry}
		metas[i] = store.BlockMeta{Tag: te.Tag, Parent: te.Parent, HasParent: te.HasParent()}
		if err := te.CheckMeta(); err != nil {
			e.st, e.det = abi.BadRequest, abi.DetailOf(err)
		}
	}
}

// markMetaConflicts refuses (BadRequest/BadMeta) every valid entry of a
// tagged STORE_BLOCKS whose block another valid entry of the call names
// with another tag or parent: which of the two the block is would depend
// on the order the store saw them. It returns how many it refused.
func markMetaConflicts(ents []blockEnt, metas entMetas) int {
	first := make(map[uint64]int32, len(ents))
	conflict := map[uint64]bool{}
	for i := range ents {
		e := &ents[i]
		if !e.valid {
			continue
		}
		if j, ok := first[e.e.Block]; !ok {
			first[e.e.Block] = int32(i)
		} else if metas[j] != metas[i] {
			conflict[e.e.Block] = true
		}
	}
	if len(conflict) == 0 {
		return 0
	}
	refused := 0
	for i := range ents {
		if e := &ents[i]; e.valid && conflict[e.e.Block] {
			e.valid, e.st, e.det = false, abi.BadRequest, abi.BadMeta
			refused++
		}
	}
	return refused
}

// markBlockOverlaps refuses (BadRequest/BadOverlap) every valid LOAD entry
// that shares a group — a (layer, head, kind) of the same cache block —
// with another valid entry: both would land in the same tile. The target's
// tiles are pairwise disjoint (checked at registration), so entries of
// different cache blocks never overlap. Cost: one pass when the entries
// come in cache-block order (a sort otherwise); entries sharing a cache
// block are resolved on a map of that block's groups, linear in their
// groups.
func markBlockOverlaps(ents []blockEnt, l *abi.Layout, sc *blockScratch) int {
	order := sc.order[:0]
	sorted := true
	for i := range ents {
		if !ents[i].valid {
			continue
		}
		if k := len(order); k > 0 && ents[i].e.CacheBlock < ents[order[k-1]].e.CacheBlock {
			sorted = false
		}
		order = append(order, int32(i))
	}
	if !sorted {
		slices.SortFunc(order, func(a, b int32) int {
			if c := cmp.Compare(ents[a].e.CacheBlock, ents[b].e.CacheBlock); c != 0 {
				return c
			}
			return cmp.Compare(a, b)
		})
	}
	refused := 0
	for lo := 0; lo < len(order); {
		hi := lo + 1
		for hi < len(order) && ents[order[hi]].e.CacheBlock == ents[order[lo]].e.CacheBlock {
			hi++
		}
		if hi-lo > 1 {
			refused += resolveCacheBlock(ents, order[lo:hi], l, sc)
		}
		lo = hi
	}
	sc.order = order[:0]
	return refused
}

// resolveCacheBlock marks the entries of one cache block that share a
// group with another of them.
func resolveCacheBlock(ents []blockEnt, run []int32, l *abi.Layout, sc *blockScratch) int {
	nh := int(l.HeadEnd - l.HeadFirst)
	nl := int(l.LayerEnd - l.LayerFirst)
	cells := sc.cells
	if cap(cells) < nl*nh*2 {
		cells = make([]int32, nl*nh*2)
	}
	cells = cells[:nl*nh*2]
	for i := range cells {
		cells[i] = -1
	}
	hit := make(map[int32]bool)
	for _, k := range run {
		e := &ents[k].e
		for layer := uint32(e.LayerFirst); layer < uint32(e.LayerFirst)+uint32(e.LayerCount); layer++ {
			for kind := range 2 {
				if e.Kinds&(1<<kind) == 0 {
					continue
				}
				for h := uint32(e.HeadFirst); h < uint32(e.HeadFirst)+uint32(e.HeadCount); h++ {
					c := &cells[((int(layer-l.LayerFirst)*2+kind)*nh)+int(h-l.HeadFirst)]
					if *c >= 0 {
						hit[*c], hit[k] = true, true
					} else {
						*c = k
					}
				}
			}
		}
	}
	for k := range hit {
		e := &ents[k]
		e.valid, e.st, e.det = false, abi.BadRequest, abi.BadOverlap
	}
	sc.cells = cells[:0]
	return len(hit)
}

// tilesOf calls f for every (layer, kind) of a valid entry, in slot
// order (layer, K before V), with the key of its first head and its tile's
// offset in its region's buffer.
func tilesOf(t *target, e *abi.BlockEntry, f func(k layout.Key, r *region, off uint64)) {
	for layer := uint32(e.LayerFirst); layer < uint32(e.LayerFirst)+uint32(e.LayerCount); layer++ {
		for kind := range 2 {
			if e.Kinds&(1<<kind) != 0 {
				r := t.region(layer, kind)
				f(layout.Key{Block: e.Block, Layer: int(layer), Kind: layout.Kind(kind), Head: int(e.HeadFirst)}, r, r.off+t.lay.TileOffset(e.CacheBlock, uint32(e.HeadFirst)))
			}
		}
	}
}

// groupsOf calls f for every group of a valid entry, in slot order (layer,
// K before V, head), with the group's key and its tile's offset in its
// region's buffer.
func groupsOf(t *target, e *abi.BlockEntry, f func(k layout.Key, r *region, off uint64)) {
	hs := t.lay.HeadStride
	tilesOf(t, e, func(k layout.Key, r *region, off uint64) {
		for range e.HeadCount {
			f(k, r, off)
			k.Head++
			off += hs
		}
	})
}

// window is the valid entries [lo, hi) of one store call and its staging.
func nextWindow(ents []blockEnt, lo int, stagePer int, budget int) (hi, groups, stageBytes int) {
	hi = lo
	for ; hi < len(ents); hi++ {
		e := &ents[hi]
		if !e.valid {
			continue
		}
		need := int(e.groups) * stagePer
		if groups > 0 && (stageBytes+need > budget || groups+int(e.groups) > maxGroupsPerCall) {
			break
		}
		groups += int(e.groups)
		stageBytes += need
	}
	return hi, groups, stageBytes
}

// loadBlocks reads the groups of the valid entries straight into the
// client's tiles. Packed tiles (row pitch = row bytes) are handed to the
// store as destinations reaching to the end of their mapping, so a run of
// adjacent tiles in slot order (the heads of an HND cache) lands in one
// read; pitched tiles (NHD) are handed over with their pitch, and the store
// lands them row by row (vectored where the engine reads into segments,
// else verified in its bounce memory and copied while the group is still
// in cache). No staging copy is made here.
//
// A tile's heads of one (layer, kind) are one store request (a range,
// store.ReadReq.Heads): the control path writes and reads one request per
// (layer, kind) of an entry, not one per group. The requests of one store
// call (up to maxGroupsPerCall groups, 160 bytes per request) outgrow the
// core's cache, and the store's own traffic evicts them:
// each pass over them is a pass over memory. So a request's outcome is
// read back into its entry just before the next window's request takes its
// place (the line is fetched once for both), and the last window's as the
// requests are cleared at the end of the call; a read that faulted in
// client memory is found there too (outcomes.fault), and fails the call
// before the next window's read.
func (ss *Session) loadBlocks(t *target, ents []blockEnt, metas entMetas, sc *blockScratch) error {
	s := ss.srv
	gb := s.gb
	rows, rowBytes, pitch := int(s.tile.Rows), int(s.tile.RowBytes), int(t.lay.RowPitch)
	// A packed tile is gb contiguous bytes; a pitched one spans its rows.
	span, reqPitch, reqRowBytes := uint64(gb), 0, 0
	if !t.lay.Packed {
		span, reqPitch, reqRowBytes = uint64((rows-1)*pitch+rowBytes), pitch, rowBytes
	}
	reqs := sc.rreqs[:0]
	// No reference to client memory (nor a store error) outlives the
	// call: the requests used are cleared when it ends, whatever the
	// outcome (each window writes every field the store reads but Err,
	// which the store sets).
	used := 0 // requests holding references
	defer func() { clear(reqs[:used]) }()
	out := outcomes{ss: ss, ents: ents}
	for lo := 0; lo < len(ents); {
		hi, groups, _ := nextWindow(ents, lo, 0, s.opts.MaxStagingBytes)
		if groups == 0 {
			lo = hi
			continue
		}
		n := 0 // requests: one per (layer, kind) of each entry
		for i := lo; i < hi; i++ {
			if e := &ents[i]; e.valid {
				n += e.reqs()
			}
		}
		if cap(reqs) < n {
			// The outcomes not yet read are in the old array.
			out.read(reqs[:used], used)
			clear(reqs[:used])
			reqs = make([]store.ReadReq, 0, n)
			sc.rreqs, used = reqs, 0
		}
		used = max(used, n)
		k := 0
		for i := lo; i < hi; i++ {
			if e := &ents[i]; e.valid {
				out.read(reqs[:used], k+e.reqs())
				k = t.fillReads(reqs[:n], k, e, metas.tag(i), span, reqPitch, reqRowBytes)
			}
		}
		out.read(reqs[:used], used)
		if out.fault != nil {
			return ss.readFault(out.fault)
		}
		err := ss.guard(t.owns, func() error { return ss.readStore(reqs[:n]) })
		if err != nil {
			return err
		}
		out.next(lo, n)
		lo = hi
	}
	// The last window's outcomes, each piece cleared as soon as read (while
	// still in cache).
	for k := 0; k < used; k += 1024 {
		out.read(reqs[:used], k+1024)
		clear(reqs[k:min(k+1024, used)])
	}
	used = 0
	if out.fault != nil {
		return ss.readFault(out.fault)
	}
	return nil
}

// outcomes reads the outcomes of one store call's requests — those of the
// valid entries from lo on, in order — back into their entries.
type outcomes struct {
	ss   *Session
	ents []blockEnt
	i    int // entry of request at
	left int // its requests not yet read
	at   int // next request to read
	n    int // requests of the call
	// fault is the error of the first request read whose read(2) into
	// client memory faulted (isFault): the call fails with it (readFault)
	// before its next store read, as readGroups would have failed it.
	fault error
}

// next starts on the n requests of a store call for the entries from lo.
func (o *outcomes) next(lo, n int) {
	o.i, o.left, o.at, o.n = lo-1, 0, 0, n
}

// read reads the outcomes of the requests below k not yet read.
func (o *outcomes) read(reqs []store.ReadReq, k int) {
	for k = min(k, o.n); o.at < k; {
		for o.left == 0 {
			o.i++
			if e := &o.ents[o.i]; e.valid {
				o.left = e.reqs()
			}
		}
		e := &o.ents[o.i]
		g := reqs[o.at : o.at+min(o.left, k-o.at)]
		o.at += len(g)
		o.left -= len(g)
		// By pointer (a ReadReq is 160 bytes), reading only the outcome.
		for j := range g {
			q := &g[j]
			e.ok += uint32(q.Heads - q.Failed)
			if q.Err == nil {
				continue
			}
			if o.fault == nil && isFault(q.Err) {
				o.fault = q.Err
			}
			e.tally(o.ss.loadOutcome(q.Err, nil))
		}
	}
}

// fillReads writes the requests of valid entry be, one per (layer, kind) in
// slot order (layer, K before V) for its heads, into reqs from index k on,
// and returns the index past them. Every field the store reads is written
// except Err and Failed, which the store sets itself; Unverified and CRC
// stay zero (host loads are verified by the store; clear leaves them so).
// Each request expects tag, the entry's (entMetas.tag: nil for any),
// which the store checks against the header of the slot it reads.
// A request's destination starts at its first head's tile in its region's
// buffer and spans its heads (span bytes each, headStride apart), its
// capacity reaching to the end of the mapping (packed tiles adjacent in
// slot order then land in one read); pitch and rowBytes are the pitched
// shape, zero for a packed tile. It walks an entry's (layer, kind) tiles as
// groupsOf does, but as a plain loop: a callback per (layer, kind) is a
// measurable share of the control path's cost per block
// (docs/performance.md, "Control-path cost").
func (t *target) fillReads(reqs []store.ReadReq, k int, be *blockEnt, tag *store.Tag, span uint64, pitch, rowBytes int) int {
	e := &be.e
	block, hs := e.Block, t.lay.HeadStride
	h0, hn := int(e.HeadFirst), int(e.HeadCount)
	tileOff := t.lay.TileOffset(e.CacheBlock, uint32(e.HeadFirst))
	l0, l1 := int(e.LayerFirst), int(e.LayerFirst)+int(e.LayerCount)
	regions := t.regions[2*(l0-int(t.lay.LayerFirst)):]
	for layer := l0; layer < l1; layer++ {
		for kind := range 2 {
			if e.Kinds&(1<<kind) == 0 {
				continue
			}
			r := &regions[2*(layer-l0)+kind]
			off := r.off + tileOff
			q := &reqs[k]
			q.Key = layout.Key{Block: block, Layer: layer, Head: h0, Kind: layout.Kind(kind)}
			q.Buf = r.b.mem[off : off+uint64(hn-1)*hs+span]
			q.Pitch, q.RowBytes = pitch, rowBytes
			q.Heads, q.HeadStride = hn, int(hs)
			q.Tag = tag
			k++
		}
	}
	return k
}

// storeSumWindow is how many bytes of groups one goroutine copies and sums
// at a time in storeBlocks.
const storeSumWindow = 4 << 20

// storeBlocks copies the tiles of the valid entries out of the client's
// memory into staging, checksumming the bytes copied (so the checksum the
// store records is of the bytes it writes, whatever the client does to
// its memory meanwhile), then writes them, durable on return.
func (ss *Session) storeBlocks(t *target, ents []blockEnt, metas entMetas, sc *blockScratch) error {
	s := ss.srv
	gb := s.gb
	for lo := 0; lo < len(ents); {
		hi, groups, stageBytes := nextWindow(ents, lo, gb, s.opts.MaxStagingBytes)
		if groups == 0 {
			lo = hi
			continue
		}
		stage, err := s.stage.get(stageBytes)
		if err != nil {
			return err
		}
		reqs, owner, srcs := sc.wreqs[:0], sc.owner[:0], sc.srcs[:0]
		rows, rowBytes, pitch := int(s.tile.Rows), int(s.tile.RowBytes), int(t.lay.RowPitch)
		span := uint64(gb)
		if !t.lay.Packed {
			span = uint64((rows-1)*pitch + rowBytes)
		}
		for i := lo; i < hi; i++ {
			e := &ents[i]
			if !e.valid {
				continue
			}
			meta := metas.meta(i)
			groupsOf(t, &e.e, func(k layout.Key, r *region, off uint64) {
				// Capacity to the staging buffer's end: the store writes
				// the groups of a slot that follow each other here with
				// one I/O, straight from staging (no bounce copy).
				o := len(reqs) * gb
				reqs = append(reqs, store.WriteReq{Key: k, Data: stage[o : o+gb], Meta: meta})
				srcs = append(srcs, r.b.mem[off:off+span])
				owner = append(owner, int32(i))
			})
		}
		// Each group is copied into staging (the snapshot the store
		// writes, whatever the client does to its memory meanwhile) and
		// summed on the way, the groups spread over the cores; the store
		// then reads no payload to checksum it.
		if t.lay.Packed {
			rows = 0
		}
		err = ss.guard(t.owns, func() error {
			par.Pieces(len(reqs), max(1, storeSumWindow/gb), runtime.GOMAXPROCS(0), func(lo, hi int) {
				s.st.GatherWrites(reqs[lo:hi], srcs[lo:hi], rows, rowBytes, pitch)
			})
			return nil
		})
		if err == nil {
			werr := ss.writeGroups(reqs)
			if errors.Is(werr, store.ErrClosed) {
				err = werr
			} else {
				for k := range reqs {
					ents[owner[k]].tally(writeOutcome(reqs[k].Err, werr))
				}
			}
		}
		clear(reqs)
		clear(srcs) // no reference to client memory outlives the call
		sc.wreqs, sc.owner, sc.srcs = reqs[:0], owner[:0], srcs[:0]
		s.stage.put(stage)
		if err != nil {
			return err
		}
		lo = hi
	}
	return nil
}

// severity orders the statuses an entry's groups can have: the entry
// reports its most severe group's (OK only when every group is OK).
func severity(st abi.Status) int {
	switch st {
	case abi.OK:
		return 0
	case abi.Absent:
		return 1
	case abi.NoSpace:
		return 2
	case abi.Corrupt:
		return 3
	case abi.BadRequest:
		return 4
	}
	return 5 // IOError
}

func (e *blockEnt) tally(st abi.Status, det abi.Detail) {
	if st == abi.OK {
		e.ok++
		return
	}
	if e.st == abi.OK || severity(st) > severity(e.st) {
		e.st, e.det = st, det
	}
}

// owns reports whether addr lies in one of the target's buffers (the
// memory a fault of a call on it may be in).
func (t *target) owns(addr uintptr) bool {
	for _, b := range t.bufs {
		if b.contains(addr) {
			return true
		}
	}
	return false
}

// ownsOr is owns, and the entry array's buffer eb (nil: none).
func (t *target) ownsOr(eb *buffer) func(addr uintptr) bool {
	return func(addr uintptr) bool { return (eb != nil && eb.contains(addr)) || t.owns(addr) }
}
