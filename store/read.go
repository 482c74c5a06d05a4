package store

import (
	"cmp"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"time"
	"unsafe"

	"github.com/kvfs/kvfs/layout"
)

// ReadReq asks for one group and says where it lands.
//
// With Pitch 0 (or Pitch == RowBytes) the destination is contiguous: Buf is
// exactly GroupBytes long and receives the group as stored. With Pitch >
// RowBytes the destination is pitched (a token-major, NHD, cache: one
// head's token rows interleaved with the other heads' rows): the group is
// GroupBytes/RowBytes rows of RowBytes bytes, row r lands at
// Buf[r*Pitch : r*Pitch+RowBytes], len(Buf) is exactly
// (rows-1)*Pitch + RowBytes, and the bytes between rows are never touched.
type ReadReq struct {
	Key layout.Key
	Buf []byte
	// Pitch is the distance in bytes between the starts of consecutive
	// rows of the destination; 0 means contiguous.
	Pitch int
	// RowBytes is the length of one row; it must divide GroupBytes. Only
	// read when Pitch is nonzero.
	RowBytes int
	// Unverified asks Read not to check the group's checksum: the caller
	// verifies the landed bytes against CRC itself (the GPU path checks
	// groups where they end up, in GPU memory) and must not use them
	// before it has.
	Unverified bool
	// CRC is set by Read for an Unverified request that landed: the
	// CRC32C the group's header records.
	CRC uint32
	// CRCs is, for an Unverified range, where Read puts each landed
	// head's recorded CRC32C: CRCs[j] for head Key.Head+j. Its length
	// must be Heads.
	CRCs []uint32
	// Tag, when set and not zero, is the tag the block must be stored
	// under: a block stored under another tag fails the request with
	// ErrTagMismatch (its destination is not written, as for a miss),
	// counted in Metrics.TagMismatch. Nil (or the zero tag) reads
	// whatever is stored. A pointer, not the 16 bytes: the requests of a
	// call are written and read back per (layer, kind) of every block, and
	// a larger request is a measurable share of the control path's cost
	// per block (docs/performance.md, "Control-path cost"); callers point
	// every request of a block at one tag.
	Tag *Tag
	// Heads, above 1, makes the request a range: the groups of heads
	// Key.Head to Key.Head+Heads-1 of one (block, layer, kind), head j's
	// landing at Buf[j*HeadStride:] with the shape above (contiguous, or
	// pitched rows), so len(Buf) is (Heads-1)*HeadStride plus one group's
	// span. One request for a tile's heads instead of one per head: a
	// caller that moves whole blocks writes and reads an eighth of the
	// requests. The destinations may interleave (pitched heads of a
	// token-major cache, HeadStride one row) but must not overlap. An
	// Unverified range has at most MaxBadHeads heads and takes their
	// checksums in CRCs.
	Heads, HeadStride int
	// Err is set by Read: nil (every group landed, its checksum verified,
	// or for an Unverified request its CRC set), ErrNotFound (the sentinel
	// itself, no allocation), ErrCorrupt (the destination's rows zeroed),
	// ErrInvalid, ErrSize or an I/O error. For a range, the error of one
	// of the groups that failed, the most serious: an I/O error, else a
	// corruption, else ErrNotFound.
	Err error
	// Failed is set by Read: how many of the request's groups did not
	// land (0 with Err nil; 1 for a one-group request that failed).
	Failed int
	// Bad is set by Read: bit j for head Key.Head+j when that group did
	// not land (bit 0 for a one-group request), for the first MaxBadHeads
	// heads of a range. A caller that moves a range on (to a device) must
	// skip the heads that failed: their destinations hold no group.
	Bad uint64
}

// MaxBadHeads is the most heads of a range ReadReq.Bad describes, and the
// most heads of an Unverified range.
const MaxBadHeads = 64

// want is one group a read moves: a request with its slot and checksum.
type want struct {
	r    *ReadReq // its destination: Store.dst
	slot int64
	idx  int
	crc  uint32
	rows int // 0: contiguous destination; else rows of a pitched one
	run  int // index of its run
}

