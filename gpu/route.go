package gpu

import "fmt"

// Routes. A load takes one of three routes, chosen by Load alone from the
// request (the reader, the items, whether they hold tiles) and the
// pipeline's state:
//
//   - direct (direct.go): the store's file is in host memory and
//     registered with the device (SetHost), the reader says where groups
//     lie (Locator) and the device checks them (Verify; Land for pitched
//     tiles). The copy engines read the groups straight from the file;
//     no staging. Packed tiles go direct too (each head located and
//     copied as a group); pitched tiles never do. A reader that is a
//     Cache (the DRAM tier) whose memory is registered (SetCache) takes
//     this route for its hits, from its memory (packed tiles too), and
//     the staged route for the rest (cache.go).
//   - landed (landed.go): through staging, with pitched tiles among the
//     items and a device that lands them (Land): their groups are staged
//     packed into device scratch, checked and written into their rows by
//     one kernel pass.
//   - staged (staged.go): everything else. Groups are read into pinned
//     staging and copied to their tiles, checked by the store on the CPU
//     or by the device once copied.
//
// Whatever the route, a group is checked before its bytes are used
// (check.go). From a Cache, a group that fails the device's check is
// loaded once more through staging, the cache having dropped its copy
// (cache.go).

// Load reads items' groups from r and copies them to the device, by the
// route the request takes (see Routes). Per-item outcomes are in Item.Err
// (and a tile's Tile.Failed and Tile.Bad); the error is for the batch as
// a whole (the pool closed, the store closed). Items must have disjoint
// destinations.
//
// tiles reports that items may hold tiles (Item.Tile): the caller built
// them because TakesTiles said the pipeline takes them. Packed ones go
// direct where the host view is registered now, else through staging
// (SetHost runs in the background: it may come or go between TakesTiles
// and Load); pitched ones always through staging. Without it Load does
// not look for tiles before a direct load (a pass over half a million
// items of a 1 GB call), and fails any it meets there.
func (p *Pipeline) Load(r Reader, items []Item, tiles bool) error {
	if !tiles {
		if l, host := p.directFor(r, items); l != nil {
			return p.loadDirect(l, host, items, len(items), false)
		}
	}
	hasTiles, groups, err := p.checkTiles(items)
	if l, host := p.hostView(r); err == nil && tiles && l != nil && !p.anyPitched(items) {
		return p.loadDirect(l, host, items, groups, true)
	}
	if err == nil && hasTiles && !p.tilesStaged(p.anyPitched(items)) {
		err = fmt.Errorf("%w: tiles for a load that takes one group per item", ErrConfig)
	}
	if err != nil {
		for i := range items {
			items[i].failAll(err)
		}
		return err
	}
	err = p.loadStagedOrLanded(r, items, groups)
	if c, ok := r.(Cache); ok && err == nil && p.checksOnDevice() {
		// A cache's copy that failed the device's check is the cache's
		// fault, not the store's: read once more, from the store.
		err = p.loadAgain(c, items, p.corruptCopies(c, items, nil), nil)
	}
	return err
}
