package tier

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
)

// Options configure New.
type Options struct {
	// Bytes is the size of the tier's memory; it holds Bytes divided by a
	// block's payload (store.Geometry().PayloadBytes()) whole blocks.
	Bytes int64
	// Logger receives the tier's log lines; nil means none.
	Logger *zap.Logger
	// Evict orders the tier's evictions, as store.Options.Evict does the
	// store's: index.Prefix (the zero value) evicts leaves of the prefix
	// forest the cached blocks' parents form, least recently used first;
	// index.LRU the least recently used block.
	Evict index.Policy
	// NoRegisterMemory leaves the tier's memory unregistered with the
	// store's engine (see Metrics.Registered).
	NoRegisterMemory bool
}

// Metrics is a snapshot of the tier's counters. Hits and Misses count
// groups: a group a read asked for is a hit when it landed from the tier's
// memory, a miss when the store served it (reading it into the tier or
// for the caller alone).
type Metrics struct {
	Bytes     int64 // the tier's memory (Options.Bytes)
	Slots     int64 // blocks it can hold
	Blocks    int64 // blocks it holds now
	HugePages bool  // the memory is reserved huge pages (else base pages, transparent huge pages asked for)
	// Registered: the memory is registered with the store's engine (an
	// io_uring fixed buffer), so reads from the store into it use
	// READ_FIXED and the kernel pins no pages per read.
	Registered bool
	Hits       uint64
	Misses     uint64
	// Evictions counts blocks dropped to make room for another.
	Evictions uint64
	// Invalidations counts blocks dropped because the store's version
	// changed (a write, delete, rename, or the store's own eviction).
	Invalidations uint64
	// PromotedBytes counts the bytes of groups read from the store into
	// the tier.
	PromotedBytes uint64
	// WrittenBytes counts the bytes of whole blocks written through the
	// tier that it kept (Write).
	WrittenBytes uint64
	// Corrupt counts groups whose copy in the tier failed its checksum
	// on a hit: the block was dropped and the store read again.
	Corrupt uint64
}

// entry is the state of one tier slot. Guarded by Tier.mu.
type entry struct {
	gen     uint64 // the store generation the copy was read under
	pins    int32  // reads landing from (or filling) the slot
	filling bool   // being read from the store; not served yet
	dead    bool   // dropped while pinned: freed by the last unpin
}

// Tier is a DRAM cache of whole blocks in front of a store. All methods are
// safe for concurrent use. See the package documentation.
type Tier struct {
	st     *store.Store
	geo    layout.Geometry
	gb     int   // group bytes
	stride int64 // distance between groups in a slot (the store's group stride)
	groups int   // groups per block
	sb     int64 // bytes per slot
	slots  int64
	words  int // presence bitmap words per slot
	ar     *arena
	log    *zap.Logger
	// unregister undoes the registration of the arena with the store's
	// engine; nil when it is not registered.
	unregister func()

	// present and crc are per slot: which groups the copy holds and the
	// CRC32C each was verified against. Written by the read that fills
	// the slot while it is pinned and not yet served; read by hits after
	// pinning it under mu.
	present []uint64
	crc     []uint32

	// life is held shared by every read landing from the arena and
	// exclusively by Close, which unmaps it.
	life   sync.RWMutex
	closed bool // under life

	mu struct {
		sync.Mutex
		idx  *index.Index // block ↔ slot, and the eviction order
		ent  []entry
		free []int64
	}
	scratch  sync.Pool // *scratch
	wscratch sync.Pool // *wscratch
	m        struct {
		hits, misses, evictions, invalidations, promoted, written, corrupt atomic.Uint64
	}
}

// New returns a tier of o.Bytes in front of st, its memory mapped and
// faulted in. A size below one block is ErrInvalid; a size the machine
// cannot give is ErrTooLarge (the message says how much is available).
// The store must stay open until Close.
func New(st *store.Store, o Options) (*Tier, error) {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	g := st.Geometry()
	sb := g.PayloadBytes()
	slots := o.Bytes / sb
	if slots < 1 {
		return nil, fmt.Errorf("%w: a DRAM tier of %s holds no block of %s", store.ErrInvalid, bytesize.Format(o.Bytes), bytesize.Format(sb))
	}
	ar, err := mapArena(slots * sb)
	if err != nil {
		return nil, err
	}
	t := &Tier{
		st: st, geo: g, gb: g.GroupBytes(), stride: g.GroupStride(), groups: g.GroupsPerBlock(),
		sb: sb, slots: slots, words: (g.GroupsPerBlock() + 63) / 64, ar: ar, log: o.Logger,
	}
	t.present = make([]uint64, int(slots)*t.words)
	t.crc = make([]uint32, int(slots)*t.groups)
	t.mu.idx = index.New(slots, o.Evict)
	t.mu.ent = make([]entry, slots)
	t.mu.free = make([]int64, 0, slots)
	for s := slots - 1; s >= 0; s-- {
		t.mu.free = append(t.mu.free, s)
	}
	t.scratch.New = func() any { return new(scratch) }
	if r, ok := st.Engine().(store.MemoryRegistrar); ok && !o.NoRegisterMemory {
		// Misses land straight in the arena (whole aligned slots); as a
		// fixed buffer the kernel does not pin its pages on every read.
		if un, err := r.RegisterMemory(ar.b); err == nil {
			t.unregister = un
		} else {
			t.log.Info("tier: the DRAM tier's memory is not registered with the store's engine: reads into it use plain buffers", zap.Error(err))
		}
	}
	if ar.thpWhy != "" {
		t.log.Info("tier: the DRAM tier is on transparent huge pages, not the reserved ones", zap.String("why", ar.thpWhy))
	}
	t.log.Info("tier: DRAM tier ready", zap.String("bytes", bytesize.Format(slots*sb)),
		zap.Int64("blocks", slots), zap.Bool("huge_pages", ar.huge), zap.Bool("registered", t.unregister != nil),
		zap.String("evict", o.Evict.String()))
	return t, nil
}