// Landing modes of a run.
const (
	landBounce = iota // into store memory, verified there, copied once
	landDirect        // straight into one contiguous caller range (IO.Buf)
	landVec           // straight into the caller's segments (IO.Vec)
)

// run is a set of groups of one slot that sit next to each other on disk and
// are read with one I/O.
type run struct {
	slot     int64
	first, n int // groups [first, first+n)
	lo, hi   int // its wants, sorted by group
	mode     int
	v0, v1   int    // landVec: its segments in readScratch.vecs
	buf      []byte // landBounce: n*stride bytes of bounce memory
}

// readScratch is the per-call working memory of Read, pooled so that a
// batch allocates nothing per group.
type readScratch struct {
	wants  []want
	sorted []want // sortWants' gather buffer
	segs   []wantSeg
	pins   []int64
	runs   []run
	vecs   [][]byte
	win    [2]readWindow
	pend   [2]windowTask
}

// readWindow is the working memory of one window of runs: its I/O requests
// and the bounce buffers its runs were carved from. Two windows of a call
// may be in flight at once (see readWants).
type readWindow struct {
	ios     []IO
	bounces [][]byte
}

func (s *Store) getScratch() *readScratch { return s.scratch.Get() }

func (s *Store) putScratch(sc *readScratch) {
	clear(sc.wants) // no references to callers' memory outlive the call
	clear(sc.sorted)
	clear(sc.runs)
	for i := range sc.win {
		clear(sc.win[i].ios)
		sc.win[i].ios = sc.win[i].ios[:0]
	}
	clear(sc.vecs)
	sc.wants, sc.pins, sc.runs, sc.vecs = sc.wants[:0], sc.pins[:0], sc.runs[:0], sc.vecs[:0]
	s.scratch.Put(sc)
}

// Read reads a batch of groups. Groups adjacent on disk are coalesced into
// single I/Os of up to MaxIO bytes, and the whole batch is handed to the
// engine at once. A run of groups lands straight in the callers' memory
// when it can (see the package doc, "Where reads land"); otherwise it is
// read into a bounce buffer, verified there and copied once. Every group's
// CRC32C is verified before Read returns; a group that fails is zeroed and
// reported as ErrCorrupt, never served. The returned error is for the batch
// as a whole (store closed, engine broken); per-group outcomes are in each
// request's Err. Read allocates nothing per group, for hits and misses.
func (s *Store) Read(reqs []ReadReq) error {
	start := time.Now()
	sc := s.getScratch()
	defer s.putScratch(sc)
	wants := sc.wants[:0]
	for i := range reqs {
		r := &reqs[i]
		rows, err := s.checkRead(r)
		r.Err, r.Failed, r.Bad = err, 0, 0
		if err != nil {
			r.Failed = max(1, r.Heads)
			r.Bad = AllBad(r.Heads)
			continue
		}
		if r.Heads <= 1 {
			wants = append(wants, want{r: r, idx: s.geo.Index(r.Key), rows: rows})
			continue
		}
		k := r.Key
		for j := range r.Heads {
			k.Head = r.Key.Head + j
			wants = append(wants, want{r: r, idx: s.geo.Index(k), rows: rows})
		}
	}
	misses, mismatches := 0, 0
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		sc.wants = wants
		return ErrClosed
	}
	// One pin and one LRU touch per slot (per run of requests for the same
	// block), not per group.
	pins := sc.pins[:0]
	bp := blockPinner{slot: -1}
	kept := wants[:0]
	for _, w := range wants {
		pins = s.pinBlockLocked(&bp, w.r.Key.Block, pins)
		// The tag is checked only where a request expects one, before the
		// group (a block of another prefix is a mismatch whatever groups
		// it has); a range's heads are one request, counted once. It is
		// checked against the header of the slot pinned here, under the
		// same hold of s.mu: a pinned slot is not reused (no write or
		// eviction replaces its header or payload) until the read's
		// unpin, so the bytes read are those of the block whose tag
		// matched, even when the block is replaced or evicted meanwhile
		// (the replacement lands in another slot).
		var miss error
		switch hdr := bp.hdr; {
		case hdr == nil:
			miss = ErrNotFound
		case !TagMatches(w.r.Tag, hdr.Meta.Tag):
			miss = ErrTagMismatch
		case !hdr.Has(w.idx):
			miss = ErrNotFound
		}
		if miss != nil {
			// Before any goroutine: no lock (see fail).
			if q := w.r; q.Err == nil {
				q.Err = miss
				if miss == ErrTagMismatch {
					mismatches++
				}
			}
			w.r.Failed++
			w.r.Bad |= s.headBit(&w)
			misses++
			continue
		}
		w.slot, w.crc = bp.slot, bp.hdr.CRC[w.idx]
		kept = append(kept, w)
	}
	reader := len(pins) > 0
	if reader {
		s.mu.readers++
	}
	s.mu.Unlock()
	sc.wants, sc.pins = kept, pins
	if misses > 0 {
		s.m.misses.Add(uint64(misses))
	}
	if mismatches > 0 {
		s.m.tagMismatch.Add(uint64(mismatches))
	}
	// Deferred: a fault on caller memory (a client's mapping cut short)
	// may panic through Read when the caller asked for that
	// (debug.SetPanicOnFault); the pins must still drop.
	defer s.unpin(pins, reader)
	err := s.readWants(sc, kept)
	if err == nil && s.opts.Observe != nil {
		s.opts.Observe(OpRead, len(kept), time.Since(start))
	}
	return err
}

