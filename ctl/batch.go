package ctl

import (
	"encoding/binary"
	"errors"
	"unsafe"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// ent is one decoded batch entry and its outcome.
type ent struct {
	e       abi.Entry
	b       *buffer
	valid   bool // passed every check; I/O may touch its tile
	pitched bool // rows are not packed: the store scatters them (LOAD) or they are gathered row by row (STORE)
	st      abi.Status
	det     abi.Detail
}

// scratch is per-call working memory, pooled to keep a batch free of
// allocations proportional to its entries.
type scratch struct {
	ents  []ent
	rreqs []store.ReadReq
	wreqs []store.WriteReq
	srcs  [][]byte // per write request: its tile in client memory
	pitch []int    // per write request: its rows' pitch (0: packed)
	idx   []int
	// markOverlaps
	order, active []int32
	overlap       []bool
	spans         []span
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (e *ent) key() layout.Key {
	return layout.Key{Block: e.e.Block, Layer: int(e.e.Layer), Head: int(e.e.Head), Kind: layout.Kind(e.e.Kind)}
}

// tile is the entry's span of its registered buffer. Its capacity runs to
// the end of the mapping: store.Read lands a run of adjacent packed tiles
// with one plain I/O when the first tile's capacity spans the run (see
// store's package doc, "Where reads land").
func (e *ent) tile(extent int) []byte {
	off := int(e.e.Offset)
	return e.b.mem[off : off+extent]
}

// batch serves LOAD and STORE: decode and check every entry, then move the
// valid ones in as few store calls as the staging budget allows (one for
// any batch of packed tiles), then write the statuses.
func (ss *Session) batch(req *abi.Request, in, out []byte) (int32, error) {
	s := ss.srv
	load := req.Op == abi.OpLoad
	start, err := ss.admit(load, in, out)
	if err != nil {
		return 0, err
	}
	defer ss.took(start)
	n := int(req.Header.Count)
	sc := s.scratch.Get().(*scratch)
	if cap(sc.ents) < n {
		sc.ents = make([]ent, n)
	}
	ents := sc.ents[:n]
	defer func() {
		clear(ents) // no references to registrations outlive the call
		s.scratch.Put(sc)
	}()

	ss.io.RLock()
	defer ss.io.RUnlock()
	ss.mu.Lock()
	if ss.mu.closed {
		ss.mu.Unlock()
		return 0, ErrClosed
	}
	var last *buffer
	for i := range ents {
		e := &ents[i]
		*e = ent{}
		e.e.Unmarshal(req.Entries[i*abi.EntrySize:])
		if last != nil && last.id == e.e.Buffer {
			e.b = last
		} else {
			e.b = ss.mu.bufs[e.e.Buffer]
			last = e.b
		}
	}
	ss.mu.Unlock()

	bad := 0
	rowBytes := s.tile.RowBytes
	for i := range ents {
		e := &ents[i]
		var bufLen uint64
		if e.b != nil {
			bufLen = e.b.size()
		}
		if _, err := s.tile.Check(&e.e, bufLen, e.b != nil); err != nil {
			e.st, e.det = abi.BadRequest, abi.DetailOf(err)
			bad++
			continue
		}
		e.valid = true
		e.pitched = e.e.Pitch != 0 && e.e.Pitch != rowBytes
	}
	if load {
		bad += markOverlaps(ents, uint64(s.tile.Rows), uint64(rowBytes), sc)
	}

	if load {
		// One store call: tiles, packed or pitched, are the destinations
		// themselves; no staging.
		if err := ss.load(ents, sc); err != nil {
			return 0, err
		}
		if err := ss.gpuBatch(ents, true); err != nil {
			return 0, err
		}
	}
	// STORE: windows of entries whose staging fits the budget.
	for lo := 0; lo < n && !load; {
		hi, bytes := lo, 0
		for ; hi < n; hi++ {
			need := 0
			if ents[hi].valid && ents[hi].b.cuda == nil {
				need = s.gb
			}
			if hi > lo && bytes+need > s.opts.MaxStagingBytes {
				break
			}
			bytes += need
		}
		if err := ss.store(ents[lo:hi], bytes, sc); err != nil {
			return 0, err
		}
		lo = hi
	}
	if !load {
		if err := ss.gpuBatch(ents, false); err != nil {
			return 0, err
		}
	}

	nok := 0
	for i := range ents {
		b := out[abi.BatchHeaderSize+i*abi.EntrySize:]
		b[abi.EntryStatusOff] = uint8(ents[i].st)
		b[abi.EntryDetailOff] = uint8(ents[i].det)
		if ents[i].st == abi.OK {
			nok++
		}
	}
	binary.LittleEndian.PutUint32(out[abi.HeaderNOKOff:], uint32(nok))
	ss.count(load, bad, uint64(nok))
	return int32(nok), nil
}

// load reads the valid entries of ents with one store.Read, straight into
// their tiles: packed tiles as contiguous destinations, pitched ones as
// pitched destinations (store.ReadReq.Pitch), which the store fills with a
// vector read or one copy from its bounce memory. A corrupt group's rows
// are zeroed by the store.
func (ss *Session) load(ents []ent, sc *scratch) error {
	s := ss.srv
	rows, rowBytes := int(s.tile.Rows), int(s.tile.RowBytes)
	reqs, idx := sc.rreqs[:0], sc.idx[:0]
	for i := range ents {
		e := &ents[i]
		if !e.valid || e.b.cuda != nil {
			continue
		}
		r := store.ReadReq{Key: e.key(), Buf: e.tile(s.gb)}
		if e.pitched {
			pitch := int(e.e.Pitch)
			r.Buf = e.tile((rows-1)*pitch + rowBytes)
			r.Pitch, r.RowBytes = pitch, rowBytes
		}
		reqs = append(reqs, r)
		idx = append(idx, i)
	}
	defer func() {
		clear(reqs) // drop references to client memory
		sc.rreqs, sc.idx = reqs[:0], idx[:0]
	}()
	if len(reqs) == 0 {
		return nil
	}
	return ss.guard(batchEnts(ents).owns, func() error {
		if err := ss.readGroups(reqs); err != nil {
			return err
		}
		for k := range reqs {
			e := &ents[idx[k]]
			e.st, e.det = ss.loadOutcome(reqs[k].Err, nil)
		}
		return nil
	})
}

// store copies the valid entries' tiles out of the registered memory into
// staging, checksumming the bytes copied (so the checksum the store records
// is of the bytes it writes, whatever the client does to its memory
// meanwhile), and writes them with one store.Write.
func (ss *Session) store(ents []ent, stageBytes int, sc *scratch) error {
	s := ss.srv
	if stageBytes == 0 {
		return nil
	}
	stage, err := s.stage.get(stageBytes)
	if err != nil {
		return err
	}
	defer s.stage.put(stage)
	reqs, srcs, pitches, idx := sc.wreqs[:0], sc.srcs[:0], sc.pitch[:0], sc.idx[:0]
	defer func() {
		clear(reqs)
		clear(srcs) // no reference to client memory outlives the call
		sc.wreqs, sc.srcs, sc.pitch, sc.idx = reqs[:0], srcs[:0], pitches[:0], idx[:0]
	}()
	rows, rowBytes := int(s.tile.Rows), int(s.tile.RowBytes)
	off := 0
	for i := range ents {
		e := &ents[i]
		if !e.valid || e.b.cuda != nil {
			continue
		}
		// Capacity to the end of staging: tiles of a block in slot order
		// are adjacent there, and the store writes such a run straight
		// from staging (store.WriteReq).
		reqs = append(reqs, store.WriteReq{Key: e.key(), Data: stage[off : off+s.gb]})
		off += s.gb
		pitch := 0
		if e.pitched {
			pitch = int(e.e.Pitch)
		}
		srcs, pitches = append(srcs, e.tile(max(s.gb, (rows-1)*pitch+rowBytes))), append(pitches, pitch)
		idx = append(idx, i)
	}
	// Runs of entries of one pitch are gathered together.
	err = ss.guard(batchEnts(ents).owns, func() error {
		for lo := 0; lo < len(reqs); {
			hi := lo + 1
			for hi < len(reqs) && pitches[hi] == pitches[lo] {
				hi++
			}
			r := rows
			if pitches[lo] == 0 {
				r = 0 // packed
			}
			s.st.GatherWrites(reqs[lo:hi], srcs[lo:hi], r, rowBytes, pitches[lo])
			lo = hi
		}
		return nil
	})
	if err != nil {
		return err
	}
	werr := ss.writeGroups(reqs)
	if errors.Is(werr, store.ErrClosed) {
		return werr
	}
	for k := range reqs {
		e := &ents[idx[k]]
		e.st, e.det = writeOutcome(reqs[k].Err, werr)
	}
	return nil
}

// batchEnts is a v1 call's entries.
type batchEnts []ent

// owns reports whether addr lies in one of the entries' registrations
// (the memory a fault of the call may be in).
func (es batchEnts) owns(addr uintptr) bool {
	var last *buffer
	for i := range es {
		if b := es[i].b; b != nil && b != last {
			if b.contains(addr) {
				return true
			}
			last = b
		}
	}
	return false
}
