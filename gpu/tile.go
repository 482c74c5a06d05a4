package gpu

import (
	"fmt"

	"github.com/kvfs/kvfs/store"
)

// Tiles: items of several heads (Item.Tile). Moved one group per item, a
// GPU load of whole blocks pays the CPU per group (an item, a store
// request, its outcome, a checker descriptor), which where I/O and CRC are
// cheap is a large share of its CPU per GB (docs/performance.md, "CPU per
// GB"). As tiles, a block's (layer, kind) is one item and one store request
// for all its heads.

// Tile is what makes an item (Item.Tile) a tile of several heads: the
// groups of heads Key.Head to Key.Head+Heads-1 of one (block, layer,
// kind), head j's at Item.Dst + j*HeadStride, each laid out as an item's
// group is (rows Item.Pitch apart). From 2 to store.MaxBadHeads heads,
// their destinations disjoint.
type Tile struct {
	Heads, HeadStride int
	// CRCs holds the heads' recorded checksums (a load sets them; the
	// caller provides the Heads elements), as Item.CRC does for one group.
	CRCs []uint32
	// Failed and Bad are the tile's outcome besides Item.Err: how many of
	// its heads did not land, and which (bit j for head Key.Head+j).
	// Item.Err is then the most serious of their failures (an I/O or copy
	// error, else a corruption, else store.ErrNotFound), nil with Failed 0.
	Failed int
	Bad    uint64
}

// Groups is how many groups the item moves: a tile's heads, else 1.
func (it *Item) Groups() int {
	if it.Tile != nil {
		return it.Tile.Heads
	}
	return 1
}

// Group is head j's group of the item (j 0 for a one-group item): where it
// lies on the device (rows Pitch apart, packed for Pitch 0) and its
// recorded checksum.
func (it *Item) Group(j int) (dst uint64, crc uint32) {
	if t := it.Tile; t != nil {
		return it.Dst + uint64(j*t.HeadStride), t.CRCs[j]
	}
	return it.Dst, it.CRC
}

// Skip reports whether group j of the item has an outcome already (did
// not land, or failed): a checker leaves it alone.
func (it *Item) Skip(j int) bool {
	if t := it.Tile; t != nil {
		return t.Bad&(1<<j) != 0
	}
	return it.Err != nil
}

// FailHead records that group j of the item failed with err: a checker
// found it corrupt (and zeroed it).
func (it *Item) FailHead(j int, err error) {
	t := it.Tile
	if t == nil {
		it.Err = err
		return
	}
	if t.Bad&(1<<j) != 0 {
		return
	}
	t.Bad |= 1 << j
	t.Failed++
	if it.Err == nil || store.FailRank(err) > store.FailRank(it.Err) {
		it.Err = err
	}
}

// failAll fails every group of the item that has no outcome with err.
func (it *Item) failAll(err error) {
	t := it.Tile
	if t == nil {
		it.Err = err
		return
	}
	t.Failed, t.Bad = t.Heads, store.AllBad(t.Heads)
	if it.Err == nil || store.FailRank(err) >= store.FailRank(it.Err) {
		it.Err = err
	}
}

// done reports whether no group of the item is left to move or check.
func (it *Item) done() bool {
	if t := it.Tile; t != nil {
		return t.Failed >= t.Heads
	}
	return it.Err != nil
}

// TakesTiles reports whether a load from r may be given tiles (Item.Tile;
// Load with tiles set): loads checked on the device (Verify), through
// staging (the pitched ones (pitched) landed by Land) or, packed ones,
// direct from the store's host view (SetHost) or a Cache's registered
// memory (SetCache), whose direct route hands a tile with any head it does
// not hold to staging whole. Pitched loads that would go direct and loads
// checked on the CPU take one group per item.
func (p *Pipeline) TakesTiles(r Reader, pitched bool) bool {
	if l, _ := p.hostView(r); l != nil {
		return !pitched
	}
	return p.tilesStaged(pitched)
}

// tilesStaged reports whether a staged load can take tiles: checked on the
// device, the pitched ones landed by Land. A load declared to hold tiles
// asks only this: a host view registered since the caller asked
// TakesTiles (SetHost runs in the background) leaves its tiles on
// staging.
func (p *Pipeline) tilesStaged(pitched bool) bool {
	return p.checksOnDevice() && (!pitched || (p.Land != nil && p.canAllocDevice()))
}

// checkTiles validates the tiles among items, resetting their outcomes,
// and reports whether there are any, and the groups of all items.
func (p *Pipeline) checkTiles(items []Item) (tiles bool, groups int, err error) {
	for i := range items {
		it := &items[i]
		t := it.Tile
		if t == nil {
			groups++
			continue
		}
		tiles = true
		groups += max(1, t.Heads)
		it.Err, t.Failed, t.Bad = nil, 0, 0
		if t.Heads < 2 || t.Heads > store.MaxBadHeads || len(t.CRCs) != t.Heads || t.HeadStride <= 0 {
			err = fmt.Errorf("%w: a tile of %d heads %d bytes apart with %d checksums", ErrConfig, t.Heads, t.HeadStride, len(t.CRCs))
		}
	}
	return tiles, groups, err
}