// blockPinner follows the block a run of requests is for (pinBlockLocked).
type blockPinner struct {
	block uint64
	have  bool
	slot  int64   // the slot last pinned (-1: none)
	hdr   *Header // the current block's header, nil when it is absent
}

// pinBlockLocked moves p to block b: when b differs from the block before,
// it looks b up and, present in a slot other than the one last pinned,
// pins that slot, appending it to pins, and touches it in the LRU. One pin
// and one touch per run of requests for the same block, not per group.
// s.mu is held.
func (s *Store) pinBlockLocked(p *blockPinner, b uint64, pins []int64) []int64 {
	if p.have && b == p.block {
		return pins
	}
	p.block, p.have, p.hdr = b, true, nil
	slot, ok := s.mu.idx.Slot(b)
	if !ok {
		return pins
	}
	p.hdr = s.mu.slots[slot].hdr
	if slot != p.slot {
		s.mu.slots[slot].pins++
		pins = append(pins, slot)
		s.mu.idx.Touch(slot)
		p.slot = slot
	}
	return pins
}

// checkRead validates one request: a key within the geometry (every head
// of a range) and a destination of exactly one group per head, contiguous
// or pitched. It returns the number of rows of a pitched destination (0
// for a contiguous one).
func (s *Store) checkRead(r *ReadReq) (rows int, err error) {
	if err := s.geo.CheckKey(r.Key); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	gb := s.geo.GroupBytes()
	span := gb
	if r.Pitch != 0 && (r.Pitch != r.RowBytes || r.Pitch <= 0) {
		if r.RowBytes <= 0 || r.RowBytes > gb || gb%r.RowBytes != 0 || r.Pitch < r.RowBytes {
			return 0, fmt.Errorf("%w: pitch %d with %d-byte rows for a %d-byte group", ErrInvalid, r.Pitch, r.RowBytes, gb)
		}
		rows = gb / r.RowBytes
		if rows > 1 && r.Pitch > (math.MaxInt-r.RowBytes)/(rows-1) {
			return 0, fmt.Errorf("%w: pitch %d too large", ErrInvalid, r.Pitch)
		}
		span = (rows-1)*r.Pitch + r.RowBytes
	}
	if r.Heads <= 1 {
		if len(r.Buf) != span {
			return 0, fmt.Errorf("%w: %d bytes for a group spanning %d", ErrSize, len(r.Buf), span)
		}
		return rows, nil
	}
	last := r.Key
	last.Head += r.Heads - 1
	if r.HeadStride <= 0 || last.Head < r.Key.Head {
		return 0, fmt.Errorf("%w: a range of %d heads %d bytes apart", ErrInvalid, r.Heads, r.HeadStride)
	}
	if r.Unverified && (r.Heads > MaxBadHeads || len(r.CRCs) != r.Heads) {
		return 0, fmt.Errorf("%w: an unverified range of %d heads (at most %d) with %d checksums", ErrInvalid, r.Heads, MaxBadHeads, len(r.CRCs))
	}
	if err := s.geo.CheckKey(last); err != nil {
		return 0, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if r.HeadStride > (math.MaxInt-span)/(r.Heads-1) {
		return 0, fmt.Errorf("%w: head stride %d too large", ErrInvalid, r.HeadStride)
	}
	if n := (r.Heads-1)*r.HeadStride + span; len(r.Buf) != n {
		return 0, fmt.Errorf("%w: %d bytes for %d heads %d apart, each spanning %d", ErrSize, len(r.Buf), r.Heads, r.HeadStride, span)
	}
	return rows, nil
}

// readWants reads and verifies wants, whose slots the caller pinned and
// whose checksums it took from the headers in force.
func (s *Store) readWants(sc *readScratch, wants []want) error {
	if len(wants) == 0 {
		return nil
	}
	if !slices.IsSortedFunc(wants, cmpWant) {
		sortWants(sc, wants)
	}
	stride := int(s.geo.GroupStride())
	maxGroups := max(1, s.opts.MaxIO/stride)
	runs := sc.runs[:0]
	for i := range wants {
		w := &wants[i]
		if n := len(runs); n > 0 {
			r := &runs[n-1]
			last := r.first + r.n - 1
			// The same group asked for twice is read once and copied twice.
			if r.slot == w.slot && (w.idx == last || (w.idx == last+1 && r.n < maxGroups)) {
				r.n = w.idx - r.first + 1
				r.hi = i + 1
				w.run = n - 1
				continue
			}
		}
		runs = append(runs, run{slot: w.slot, first: w.idx, n: 1, lo: i, hi: i + 1})
		w.run = len(runs) - 1
	}
	sc.runs = runs
	for i := range runs {
		s.landing(sc, &runs[i], wants)
	}
	pend := &sc.pend
	defer func() {
		// When a fault panics through verify: let the other window's
		// goroutine finish too (nothing touches caller memory after Read)
		// and leave the pooled scratch clean.
		for i := range pend {
			pend[i].wg.Wait()
			pend[i].started, pend[i].err, pend[i].caught = false, nil, nil
			s.putBounces(&sc.win[i])
		}
	}()
	// Issue the runs in windows whose bounce memory stays bounded; runs
	// that land in the callers' memory need none. On the rings two windows
	// are in flight at once: the next is queued while the last I/Os of the
	// one before drain and are verified, so the device's queue does not
	// run dry at every window's end (one window at a time left a disk store
	// waiting on its slowest I/O 32 times a gigabyte). Inline reads keep
	// every core busy within a window already.
	window := readWindowBytes
	pipelined := s.inline == nil
	if pipelined {
		window /= 2
	}
	var werr error
	k := 0
	for lo := 0; lo < len(runs); k++ {
		hi, bytes := lo, 0
		for hi < len(runs) {
			need := 0
			if runs[hi].mode == landBounce && !s.chunkBounced(&runs[hi]) {
				need = runs[hi].n * stride
			}
			if hi > lo && bytes+need > window {
				break
			}
			bytes += need
			hi++
		}
		w := &sc.win[k%2]
		if !pipelined || (lo == 0 && hi == len(runs)) {
			err := s.readRuns(sc, w, runs[lo:hi], wants)
			s.putBounces(w)
			if err != nil {
				return err
			}
			lo = hi
			continue
		}
		// w's previous window (k-2) was waited for below, at k-1.
		win := runs[lo:hi]
		pend[k%2].start(func() error { return s.readRuns(sc, w, win, wants) })
		if k > 0 {
			if err := s.finishWindow(&pend[(k-1)%2], &sc.win[(k-1)%2]); err != nil && werr == nil {
				werr = err
			}
		}
		if werr != nil {
			break
		}
		lo = hi
	}
	if pipelined && k > 0 {
		// The last window started (and, after an error, the one before
		// it if it is still running).
		for i := range pend {
			if pend[i].started {
				if err := s.finishWindow(&pend[i], &sc.win[i]); err != nil && werr == nil {
					werr = err
				}
			}
		}
	}
	return werr
}

// readWindowBytes bounds the bounce memory of one call's reads in flight.
const readWindowBytes = 64 << 20

// windowTask is one window of runs read on its own goroutine.
type windowTask struct {
	wg      sync.WaitGroup
	started bool
	err     error
	caught  any
}

// start runs f on a goroutine that touches caller memory as the calling
// goroutine would (its panic-on-fault setting); a panic is kept for wait.
func (t *windowTask) start(f func() error) {
	onFault := debug.SetPanicOnFault(true)
	debug.SetPanicOnFault(onFault)
	t.started, t.err, t.caught = true, nil, nil
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		debug.SetPanicOnFault(onFault)
		defer func() {
			if r := recover(); r != nil {
				t.caught = r
			}
		}()
		t.err = f()
	}()
}

