package gpu

import (
	"fmt"
	"slices"

	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/store"
)

// Direct loads. A store file in memory (tmpfs, ramfs) is already host
// memory: mapped read-only (store.Store.HostView) and registered with the
// device, it is a source the GPU's copy engines read by DMA. A load then
// reads nothing into staging: Locate pins the groups' slots and says where
// each lies, the pipeline queues copies from there straight into the
// destinations, and once a chunk's copies completed the GPU checksums the
// groups where they landed (Verify; a group that fails is zeroed there)
// and the slots are unpinned. Pitched groups, and tiles whose heads lie
// apart on the device (scatters), are copied packed into device scratch
// instead, and Land checks them there and writes them in place. No
// CPU touches the payload: a registered tmpfs file copies at nearly the
// rate of pinned memory (kvfs bench-h2d --from measures both), where the
// staged route first has the CPU copy every byte out of the page cache
// into staging.

// Locator is a store that says where groups lie in its file and pins them
// there (store.Store).
type Locator interface {
	Locate(reqs []store.LocateReq, pins []int64) ([]int64, error)
	Unpin(pins []int64)
}

// HostRegistrar is implemented by devices that can register host memory
// they did not allocate for DMA (CUDA: cuMemHostRegister, portable and
// read-only): the store's host view, for direct loads.
type HostRegistrar interface {
	RegisterHost(b []byte) (unregister func() error, err error)
}

// SetHost gives the pipeline the store's file in host memory, registered
// with the device (every device, portably), or takes it away (nil). From
// then on a load from a Reader that is a Locator, with Verify set (and
// Land for pitched tiles), copies the groups straight from it (loadDirect); without
// Verify the CPU would have to read the payload to check it, which is what
// the staged path does anyway.
func (p *Pipeline) SetHost(b []byte) {
	if len(b) == 0 {
		p.host.Store(nil)
		return
	}
	p.host.Store(&b)
}

// Direct reports how many groups loads copied straight from the host view.
func (p *Pipeline) Direct() uint64 { return p.direct.Load() }

// directChunk is one chunk of a direct load: its items, their places, the
// slots pinned for them, and the event after its copies.
type directChunk struct {
	lo, hi   int
	reqs     []store.LocateReq
	pins     []int64
	copied   []bool
	runs     []run
	batch    copyBatch
	verified []*Item
	ev       Event
	dev      Device
	busy     bool  // ev recorded and not yet seen complete
	failed   error // queueing or recording failed
	// scratch is device memory of directGroups groups (allocated the first
	// time the chunk carries items to land, kept with it): such an item's
	// groups are copied packed to scratch + soff[k] (k its place in the
	// chunk, soff the groups of the items before it) and Land writes them
	// in place: a pitched group into its rows, a scattered tile's heads
	// into their places. landed and srcs are the chunk's items to land and
	// their scratch addresses.
	scratch     uint64
	freeScratch func() error
	landed      []*Item
	srcs        []uint64
	pitched     []bool   // per item of the chunk: copied to scratch, to land
	soff        []int    // per item of the chunk: its offset in scratch
	stale       []uint64 // a load from a Cache: the blocks Changed reported
}

// directFor returns the host view when items can be loaded directly from
// r: a Locator, Verify set, a host view (a Cache's memory, SetCache, for a
// Cache), and every tile packed.
func (p *Pipeline) directFor(r Reader, items []Item) (Locator, []byte) {
	l, h := p.hostView(r)
	if l == nil || (p.Land == nil || !p.canAllocDevice()) && p.anyPitched(items) {
		return nil, nil
	}
	return l, h
}

