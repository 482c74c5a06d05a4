package store

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/internal/freelist"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store/index"
)

// Tag is a block's 16-byte tag: the caller's hash of what the block stands
// for (model, dtype, shard, token chain). The zero tag is "untagged".
type Tag = index.Tag

// TagMatches reports whether a block stored under stored serves a request
// that expects want (ReadReq.Tag, LocateReq.Tag): nil or the zero tag
// expects none.
func TagMatches(want *Tag, stored Tag) bool {
	return want == nil || *want == stored || want.IsZero()
}

// BlockMeta is what a block says of itself besides its groups: its tag and
// its parent (the block before it in its sequence).
type BlockMeta = index.Meta

// Options control Open.
type Options struct {
	// Logger receives the store's log lines; nil means none.
	Logger *zap.Logger
	// Now is the clock for group write times; nil means time.Now.
	Now func() time.Time
	// Expect, when set, makes Open fail with ErrGeometry unless the store
	// has exactly this geometry.
	Expect *layout.Geometry
	// MaxIO bounds one coalesced read or write (default 1 MiB).
	MaxIO int
	// ReadOnly opens the store without recovery writes.
	ReadOnly bool
	// Failpoint, when set, is called at named points of the write path
	// ("before-tombstones", "before-payloads", "before-headers",
	// "before-sync"; "before-superblocks" of UpgradeFormat); an error it
	// returns fails the operation there, as an engine error would.
	Failpoint func(name string) error
	// ScatterMin is the shortest memory segment (a row of a pitched read
	// destination, or a whole contiguous one) that the store reads
	// straight into place with a vector read (on engines that implement
	// VectorReader); a run with shorter segments is read into a bounce
	// buffer and copied once. Default 4096: small segments cost more than
	// a copy (with O_DIRECT, 512-byte rows scattered were several times
	// slower than one bounce; see docs/performance.md, 'Disk store'). 1
	// scatters every segment the engine's alignment allows.
	ScatterMin int
	// InlineChunk is, on an engine whose reads are CPU copies
	// (InlineReader), how many bytes of a run are read before their
	// groups are verified, so that the checksum reads them from the
	// core's cache. 0 means DefaultInlineChunk.
	InlineChunk int
	// NoViewReads keeps an inline engine's bounced reads as copies into
	// the chunk buffers even where the engine offers a host view of its
	// file (HostViewer): by default they are verified and landed straight
	// from the view (see readInlineRun).
	NoViewReads bool
	// Observe, when set, is called after each Read and Write batch.
	Observe func(op Op, groups int, d time.Duration)
	// Lease, when set (and not ReadOnly), makes Open take the store's
	// ownership lease and the store renew it until Close; see LeaseOffset.
	// Open fails with ErrLeaseHeld while another host holds it.
	Lease *LeaseOptions
	// OpenProgress, when set, is called during Open's scan of every slot's
	// headers with the bytes of header copies read so far of the total.
	OpenProgress func(done, total int64)
	// Evict is the eviction policy: index.Prefix (the zero value) evicts
	// leaves of the prefix forest that the blocks' parents form, least
	// recently used first; index.LRU evicts the least recently used block.
	Evict index.Policy
}

// slotState is the in-memory copy of one slot's current header. Guarded by
// Store.mu.
type slotState struct {
	hdr  *Header // nil when the slot is free and holds no live header
	cur  int     // header copy holding the current header, -1 when none is valid
	gen  uint64  // generation of the current copy (also for tombstones)
	pins int     // readers and writers using the slot's payloads

	// free-list bookkeeping
	quarantined bool // unknown on-disk state after a failed write: not reused until reopen
	releasing   bool // freed while pinned: goes to the free list on the last unpin
	stream      uint16
}