// finishWindow waits for t, gives back w's bounce memory and raises t's
// panic (a fault on a client's mapping) again in the caller.
func (s *Store) finishWindow(t *windowTask, w *readWindow) error {
	t.wg.Wait()
	t.started = false
	s.putBounces(w)
	if c := t.caught; c != nil {
		t.caught = nil
		panic(c)
	}
	return t.err
}

func (s *Store) putBounces(w *readWindow) {
	for _, b := range w.bounces {
		s.putBounce(b)
	}
	clear(w.bounces)
	w.bounces = w.bounces[:0]
}

// wantSeg is a stretch wants[lo:hi] of one slot in group order.
type wantSeg struct{ lo, hi int }

// sortWants sorts wants by slot and group. Requests come block by block,
// each block's groups in slot order, the blocks in any order: then the
// blocks' stretches are sorted and gathered, O(groups + blocks·log
// blocks), instead of a stable sort of every group (a large part of the
// store's time in a profile of loads of 1,024 random blocks per call).
// Anything else gets the full sort.
func sortWants(sc *readScratch, wants []want) {
	segs := sc.segs[:0]
	for i := 0; i < len(wants); {
		j := i + 1
		for j < len(wants) && wants[j].slot == wants[i].slot && wants[j].idx >= wants[j-1].idx {
			j++
		}
		segs = append(segs, wantSeg{i, j})
		i = j
	}
	sc.segs = segs
	if len(segs) > len(wants)/8 {
		slices.SortStableFunc(wants, cmpWant)
		return
	}
	slices.SortStableFunc(segs, func(a, b wantSeg) int { return cmpWant(wants[a.lo], wants[b.lo]) })
	for k := 1; k < len(segs); k++ {
		p, c := segs[k-1], segs[k]
		if wants[p.lo].slot == wants[c.lo].slot && wants[p.hi-1].idx > wants[c.lo].idx {
			// Stretches of one slot overlap: merge them properly.
			slices.SortStableFunc(wants, cmpWant)
			return
		}
	}
	out := sc.sorted[:0]
	for _, g := range segs {
		out = append(out, wants[g.lo:g.hi]...)
	}
	copy(wants, out)
	clear(out)
	sc.sorted = out[:0]
}

