package gpu

import "fmt"

// The landed route: staged loads of pitched tiles, landed by the GPU. A
// store that is not in memory (a disk) is read into pinned staging by DMA;
// on the staged route a pitched (NHD) tile then has the CPU lay its rows
// out in staging as they lie on the device, a copy of every byte, which
// costs as much CPU as a load into host memory. With Land, pitched tiles
// are read packed instead (the storage's DMA, no CPU), copied packed into
// device scratch, and the kernel checks each group there and writes its
// rows into the tile, in one pass.

// landBatch is the most bytes of pitched tiles one scratch carries
// (Pipeline.LandBatch, default 128 MiB): a load's pitched tiles go
// through it in batches of that size, each one staged pipeline that fills
// and drains (smaller batches drain too often to keep a disk busy).
func (p *Pipeline) landBatch() int {
	if p.LandBatch > 0 {
		return max(p.LandBatch, p.Geo.GroupBytes)
	}
	return 128 << 20
}

// landScratch is device memory for one batch, and the host slices that
// describe a batch (kept with it).
type landScratch struct {
	addr   uint64
	free   func() error
	tiles  []tile // the batch's pitched items' own tiles
	landed []*Item
	srcs   []uint64
}

// tile is where a pitched item lands, kept aside while the item points at
// device scratch.
type tile struct {
	dst, mapping      uint64
	pitch, headStride int
}

// landsStaged reports whether a staged load of items should land pitched
// tiles with the kernel: Land and Verify set, a device that allocates, and
// a pitched tile among items.
func (p *Pipeline) landsStaged(items []Item) bool {
	return p.Land != nil && p.checksOnDevice() && p.canAllocDevice() && p.anyPitched(items)
}

// loadLanded is Load through staging for items with pitched tiles: in
// batches of landBatch bytes of them, every pitched tile's group is
// loaded packed into device scratch (the staged pipeline as for packed
// tiles, without Verify), then Land checks it there and writes its rows
// into the tile, zeros for one that fails: each group's checksum is
// computed once. Packed tiles go straight to their places in the same
// runs, verified there.
//
// Tiles of several heads (Item.Tile) are staged with their heads packed
// one after another in scratch, and Land writes each head that landed
// into its place.
func (p *Pipeline) loadLanded(r Reader, items []Item) error {
	gb := p.Geo.GroupBytes
	p.landOnce.Do(func() { p.idleLand.Max = 4 })
	sc := p.idleLand.Get()
	if sc.free == nil {
		a := p.Dev.(DeviceAllocator)
		addr, free, err := a.AllocDevice(p.landBatch())
		if err != nil {
			p.idleLand.Put(sc)
			err = fmt.Errorf("%w: device scratch: %w", ErrCopy, err)
			for i := range items {
				items[i].failAll(err)
			}
			return nil
		}
		sc.addr, sc.free = addr, free
	}
	defer func() {
		if !p.idleLand.Put(sc) {
			_ = sc.free()
		}
	}()
	per := p.landBatch() / gb
	tiles, landed, srcs := sc.tiles, sc.landed, sc.srcs
	defer func() {
		clear(landed[:cap(landed)]) // no item stays reachable from an idle scratch
		sc.tiles, sc.landed, sc.srcs = tiles[:0], landed[:0], srcs[:0]
	}()
	for lo := 0; lo < len(items); {
		// A batch: items from lo until per pitched tiles are in it. Each
		// pitched item is pointed at its place in scratch, in place (a
		// copy of the batch's items cost more than the rest of this
		// loop), its tile kept aside until the read is over.
		tiles, landed, srcs = tiles[:0], landed[:0], srcs[:0]
		hi, used, groups := lo, 0, 0 // used: scratch, in groups
		for ; hi < len(items); hi++ {
			it := &items[hi]
			if p.pitched(it) {
				n := it.Groups()
				if used > 0 && used+n > per {
					break
				}
				t := tile{dst: it.Dst, mapping: it.Mapping, pitch: it.Pitch}
				it.Dst, it.Pitch, it.Mapping, it.landed = sc.addr+uint64(used*gb), 0, sc.addr, true
				if it.Tile != nil {
					t.headStride, it.Tile.HeadStride = it.Tile.HeadStride, gb
				}
				tiles = append(tiles, t)
				used += n
			}
			groups += it.Groups()
		}
		err := p.loadStaged(r, items[lo:hi], groups)
		k := 0
		for i := lo; i < hi; i++ {
			it := &items[i]
			if !it.landed {
				continue
			}
			src, t := it.Dst, tiles[k]
			k++
			it.Dst, it.Mapping, it.Pitch, it.landed = t.dst, t.mapping, t.pitch, false
			if it.Tile != nil {
				it.Tile.HeadStride = t.headStride
				// The heads that landed in scratch (the others are
				// missing, or their read or copy failed: left as they
				// are) go to Land.
				if !it.done() {
					landed = append(landed, it)
					srcs = append(srcs, src)
				}
				continue
			}
			if goesOn(it.Err) {
				// Not verified in scratch (Land checks it), or found
				// corrupt by the store: Land finds it differs and writes
				// zeros into the tile.
				it.Err = nil
				landed = append(landed, it)
				srcs = append(srcs, src)
			}
		}
		p.check(nil, landed, srcs)
		if err != nil {
			for i := hi; i < len(items); i++ {
				items[i].failAll(err)
			}
			return err
		}
		lo = hi
	}
	return nil
}
