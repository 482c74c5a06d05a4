package gpu

import (
	"errors"
	"fmt"

	"github.com/kvfs/kvfs/store"
)

// The store path: tiles are copied from the device into staging and
// written to the store from there, so the checksums recorded are of
// exactly the bytes written.

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
			reqs = append(reqs, store.WriteReq{Key: it.Key, Data: c.st.Mem[i*gb : (i+1)*gb], Meta: it.Meta})
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
			// cache's consecutive positions. Their runs are queued once
			// the chunk's items are walked (copyRunsD2H: a constant
			// stride apart on the device, one 2D copy).
			runs := c.runs[:0]
			for i := lo; i < hi; i++ {
				it := &items[i]
				c.items = append(c.items, it)
				k := i - lo
				if c.failed != nil {
					it.Err = c.failed
					continue
				}
				c.copied[k] = true
				if !p.pitched(it) {
					runs = addRun(runs, run{src: k * gb, dst: it.Dst, n: gb, m: it.Mapping})
					continue
				}
				var err error
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
			if c.failed == nil {
				if err := copyRunsD2H(q, st.Mem, runs, c2); err != nil {
					c.failed = copyErr(err)
				}
			}
			c.runs = runs[:0]
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
