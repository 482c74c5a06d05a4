package fs

import (
	"time"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Which block and head directories exist: a layer's groups in the store, or
// a pending directory (made by mkdir, or left by rm of its last group) held
// in memory.

// layerRange is the range of group indexes of one layer: K of every head,
// then V of every head.
func (f *FS) layerRange(layer int) (lo, hi int) {
	lo = f.geo.Index(layout.Key{Layer: layer, Kind: layout.K})
	return lo, lo + 2*f.geo.KVHeads
}

func (f *FS) hasLayer(bi store.BlockInfo, layer int) bool {
	lo, hi := f.layerRange(layer)
	for i := lo; i < hi; {
		if i%64 == 0 && hi-i >= 64 {
			if bi.Present[i/64] != 0 {
				return true
			}
			i += 64
			continue
		}
		if bi.Has(i) {
			return true
		}
		i++
	}
	return false
}

// pendingDir is a block directory of one layer that exists without a group
// of that layer in the store (made by mkdir, or left by rm of its last
// group), and the head directories in it that exist without a group.
type pendingDir struct {
	mtime time.Time
	heads map[int]bool
}

// blockDir reports whether directory layer-L/block-B exists: the block has
// a group in the layer, or the directory is pending. mtime is the block's
// latest write (or the pending directory's creation).
func (f *FS) blockDir(layer int, block uint64) (exists bool, groups bool, mtime time.Time) {
	if bi, ok := f.st.Block(block); ok && f.hasLayer(bi, layer) {
		return true, true, bi.MTime
	}
	f.mu.Lock()
	p, ok := f.mu.pending[blockDirKey{layer, block}]
	if ok {
		mtime = p.mtime
	}
	f.mu.Unlock()
	return ok, false, mtime
}

// headGroups reports whether head H of block B has a group (K or V) in
// layer L.
func (f *FS) headGroups(bi store.BlockInfo, layer, head int) bool {
	for _, kind := range []layout.Kind{layout.K, layout.V} {
		if bi.Has(f.geo.Index(layout.Key{Block: bi.ID, Layer: layer, Head: head, Kind: kind})) {
			return true
		}
	}
	return false
}

// headDirExists reports whether layer-L/block-B/head-H exists: it holds a
// group, or it is pending (made by mkdir, or left by rm of its last group).
func (f *FS) headDirExists(layer int, block uint64, head int) (bool, time.Time) {
	if bi, ok := f.st.Block(block); ok && f.headGroups(bi, layer, head) {
		return true, bi.MTime
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.mu.pending[blockDirKey{layer, block}]; ok && p.heads[head] {
		return true, p.mtime
	}
	return false, time.Time{}
}

// pendingHeads lists the pending head directories of a block directory.
func (f *FS) pendingHeads(layer int, block uint64) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.mu.pending[blockDirKey{layer, block}]
	if !ok {
		return nil
	}
	hs := make([]int, 0, len(p.heads))
	for h := range p.heads {
		hs = append(hs, h)
	}
	return hs
}

// addPendingLocked returns the pending entry of a block directory, making
// it; nil when the set is full.
func (f *FS) addPendingLocked(layer int, block uint64) *pendingDir {
	k := blockDirKey{layer, block}
	if p, ok := f.mu.pending[k]; ok {
		return p
	}
	if len(f.mu.pending) >= f.opts.MaxPending {
		return nil
	}
	p := &pendingDir{mtime: f.opts.Now(), heads: map[int]bool{}}
	f.mu.pending[k] = p
	return p
}

// addPending keeps an empty block directory; false when the set is full.
func (f *FS) addPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addPendingLocked(layer, block) != nil
}

// addPendingHead keeps an empty head directory (and its block directory);
// false when the set is full.
func (f *FS) addPendingHead(layer int, block uint64, head int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.addPendingLocked(layer, block)
	if p == nil {
		return false
	}
	p.heads[head] = true
	return true
}

func (f *FS) dropPendingHead(layer int, block uint64, head int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.mu.pending[blockDirKey{layer, block}]; ok {
		delete(p.heads, head)
	}
}

func (f *FS) dropPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := blockDirKey{layer, block}
	_, ok := f.mu.pending[k]
	delete(f.mu.pending, k)
	return ok
}

// storedGroup forgets the pending state a stored group makes redundant:
// its head directory, and its block directory once no pending head is left.
func (f *FS) storedGroup(k layout.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	bk := blockDirKey{k.Layer, k.Block}
	if p, ok := f.mu.pending[bk]; ok {
		delete(p.heads, k.Head)
		if len(p.heads) == 0 {
			delete(f.mu.pending, bk)
		}
	}
}

// movePending moves the pending entries of block from to block to, in
// every layer (after the block was re-keyed in the store).
func (f *FS) movePending(from, to uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, p := range f.mu.pending {
		if k.block != from {
			continue
		}
		delete(f.mu.pending, k)
		nk := blockDirKey{k.layer, to}
		if q, ok := f.mu.pending[nk]; ok {
			for h := range p.heads {
				q.heads[h] = true
			}
			continue
		}
		f.mu.pending[nk] = p
	}
}
