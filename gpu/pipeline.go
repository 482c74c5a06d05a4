package gpu

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/kvfs/kvfs/internal/freelist"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Reader reads groups from the store (store.Store implements it).
type Reader interface {
	Read(reqs []store.ReadReq) error
}

// Writer writes groups durably (store.Store implements it).
type Writer interface {
	Write(reqs []store.WriteReq) error
}

// Item is one group moved between the store and device memory.
type Item struct {
	Key layout.Key
	// Dst is the device address of the tile: the group's rows go to
	// Dst + r*Pitch (Pitch 0: packed rows, the group contiguous).
	Dst   uint64
	Pitch int
	// Mapping identifies the device allocation (as the daemon mapped it)
	// the tile lies in: tiles of different mappings never share a copy,
	// even where the mappings happen to be adjacent in the address space
	// (a copy may not span two allocations). Zero for all is one mapping.
	Mapping uint64
	// Err is the outcome: nil, store.ErrNotFound, store.ErrCorrupt (the
	// tile was zeroed), ErrCopy (a copy failed; the tile is undefined), or
	// the store's error for the group.
	Err error
	// Tile, when set, makes the item a tile of several heads (see Tile):
	// one store request and one item where its heads would be one each,
	// so a GPU load of whole blocks pays per tile, not per group. Only a
	// load declared to hold tiles takes them, where TakesTiles says so. A
	// pointer, so the half a million items of a 1 GB load that are not
	// tiles grow by 8 bytes only: every pass over them is a pass over
	// memory, and direct loads, which take no tiles, are the ones that
	// make such calls (docs/performance.md, "LOAD_BLOCKS into GPU memory").
	Tile *Tile
	// Meta, when set, is the block's tag and parent: a load reads the
	// group only from a block stored under Meta.Tag (another tag fails
	// the item with store.ErrTagMismatch; a zero tag checks none), a store
	// records them (store.WriteReq.Meta). Nil: any tag, and a store keeps
	// the stored block's. A pointer, shared by an entry's items.
	Meta *store.BlockMeta
	// CRC is the group's recorded CRC32C, set by Load for Verify.
	CRC uint32
	// landed marks a pitched tile's group staged into device scratch by
	// loadLanded: Land checks it there as it writes its rows, so the
	// staged pipeline does not Verify it first.
	landed bool
}

// Geometry is what the pipeline needs of the store's layout.
type Geometry struct {
	GroupBytes int // bytes of one group
	Rows       int // rows (tokens) of a group
	RowBytes   int // bytes of one row
}

// Pipeline moves batches of groups between a store and one device.
type Pipeline struct {
	Dev  Device
	Pool *Pool
	Geo  Geometry
	// Depth is the number of staging buffers one batch keeps in flight
	// (default 4, at most the pool's count).
	Depth int
	// ReadAhead is how many staging buffers' chunks one store read fills
	// (default 4, at most Depth): a group of chunks is read with one call,
	// so the storage has that many chunks' reads in flight, then each
	// chunk's copies are queued as the next group is read.
	ReadAhead int
	// Verify, when set, checks loaded groups where they landed on the
	// device instead of the store checking them on the CPU (the reads are
	// store.ReadReq.Unverified and Item.CRC carries each group's recorded
	// checksum). It is called with a chunk's items once their copies
	// completed; it must zero every group whose checksum differs and set
	// its Err (wrapping store.ErrCorrupt). An error fails every item it
	// was given that has no outcome yet (their tiles are then undefined).
	// It is called concurrently (by concurrent loads, and by the workers
	// of one direct load).
	Verify func(items []*Item) error
	// Land, when set with Verify, has direct loads (SetHost) take pitched
	// tiles too: their groups are copied packed into device scratch and
	// Land checks each against Item.CRC and copies it into its rows (or
	// zeros them, setting Err) in one pass (GPUVerifier.Land). Direct
	// loads copy tiles whose heads lie apart (scatters) the same way, a
	// tile's heads packed at srcs[i] one group apart, and Land checks
	// and places each head (FailHead for one that differs). The device
	// must be a DeviceAllocator.
	Land func(items []*Item, srcs []uint64) error
	// Corrupt, when set, is told how many groups the device's checks
	// (Verify, Land) found corrupt: the store handed them out unchecked,
	// and counts them with those it found itself (store.Store.NoteCorrupt).
	Corrupt func(n int)
	// Sum, when set, checksums the groups Store staged, where they lie in
	// the pinned staging buffer (which the device reads directly: the
	// CRC32C kernel), once their copies completed: crcs[i] for staged[i].
	// The store then records those instead of reading the payload on the
	// CPU; they are of exactly the bytes written, whatever the client does
	// to its tiles meanwhile. On an error the store computes them.
	Sum func(staged [][]byte, crcs []uint32) error
	// NoBatch queues copies one by one even on a Batcher.
	NoBatch bool
	// LandBatch is the bytes of device scratch a staged load of pitched
	// tiles lands them through, in batches (default 128 MiB; see Land).
	LandBatch int
	// ScratchBudget bounds the device scratch direct loads of pitched
	// and scattered tiles keep (default 512 MiB): past it a load reuses
	// the scratch of its own oldest chunk instead of allocating more, so
	// at most the budget plus one chunk's (twice the staging buffer size)
	// per load.
	ScratchBudget int
	// DirectWorkers is how many goroutines queue the copies of one load
	// from the store's host view (default 4; see SetHost).
	DirectWorkers int

	summed, sumFailed atomic.Uint64
	batched           atomic.Uint64 // copies queued in batches
	lanes             atomic.Uint64 // batches given a lane
	batchOff          atomic.Bool   // a batch failed where single copies worked
	// idle keeps the read groups of finished loads, whose request slices
	// the next loads reuse.
	idle freelist.List[[3]readGroup]
	// host is the store's file in host memory, registered with the
	// device (SetHost); direct counts the groups loaded from it.
	host   atomic.Pointer[[]byte]
	direct atomic.Uint64
	// cache is a cache's memory registered with the device (SetCache)
	// and the groups loads served from it.
	cache      cacheState
	idleDirect freelist.List[directChunk] // Max 16 (directOnce)
	directOnce sync.Once
	// scratchBytes is the device scratch the direct chunks hold.
	scratchBytes atomic.Int64
	idleLand     freelist.List[landScratch] // Max 4 (landOnce): 512 MiB of device memory idle at most
	landOnce     sync.Once
}