// hostView returns r as a Locator and the store's host view when loads
// from r may go straight from the view (directFor, tiles aside): r a
// Locator, Verify set and a host view; else nil, nil. A Cache's view is
// its memory (cacheView), never the store's.
func (p *Pipeline) hostView(r Reader) (Locator, []byte) {
	if !p.checksOnDevice() {
		return nil, nil
	}
	if _, ok := r.(Cache); ok {
		return p.cacheView(r)
	}
	l, ok := r.(Locator)
	if !ok {
		return nil, nil
	}
	h := p.host.Load()
	if h == nil {
		return nil, nil
	}
	return l, *h
}

// pitched reports whether the item's tile has its rows apart (NHD): a
// direct load copies it to device scratch and lands it with Land.
func (p *Pipeline) pitched(it *Item) bool { return it.Pitch != 0 && it.Pitch != p.Geo.RowBytes }

func (p *Pipeline) canAllocDevice() bool {
	_, ok := p.Dev.(DeviceAllocator)
	return ok
}

// ensureScratch gives the chunk its device scratch.
func (p *Pipeline) ensureScratch(c *directChunk) error {
	if c.freeScratch != nil {
		return nil
	}
	a, ok := p.Dev.(DeviceAllocator)
	if !ok {
		return fmt.Errorf("%w: the device allocates no memory", ErrConfig)
	}
	n := p.directGroups() * p.Geo.GroupBytes
	addr, free, err := a.AllocDevice(n)
	if err != nil {
		return fmt.Errorf("%w: device scratch: %w", ErrCopy, err)
	}
	p.scratchBytes.Add(int64(n))
	c.scratch, c.freeScratch = addr, func() error {
		p.scratchBytes.Add(-int64(n))
		return free()
	}
	return nil
}

// overScratch reports whether the direct chunks' device scratch (in use
// and idle) has reached ScratchBudget.
func (p *Pipeline) overScratch() bool {
	b := p.ScratchBudget
	if b <= 0 {
		b = 512 << 20
	}
	return p.scratchBytes.Load() >= int64(b)
}

// anyPitched reports whether items hold a pitched tile.
func (p *Pipeline) anyPitched(items []Item) bool {
	for i := range items {
		if p.pitched(&items[i]) {
			return true
		}
	}
	return false
}

// scatters reports whether a direct load copies tile it packed into device
// scratch for Land to check and write in place: its heads lie apart on the
// device (a Hugging Face cache's, a sequence apart), Land is set and the
// device allocates memory. In the store a block's groups lie one after
// another, so packed they move with one copy per slot (per run of
// consecutive slots), where copied to their places every head is a copy
// of its own (or, across blocks, a 2D copy per head: acrossBlocks); Land
// then checks and places them in the one kernel pass the check costs
// anyway.
func (p *Pipeline) scatters(it *Item) bool {
	return it.Tile != nil && it.Tile.HeadStride != p.Geo.GroupBytes && p.Land != nil && p.canAllocDevice()
}

// landsAny reports whether items hold one a direct load copies to device
// scratch: a pitched group or a tile that scatters.
func (p *Pipeline) landsAny(items []Item) bool {
	for i := range items {
		if p.pitched(&items[i]) || p.scatters(&items[i]) {
			return true
		}
	}
	return false
}

// directGroups is how many groups one direct chunk carries: as many as
// two staging buffers would (8 MiB by default), so a chunk's event, verify
// and unpin are paid per several megabytes.
func (p *Pipeline) directGroups() int {
	return max(1, 2*p.Pool.BufferSize()/p.Geo.GroupBytes)
}