// Store is an open slot store. All methods are safe for concurrent use.
//
// Lock order: wmu before mu. wmu serialises every operation that writes
// (Write, Delete, DeleteBlock, RenameBlock, Fsck); mu guards the index (with
// its eviction order), the slot states and the free list, and is never held
// across I/O.
type Store struct {
	e  Engine
	sb Superblock // as read at Open (the version may have moved on: ver)
	// ver is the format version in force: sb.Version, raised by
	// UpgradeFormat.
	ver  atomic.Uint32
	geo  layout.Geometry
	log  *zap.Logger
	now  func() time.Time
	opts Options
	vec  bool // the engine takes vector reads (VectorReader)
	// notify is the engine when it reports completions during a Do
	// (NotifyEngine): reads are then verified run by run as they land.
	notify NotifyEngine
	// inline is the engine when its reads are CPU copies (InlineReader):
	// each run is read and verified by one goroutine.
	inline InlineReader
	// inlineSlots bounds the runs read inline at once, over all calls
	// (GOMAXPROCS tokens; a goroutine holds one for a run, MaxIO bytes at
	// most): each call spreads its runs over up to GOMAXPROCS goroutines,
	// and with many callers their chunks, read into a core's cache to be
	// verified there, evicted each other's as the goroutines took turns on
	// the cores.
	// Each slot carries its chunk buffer (nil until a bounced run needs
	// it; readInlineRun), so the chunks an inline engine's bounced reads
	// land in are GOMAXPROCS buffers of InlineChunk bytes, kept warm.
	inlineSlots chan []byte
	// inlineChunk is the bytes an inline read moves before its groups
	// are verified (Options.InlineChunk).
	inlineChunk int
	// view is the host view bounced inline runs are verified and landed
	// from, or nil (no inline engine, Options.NoViewReads): an inline
	// engine's file in memory, mapped read-only (HostViewer), made at
	// open, when its engine starts mapping its pages in the background
	// (engine/uring populateView). An inline read into a chunk buffer
	// costs the kernel's copy of every byte, a large part of the daemon's
	// CPU in a load by many callers (see docs/performance.md, 'CPU per
	// GB'); reading through the view leaves that copy out (the checksum
	// reads the page cache itself). The
	// view lives as long as the engine; the store is closed first. The
	// bytes checked are the bytes landed, as from a chunk buffer, unless
	// something other than the store writes the file between the two
	// (the checksum guards against corruption at rest, not against a
	// writer of the store file: one could rewrite the headers' checksums
	// too).
	view []byte
	// shift4 joins the four checksums crcLand takes of a group as it
	// copies it; nil where that copy does not run (crcLand then checksums,
	// then copies).
	shift4 *crcShift
	lease  *lease // the ownership lease held, nil without Options.Lease

	sbProblems []string // superblock copies found damaged at open

	// bounce keeps MaxIO-sized I/O buffers for reuse, so reads and writes
	// that cannot land in the caller's memory do not map and unmap
	// memory (or drain the engine's registered pool) on every call.
	bounce struct {
		sync.Mutex
		free [][]byte
	}

	// failMu guards the outcome of a range read request whose groups
	// fail on several goroutines at once (a leaf lock; see fail).
	failMu sync.Mutex

	// scratch keeps Read's per-call working memory (a leaf lock).
	scratch freelist.List[readScratch]

	// wq queues Write calls for the next committer (a leaf lock).
	wq struct {
		sync.Mutex
		pending []*writeCall
	}

	wmu sync.Mutex
	mu  struct {
		sync.Mutex
		closed bool
		slots  []slotState
		// idx maps blocks to slots and keeps the eviction order.
		idx    *index.Index
		free   []int64
		gen    uint64 // last generation handed out
		allocs uint64
		// readers counts Read batches holding pins; with none (and wmu
		// held) no slot is pinned.
		readers int
	}
	m metrics
}

type metrics struct {
	reads, writes, bytesRead, bytesWritten, hits, misses, evictions, corrupt, ioErrors, bounced, writeBounced, commits, tagMismatch atomic.Uint64
}