// Batched reports how many copies were queued in batches (Batcher).
func (p *Pipeline) Batched() uint64 { return p.batched.Load() }

// Summed reports how many groups Store had checksummed by Sum, and how
// many Sum failed on (the store computed theirs).
func (p *Pipeline) Summed() (ok, failed uint64) { return p.summed.Load(), p.sumFailed.Load() }

// readAhead is how many chunks one store call reads (ReadAhead, default
// 4, at most depth).
func (p *Pipeline) readAhead() int {
	r := p.ReadAhead
	if r <= 0 {
		r = 4
	}
	return max(1, min(r, p.depth()))
}

func (p *Pipeline) depth() int {
	d := p.Depth
	if d <= 0 {
		d = 4
	}
	return min(d, p.Pool.Count())
}

// chunkGroups is how many groups one staging buffer carries for a batch of
// n: enough chunks to keep depth buffers busy, no more than fit.
func (p *Pipeline) chunkGroups(n int) int {
	per := p.Pool.BufferSize() / p.Geo.GroupBytes
	if per < 1 {
		return 0
	}
	want := (n + p.depth() - 1) / p.depth()
	return max(1, min(per, want))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// grow returns b with length n, reusing its memory when it has the room.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// bind runs fn with the device's per-thread setup done once (Binder), so a
// chunk's many copies do not each pay for it; fn queues through q.
func (p *Pipeline) bind(dev Device, fn func(q Device)) {
	if b, ok := dev.(Binder); ok {
		_ = b.Bind(func(q Device) error { fn(q); return nil })
		return
	}
	fn(dev)
}

// lane is the device a batch queues all its copies on: the next of the
// device's lanes (Laner), round robin, or the device.
func (p *Pipeline) lane() Device {
	if l, ok := p.Dev.(Laner); ok && l.Lanes() > 1 {
		return l.Lane(int(p.lanes.Add(1) % uint64(l.Lanes())))
	}
	return p.Dev
}

// copier2D is the device's one-operation pitched copy, nil when it has none.
func copier2D(q Device) Copier2D {
	if c, ok := q.(Copier2D); ok && c.Can2D() {
		return c
	}
	return nil
}

func copyErr(err error) error {
	if errors.Is(err, ErrCopy) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCopy, err)
}

// tag is the tag a load of the item expects (nil or zero: any), for
// store.ReadReq.Tag and store.LocateReq.Tag: it points into the entry's
// Meta, which the items of a block share.
func (it *Item) tag() *store.Tag {
	if it.Meta == nil {
		return nil
	}
	return &it.Meta.Tag
}
