package gpu

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
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
	// make such calls (docs/performance.md, "LOAD_BLOCKS into GPU").
	Tile *Tile
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
	// zeros them, setting Err) in one pass (GPUVerifier.Land). The device
	// must be a DeviceAllocator.
	Land func(items []*Item, srcs []uint64) error
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
	// tiles keep (default 512 MiB): past it a load reuses the scratch of
	// its own oldest chunk instead of allocating more, so at most the
	// budget plus one chunk's (twice the staging buffer size) per load.
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
	host       atomic.Pointer[[]byte]
	direct     atomic.Uint64
	idleDirect freelist.List[directChunk] // Max 16 (directOnce)
	directOnce sync.Once
	// scratchBytes is the device scratch the direct chunks hold.
	scratchBytes atomic.Int64
	idleLand     freelist.List[landScratch] // Max 4 (landOnce): 512 MiB of device memory idle at most
	landOnce     sync.Once
}

// putReadGroups keeps a finished load's read groups, emptied, for the next
// (up to freelist.DefaultMax of them).
func (p *Pipeline) putReadGroups(gs *[3]readGroup) {
	for i := range gs {
		g := &gs[i]
		clear(g.chunks[:cap(g.chunks)])
		// Only the requests this load wrote: the rest were cleared by
		// the load before that wrote them (a disk NHD load, a staged
		// load per 128 MiB batch, spent 2 % of its CPU clearing all).
		clear(g.reqs[:g.used])
		*g = readGroup{chunks: g.chunks[:0], bounds: g.bounds[:0], reqs: g.reqs[:0]}
	}
	p.idle.Put(gs)
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

// chunk is one staging buffer's share of a batch.
type chunk struct {
	st     *Staging
	items  []*Item
	copied []bool // the item's copy was queued (its outcome waits on the event)
	// set is, per item, the length of the interleaved set it starts
	// (interleaved), 0 for the set's other members, 1 for a lone group.
	set    []int32
	failed error // queueing failed; items not yet final fail with it
	runs   []run
	tiled  bool // its items include tiles (Item.Tile), staged in item order
	// pos is, per item, its group's place in the staging buffer (in
	// GroupBytes), and order the item at each place; both nil when that is
	// the item's own index: packed tiles may be staged in the order of
	// their destinations (see sortStaging).
	pos, order []int32
	// posBuf, orderBuf and sortBuf keep sortStaging's memory for the
	// buffer's next chunks.
	posBuf, orderBuf []int32
	sortBuf          []stagedAt
	batch            copyBatch // copyRuns' gathered copies
	dev              Device    // the device, or its lane, its copies were queued on
	verified         []*Item   // finish's items handed to Verify
	// Store's writes of the chunk: the requests, their items, and the
	// staged groups and checksums handed to Sum.
	wreqs  []store.WriteReq
	widx   []int
	staged [][]byte
	crcs   []uint32
}

// chunk returns the buffer's chunk for n items queued on dev, empty: the
// slices of the buffer's chunks before it are reused, so a batch allocates
// nothing per group once each buffer has carried one. The buffer is the
// batch's until it goes back to the pool, and with it the chunk.
func (st *Staging) chunk(dev Device, n int) *chunk {
	c := st.c
	if c == nil {
		c = new(chunk)
		st.c = c
	}
	clear(c.items) // no item of an earlier batch stays reachable
	*c = chunk{st: st, dev: dev, items: c.items[:0], copied: grow(c.copied, n), set: c.set[:0], runs: c.runs[:0],
		posBuf: c.posBuf, orderBuf: c.orderBuf, sortBuf: c.sortBuf, batch: copyBatch{dsts: c.batch.dsts[:0], srcs: c.batch.srcs[:0]},
		verified: c.verified[:0], wreqs: c.wreqs[:0], widx: c.widx[:0], staged: c.staged[:0], crcs: c.crcs[:0]}
	clear(c.copied)
	return c
}

// at is the offset in the staging buffer of item i's group.
func (c *chunk) at(i, gb int) int {
	if c.pos != nil {
		return int(c.pos[i]) * gb
	}
	return i * gb
}

// held is a batch's buffers in flight, oldest first.
type held struct {
	p      *Pipeline
	chunks []*chunk
	owned  int
}

// acquire returns a buffer for the next chunk: a free one from the pool
// while the batch holds fewer than depth, else its own oldest once that
// one's event completed (finish runs on it first). A batch holding none
// blocks on the pool; one holding some never does, so batches cannot
// deadlock on each other. Every buffer the batch owns is in h.chunks when
// acquire runs.
func (h *held) acquire(finish func(*chunk)) (*Staging, error) {
	for {
		if h.owned < h.p.depth() {
			if h.owned == 0 {
				st, err := h.p.Pool.Get()
				if err != nil {
					return nil, err
				}
				h.owned++
				return st, nil
			}
			if st := h.p.Pool.TryGet(); st != nil {
				h.owned++
				return st, nil
			}
		}
		c := h.chunks[0]
		h.chunks = h.chunks[1:]
		finish(c)
		if h.p.settle(c) {
			return c.st, nil
		}
		h.owned-- // withdrawn
	}
}

// tryAcquire is acquire without blocking: a free buffer from the pool while
// the batch holds fewer than depth, else its oldest chunk's buffer if that
// chunk's copies have already completed; nil otherwise.
func (h *held) tryAcquire(finish func(*chunk)) *Staging {
	if h.owned < h.p.depth() {
		if st := h.p.Pool.TryGet(); st != nil {
			h.owned++
			return st
		}
	}
	for len(h.chunks) > 0 {
		c := h.chunks[0]
		if c.st.busy {
			if done, _ := c.st.ev.Query(); !done {
				return nil
			}
		}
		h.chunks = h.chunks[1:]
		finish(c)
		if h.p.settle(c) {
			return c.st
		}
		h.owned-- // withdrawn
	}
	return nil
}

// wait blocks until the chunk's event completed; the error is the failure
// of its copies. After it the buffer is idle (busy cleared) unless the
// event could not tell and the device could not synchronize.
func (p *Pipeline) wait(c *chunk) error {
	if !c.st.busy {
		return nil
	}
	err := c.st.ev.Wait()
	c.st.busy = false
	return err
}

// settle makes sure the chunk's buffer is idle; false: it could not be
// confirmed and is withdrawn.
func (p *Pipeline) settle(c *chunk) bool {
	if !c.st.busy {
		return true
	}
	if err := c.dev.Synchronize(); err != nil {
		p.Pool.leak(c.st)
		return false
	}
	c.st.busy = false
	return true
}

// record marks the chunk's queued copies with its buffer's event. When the
// event cannot be recorded the device is synchronized instead.
func (p *Pipeline) record(c *chunk) {
	var err error
	if r, ok := c.dev.(LaneRecorder); ok {
		err = r.RecordOn(c.st.ev)
	} else {
		err = c.st.ev.Record()
	}
	if err != nil {
		if c.failed == nil {
			c.failed = fmt.Errorf("%w: event record: %w", ErrCopy, err)
		}
		if serr := c.dev.Synchronize(); serr == nil {
			c.st.busy = false
			return
		}
		c.st.busy = true // unconfirmed: settle withdraws it
		return
	}
	c.st.busy = true
}

// release returns every buffer of the batch to the pool.
func (h *held) release(finish func(*chunk)) {
	for _, c := range h.chunks {
		finish(c)
		if h.p.settle(c) {
			_ = h.p.Pool.Put(c.st)
		}
	}
	h.chunks = nil
}

// loadStaged is Load through staging, of items that move ngroups groups.
func (p *Pipeline) loadStaged(r Reader, items []Item, ngroups int) error {
	gb := p.Geo.GroupBytes
	per := p.chunkGroups(ngroups)
	tiled := ngroups > len(items) // tiles among items (each at least 2 groups)
	if tiled {
		// A chunk takes whole tiles: at least the largest.
		for i := range items {
			per = max(per, items[i].Groups())
		}
	}
	if per == 0 || per*gb > p.Pool.BufferSize() {
		return fmt.Errorf("%w: staging buffers of %d bytes hold no %d groups of %d bytes", ErrConfig, p.Pool.BufferSize(), max(1, per), gb)
	}
	h := &held{p: p}
	dev := p.lane()
	finish := func(c *chunk) {
		err := p.wait(c)
		if err == nil && c.failed != nil {
			err = c.failed
		}
		for i, it := range c.items {
			if !c.copied[i] {
				continue
			}
			if err != nil {
				it.failAll(copyErr(err))
			}
		}
		if err == nil && p.checksOnDevice() {
			ok := c.verified[:0] // the chunk's, reused: a load allocates nothing per chunk
			for i, it := range c.items {
				if c.copied[i] && !it.done() && !it.landed {
					ok = append(ok, it)
				}
			}
			p.check(ok, nil, nil)
			clear(ok) // no item stays reachable past its batch
			c.verified = ok[:0]
		}
	}
	var batchErr error
	reached := 0 // items before it were handed to a chunk
	// prepare hands the next items, from lo, to a group of up to readAhead
	// chunks, each with a staging buffer, and builds the group's read
	// requests; it returns the new lo. The first buffer may be waited for
	// (when mayWait), the others are taken only if free now.
	prepare := func(g *readGroup, lo int, mayWait bool) int {
		g.chunks, g.bounds, g.reqs, g.err, g.panicked = g.chunks[:0], g.bounds[:0], g.reqs[:0], nil, nil
		for len(g.chunks) < p.readAhead() && lo < len(items) {
			var st *Staging
			if len(g.chunks) == 0 && mayWait {
				var err error
				if st, err = h.acquire(finish); err != nil {
					batchErr = err
					break
				}
			} else if st = h.tryAcquire(finish); st == nil {
				break
			}
			hi := min(lo+per, len(items))
			if tiled {
				// Whole tiles up to per groups; their places in staging
				// (pos) follow from their heads.
				n := 0
				for hi = lo; hi < len(items) && n+items[hi].Groups() <= per; hi++ {
					n += items[hi].Groups()
				}
			}
			c := st.chunk(dev, hi-lo)
			if tiled {
				c.pos, c.tiled = c.posBuf[:0], true
			}
			g.bounds = append(g.bounds, len(g.reqs))
			rows, rb := p.Geo.Rows, p.Geo.RowBytes
			at := 0 // in groups
			for i := lo; i < hi; {
				off := at * gb
				if tiled {
					c.pos = append(c.pos, int32(at)) // the item's (a set's) place
				}
				if it := &items[i]; it.Tile != nil {
					// A tile: one request for its heads, packed in
					// staging, their checksums straight into the tile.
					h := it.Tile.Heads
					g.reqs = append(g.reqs, store.ReadReq{Key: it.Key, Buf: st.Mem[off : off+h*gb : len(st.Mem)], Heads: h, HeadStride: gb, Unverified: p.checksOnDevice(), CRCs: it.Tile.CRCs})
					c.items = append(c.items, it)
					c.set = append(c.set, 1)
					at += h
					i++
					continue
				}
				n := p.interleaved(items[i:hi])
				if n == 1 {
					// Capacity to the buffer's end: the store lands adjacent
					// groups of one slot with one read.
					g.reqs = append(g.reqs, store.ReadReq{Key: items[i].Key, Buf: st.Mem[off : off+gb : len(st.Mem)], Unverified: p.checksOnDevice()})
					c.items = append(c.items, &items[i])
					c.set = append(c.set, 1)
					at++
					i++
					continue
				}
				// An interleaved set lands in staging as its tiles lie on
				// the device (row r of member j at r*n*RowBytes + j*RowBytes),
				// so the set moves with one copy instead of one 2D copy per
				// group.
				sp := n * rb
				for j := range n {
					b := off + j*rb
					g.reqs = append(g.reqs, store.ReadReq{Key: items[i+j].Key, Buf: st.Mem[b : b+(rows-1)*sp+rb], Pitch: sp, RowBytes: rb, Unverified: p.checksOnDevice()})
					c.items = append(c.items, &items[i+j])
					c.set = append(c.set, int32(n*btoi(j == 0)))
					if tiled && j > 0 {
						c.pos = append(c.pos, int32(at)) // a member's place: its set's
					}
				}
				at += n
				i += n
			}
			if tiled {
				c.posBuf = c.pos // in item order: never sorted
			} else {
				p.sortStaging(c, g.reqs[g.bounds[len(g.bounds)-1]:], st)
			}
			g.chunks = append(g.chunks, c)
			reached, lo = hi, hi
		}
		g.bounds = append(g.bounds, len(g.reqs))
		g.used = max(g.used, len(g.reqs))
		return lo
	}
	// queue takes a group whose read is over: on a failed read its items
	// fail with the error; else each chunk's copies are queued and its
	// event recorded. Either way its chunks join the batch's buffers.
	queue := func(g *readGroup) {
		if g.err != nil {
			for _, c := range g.chunks {
				for _, it := range c.items {
					it.failAll(g.err)
				}
				h.chunks = append(h.chunks, c)
			}
			return
		}
		for k, c := range g.chunks {
			rq := g.reqs[g.bounds[k]:g.bounds[k+1]]
			if p.checksOnDevice() {
				for j := range rq {
					c.items[j].CRC = rq[j].CRC // a tile's are in its CRCs already
				}
			}
			p.bind(c.dev, func(q Device) { p.queueH2D(q, c, rq) })
			p.record(c)
			h.chunks = append(h.chunks, c)
		}
	}
	// With room for two groups in the depth, two store reads are in
	// flight at once (each on its own goroutine): the next group's read is
	// started as soon as this one's is, so the storage never waits for a
	// read to end before the next begins (a store read spread over the
	// cores leaves them idle at its tail), nor for the copy submissions.
	// A group started while another is in flight takes only buffers free
	// now (the batch's own may all be in flight, not yet queued, so there
	// is none to wait for); with none in flight it may wait for one.
	// Without the room, one group at a time.
	overlap := 2*p.readAhead() <= p.depth()
	groups := p.idle.Get()
	// No read may outlive Load, even when one panics (its staging
	// buffers go back to the pool).
	defer func() {
		for i := range groups {
			if g := &groups[i]; g.done != nil {
				<-g.done
			}
		}
		p.putReadGroups(groups)
	}()
	var flight []*readGroup // reads started, oldest first (at most two)
	lo := 0
	launch := func(mayWait, async bool) {
		var g *readGroup
		for i := range groups {
			// In flight or being queued, a group has chunks.
			if len(groups[i].chunks) == 0 {
				g = &groups[i]
				break
			}
		}
		if lo = prepare(g, lo, mayWait); len(g.chunks) > 0 {
			g.start(r, async)
			flight = append(flight, g)
		}
	}
	launch(true, overlap)
	if overlap && batchErr == nil && lo < len(items) {
		launch(false, true)
	}
	for len(flight) > 0 {
		cur := flight[0]
		flight = append(flight[:0], flight[1:]...)
		cur.wait()
		if cur.err != nil && batchErr == nil {
			batchErr = cur.err
		}
		if overlap && batchErr == nil && lo < len(items) {
			launch(false, true)
		}
		queue(cur)
		cur.chunks = cur.chunks[:0]
		if len(flight) == 0 && batchErr == nil && lo < len(items) {
			launch(true, overlap)
		}
	}
	h.release(finish)
	if batchErr != nil {
		for i := reached; i < len(items); i++ {
			items[i].failAll(batchErr)
		}
	}
	return batchErr
}

// readGroup is a group of chunks read with one store call.
type readGroup struct {
	chunks   []*chunk
	bounds   []int // the chunks' requests: reqs[bounds[k]:bounds[k+1]]
	reqs     []store.ReadReq
	used     int   // the most requests one read of this load held
	err      error // the store call's
	panicked any   // a panic of the store call on its own goroutine
	done     chan struct{}
}

// start reads the group's requests from r: on a goroutine of its own when
// async (wait collects it), else now.
func (g *readGroup) start(r Reader, async bool) {
	if !async {
		g.done = nil
		g.err = r.Read(g.reqs)
		return
	}
	g.done = make(chan struct{})
	go func() {
		defer close(g.done)
		defer func() { g.panicked = recover() }()
		g.err = r.Read(g.reqs)
	}()
}

// wait waits for the group's read; a panic in it is raised here.
func (g *readGroup) wait() {
	if g.done != nil {
		<-g.done
		g.done = nil
	}
	if g.panicked != nil {
		panic(g.panicked)
	}
}

// queueH2D sets each item's outcome from its read and queues the copies of
// the groups that go to the device (good ones, and corrupt ones zeroed).
// Packed groups adjacent in staging and on the device become one run, and
// runs become copies (copyRuns); a pitched group is one 2D copy (or one
// copy per row without Copier2D).
func (p *Pipeline) queueH2D(q Device, c *chunk, reqs []store.ReadReq) {
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	c2 := copier2D(q)
	runs := c.runs[:0]
	fail := func(err error) {
		if c.failed == nil {
			c.failed = copyErr(err)
		}
	}
	// In staging order (j), so runs form as the tiles lie there.
	for j := 0; j < len(reqs); {
		i := j
		if c.order != nil {
			i = int(c.order[j])
		}
		if n := int(c.set[i]); n > 1 {
			runs = p.queueSet(q, c2, c, reqs, i, n, runs, fail)
			j += n
			continue
		}
		if c.items[i].Tile != nil {
			runs = p.queueTile(c, i, &reqs[i], runs)
			j++
			continue
		}
		it := c.items[i]
		rerr := reqs[i].Err
		src := c.at(i, gb)
		switch {
		case rerr == nil:
		case errors.Is(rerr, store.ErrCorrupt):
			// Never leave a failed group in the destination as if good.
			clear(c.st.Mem[src : src+gb])
		default:
			it.Err = rerr
			j++
			continue
		}
		it.Err = rerr
		if c.failed != nil {
			it.Err = c.failed
			j++
			continue
		}
		c.copied[i] = true
		if !p.pitched(it) {
			runs = addRun(runs, run{src: src, dst: it.Dst, n: gb, m: it.Mapping})
			j++
			continue
		}
		var err error
		if c2 != nil {
			err = c2.CopyH2D2D(it.Dst, it.Pitch, c.st.Mem[src:src+gb], rb, rb, rows)
		} else {
			for r := 0; r < rows && err == nil; r++ {
				err = q.CopyH2D(it.Dst+uint64(r*it.Pitch), c.st.Mem[src+r*rb:src+(r+1)*rb])
			}
		}
		if err != nil {
			fail(err)
		}
		j++
	}
	if c.failed == nil {
		// A tiled chunk's runs are already whole tiles, in item order: a
		// block's (layer, kind) tiles one after another in staging, and
		// as far apart on the device as the target's tensors are, so in
		// that order they become one 2D copy per block (sorted by
		// destination, one per tensor and block).
		if err := p.copyRuns(q, c.st.Mem, &c.batch, runs, c2, c.tiled); err != nil {
			fail(err)
		}
	}
	c.runs = runs[:0]
}

// addRun appends r to runs, or extends the last run when r follows it on
// both sides.
func addRun(runs []run, r run) []run {
	if n := len(runs); n > 0 && runs[n-1].joins(r) {
		runs[n-1].n += r.n
		return runs
	}
	return append(runs, r)
}

// joins reports whether b follows a on both sides, in the same mapping:
// the two are one copy.
func (a run) joins(b run) bool {
	return a.m == b.m && a.src+a.n == b.src && a.dst+uint64(a.n) == b.dst
}

// queueTile sets the outcome of tile item i from its read, q, and adds the
// copies of the heads that landed to runs: the whole tile as one run when
// its heads lie next to each other on the device, else one run per head;
// a head that failed (missing, or its read failed) is not copied, so its
// destination is left as it was.
func (p *Pipeline) queueTile(c *chunk, i int, q *store.ReadReq, runs []run) []run {
	gb := p.Geo.GroupBytes
	it := c.items[i]
	t := it.Tile
	it.Err, t.Failed, t.Bad = q.Err, q.Failed, q.Bad
	if c.failed != nil {
		it.failAll(c.failed)
		return runs
	}
	if it.done() {
		return runs
	}
	c.copied[i] = true
	src := c.at(i, gb)
	if t.Bad == 0 && t.HeadStride == gb {
		return addRun(runs, run{src: src, dst: it.Dst, n: t.Heads * gb, m: it.Mapping})
	}
	for h := range t.Heads {
		if t.Bad&(1<<h) == 0 {
			runs = addRun(runs, run{src: src + h*gb, dst: it.Dst + uint64(h*t.HeadStride), n: gb, m: it.Mapping})
		}
	}
	return runs
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sortStaging places a chunk's packed tiles in its staging buffer in the
// order of their destinations when, in item order, they would move in
// short copies: the tiles of one (layer, kind, head) of consecutive cache
// blocks of a Hugging Face cache ([batch, kv_heads, seq, head_dim]) lie
// next to each other on the device but a whole block apart in item order
// (one 4 KiB copy per group); staged by destination they move with one
// copy. The store then lands a run of a slot's groups by vector read (its
// destinations lie apart in staging) instead of one contiguous read, so
// chunks whose tiles already form runs of minRun groups or more (a
// head-major cache's heads of one block), chunks with pitched tiles
// (interleaved sets) and chunks already in destination order keep item
// order.
func (p *Pipeline) sortStaging(c *chunk, reqs []store.ReadReq, st *Staging) {
	const minRun = 4
	n := len(c.items)
	if n < 2 {
		return
	}
	gb := p.Geo.GroupBytes
	sorted, runs := true, 1
	for i, it := range c.items {
		if p.pitched(it) {
			return
		}
		if i > 0 {
			prev := c.items[i-1]
			if it.Dst < prev.Dst {
				sorted = false
			}
			if it.Dst != prev.Dst+uint64(gb) || it.Mapping != prev.Mapping {
				runs++
			}
		}
	}
	if sorted || n >= minRun*runs {
		return
	}
	// Sort (destination, item) pairs, not item indexes through pointers.
	ents := grow(c.sortBuf, n)
	c.sortBuf = ents
	for i, it := range c.items {
		ents[i] = stagedAt{it.Dst, int32(i)}
	}
	slices.SortFunc(ents, func(a, b stagedAt) int { return cmp.Compare(a.dst, b.dst) })
	c.posBuf, c.orderBuf = grow(c.posBuf, n), grow(c.orderBuf, n)
	c.pos, c.order = c.posBuf, c.orderBuf
	for k, e := range ents {
		c.pos[e.i], c.order[k] = int32(k), e.i
	}
	for i := range reqs {
		o := int(c.pos[i]) * gb
		reqs[i].Buf = st.Mem[o : o+gb : len(st.Mem)]
	}
}

// stagedAt is an item of a chunk (i) and its destination, for sortStaging.
type stagedAt struct {
	dst uint64
	i   int32
}

// grow returns b with length n, reusing its memory when it has the room.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// interleaved is how many of its, from the first, form an interleaved set:
// pitched tiles (the heads of one (layer, kind) of an NHD cache block)
// whose rows sit side by side on the device, each RowBytes after the
// previous, with the same pitch: row r of the set is one span of
// n*RowBytes bytes. 1 when the first tile starts no such set.
func (p *Pipeline) interleaved(its []Item) int {
	rb, pitch := p.Geo.RowBytes, its[0].Pitch
	if pitch == 0 || pitch == rb || p.Geo.Rows < 2 {
		return 1
	}
	n := 1
	for n < len(its) && its[n].Pitch == pitch && its[n].Mapping == its[0].Mapping && its[n].Dst == its[0].Dst+uint64(n*rb) && (n+1)*rb <= pitch {
		n++
	}
	return n
}

// queueSet sets the outcomes of the interleaved set reqs[i:i+n] and queues
// its copies: the whole set as one run (its rows fill the pitch: merged
// with adjacent runs) or one 2D copy when every member goes to the device
// (good, or corrupt and zeroed by the store in staging); else one 2D copy
// per member that does, so a missing group's tile is left as it was.
func (p *Pipeline) queueSet(q Device, c2 Copier2D, c *chunk, reqs []store.ReadReq, i, n int, runs []run, fail func(error)) []run {
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	all := true
	for j := i; j < i+n; j++ {
		it, rerr := c.items[j], reqs[j].Err
		if rerr != nil && !errors.Is(rerr, store.ErrCorrupt) {
			it.Err, all = rerr, false
			continue
		}
		it.Err = rerr
		if c.failed != nil {
			it.Err = c.failed
			continue
		}
		c.copied[j] = true
	}
	if c.failed != nil {
		return runs
	}
	sp := n * rb
	at := c.at(i, gb)
	img := c.st.Mem[at : at+n*gb]
	dst, pitch := c.items[i].Dst, c.items[i].Pitch
	var err error
	switch {
	case all && pitch == sp:
		runs = addRun(runs, run{src: at, dst: dst, n: n * gb, m: c.items[i].Mapping})
	case all && c2 != nil:
		err = c2.CopyH2D2D(dst, pitch, img, sp, sp, rows)
	case all:
		for r := 0; r < rows && err == nil; r++ {
			err = q.CopyH2D(dst+uint64(r*pitch), img[r*sp:r*sp+sp])
		}
	default:
		for j := i; j < i+n && err == nil; j++ {
			if !c.copied[j] {
				continue
			}
			o := (j - i) * rb
			if c2 != nil {
				err = c2.CopyH2D2D(c.items[j].Dst, pitch, img[o:o+(rows-1)*sp+rb], sp, rb, rows)
				continue
			}
			for r := 0; r < rows && err == nil; r++ {
				err = q.CopyH2D(c.items[j].Dst+uint64(r*pitch), img[o+r*sp:o+r*sp+rb])
			}
		}
	}
	if err != nil {
		fail(err)
	}
	return runs
}

// run is a contiguous span of staging going to a contiguous span of device
// memory.
type run struct {
	src int    // offset in the staging buffer
	dst uint64 // device address
	n   int
	m   uint64 // the destination's Item.Mapping
}

// maxPitch bounds the pitches of a merged 2D copy (devices cap them; the
// H100/H200 at 2^31-1).
const maxPitch = 1 << 30

// copyRuns queues the chunk's runs in device order, runs next to each other
// on both sides as one copy. With a Copier2D, runs of equal length whose
// sources and destinations advance by constant strides become one 2D copy:
// the heads of one (layer, kind) of consecutive cache blocks of an HND
// target, when they lie a block apart in staging and next to each other on
// the device, move in one copy. With a Batcher, the copies left (tiles of
// cache blocks scattered over the device: one per (block, layer, kind) of
// an HND target) are queued with one call.
//
// Run sources are offsets in mem: the chunk's staging buffer, or for a
// direct load the store's file in host memory (loadDirect). bt gathers the
// batched copies. inOrder keeps the runs in the order given (already
// merged where adjacent) instead of sorting them by destination: a direct
// load's runs in item order are a block's (layer, kind) tiles one after
// another, a constant stride apart in the file and, where the target's
// tensors are evenly spaced, on the device too: one 2D copy per block.
func (p *Pipeline) copyRuns(q Device, mem []byte, bt *copyBatch, runs []run, c2 Copier2D, inOrder bool) error {
	b := p.batcher(q)
	if len(runs) < 2 {
		for _, r := range runs {
			if err := q.CopyH2D(r.dst, mem[r.src:r.src+r.n]); err != nil {
				return err
			}
		}
		return nil
	}
	if !inOrder {
		slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.dst, b.dst) })
		// Runs next to each other on both sides (staged in destination
		// order by sortStaging, queued in item order) are one copy.
		k := 0
		for _, r := range runs[1:] {
			if runs[k].joins(r) {
				runs[k].n += r.n
				continue
			}
			k++
			runs[k] = r
		}
		runs = runs[:k+1]
	}
	bt.dsts, bt.srcs = bt.dsts[:0], bt.srcs[:0]
	one := func(r run) error {
		if b != nil {
			bt.dsts = append(bt.dsts, r.dst)
			bt.srcs = append(bt.srcs, mem[r.src:r.src+r.n])
			return nil
		}
		return q.CopyH2D(r.dst, mem[r.src:r.src+r.n])
	}
	for lo := 0; lo < len(runs); {
		r0 := runs[lo]
		hi := lo + 1
		if c2 != nil && hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src > r0.src && runs[hi].src-r0.src >= r0.n &&
			runs[hi].src-r0.src <= maxPitch && runs[hi].dst-r0.dst <= maxPitch {
			ss, ds := runs[hi].src-r0.src, runs[hi].dst-r0.dst
			for hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src == r0.src+(hi-lo)*ss && runs[hi].dst == r0.dst+uint64(hi-lo)*ds {
				hi++
			}
		}
		var err error
		if h := hi - lo; h == 1 || (b != nil && h < minBatch) {
			// With a batch to join, a few runs go in it rather than as a
			// 2D copy of their own.
			for _, r := range runs[lo:hi] {
				if err = one(r); err != nil {
					break
				}
			}
		} else {
			ss, ds := runs[lo+1].src-r0.src, int(runs[lo+1].dst-r0.dst)
			err = c2.CopyH2D2D(r0.dst, ds, mem[r0.src:r0.src+(h-1)*ss+r0.n], ss, r0.n, h)
		}
		if err != nil {
			return err
		}
		lo = hi
	}
	return p.flushBatch(q, b, bt)
}