// Metrics is a snapshot of the store's counters.
type Metrics struct {
	Reads        uint64 // groups read
	Writes       uint64 // groups written
	BytesRead    uint64
	BytesWritten uint64
	Hits         uint64 // groups found
	Misses       uint64 // groups asked for and absent
	Evictions    uint64 // blocks evicted to make room
	Corrupt      uint64 // groups whose checksum failed on read
	IOErrors     uint64
	// Bounced counts group bytes read into store memory and copied to
	// the caller (the rest landed straight in the caller's memory).
	Bounced uint64
	// WriteBounced counts group bytes copied into store memory to be
	// written (the rest went to the device straight from the caller's).
	WriteBounced uint64
	// Commits counts write commits: one Write call, or several concurrent
	// ones committed together (group commit), each with its own syncs.
	Commits uint64
	// TagMismatch counts read requests that found their block stored
	// under another tag than the one they expected (ErrTagMismatch; their
	// groups also count as misses).
	TagMismatch uint64
}

// Info describes an open store.
type Info struct {
	UUID        string
	Version     uint32 // format version (FormatVersion, or an older one the store was made with)
	Geometry    layout.Geometry
	GroupBytes  int
	GroupStride int64
	HeaderBytes int64
	SlotBytes   int64
	Slots       int64
	UsedSlots   int64
	FreeSlots   int64
	Size        int64
	Created     time.Time
	Engine      string
}

// DefaultInlineChunk is Options.InlineChunk's default: a chunk this size
// is still in the reading core's cache when its groups are verified and
// landed; larger chunks, up to whole 1 MiB runs, loaded measurably slower
// (see docs/performance.md, 'Store batched reads').
const DefaultInlineChunk = 64 << 10

