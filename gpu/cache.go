package gpu

import (
	"errors"
	"slices"
	"sync/atomic"

	"github.com/kvfs/kvfs/store"
)

// Loads from a cache in host memory (the daemon's DRAM tier, package
// tier). Its memory registered with the device (SetCache), a hit is a
// direct load (direct.go) from it: Locate pins the blocks the cache holds
// as the store's current version and says where their groups lie, the
// copy engines read them by DMA (runs adjacent on both sides merged, 2D
// and batched copies as from the store's file), and the device checks each
// where it landed (Verify, Land). Three kinds of groups are then read
// again through the staged route, from the cache as a Reader (which reads
// a miss from the store and keeps the block), so that none is served from
// a copy that is not the store's current version:
//
//   - the ones Locate did not serve (the cache lacks them, or cannot say),
//   - the ones whose copy failed its checksum on the device (the cache is
//     told, Corrupt, and drops the block: its copy in memory is bad, the
//     store's is read),
//   - the ones of blocks whose store version changed while they were
//     copied (Changed, asked after the copies completed): a write that
//     ended during the load is not undone by it.
//
// Their destinations are written again by the staged load, whose outcome
// is theirs.

// Cache is a Reader that keeps whole blocks in host memory and locates
// the groups of the ones it holds there (tier.Tier). Locate sets Err on
// every request it does not serve from memory (the load reads those
// through Read); its pins are opaque, handed back to Changed and Unpin.
type Cache interface {
	Reader
	Locator
	// Changed appends to stale the blocks of pins (not yet unpinned)
	// whose copy is no longer the store's current version; an error
	// vouches for none.
	Changed(pins []int64, stale []uint64) ([]uint64, error)
	// Corrupt says that a group copied from block b's copy failed its
	// checksum on the device: the cache drops the copy.
	Corrupt(b uint64)
}

// SetCache gives the pipeline the memory of a cache in host memory (the
// DRAM tier's arena), registered with the device, or takes it away (nil).
// From then on a load from a Reader that is a Cache, with Verify set (and
// Land for pitched tiles), copies the hits straight from it (see
// Loads from a cache in host memory).
func (p *Pipeline) SetCache(b []byte) {
	if len(b) == 0 {
		p.cache.view.Store(nil)
		return
	}
	p.cache.view.Store(&b)
}

// Cached reports how many groups loads copied straight from the cache's
// memory and served (checked, still the store's version).
func (p *Pipeline) Cached() uint64 { return p.cache.served.Load() }

// cacheState is the pipeline's cache memory (SetCache) and its counter.
type cacheState struct {
	view   atomic.Pointer[[]byte]
	served atomic.Uint64
}

// cacheView returns r as a Cache and the cache's registered memory when
// loads from r may copy hits straight from it; else nil, nil.
func (p *Pipeline) cacheView(r Reader) (Locator, []byte) {
	c, ok := r.(Cache)
	if !ok {
		return nil, nil
	}
	h := p.cache.view.Load()
	if h == nil {
		return nil, nil
	}
	return c, *h
}

// settleCached decides, once a direct chunk from a cache was copied and
// checked, which of its items are served and which go again through the
// staged route (appended to retry, indices into items; base is the
// chunk's first item's index in the load): a group that failed its
// checksum (the cache drops its block) and every group of a block the
// store changed since Locate. Called before the chunk's pins are
// released, so that Changed compares the copies' versions.
func (p *Pipeline) settleCached(cache Cache, c *directChunk, items []Item, base int, retry []int) []int {
	stale, err := cache.Changed(c.pins, c.stale[:0])
	c.stale = stale[:0]
	var served uint64
	dropped, have := uint64(0), false
	for i := c.lo; i < c.hi; i++ {
		if !c.copied[i-c.lo] {
			continue
		}
		it := &items[i]
		switch {
		case err != nil || slices.Contains(stale, it.Key.Block):
		case it.Err != nil && errors.Is(it.Err, store.ErrCorrupt):
			if b := it.Key.Block; !have || b != dropped {
				cache.Corrupt(b)
				dropped, have = b, true
			}
		case it.Err == nil:
			served += uint64(it.Groups())
			continue
		default:
			continue // a copy or checker error: the item's outcome
		}
		it.Err = nil
		retry = append(retry, base+i)
	}
	p.cache.served.Add(served)
	return retry
}

// corruptCopies appends to idx the items of a staged load from cache
// that failed the device's check (a tile with any head that did), telling
// the cache of each block (Corrupt): its copy in memory is dropped, so a
// second load reads the store.
func (p *Pipeline) corruptCopies(cache Cache, items []Item, idx []int) []int {
	dropped, have := uint64(0), false
	for i := range items {
		it := &items[i]
		if it.Err == nil || !errors.Is(it.Err, store.ErrCorrupt) {
			continue
		}
		if b := it.Key.Block; !have || b != dropped {
			cache.Corrupt(b)
			dropped, have = b, true
		}
		idx = append(idx, i)
	}
	return idx
}

// loadAgain loads items[idx] through the staged route from r (the cache
// as a Reader): the groups a load from the cache's memory did not serve.
// When that load failed as a whole (batchErr), they fail with its error
// instead.
func (p *Pipeline) loadAgain(r Reader, items []Item, idx []int, batchErr error) error {
	if batchErr != nil {
		for _, i := range idx {
			items[i].Err = batchErr
		}
		return batchErr
	}
	if len(idx) == 0 {
		return nil
	}
	groups := 0
	if len(idx) == len(items) {
		// All of them (a load of blocks the cache lacks): in place.
		for i := range items {
			groups += items[i].again()
		}
		return p.loadStagedOrLanded(r, items, groups)
	}
	sub := make([]Item, len(idx))
	for k, i := range idx {
		sub[k] = items[i]
		groups += sub[k].again()
	}
	err := p.loadStagedOrLanded(r, sub, groups)
	for k, i := range idx {
		items[i] = sub[k]
	}
	return err
}

// loadStagedOrLanded loads items through staging, landing pitched tiles
// on the device where it can (as Load does past the direct route).
func (p *Pipeline) loadStagedOrLanded(r Reader, items []Item, groups int) error {
	if p.landsStaged(items) {
		return p.loadLanded(r, items)
	}
	return p.loadStaged(r, items, groups)
}

// again clears the item's outcome for another load and returns its groups.
func (it *Item) again() int {
	it.Err = nil
	if t := it.Tile; t != nil {
		t.Failed, t.Bad = 0, 0
	}
	return it.Groups()
}
