package gpu

import (
	"errors"
	"fmt"

	"github.com/kvfs/kvfs/store"
)

// Tiles: items of several heads (Item.Heads). A GPU load of whole blocks
// from a disk store spent ~0.3 µs of CPU per group on the H200 (an item,
// a store request, its outcome, a checker descriptor), which on a machine
// with cheap I/O and CRC made its CPU per GB more than a third of a host
// load's. As tiles, a block's (layer, kind) is one item and one store
// request for all its heads.

// Groups is how many groups the item moves: Heads for a tile, else 1.
func (it *Item) Groups() int { return max(1, it.Heads) }

// Group is head j's group of the item (j 0 for a one-group item): where it
// lies on the device (rows Pitch apart, packed for Pitch 0) and its
// recorded checksum.
func (it *Item) Group(j int) (dst uint64, crc uint32) {
	if it.Heads <= 1 {
		return it.Dst, it.CRC
	}
	return it.Dst + uint64(j*it.HeadStride), it.CRCs[j]
}

// Skip reports whether head j of the item has an outcome already (did not
// land): a checker leaves it alone.
func (it *Item) Skip(j int) bool {
	if it.Heads <= 1 {
		return it.Err != nil
	}
	return it.Bad&(1<<j) != 0
}

// FailHead records that head j of the item failed with err: a checker
// found it corrupt (and zeroed it).
func (it *Item) FailHead(j int, err error) {
	if it.Heads <= 1 {
		it.Err = err
		return
	}
	if it.Bad&(1<<j) != 0 {
		return
	}
	it.Bad |= 1 << j
	it.Failed++
	if it.Err == nil || failRank(err) > failRank(it.Err) {
		it.Err = err
	}
}

// failAll fails every head of the item that has no outcome with err.
func (it *Item) failAll(err error) {
	if it.Heads <= 1 {
		it.Err = err
		return
	}
	it.Failed, it.Bad = it.Heads, allHeads(it.Heads)
	if it.Err == nil || failRank(err) >= failRank(it.Err) {
		it.Err = err
	}
}

// done reports whether no group of the item is left to move or check.
func (it *Item) done() bool {
	if it.Heads <= 1 {
		return it.Err != nil
	}
	return it.Failed >= it.Heads
}

// allHeads is Bad with all of heads set.
func allHeads(heads int) uint64 {
	if heads >= 64 {
		return ^uint64(0)
	}
	return 1<<heads - 1
}

// failRank orders a tile's failures as the store orders a range's: a
// missing group, then a corrupt one, then an I/O or copy error.
func failRank(err error) int {
	switch {
	case errors.Is(err, store.ErrNotFound):
		return 0
	case errors.Is(err, store.ErrCorrupt):
		return 1
	}
	return 2
}

// TakesTiles reports whether loads from r take tiles (Item.Heads above 1,
// by LoadTiles): loads checked on the device (Verify) that go through
// staging, the pitched ones (pitched) landed by Land. Loads from the
// store's host view (SetHost) and loads checked on the CPU take one group
// per item.
func (p *Pipeline) TakesTiles(r Reader, pitched bool) bool {
	return p.tilesStaged(pitched) && !p.hostDirect(r)
}

// tilesStaged reports whether a staged load can take tiles: checked on the
// device, the pitched ones landed by Land. LoadTiles asks only this: a
// host view registered since the caller asked TakesTiles (SetHost runs in
// the background) leaves its tiles on staging.
func (p *Pipeline) tilesStaged(pitched bool) bool {
	return p.Verify != nil && (!pitched || (p.Land != nil && p.canAllocDevice()))
}

// checkTiles validates the tiles among items, resetting their outcomes,
// and reports whether there are any, and the groups of all items.
func (p *Pipeline) checkTiles(items []Item) (tiles bool, groups int, err error) {
	for i := range items {
		it := &items[i]
		if it.Heads <= 1 {
			groups++
			continue
		}
		tiles = true
		groups += it.Heads
		it.Err, it.Failed, it.Bad = nil, 0, 0
		if it.Heads > store.MaxBadHeads || len(it.CRCs) != it.Heads || it.HeadStride <= 0 {
			err = fmt.Errorf("%w: a tile of %d heads %d bytes apart with %d checksums", ErrConfig, it.Heads, it.HeadStride, len(it.CRCs))
		}
	}
	return tiles, groups, err
}
