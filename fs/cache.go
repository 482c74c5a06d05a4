package fs

import (
	"container/list"
	"errors"
	"fmt"
	"sync"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Read-ahead. A miss reads the whole extent of the group's layer in its
// block (K and V of every head: contiguous in the slot, one I/O) when it is
// at most Options.ReadAhead bytes, and keeps every group of it in a small
// LRU cache of snapshots. Tools walk the tree head by head, K then V, so
// the next opens of the same block and layer are served from memory.
//
// A cached snapshot carries the identity (CRC, mtime, slot) the store's
// index gave for its group just before the read, and is served only while
// store.Stat still gives that identity, exactly like a handle's own
// snapshot: the cache can cost a re-read, never a stale byte.

// snapCache is an LRU of group snapshots bounded in bytes.
type snapCache struct {
	mu struct {
		sync.Mutex
		m     map[layout.Key]*list.Element // of *cacheEntry
		lru   list.List                    // front = most recent
		bytes int
	}
	max int
}

type cacheEntry struct {
	key  layout.Key
	snap *snapshot
}

func newSnapCache(maxBytes int) *snapCache {
	c := &snapCache{max: maxBytes}
	c.mu.m = map[layout.Key]*list.Element{}
	return c
}

func (c *snapCache) get(k layout.Key) *snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.mu.m[k]
	if !ok {
		return nil
	}
	c.mu.lru.MoveToFront(e)
	return e.Value.(*cacheEntry).snap
}

func (c *snapCache) put(k layout.Key, s *snapshot) {
	if c.max <= 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.mu.m[k]; ok {
		old := e.Value.(*cacheEntry)
		c.mu.bytes += len(s.data) - len(old.snap.data)
		old.snap = s
		c.mu.lru.MoveToFront(e)
	} else {
		c.mu.m[k] = c.mu.lru.PushFront(&cacheEntry{k, s})
		c.mu.bytes += len(s.data)
	}
	for c.mu.bytes > c.max && c.mu.lru.Len() > 0 {
		e := c.mu.lru.Back()
		ce := e.Value.(*cacheEntry)
		c.mu.lru.Remove(e)
		delete(c.mu.m, ce.key)
		c.mu.bytes -= len(ce.snap.data)
	}
}

// snapshotOf returns the bytes of group k's version gi (its current one):
// from the cache when it holds that version, else read from the store with
// the rest of the layer's extent.
func (f *FS) snapshotOf(k layout.Key, gi store.GroupInfo) (*snapshot, error) {
	if s := f.cache.get(k); s.is(gi) {
		f.m.cacheHits.Add(1)
		return s, nil
	}
	f.m.cacheMisses.Add(1)
	gb := f.geo.GroupBytes()
	type want struct {
		key layout.Key
		gi  store.GroupInfo
	}
	// The wanted groups in slot (index) order; mineAt is k's place.
	wants := []want{{k, gi}}
	mineAt := 0
	lo, hi := f.layerRange(k.Layer)
	if (hi-lo)*gb <= f.opts.ReadAhead {
		if bi, ok := f.st.Block(k.Block); ok {
			wants = wants[:0]
			for idx := lo; idx < hi; idx++ {
				key := f.geo.KeyAt(k.Block, idx)
				if key == k {
					mineAt = len(wants)
					wants = append(wants, want{k, gi})
					continue
				}
				if !bi.Has(idx) {
					continue
				}
				// Label each group before reading it (see above).
				if g, err := f.st.Stat(key); err == nil {
					wants = append(wants, want{key, g})
				}
			}
		}
	}
	// One aligned buffer, groups in index order, each request's capacity
	// running to the buffer's end: the store lands each run of adjacent
	// groups with one I/O straight into it (store's package doc, "Where
	// reads land").
	buf := store.MakeAligned(len(wants)*gb, f.align) // store.Read lands in it without a bounce buffer
	reqs := make([]store.ReadReq, len(wants))
	for i := range wants {
		reqs[i] = store.ReadReq{Key: wants[i].key, Buf: buf[i*gb : (i+1)*gb]}
	}
	if err := f.io.Read(reqs); err != nil {
		return nil, err
	}
	var mine *snapshot
	var mineErr error
	for i, w := range wants {
		if err := reqs[i].Err; err != nil {
			if i == mineAt {
				if errors.Is(err, store.ErrNotFound) {
					err = fmt.Errorf("%w: %v", errGone, k)
				}
				mineErr = err
			}
			continue
		}
		s := &snapshot{crc: w.gi.CRC, mtime: w.gi.MTime.UnixNano(), slot: w.gi.Slot, data: buf[i*gb : (i+1)*gb : (i+1)*gb]}
		if i == mineAt {
			mine = s
		}
		f.cache.put(w.key, s)
	}
	return mine, mineErr
}