// minBatch is the fewest copies queued as a batch (fewer go one by one).
const minBatch = 4

// copyBatch is a chunk's copies gathered for one batch call.
type copyBatch struct {
	dsts []uint64
	srcs [][]byte
}

// batcher is the device's batch copier, nil when it has none or a batch
// failed where single copies worked (the driver refuses batches).
func (p *Pipeline) batcher(q Device) Batcher {
	if b, ok := q.(Batcher); ok && !p.NoBatch && !p.batchOff.Load() && b.CanBatch() {
		return b
	}
	return nil
}

// flushBatch queues the gathered copies: as one batch, or one by one when
// they are few or the batch fails (none of a failed batch's copies can be
// taken as queued: each is queued again, which rewrites the same bytes).
func (p *Pipeline) flushBatch(q Device, b Batcher, bt *copyBatch) error {
	defer func() { clear(bt.srcs) }()
	refused := false
	if len(bt.dsts) >= minBatch {
		if b.CopyH2DBatch(bt.dsts, bt.srcs) == nil {
			p.batched.Add(uint64(len(bt.dsts)))
			return nil
		}
		refused = true
	}
	for i, dst := range bt.dsts {
		if err := q.CopyH2D(dst, bt.srcs[i]); err != nil {
			return err // not the batch's fault alone
		}
	}
	if refused {
		p.batchOff.Store(true)
	}
	return nil
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

// sumStaged has Sum checksum the staged groups of reqs.
func (p *Pipeline) sumStaged(c *chunk, reqs []store.WriteReq) {
	if p.Sum == nil {
		return
	}
	staged, crcs := c.staged[:0], grow(c.crcs, len(reqs))
	for k := range reqs {
		staged = append(staged, reqs[k].Data)
	}
	defer func() {
		clear(staged) // no staging slice outlives the chunk's write
		c.staged, c.crcs = staged[:0], crcs
	}()
	if err := p.Sum(staged, crcs); err != nil {
		p.sumFailed.Add(uint64(len(reqs)))
		return
	}
	for k := range reqs {
		reqs[k].CRC, reqs[k].Summed = crcs[k], true
	}
	p.summed.Add(uint64(len(reqs)))
}

func copyErr(err error) error {
	if errors.Is(err, ErrCopy) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrCopy, err)
}