// loadDirect is Load from the host view of items that move groups
// groups: the chunks of items are split among DirectWorkers goroutines
// (directRange each), so queueing the copies is not one core's work.
// tiles: items may hold packed tiles (Load checked them), each of whose
// heads is located and copied as a group of its own. From a Cache, the
// items the copies did not serve (a tile with any head the cache lacks,
// whole) are then loaded through staging (loadAgain).
func (p *Pipeline) loadDirect(l Locator, host []byte, items []Item, groups int, tiles bool) error {
	// Idle chunks keep their device scratch (32 MiB each by default):
	// at most 16 of them.
	p.directOnce.Do(func() { p.idleDirect.Max = 16 })
	cache, _ := l.(Cache)
	per := p.directGroups()
	chunks := (groups + per - 1) / per
	w := min(p.directWorkers(), chunks)
	if w <= 1 {
		var retry []int
		err := p.directRange(l, cache, host, items, 0, p.depth(), &retry, tiles)
		if cache == nil {
			return err
		}
		return p.loadAgain(cache, items, retry, err)
	}
	// Several submitters: the driver's work per copy bounds what one
	// goroutine queues to well below what the copy engines move
	// (docs/performance.md, "LOAD_BLOCKS into GPU memory"). Each takes an
	// equal share of the chunks, in order, with its share of the depth.
	share := max(1, (chunks+w-1)/w*per*len(items)/groups) // items, of about equal groups
	depth := max(2, p.depth()/w)
	errs := make([]error, w)
	retries := make([][]int, w)
	par.Pieces(w, 1, w, func(k, _ int) {
		if lo, hi := min(k*share, len(items)), min((k+1)*share, len(items)); lo < hi {
			errs[k] = p.directRange(l, cache, host, items[lo:hi], lo, depth, &retries[k], tiles)
		}
	})
	var err error
	for _, e := range errs {
		if e != nil {
			err = e
			break
		}
	}
	if cache == nil {
		return err
	}
	return p.loadAgain(cache, items, slices.Concat(retries...), err)
}

// directWorkers is how many goroutines queue one direct load's copies
// (DirectWorkers, default 4).
func (p *Pipeline) directWorkers() int {
	if p.DirectWorkers > 0 {
		return p.DirectWorkers
	}
	return 4
}