func cmpWant(a, b want) int {
	if c := cmp.Compare(a.slot, b.slot); c != 0 {
		return c
	}
	return cmp.Compare(a.idx, b.idx)
}

// landing decides where run r lands: straight into one contiguous range of
// the callers' memory, into their segments with a vector read, or into a
// bounce buffer.
func (s *Store) landing(sc *readScratch, r *run, wants []want) {
	r.mode = landBounce
	ws := wants[r.lo:r.hi]
	gb := s.geo.GroupBytes()
	if int(s.geo.GroupStride()) != gb || len(ws) != r.n {
		// Padding between groups on disk, or a group asked for twice.
		return
	}
	if s.inline != nil && packed(ws) {
		// An inline engine's read is a CPU copy: into the caller's memory
		// it writes lines the copy must first read in (and the checksum
		// then reads them again), into the slot's chunk buffer it writes
		// lines already in this core's cache, verified there and landed
		// with non-temporal stores (land). Through the chunk buffers,
		// loads by many callers move more and cost fewer core-seconds per
		// GB than landing directly (see docs/performance.md, 'Store
		// batched reads'). Pitched rows long enough to scatter to
		// (ScatterMin) still land directly.
		return
	}
	align := s.e.Align()
	// Direct: contiguous destinations following each other in memory, the
	// first one's capacity spanning the run (so they are one range of one
	// allocation), aligned for the engine.
	direct := true
	for i := range ws {
		if ws[i].rows != 0 || (i > 0 && !follows(s.dst(&ws[i-1]), s.dst(&ws[i]))) {
			direct = false
			break
		}
	}
	if direct && cap(s.dst(&ws[0])) >= r.n*gb && Aligned(s.dst(&ws[0])[:r.n*gb], align) {
		r.mode = landDirect
		return
	}
	if !s.vec {
		return
	}
	// Vector: every segment (a contiguous destination, or one row of a
	// pitched one) aligned and no shorter than ScatterMin.
	for _, w := range ws {
		if w.rows == 0 {
			if gb < s.opts.ScatterMin || !Aligned(s.dst(&w), align) {
				return
			}
			continue
		}
		rb := w.r.RowBytes
		if rb < s.opts.ScatterMin || rb%max(align, 1) != 0 || (align > 1 && w.r.Pitch%align != 0) || !Aligned(s.dst(&w)[:rb], align) {
			return
		}
	}
	r.v0 = len(sc.vecs)
	sc.vecs = s.appendVec(sc.vecs, r.v0, ws)
	r.v1 = len(sc.vecs)
	r.mode = landVec
}