// Store copies items' tiles from the device into staging and writes them
// to w, overlapping one chunk's device-to-host copies with the previous
// chunk's write. The store checksums the staging bytes it writes, so the
// checksum is of exactly the bytes stored. Per-item outcomes are in
// Item.Err (nil once durable); the error is for the batch as a whole.
func (p *Pipeline) Store(w Writer, items []Item) error {
	if tiles, _, _ := p.checkTiles(items); tiles {
		err := fmt.Errorf("%w: a store takes one group per item, not tiles", ErrConfig)
		for i := range items {
			items[i].failAll(err)
		}
		return err
	}
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	per := p.chunkGroups(len(items))
	if per == 0 {
		return fmt.Errorf("%w: staging buffers of %d bytes hold no %d-byte group", ErrConfig, p.Pool.BufferSize(), gb)
	}
	h := &held{p: p}
	dev := p.lane()
	var batchErr error
	// finish waits for the chunk's copies, then writes what arrived. Its
	// requests are the chunk's, kept with the staging buffer: a store
	// allocates nothing per group once each buffer has carried one.
	finish := func(c *chunk) {
		err := p.wait(c)
		if err == nil && c.failed != nil {
			err = c.failed
		}
		reqs, idx := c.wreqs[:0], c.widx[:0]
		defer func() {
			clear(reqs) // no reference to staging or a store error stays
			c.wreqs, c.widx = reqs[:0], idx[:0]
		}()
		for i, it := range c.items {
			if !c.copied[i] {
				continue
			}
			if err != nil {
				it.Err = copyErr(err)
				continue
			}
			reqs = append(reqs, store.WriteReq{Key: it.Key, Data: c.st.Mem[i*gb : (i+1)*gb]})
			idx = append(idx, i)
		}
		if len(reqs) == 0 || batchErr != nil {
			for _, i := range idx {
				c.items[i].Err = batchErr
			}
			return
		}
		p.sumStaged(c, reqs)
		werr := w.Write(reqs)
		for k, i := range idx {
			c.items[i].Err = reqs[k].Err
			if werr != nil && reqs[k].Err == nil {
				// The write failed as a whole: claim nothing.
				c.items[i].Err = werr
			}
		}
		if errors.Is(werr, store.ErrClosed) {
			batchErr = werr
		}
	}
	reached := 0
	for lo := 0; lo < len(items) && batchErr == nil; lo += per {
		hi := min(lo+per, len(items))
		st, err := h.acquire(finish)
		if err != nil {
			batchErr = err
			break
		}
		reached = hi
		c := st.chunk(dev, hi-lo)
		p.bind(dev, func(q Device) {
			c2 := copier2D(q)
			// Packed tiles adjacent on the device (and so in staging,
			// which takes them in item order) move with one copy: the
			// heads of one (layer, kind) of an HND block, a Hugging Face
			// cache's consecutive positions.
			var pend run
			flush := func() {
				if pend.n > 0 && c.failed == nil {
					if err := q.CopyD2H(st.Mem[pend.src:pend.src+pend.n], pend.dst); err != nil {
						c.failed = copyErr(err)
					}
				}
				pend.n = 0
			}
			for i := lo; i < hi; i++ {
				it := &items[i]
				c.items = append(c.items, it)
				k := i - lo
				if c.failed != nil {
					it.Err = c.failed
					continue
				}
				c.copied[k] = true
				var err error
				if !p.pitched(it) {
					if pend.n > 0 && pend.m == it.Mapping && pend.src+pend.n == k*gb && pend.dst+uint64(pend.n) == it.Dst {
						pend.n += gb
						continue
					}
					flush()
					pend = run{src: k * gb, dst: it.Dst, n: gb, m: it.Mapping}
					continue
				}
				flush()
				if c.failed != nil {
					it.Err = c.failed
					c.copied[k] = false
					continue
				}
				if c2 != nil {
					err = c2.CopyD2H2D(st.Mem[k*gb:(k+1)*gb], rb, it.Dst, it.Pitch, rb, rows)
				} else {
					for r := 0; r < rows && err == nil; r++ {
						err = q.CopyD2H(st.Mem[k*gb+r*rb:k*gb+(r+1)*rb], it.Dst+uint64(r*it.Pitch))
					}
				}
				if err != nil {
					c.failed = copyErr(err)
				}
			}
			flush()
		})
		p.record(c)
		h.chunks = append(h.chunks, c)
		// Keep at most one chunk's copies running ahead of the writes.
		for len(h.chunks) > 1 {
			old := h.chunks[0]
			h.chunks = h.chunks[1:]
			finish(old)
			if p.settle(old) {
				_ = p.Pool.Put(old.st)
			}
			h.owned--
		}
	}
	h.release(finish)
	if batchErr != nil {
		for i := reached; i < len(items); i++ {
			items[i].Err = batchErr
		}
	}
	return batchErr
}