// directRange loads items directly: chunks of items are located, their
// copies queued and their events recorded, up to depth chunks in flight;
// the oldest is finished (its event waited for, its groups verified where
// they landed, its slots unpinned) before another starts. From a cache
// (l is cache), the items it does not serve are appended to retry as
// base plus their index in items (settleCached), their outcomes left to
// the caller's staged load. tiles: as loadDirect's.
func (p *Pipeline) directRange(l Locator, cache Cache, host []byte, items []Item, base, depth int, retry *[]int, tiles bool) error {
	gb := p.Geo.GroupBytes
	per := p.directGroups()
	dev := p.lane()
	c2 := copier2D(dev)
	var flight []*directChunk
	defer func() {
		for _, c := range flight { // a panic: no slot stays pinned
			l.Unpin(c.pins)
		}
	}()
	finish := func(c *directChunk) {
		var err error
		if c.busy {
			err = c.ev.Wait()
			c.busy = false
		}
		if err == nil {
			err = c.failed
		}
		ok, landed, srcs := c.verified[:0], c.landed[:0], c.srcs[:0]
		for i := c.lo; i < c.hi; i++ {
			k := i - c.lo
			if !c.copied[k] {
				continue
			}
			if err != nil {
				items[i].failAll(copyErr(err))
				continue
			}
			if c.pitched[k] {
				landed = append(landed, &items[i])
				srcs = append(srcs, c.scratch+uint64(c.soff[k]))
				continue
			}
			ok = append(ok, &items[i])
		}
		p.check(ok, landed, srcs)
		clear(ok)
		clear(landed)
		c.verified, c.landed, c.srcs = ok[:0], landed[:0], srcs[:0]
		if cache != nil && err == nil {
			*retry = p.settleCached(cache, c, items, base, *retry)
		}
		// Only now, the copies over, may the slots take other blocks.
		l.Unpin(c.pins)
		c.pins = c.pins[:0]
		p.putDirectChunk(c)
	}
	var batchErr error
	lo := 0
	for lo < len(items) && batchErr == nil {
		// The oldest chunk is finished first when the depth is reached,
		// or when the next chunk needs device scratch and the device's
		// scratch is at its budget: then this load reuses its own (a
		// load never waits on another's, so the scratch in use stays
		// within the budget plus one chunk's per load).
		for len(flight) > 0 && (len(flight) >= depth || (p.overScratch() && p.landsAny(items[lo:min(lo+per, len(items))]))) {
			finish(flight[0])
			flight = flight[1:]
		}
		c, err := p.getDirectChunk()
		if err != nil {
			batchErr = err
			break
		}
		hi := c.take(items, lo, per, tiles)
		c.dev, c.failed = dev, nil
		if c.pins, err = l.Locate(c.reqs, c.pins[:0]); err != nil {
			p.putDirectChunk(c)
			batchErr = err
			break
		}
		c.copied, c.pitched = grow(c.copied, hi-lo), grow(c.pitched, hi-lo)
		c.soff = grow(c.soff, hi-lo)
		clear(c.copied)
		clear(c.pitched)
		runs := c.runs[:0]
		rq := c.reqs
		gk, scattered := 0, false
		for k := range hi - lo {
			it, q, g := &items[lo+k], &rq[0], items[lo+k].Groups()
			heads := rq[:g]
			rq = rq[g:]
			c.soff[k] = gk * gb
			gk += g
			if it.Tile != nil {
				if !tiles || p.pitched(it) {
					it.failAll(fmt.Errorf("%w: a tile in a load not declared to hold tiles, or pitched", ErrConfig))
					continue
				}
				if cache != nil && unserved(heads) {
					// Not all in the cache's memory: the whole tile
					// through staging, once this load's copies are over.
					*retry = append(*retry, base+lo+k)
					continue
				}
				if p.scatters(it) && c.soff[k]+g*gb <= per*gb && p.ensureScratch(c) == nil {
					// Packed into scratch (without scratch, to their places).
					var ok bool
					runs, ok = p.locatedTile(it, heads, host, runs, c.scratch+uint64(c.soff[k]))
					c.copied[k], c.pitched[k], scattered = ok, ok, true
					continue
				}
				var ok bool
				runs, ok = p.locatedTile(it, heads, host, runs, 0)
				c.copied[k] = ok
				continue
			}
			it.Err = q.Err
			if q.Err != nil {
				if cache != nil {
					// Not in the cache's memory: loaded through staging.
					it.Err = nil
					*retry = append(*retry, base+lo+k)
				}
				continue
			}
			if q.Off < 0 || q.Off > int64(len(host)-gb) {
				it.Err = fmt.Errorf("%w: %v at %d, outside the store's host view of %d bytes", ErrCopy, it.Key, q.Off, len(host))
				continue
			}
			// A pitched tile's group goes packed to the chunk's scratch,
			// and Land writes its rows.
			dst, m := it.Dst, it.Mapping
			if p.pitched(it) {
				if err := p.ensureScratch(c); err != nil {
					it.Err = err
					continue
				}
				dst, m = c.scratch+uint64(c.soff[k]), c.scratch
				c.pitched[k] = true
			}
			it.CRC = q.CRC
			c.copied[k] = true
			runs = addRun(runs, run{src: int(q.Off), dst: dst, n: gb, m: m})
		}
		if tiles && c2 != nil && !scattered {
			runs = p.acrossBlocks(items[lo:hi], c.reqs, runs)
		}
		c.runs = runs
		p.bind(dev, func(q Device) {
			if err := p.copyRuns(q, host, &c.batch, runs, c2, true); err != nil {
				c.failed = copyErr(err)
			}
		})
		p.recordDirect(c)
		if cache == nil {
			p.direct.Add(uint64(len(c.reqs)))
		}
		flight = append(flight, c)
		lo = hi
	}
	for len(flight) > 0 {
		c := flight[0]
		flight = flight[1:]
		finish(c)
	}
	if batchErr != nil {
		for i := lo; i < len(items); i++ {
			items[i].Err = batchErr
		}
	}
	return batchErr
}

