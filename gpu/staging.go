package gpu

import (
	"fmt"

	"github.com/kvfs/kvfs/store"
)

// Staging ownership: a batch's chunks and the staging buffers they hold.
// A buffer is the batch's from acquire until release (or until acquire
// reuses it for the batch's next chunk), and is reused only once the event
// recorded after its last copy was seen complete (see the package
// invariants).

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
	// spanned: its tiles are staged in spans (spanTiles), in destination
	// order; their copies are sorted by destination.
	spanned bool
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