// Close unmaps the tier's memory once the reads landing from it are done;
// later reads fail with store.ErrClosed. It does not close the store.
func (t *Tier) Close() error {
	t.life.Lock()
	defer t.life.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	if t.unregister != nil {
		t.unregister()
	}
	return t.ar.free()
}

// Metrics returns the tier's counters; a nil tier (none configured)
// answers zeros.
func (t *Tier) Metrics() Metrics {
	if t == nil {
		return Metrics{}
	}
	t.mu.Lock()
	blocks := int64(t.mu.idx.Len())
	t.mu.Unlock()
	return Metrics{
		Bytes: t.slots * t.sb, Slots: t.slots, Blocks: blocks, HugePages: t.ar.huge, Registered: t.unregister != nil,
		Hits: t.m.hits.Load(), Misses: t.m.misses.Load(), Evictions: t.m.evictions.Load(),
		Invalidations: t.m.invalidations.Load(), PromotedBytes: t.m.promoted.Load(), WrittenBytes: t.m.written.Load(),
		Corrupt: t.m.corrupt.Load(),
	}
}

// Holds reports whether the tier holds a copy of block b now (a copy a
// read may still find stale).
func (t *Tier) Holds(b uint64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.mu.idx.Slot(b)
	return ok
}

// Delete deletes groups in the store (store.Delete) and drops the tier's
// copies of their blocks.
func (t *Tier) Delete(keys []layout.Key) error {
	err := t.st.Delete(keys)
	t.mu.Lock()
	for _, k := range keys {
		t.dropBlockLocked(k.Block)
	}
	t.mu.Unlock()
	return err
}

// DeleteBlock deletes a whole block in the store (store.DeleteBlock) and
// drops the tier's copy.
func (t *Tier) DeleteBlock(id uint64) error {
	err := t.st.DeleteBlock(id)
	t.mu.Lock()
	t.dropBlockLocked(id)
	t.mu.Unlock()
	return err
}

// RenameBlock renames a block in the store (store.RenameBlock) and drops
// the tier's copies of both ids: the renamed block is read again under its
// new id (a rename is rare next to reads: fs renames of staged blocks).
func (t *Tier) RenameBlock(from, to uint64) error {
	err := t.st.RenameBlock(from, to)
	t.mu.Lock()
	t.dropBlockLocked(from)
	t.dropBlockLocked(to)
	t.mu.Unlock()
	return err
}

// dropBlockLocked drops the tier's copy of block b, if any. t.mu is held.
func (t *Tier) dropBlockLocked(b uint64) {
	if slot, ok := t.mu.idx.Slot(b); ok {
		t.m.invalidations.Add(1)
		t.releaseLocked(slot)
	}
}

// releaseLocked takes slot out of the index; it is free at once, or at
// its last unpin when reads still use it. t.mu is held.
func (t *Tier) releaseLocked(slot int64) {
	t.mu.idx.Remove(slot)
	e := &t.mu.ent[slot]
	if e.pins > 0 {
		e.dead = true
		return
	}
	*e = entry{}
	t.mu.free = append(t.mu.free, slot)
}

// unpinLocked drops one pin of slot, freeing it at the last when it was
// dropped meanwhile. t.mu is held.
func (t *Tier) unpinLocked(slot int64) {
	e := &t.mu.ent[slot]
	if e.pins--; e.pins == 0 && e.dead {
		*e = entry{}
		t.mu.free = append(t.mu.free, slot)
	}
}

// allocLocked returns a free slot, evicting the block first in the
// eviction order that no read pins, or -1 when every slot is pinned.
// t.mu is held.
func (t *Tier) allocLocked() int64 {
	if n := len(t.mu.free); n > 0 {
		s := t.mu.free[n-1]
		t.mu.free = t.mu.free[:n-1]
		return s
	}
	v := t.mu.idx.Victim(func(s int64) bool { return t.mu.ent[s].pins > 0 })
	if v < 0 {
		return -1
	}
	t.mu.idx.Remove(v)
	t.mu.ent[v] = entry{}
	t.m.evictions.Add(1)
	return v
}

// group is group idx of slot in the arena.
func (t *Tier) group(slot int64, idx int) []byte {
	off := slot*t.sb + int64(idx)*t.stride
	return t.ar.b[off : off+int64(t.gb) : off+int64(t.gb)]
}

// fillGroup is group idx of slot as a read from the store fills it: its
// capacity runs to the slot's end, which tells the store that a block's
// groups follow each other in one range, so it reads them straight into
// the slot (see store's "Where reads land") rather than through a bounce
// buffer and a copy.
func (t *Tier) fillGroup(slot int64, idx int) []byte {
	off := slot*t.sb + int64(idx)*t.stride
	return t.ar.b[off : off+int64(t.gb) : (slot+1)*t.sb]
}

func (t *Tier) has(slot int64, idx int) bool {
	return t.present[int(slot)*t.words+idx/64]&(1<<(idx%64)) != 0
}

// errClosed is what a read of a closed tier answers.
var errClosed = fmt.Errorf("%w (the DRAM tier)", store.ErrClosed)