// take makes the chunk items [lo, hi) and their located requests, a
// tile's heads one each: per items, or with tiles up to per groups (at
// least one item). It returns hi.
func (c *directChunk) take(items []Item, lo, per int, tiles bool) int {
	hi := min(lo+per, len(items))
	if tiles {
		n := items[lo].Groups()
		for hi = lo + 1; hi < len(items) && n+items[hi].Groups() <= per; hi++ {
			n += items[hi].Groups()
		}
	}
	c.lo, c.hi = lo, hi
	c.reqs = c.reqs[:0]
	for i := lo; i < hi; i++ {
		k := items[i].Key
		for range items[i].Groups() {
			c.reqs = append(c.reqs, store.LocateReq{Key: k, Tag: items[i].tag()})
			k.Head++
		}
	}
	return hi
}

// unserved reports whether Locate left any of the requests unserved.
func unserved(reqs []store.LocateReq) bool {
	for i := range reqs {
		if reqs[i].Err != nil {
			return true
		}
	}
	return false
}

// locatedTile sets the outcome of tile item it from its heads' located
// requests and adds the copies of the heads found to runs: head j from
// its place in the host view to it.Group(j), or with scratch (device
// scratch, for Land) to scratch + j*GroupBytes, its recorded checksum into
// the tile's. A head that is missing, under another tag or outside the
// view fails alone (Tile.Bad), its destination left as it was. ok: a head
// was copied (the tile is checked once the copies completed).
func (p *Pipeline) locatedTile(it *Item, heads []store.LocateReq, host []byte, runs []run, scratch uint64) (_ []run, ok bool) {
	gb := p.Geo.GroupBytes
	for j := range heads {
		q := &heads[j]
		switch {
		case q.Err != nil:
			it.FailHead(j, q.Err)
		case q.Off < 0 || q.Off > int64(len(host)-gb):
			it.FailHead(j, fmt.Errorf("%w: %v head %d at %d, outside the store's host view of %d bytes", ErrCopy, it.Key, it.Key.Head+j, q.Off, len(host)))
		default:
			it.Tile.CRCs[j] = q.CRC
			dst, _ := it.Group(j)
			m := it.Mapping
			if scratch != 0 {
				dst, m = scratch+uint64(j*gb), scratch
			}
			runs = addRun(runs, run{src: int(q.Off), dst: dst, n: gb, m: m})
			ok = true
		}
	}
	return runs, ok
}