// Open opens the store on e and recovers its index from the slot headers.
// The caller keeps ownership of e and closes it after the store.
func Open(e Engine, o Options) (*Store, error) {
	s := &Store{e: e, opts: o, log: o.Logger, now: o.Now}
	if s.log == nil {
		s.log = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.opts.MaxIO <= 0 {
		s.opts.MaxIO = 1 << 20
	}
	if v, ok := e.(VectorReader); ok && v.VectorReads() {
		s.vec = true
	}
	if n, ok := e.(NotifyEngine); ok {
		s.notify = n
	}
	if r, ok := e.(InlineReader); ok && r.InlineReads() {
		s.inline = r
		s.inlineSlots = make(chan []byte, runtime.GOMAXPROCS(0))
		for range cap(s.inlineSlots) {
			s.inlineSlots <- nil
		}
	}
	if s.opts.ScatterMin <= 0 {
		s.opts.ScatterMin = 4096
	}
	s.inlineChunk = s.opts.InlineChunk
	if s.inlineChunk <= 0 {
		s.inlineChunk = DefaultInlineChunk
	}
	if e.Align() > SuperblockSize {
		return nil, fmt.Errorf("%w: alignment %d above %d", ErrEngine, e.Align(), SuperblockSize)
	}
	sb, err := s.readSuperblock()
	if err != nil {
		return nil, err
	}
	s.sb = *sb
	s.ver.Store(sb.Version)
	s.geo = sb.Geometry
	if gb := s.geo.GroupBytes(); haveNT && haveCRCCopy && gb%256 == 0 {
		s.shift4 = newCRCShift(gb / 4)
	}
	if o.Expect != nil && *o.Expect != s.geo {
		return nil, fmt.Errorf("%w: store has %v, expected %v", ErrGeometry, s.geo, *o.Expect)
	}
	if s.geo.Align%e.Align() != 0 {
		return nil, fmt.Errorf("%w: the device needs %d-byte alignment, the store aligns to %d", ErrEngine, e.Align(), s.geo.Align)
	}
	if sb.DataOffset+sb.Slots*sb.SlotBytes > e.Size() {
		return nil, fmt.Errorf("%w: store needs %d bytes, device has %d", ErrTooSmall, sb.DataOffset+sb.Slots*sb.SlotBytes, e.Size())
	}
	// Whole groups per I/O, at least one.
	stride := int(s.geo.GroupStride())
	s.opts.MaxIO = max(1, s.opts.MaxIO/stride) * stride
	if o.Lease != nil && !o.ReadOnly {
		if err := s.acquireLease(*o.Lease); err != nil {
			return nil, err
		}
	}
	if err := s.rebuildIndex(); err != nil {
		_ = s.releaseLease()
		return nil, err
	}
	if s.inline != nil && !o.NoViewReads {
		s.view = s.HostView()
	}
	return s, nil
}

func (s *Store) readSuperblock() (*Superblock, error) {
	var sbs [2]*Superblock
	var errs [2]error
	for c, off := range []int64{0, superblockCopy1} {
		b, err := readAligned(s.e, off, SuperblockSize)
		if err != nil {
			errs[c] = fmt.Errorf("%w: copy %d: %v", ErrSuperblock, c, err)
			continue
		}
		sbs[c], errs[c] = UnmarshalSuperblock(b)
	}
	switch {
	case sbs[0] != nil && sbs[1] != nil:
		if sbs[0].UUID != sbs[1].UUID {
			s.sbProblems = append(s.sbProblems, "superblock copies disagree (copy 1 belongs to another store)")
		}
		return sbs[0], nil
	case sbs[0] != nil || sbs[1] != nil:
		good, bad := 0, 1
		if sbs[0] == nil {
			good, bad = 1, 0
		}
		msg := fmt.Sprintf("superblock copy %d damaged (%v); using copy %d", bad, errs[bad], good)
		s.log.Warn("store: " + msg)
		s.sbProblems = append(s.sbProblems, msg)
		return sbs[good], nil
	}
	for _, err := range errs {
		if errors.Is(err, ErrVersion) {
			return nil, err
		}
	}
	if errors.Is(errs[0], ErrNoStore) && errors.Is(errs[1], ErrNoStore) {
		return nil, fmt.Errorf("%w (no superblock found; run kvfs format)", ErrNoStore)
	}
	return nil, fmt.Errorf("%w: both copies unusable: %v; %v", ErrSuperblock, errs[0], errs[1])
}

func (s *Store) slotOffset(slot int64) int64 { return s.sb.DataOffset + slot*s.sb.SlotBytes }

func (s *Store) headerOffset(slot int64, c int) int64 {
	return s.slotOffset(slot) + int64(c)*s.sb.HeaderBytes
}

func (s *Store) groupOffset(slot int64, idx int) int64 {
	return s.slotOffset(slot) + 2*s.sb.HeaderBytes + s.geo.Offset(idx)
}

// headerScan is what recovery and fsck learn about one slot's two copies.
type headerScan struct {
	hdr     [2]*Header
	err     [2]error
	cur     int // -1 when neither copy is valid
	damaged []int
}

// scanHeaders reads both header copies of slots [first, first+n).
func (s *Store) scanHeaders(first, n int64) ([]headerScan, error) {
	hb := s.sb.HeaderBytes
	buf, err := AllocAligned(int(n * 2 * hb))
	if err != nil {
		return nil, err
	}
	defer FreeAligned(buf)
	ios := make([]IO, n)
	for i := range n {
		ios[i] = IO{Op: OpRead, Off: s.headerOffset(first+i, 0), Buf: buf[i*2*hb : (i+1)*2*hb], Stream: StreamMeta}
	}
	if err := s.e.Do(ios); err != nil {
		return nil, err
	}
	out := make([]headerScan, n)
	for i := range n {
		sc := &out[i]
		sc.cur = -1
		if ios[i].Err != nil {
			return nil, fmt.Errorf("store: read headers of slot %d: %w", first+i, ios[i].Err)
		}
		for c := range 2 {
			b := ios[i].Buf[int64(c)*hb : int64(c+1)*hb]
			sc.hdr[c], sc.err[c] = UnmarshalHeader(b, s.sb.UUID, first+i, s.geo.GroupsPerBlock())
			if sc.err[c] != nil && !errors.Is(sc.err[c], errHeaderEmpty) && !errors.Is(sc.err[c], errHeaderOther) {
				sc.damaged = append(sc.damaged, c)
			}
			if sc.hdr[c] != nil && (sc.cur < 0 || sc.hdr[c].Gen > sc.hdr[sc.cur].Gen) {
				sc.cur = c
			}
		}
	}
	return out, nil
}

const scanChunk = 256

// rebuildIndex rebuilds the in-memory state (the index with its recency
// order, slot states, free list) from every slot's current header; Open
// runs it. When two
// slots claim the same block (a crash between a copy-on-write commit and the
// old slot's tombstone), the higher generation wins and the other slot is
// tombstoned before it can be reused.
func (s *Store) rebuildIndex() error {
	n := s.sb.Slots
	s.mu.slots = make([]slotState, n)
	s.mu.idx = index.New(n, s.opts.Evict)
	byBlock := make(map[uint64]int64)
	type live struct {
		slot int64
		gen  uint64
	}
	var lives []live
	var losers []int64
	for first := int64(0); first < n; first += scanChunk {
		cnt := min(scanChunk, n-first)
		scans, err := s.scanHeaders(first, cnt)
		if err != nil {
			return err
		}
		if p := s.opts.OpenProgress; p != nil {
			p((first+cnt)*2*s.sb.HeaderBytes, n*2*s.sb.HeaderBytes)
		}
		for i, sc := range scans {
			slot := first + int64(i)
			st := &s.mu.slots[slot]
			st.cur = sc.cur
			if sc.cur < 0 {
				continue
			}
			h := sc.hdr[sc.cur]
			st.gen = h.Gen
			s.mu.gen = max(s.mu.gen, h.Gen)
			if !h.Live || h.Count() == 0 {
				continue
			}
			if old, ok := byBlock[h.Block]; ok {
				if s.mu.slots[old].gen > h.Gen {
					losers = append(losers, slot)
					st.hdr = h
					continue
				}
				losers = append(losers, old)
			}
			st.hdr = h
			byBlock[h.Block] = slot
		}
	}
	for _, slot := range byBlock {
		lives = append(lives, live{slot, s.mu.slots[slot].gen})
	}
	// Recency: the most recently written block is the most recently used,
	// so blocks are indexed oldest first.
	sort.Slice(lives, func(i, j int) bool { return lives[i].gen < lives[j].gen })
	for _, l := range lives {
		h := s.mu.slots[l.slot].hdr
		s.mu.idx.Insert(l.slot, h.Block, h.Meta, s.fullLocked(h))
	}
	if len(losers) > 0 {
		if s.opts.ReadOnly {
			for _, slot := range losers {
				s.mu.slots[slot].quarantined = true
			}
		} else {
			s.log.Info("store: dropping stale copies of blocks", zap.Int("slots", len(losers)))
			if err := s.tombstone(losers); err != nil {
				return err
			}
			if err := s.e.Sync(); err != nil {
				return fmt.Errorf("store: sync: %w", err)
			}
			for _, slot := range losers {
				s.mu.slots[slot].hdr = nil
			}
		}
	}
	for slot := n - 1; slot >= 0; slot-- {
		if st := &s.mu.slots[slot]; st.hdr == nil && !st.quarantined {
			s.mu.free = append(s.mu.free, slot)
		}
	}
	s.log.Info("store: opened", zap.String("uuid", s.sb.UUIDString()), zap.Int64("slots", n),
		zap.Int("blocks", s.mu.idx.Len()), zap.String("geometry", s.geo.String()))
	return nil
}

// tombstone writes a tombstone header into the non-current copy of each slot
// (no sync) and records it in memory. Slots whose write fails are quarantined.
// Called with wmu held (or during Open); takes mu.
func (s *Store) tombstone(slots []int64) error {
	if len(slots) == 0 {
		return nil
	}
	hb := int(s.sb.HeaderBytes)
	buf, err := s.alloc(len(slots) * hb)
	if err != nil {
		// Nothing was written, but the callers count on a slot being
		// either tombstoned or quarantined: a slot released with its live
		// header still current could be reused, and a reopen would bring
		// its block back over the new payloads.
		s.mu.Lock()
		for _, slot := range slots {
			s.mu.slots[slot].quarantined = true
		}
		s.mu.Unlock()
		return fmt.Errorf("store: tombstone: %w", err)
	}
	defer s.freeBuf(buf)
	ios := make([]IO, len(slots))
	copies := make([]int, len(slots))
	gens := make([]uint64, len(slots))
	s.mu.Lock()
	for i, slot := range slots {
		st := &s.mu.slots[slot]
		s.mu.gen++
		gens[i] = s.mu.gen
		h := newHeader(s.geo.GroupsPerBlock())
		h.Slot, h.Gen = slot, s.mu.gen
		if st.hdr != nil {
			h.Block = st.hdr.Block
		}
		copies[i] = 1 - max(st.cur, 0)
		if st.cur < 0 {
			copies[i] = 0
		}
		b := buf[i*hb : (i+1)*hb]
		s.marshalHeader(b, h)
		ios[i] = IO{Op: OpWrite, Off: s.headerOffset(slot, copies[i]), Buf: b, Stream: StreamMeta}
	}
	s.mu.Unlock()
	if err := s.failpoint("before-tombstones"); err != nil {
		return err
	}
	engErr := s.e.Do(ios)
	var firstErr error
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, slot := range slots {
		st := &s.mu.slots[slot]
		err := engErr
		if err == nil {
			err = ios[i].Err
		}
		if err != nil {
			st.quarantined = true
			s.m.ioErrors.Add(1)
			if firstErr == nil {
				firstErr = fmt.Errorf("store: tombstone slot %d: %w", slot, err)
			}
			continue
		}
		st.cur, st.gen = copies[i], gens[i]
	}
	return firstErr
}

// failpoint runs before each write phase: it refuses the write once the
// ownership lease is lost, then calls Options.Failpoint.
func (s *Store) failpoint(name string) error {
	if err := s.checkLease(); err != nil {
		return err
	}
	if s.opts.Failpoint == nil {
		return nil
	}
	if err := s.opts.Failpoint(name); err != nil {
		return fmt.Errorf("store: failpoint %s: %w", name, err)
	}
	return nil
}

func (s *Store) alloc(n int) ([]byte, error) {
	if a, ok := s.e.(BufferAllocator); ok {
		return a.AllocBuffer(n)
	}
	return AllocAligned(n)
}

// maxBounce is how many idle bounce buffers the store keeps.
const maxBounce = 32

// getBounce returns a buffer of MaxIO bytes; give it back with putBounce.
func (s *Store) getBounce() ([]byte, error) {
	s.bounce.Lock()
	if n := len(s.bounce.free); n > 0 {
		b := s.bounce.free[n-1]
		s.bounce.free = s.bounce.free[:n-1]
		s.bounce.Unlock()
		return b, nil
	}
	s.bounce.Unlock()
	return s.alloc(s.opts.MaxIO)
}

func (s *Store) putBounce(b []byte) {
	b = b[:s.opts.MaxIO]
	s.bounce.Lock()
	if len(s.bounce.free) < maxBounce {
		s.bounce.free = append(s.bounce.free, b)
		b = nil
	}
	s.bounce.Unlock()
	if b != nil {
		s.freeBuf(b)
	}
}

func (s *Store) freeBuf(b []byte) {
	if a, ok := s.e.(BufferAllocator); ok {
		a.FreeBuffer(b)
		return
	}
	FreeAligned(b)
}

// Geometry is the store's geometry.
func (s *Store) Geometry() layout.Geometry { return s.geo }

// Superblock returns a copy of the superblock in use.
func (s *Store) Superblock() Superblock {
	sb := s.sb
	sb.Version = s.formatVersion()
	return sb
}

// Engine is the engine the store runs on.
func (s *Store) Engine() Engine { return s.e }

// Info describes the store.
func (s *Store) Info() Info {
	s.mu.Lock()
	used := int64(s.mu.idx.Len())
	s.mu.Unlock()
	return Info{
		UUID: s.sb.UUIDString(), Version: s.formatVersion(), Geometry: s.geo,
		GroupBytes: s.geo.GroupBytes(), GroupStride: s.geo.GroupStride(),
		HeaderBytes: s.sb.HeaderBytes, SlotBytes: s.sb.SlotBytes,
		Slots: s.sb.Slots, UsedSlots: used, FreeSlots: s.sb.Slots - used,
		Size: s.sb.Size, Created: s.sb.Created, Engine: s.e.Name(),
	}
}

// Metrics returns the store's counters.
func (s *Store) Metrics() Metrics {
	return Metrics{
		Reads: s.m.reads.Load(), Writes: s.m.writes.Load(),
		BytesRead: s.m.bytesRead.Load(), BytesWritten: s.m.bytesWritten.Load(),
		Hits: s.m.hits.Load(), Misses: s.m.misses.Load(), Evictions: s.m.evictions.Load(),
		Corrupt: s.m.corrupt.Load(), IOErrors: s.m.ioErrors.Load(), Bounced: s.m.bounced.Load(), WriteBounced: s.m.writeBounced.Load(), Commits: s.m.commits.Load(),
		TagMismatch: s.m.tagMismatch.Load(),
	}
}

// BlockInfo describes one block in the store.
type BlockInfo struct {
	ID      uint64
	Groups  int       // present groups
	MTime   time.Time // latest group write
	Present []uint64  // bitmap by layout.Index
	Meta    BlockMeta // tag and parent (zero in a format version 1 store)
}

// Has reports whether group idx of the block is present.
func (b BlockInfo) Has(idx int) bool { return b.Present[idx/64]&(1<<(idx%64)) != 0 }

func blockInfo(h *Header) BlockInfo {
	bi := BlockInfo{ID: h.Block, Groups: h.Count(), Present: append([]uint64(nil), h.Present...), Meta: h.Meta}
	var t int64
	for i, mt := range h.MTime {
		if h.Has(i) && mt > t {
			t = mt
		}
	}
	bi.MTime = time.Unix(0, t)
	return bi
}

// Blocks lists the blocks in the store, sorted by id.
func (s *Store) Blocks() []BlockInfo {
	s.mu.Lock()
	out := make([]BlockInfo, 0, s.mu.idx.Len())
	s.mu.idx.Each(func(slot int64, _ uint64) bool {
		out = append(out, blockInfo(s.mu.slots[slot].hdr))
		return true
	})
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Block describes one block; ok is false when it is absent.
func (s *Store) Block(id uint64) (BlockInfo, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.mu.idx.Slot(id)
	if !ok {
		return BlockInfo{}, false
	}
	return blockInfo(s.mu.slots[slot].hdr), true
}

// lookupChunk is how many ids Lookup answers per hold of mu, so that a
// large lookup does not hold readers and writers off for its whole length.
const lookupChunk = 1024

// Lookup answers, for each blocks[i] with the tag tags[i] it is expected to
// carry (zero, or beyond the end of tags: any tag), whether the block is
// stored whole with that tag (index.Present), stored under another tag
// (index.TagMismatch) or not stored whole (index.Absent), into out[i]; it
// answers min(len(blocks), len(out)) ids. It returns the leading run of
// Present answers: how many blocks of a prefix the store can serve. It does
// no I/O, pins nothing and is no use of a block (eviction order stays).
func (s *Store) Lookup(blocks []uint64, tags []Tag, out []index.Status) (run int) {
	n := min(len(blocks), len(out))
	run = -1
	for lo := 0; lo < n; lo += lookupChunk {
		hi := min(lo+lookupChunk, n)
		s.mu.Lock()
		for i := lo; i < hi; i++ {
			var t Tag
			if i < len(tags) {
				t = tags[i]
			}
			out[i] = s.mu.idx.Lookup(blocks[i], t)
		}
		s.mu.Unlock()
		if run < 0 {
			for i := lo; i < hi; i++ {
				if out[i] != index.Present {
					run = i
					break
				}
			}
		}
	}
	if run < 0 {
		run = n
	}
	return run
}

// GroupInfo describes one present group.
type GroupInfo struct {
	Key   layout.Key
	Size  int
	CRC   uint32 // CRC32C of the group's bytes, as recorded when written
	MTime time.Time
	Slot  int64
}

// Stat describes group k, or returns ErrNotFound.
func (s *Store) Stat(k layout.Key) (GroupInfo, error) {
	if err := s.geo.CheckKey(k); err != nil {
		return GroupInfo{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	idx := s.geo.Index(k)
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, ok := s.mu.idx.Slot(k.Block)
	if !ok || !s.mu.slots[slot].hdr.Has(idx) {
		return GroupInfo{}, fmt.Errorf("%w: %v", ErrNotFound, k)
	}
	h := s.mu.slots[slot].hdr
	return GroupInfo{Key: k, Size: s.geo.GroupBytes(), CRC: h.CRC[idx], MTime: time.Unix(0, h.MTime[idx]), Slot: slot}, nil
}

// fullLocked reports whether h holds every group of its block.
func (s *Store) fullLocked(h *Header) bool { return h.Count() == s.geo.GroupsPerBlock() }

// unpin drops one pin of each slot; a slot freed while pinned goes to the
// free list when its last pin drops. reader is true for the pins of a Read
// batch (which counted itself in readers when it took them).
func (s *Store) unpin(slots []int64, reader bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reader {
		s.mu.readers--
	}
	for _, slot := range slots {
		st := &s.mu.slots[slot]
		st.pins--
		if st.pins == 0 && st.releasing {
			st.releasing = false
			s.mu.free = append(s.mu.free, slot)
		}
	}
}

// releaseLocked returns a slot whose on-disk header is a tombstone to the
// free list (or marks it to go there once unpinned). The slot is no longer
// indexed (the caller removed it, or indexed its block elsewhere).
func (s *Store) releaseLocked(slot int64) {
	st := &s.mu.slots[slot]
	st.hdr = nil
	if st.quarantined {
		return
	}
	if st.pins > 0 {
		st.releasing = true
		return
	}
	s.mu.free = append(s.mu.free, slot)
}

// closeHook, when set (by the store's tests), runs in Close with wmu held,
// before the store is marked closed, while the engine is still open.
var closeHook func(s *Store)

// Close makes everything durable and closes the store (not the engine).
func (s *Store) Close() error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	if closeHook != nil {
		closeHook(s)
	}
	s.mu.Lock()
	s.mu.closed = true
	s.mu.Unlock()
	s.bounce.Lock()
	for _, b := range s.bounce.free {
		s.freeBuf(b)
	}
	s.bounce.free = nil
	s.bounce.Unlock()
	if s.opts.ReadOnly {
		return nil
	}
	if err := s.releaseLease(); err != nil {
		s.log.Warn("releasing the ownership lease", zap.Error(err))
	}
	if err := s.e.Sync(); err != nil {
		return fmt.Errorf("store: sync on close: %w", err)
	}
	return nil
}

func (s *Store) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return ErrClosed
	}
	return nil
}
