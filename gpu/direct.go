package gpu

import (
	"fmt"
	"sync"

	"github.com/kvfs/kvfs/store"
)

// Direct loads. A store file in memory (tmpfs, ramfs) is already host
// memory: mapped read-only (store.Store.HostView) and registered with the
// device, it is a source the GPU's copy engines read by DMA. A load then
// reads nothing into staging: Locate pins the groups' slots and says where
// each lies, the pipeline queues copies from there straight into the
// destinations, and once a chunk's copies completed the GPU checksums the
// groups where they landed (Verify; a group that fails is zeroed there)
// and the slots are unpinned. No CPU touches the payload. On the H200 a
// registered tmpfs file copied at 0.96× the rate of pinned memory
// (kvfs bench-h2d --from), where the staged path first has the CPU copy
// every byte out of the page cache into staging.

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
// then on a load of packed tiles from a Reader that is a Locator, with
// Verify set, copies the groups straight from it (loadDirect); without
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
}

// directFor returns the host view when items can be loaded directly from
// r: a Locator, Verify set, a host view, and every tile packed.
func (p *Pipeline) directFor(r Reader, items []Item) (Locator, []byte) {
	l, ok := r.(Locator)
	if !ok || p.Verify == nil {
		return nil, nil
	}
	h := p.host.Load()
	if h == nil {
		return nil, nil
	}
	for i := range items {
		if pt := items[i].Pitch; pt != 0 && pt != p.Geo.RowBytes {
			return nil, nil
		}
	}
	return l, *h
}

// directGroups is how many groups one direct chunk carries: as many as
// two staging buffers would (8 MiB by default), so a chunk's event, verify
// and unpin are paid per several megabytes.
func (p *Pipeline) directGroups() int {
	return max(1, 2*p.Pool.BufferSize()/p.Geo.GroupBytes)
}

// loadDirect is Load from the host view: the chunks of items are split
// among DirectWorkers goroutines (directRange each), so queueing the
// copies is not one core's work.
func (p *Pipeline) loadDirect(l Locator, host []byte, items []Item) error {
	per := p.directGroups()
	chunks := (len(items) + per - 1) / per
	w := min(p.directWorkers(), chunks)
	if w <= 1 {
		return p.directRange(l, host, items, p.depth())
	}
	// Several submitters: one goroutine queues copies at about 12 GB/s
	// of 32 KiB tiles on the H200 (the driver's work per copy), where
	// eight callers together reached 36. Each takes an equal share of
	// the chunks, in order, with its share of the depth.
	share := (chunks + w - 1) / w * per
	depth := max(2, p.depth()/w)
	errs := make([]error, w)
	panics := make([]any, w)
	var wg sync.WaitGroup
	for k := range w {
		lo, hi := min(k*share, len(items)), min((k+1)*share, len(items))
		if lo == hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { panics[k] = recover() }()
			errs[k] = p.directRange(l, host, items[lo:hi], depth)
		}()
	}
	wg.Wait()
	for _, v := range panics {
		if v != nil {
			panic(v)
		}
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
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
// they landed, its slots unpinned) before another starts.
func (p *Pipeline) directRange(l Locator, host []byte, items []Item, depth int) error {
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
		ok := c.verified[:0]
		for i := c.lo; i < c.hi; i++ {
			if !c.copied[i-c.lo] {
				continue
			}
			if err != nil {
				items[i].Err = copyErr(err)
				continue
			}
			ok = append(ok, &items[i])
		}
		if len(ok) > 0 {
			if verr := p.Verify(ok); verr != nil {
				for _, it := range ok {
					if it.Err == nil {
						it.Err = verr
					}
				}
			}
		}
		clear(ok)
		c.verified = ok[:0]
		// Only now, the copies over, may the slots take other blocks.
		l.Unpin(c.pins)
		c.pins = c.pins[:0]
		p.putDirectChunk(c)
	}
	var batchErr error
	lo := 0
	for lo < len(items) && batchErr == nil {
		if len(flight) >= depth {
			finish(flight[0])
			flight = flight[1:]
		}
		c, err := p.getDirectChunk()
		if err != nil {
			batchErr = err
			break
		}
		hi := min(lo+per, len(items))
		c.lo, c.hi, c.dev, c.failed = lo, hi, dev, nil
		c.reqs = c.reqs[:0]
		for i := lo; i < hi; i++ {
			c.reqs = append(c.reqs, store.LocateReq{Key: items[i].Key})
		}
		if c.pins, err = l.Locate(c.reqs, c.pins[:0]); err != nil {
			p.putDirectChunk(c)
			batchErr = err
			break
		}
		c.copied = grow(c.copied, hi-lo)
		clear(c.copied)
		runs := c.runs[:0]
		for k := range c.reqs {
			it, q := &items[lo+k], &c.reqs[k]
			it.Err = q.Err
			if q.Err != nil {
				continue
			}
			if q.Off < 0 || q.Off > int64(len(host)-gb) {
				it.Err = fmt.Errorf("%w: %v at %d, outside the store's host view of %d bytes", ErrCopy, it.Key, q.Off, len(host))
				continue
			}
			it.CRC = q.CRC
			c.copied[k] = true
			if n := len(runs); n > 0 && runs[n-1].m == it.Mapping && runs[n-1].src+runs[n-1].n == int(q.Off) && runs[n-1].dst+uint64(runs[n-1].n) == it.Dst {
				runs[n-1].n += gb
				continue
			}
			runs = append(runs, run{src: int(q.Off), dst: it.Dst, n: gb, m: it.Mapping})
		}
		c.runs = runs
		p.bind(dev, func(q Device) {
			if err := p.copyRuns(q, host, &c.batch, runs, c2, true); err != nil {
				c.failed = copyErr(err)
			}
		})
		p.recordDirect(c)
		p.direct.Add(uint64(hi - lo))
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

// putDirectChunk keeps an idle chunk (its slices and event) for the next
// load; one the free list has no room for has its event destroyed.
func (p *Pipeline) putDirectChunk(c *directChunk) {
	clear(c.batch.srcs)
	c.busy, c.failed, c.dev = false, nil, nil
	if !p.idleDirect.Put(c) {
		_ = c.ev.Destroy()
	}
}