// acrossBlocks returns a direct chunk's runs ordered so that they make
// fewer 2D copies, where they do. In item order (runs as located), a
// block's tiles follow one another in the file, and where the target's
// tensors are evenly spaced every block is one 2D copy of its heads: a
// load of few layers of many blocks (layer by layer) then makes one short
// copy per block, and each copy costs the driver and the copy engines
// microseconds whatever its size. Across blocks, head j of a (layer, kind)
// of consecutive blocks lies a slot apart in the file and, in a Hugging
// Face cache, next to each other on the device: where the chunk's blocks
// lie at a constant stride in the file (a prefix stored in one piece into
// consecutive slots) and on the device, that head of all of them is one 2D
// copy. The chunk's items must be packed tiles of the same heads, block by
// block, each block the same (layer, kind) tiles in the same order, with
// every head located (locatedTile); the order across blocks is taken only
// when its copies (tiles per block × heads × runs of evenly spaced blocks)
// are fewer than the blocks, which is the fewest item order can make.
func (p *Pipeline) acrossBlocks(items []Item, reqs []store.LocateReq, runs []run) []run {
	gb := p.Geo.GroupBytes
	n := len(items)
	t0 := items[0].Tile
	if n < 2 || t0 == nil || t0.HeadStride <= gb || len(reqs) != n*t0.Heads {
		return runs
	}
	h, hs := t0.Heads, t0.HeadStride
	per := 1 // tiles per block
	for per < n && items[per].Key.Block == items[0].Key.Block {
		per++
	}
	if n%per != 0 || n/per < 2 {
		return runs
	}
	blocks := n / per
	for k := range items {
		it, f, b := &items[k], &items[k%per], &items[k-k%per]
		if it.Tile == nil || it.Tile.Heads != h || it.Tile.HeadStride != hs || it.Tile.Bad != 0 || it.Err != nil ||
			it.Mapping != f.Mapping || it.Key.Block != b.Key.Block || it.Key.Layer != f.Key.Layer ||
			it.Key.Kind != f.Key.Kind || it.Key.Head != f.Key.Head || it.Dst-f.Dst != b.Dst-items[0].Dst {
			return runs
		}
	}
	// Runs of blocks at a constant stride, ascending, in the file and on
	// the device (a 2D copy's pitches), as copyRuns finds them.
	src := func(j int) int64 { return reqs[j*per*h].Off }
	dst := func(j int) int64 { return int64(items[j*per].Dst) }
	spans := 0
	for j := 0; j < blocks; {
		spans++
		e := j + 1
		if e < blocks {
			ss, ds := src(e)-src(j), dst(e)-dst(j)
			if ss >= int64(gb) && ss <= maxPitch && ds >= int64(gb) && ds <= maxPitch {
				for e < blocks && src(e)-src(e-1) == ss && dst(e)-dst(e-1) == ds {
					e++
				}
			}
		}
		j = e
	}
	if per*h*spans >= blocks {
		return runs
	}
	runs = runs[:0]
	for t := range per {
		for j := range h {
			for b := range blocks {
				k := b*per + t
				it := &items[k]
				runs = addRun(runs, run{src: int(reqs[k*h+j].Off), dst: it.Dst + uint64(j*hs), n: gb, m: it.Mapping})
			}
		}
	}
	return runs
}

// recordDirect records the chunk's event after its copies; when it cannot
// be, the lane is synchronized instead (and if that fails too, the copies
// are failed: their outcome is unknown).
func (p *Pipeline) recordDirect(c *directChunk) {
	var err error
	if r, ok := c.dev.(LaneRecorder); ok {
		err = r.RecordOn(c.ev)
	} else {
		err = c.ev.Record()
	}
	if err == nil {
		c.busy = true
		return
	}
	if serr := c.dev.Synchronize(); serr != nil && c.failed == nil {
		c.failed = fmt.Errorf("%w: event record: %w; synchronize: %w", ErrCopy, err, serr)
	}
}

// getDirectChunk returns an idle chunk with its event, made on first use.
func (p *Pipeline) getDirectChunk() (*directChunk, error) {
	c := p.idleDirect.Get()
	if c.ev == nil {
		ev, err := p.Dev.NewEvent()
		if err != nil {
			return nil, fmt.Errorf("%w: event: %w", ErrCopy, err)
		}
		c.ev = ev
	}
	return c, nil
}

// putDirectChunk keeps an idle chunk (its slices, event and scratch) for
// the next load; one the free list has no room for is released.
func (p *Pipeline) putDirectChunk(c *directChunk) {
	clear(c.batch.srcs)
	c.busy, c.failed, c.dev = false, nil, nil
	if !p.idleDirect.Put(c) {
		c.release()
	}
}

// release destroys the chunk's event and frees its scratch.
func (c *directChunk) release() {
	_ = c.ev.Destroy()
	if c.freeScratch != nil {
		_ = c.freeScratch()
		c.freeScratch = nil
	}
}

// Close releases what idle direct loads keep (events, device scratch).
// Loads in progress keep theirs until they end; the device's own Close
// frees the rest.
func (p *Pipeline) Close() {
	for _, c := range p.idleDirect.Drain() {
		c.release()
	}
	for _, sc := range p.idleLand.Drain() {
		if sc.free != nil {
			_ = sc.free()
		}
	}
}