// packed reports whether every want of ws has a contiguous destination
// (no pitched rows).
func packed(ws []want) bool {
	for i := range ws {
		if ws[i].rows != 0 {
			return false
		}
	}
	return true
}

// follows reports whether b starts where a ends.
func follows(a, b []byte) bool {
	return uintptr(unsafe.Pointer(unsafe.SliceData(b))) == uintptr(unsafe.Pointer(unsafe.SliceData(a)))+uintptr(len(a))
}

// readRuns issues one window of runs and verifies their groups.
func (s *Store) readRuns(sc *readScratch, w *readWindow, runs []run, wants []want) error {
	gb := s.geo.GroupBytes()
	stride := int(s.geo.GroupStride())
	ios := w.ios[:0]
	// Bounce memory sized to the data: runs are carved one after another
	// out of MaxIO-sized buffers.
	var cur []byte
	for i := range runs {
		r := &runs[i]
		io := IO{Op: OpRead, Off: s.groupOffset(r.slot, r.first), Stream: StreamData}
		switch r.mode {
		case landDirect:
			io.Buf = s.dst(&wants[r.lo])[: r.n*gb : r.n*gb]
		case landVec:
			io.Vec = sc.vecs[r.v0:r.v1:r.v1]
		default:
			if s.chunkBounced(r) {
				r.buf = nil // read chunk by chunk into an inline slot's buffer
				break
			}
			need := r.n * stride
			if len(cur) < need {
				b, err := s.getBounce()
				if err != nil {
					w.ios = ios
					return err
				}
				w.bounces = append(w.bounces, b)
				cur = b
			}
			r.buf, cur = cur[:need:need], cur[need:]
			io.Buf = r.buf
		}
		ios = append(ios, io)
	}
	w.ios = ios
	if s.inline != nil {
		s.readInline(runs, ios, wants)
		return nil
	}
	if s.notify != nil && len(runs) > 1 {
		return s.readNotified(runs, ios, wants)
	}
	if err := s.e.Do(ios); err != nil {
		return fmt.Errorf("store: read: %w", err)
	}
	first := wants[runs[0].lo].run
	for i := range runs {
		s.failRun(&runs[i], ios[i].Err, wants)
	}
	s.verify(runs, first, wants[runs[0].lo:runs[len(runs)-1].hi])
	return nil
}
