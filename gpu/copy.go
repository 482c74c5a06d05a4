package gpu

import (
	"cmp"
	"slices"
)

// Copy planning: the host-to-device copies of a chunk, whether its
// sources are a staging buffer or the store's file in host memory, are
// gathered as runs (a span of source going to a span of device memory),
// merged where adjacent on both sides, and queued as plain copies, 2D
// copies (runs at constant strides) or one batch call.

// run is a contiguous span of staging going to a contiguous span of device
// memory.
type run struct {
	src int    // offset in the source: a staging buffer, or the store's host view
	dst uint64 // device address
	n   int
	m   uint64 // the destination's Item.Mapping
}

// addRun appends r to runs, or extends the last run when r follows it on
// both sides.
func addRun(runs []run, r run) []run {
	if n := len(runs); n > 0 && runs[n-1].joins(r) {
		runs[n-1].n += r.n
		return runs
	}
	return append(runs, r)
}

// joins reports whether b follows a on both sides, in the same mapping:
// the two are one copy.
func (a run) joins(b run) bool {
	return a.m == b.m && a.src+a.n == b.src && a.dst+uint64(a.n) == b.dst
}

// maxPitch bounds the pitches of a merged 2D copy (devices cap them, at
// 2^31-1 on current NVIDIA GPUs).
const maxPitch = 1 << 30

// copyRuns queues the chunk's runs in device order, runs next to each other
// on both sides as one copy. With a Copier2D, runs of equal length whose
// sources and destinations advance by constant strides become one 2D copy:
// the heads of one (layer, kind) of consecutive cache blocks of an HND
// target, when they lie a block apart in staging and next to each other on
// the device, move in one copy. With a Batcher, the copies left (tiles of
// cache blocks scattered over the device: one per (block, layer, kind) of
// an HND target) are queued with one call.
//
// Run sources are offsets in mem: the chunk's staging buffer, or for a
// direct load the store's file in host memory (loadDirect). bt gathers the
// batched copies. inOrder keeps the runs in the order given (already
// merged where adjacent) instead of sorting them by destination: a direct
// load's runs in item order are a block's (layer, kind) tiles one after
// another, a constant stride apart in the file and, where the target's
// tensors are evenly spaced, on the device too: one 2D copy per block.
func (p *Pipeline) copyRuns(q Device, mem []byte, bt *copyBatch, runs []run, c2 Copier2D, inOrder bool) error {
	b := p.batcher(q)
	if len(runs) < 2 {
		for _, r := range runs {
			if err := q.CopyH2D(r.dst, mem[r.src:r.src+r.n]); err != nil {
				return err
			}
		}
		return nil
	}
	if !inOrder {
		slices.SortFunc(runs, func(a, b run) int { return cmp.Compare(a.dst, b.dst) })
		// Runs next to each other on both sides (staged in destination
		// order by sortStaging, queued in item order) are one copy.
		k := 0
		for _, r := range runs[1:] {
			if runs[k].joins(r) {
				runs[k].n += r.n
				continue
			}
			k++
			runs[k] = r
		}
		runs = runs[:k+1]
	}
	bt.dsts, bt.srcs = bt.dsts[:0], bt.srcs[:0]
	one := func(r run) error {
		if b != nil {
			bt.dsts = append(bt.dsts, r.dst)
			bt.srcs = append(bt.srcs, mem[r.src:r.src+r.n])
			return nil
		}
		return q.CopyH2D(r.dst, mem[r.src:r.src+r.n])
	}
	for lo := 0; lo < len(runs); {
		r0 := runs[lo]
		hi := lo + 1
		if c2 != nil && hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src > r0.src && runs[hi].src-r0.src >= r0.n &&
			runs[hi].src-r0.src <= maxPitch && runs[hi].dst-r0.dst <= maxPitch {
			ss, ds := runs[hi].src-r0.src, runs[hi].dst-r0.dst
			for hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src == r0.src+(hi-lo)*ss && runs[hi].dst == r0.dst+uint64(hi-lo)*ds {
				hi++
			}
		}
		var err error
		if h := hi - lo; h == 1 || (b != nil && h < minBatch) {
			// With a batch to join, a few runs go in it rather than as a
			// 2D copy of their own.
			for _, r := range runs[lo:hi] {
				if err = one(r); err != nil {
					break
				}
			}
		} else {
			ss, ds := runs[lo+1].src-r0.src, int(runs[lo+1].dst-r0.dst)
			err = c2.CopyH2D2D(r0.dst, ds, mem[r0.src:r0.src+(h-1)*ss+r0.n], ss, r0.n, h)
		}
		if err != nil {
			return err
		}
		lo = hi
	}
	return p.flushBatch(q, b, bt)
}

// copyRunsD2H queues a store chunk's device-to-host runs, in the order
// given (the chunk's items', so their sources in staging ascend): each as
// one copy, or with a Copier2D, runs of equal length whose device sources
// advance by a constant stride (at least their length: a valid pitch) and
// whose staging places follow one another as one 2D copy: a Hugging Face
// cache's heads of one (layer, kind), a sequence apart on the device,
// move with one copy per tensor, or per block where the tensors are
// evenly spaced, instead of one per group.
func copyRunsD2H(q Device, mem []byte, runs []run, c2 Copier2D) error {
	for lo := 0; lo < len(runs); {
		r0 := runs[lo]
		hi := lo + 1
		if c2 != nil && hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src == r0.src+r0.n &&
			runs[hi].dst > r0.dst && runs[hi].dst-r0.dst >= uint64(r0.n) && runs[hi].dst-r0.dst <= maxPitch {
			ds := runs[hi].dst - r0.dst
			for hi < len(runs) && runs[hi].m == r0.m && runs[hi].n == r0.n && runs[hi].src == r0.src+(hi-lo)*r0.n && runs[hi].dst == r0.dst+uint64(hi-lo)*ds {
				hi++
			}
		}
		var err error
		if h := hi - lo; h == 1 {
			err = q.CopyD2H(mem[r0.src:r0.src+r0.n], r0.dst)
		} else {
			err = c2.CopyD2H2D(mem[r0.src:r0.src+h*r0.n], r0.n, r0.dst, int(runs[lo+1].dst-r0.dst), r0.n, h)
		}
		if err != nil {
			return err
		}
		lo = hi
	}
	return nil
}

// minBatch is the fewest copies queued as a batch (fewer go one by one).
const minBatch = 4

// copyBatch is a chunk's copies gathered for one batch call.
type copyBatch struct {
	dsts []uint64
	srcs [][]byte
}

// batcher is the device's batch copier, nil when it has none or a batch
// failed where single copies worked (the driver refuses batches).
func (p *Pipeline) batcher(q Device) Batcher {
	if b, ok := q.(Batcher); ok && !p.NoBatch && !p.batchOff.Load() && b.CanBatch() {
		return b
	}
	return nil
}

// flushBatch queues the gathered copies: as one batch, or one by one when
// they are few or the batch fails (none of a failed batch's copies can be
// taken as queued: each is queued again, which rewrites the same bytes).
func (p *Pipeline) flushBatch(q Device, b Batcher, bt *copyBatch) error {
	defer func() { clear(bt.srcs) }()
	refused := false
	if len(bt.dsts) >= minBatch {
		if b.CopyH2DBatch(bt.dsts, bt.srcs) == nil {
			p.batched.Add(uint64(len(bt.dsts)))
			return nil
		}
		refused = true
	}
	for i, dst := range bt.dsts {
		if err := q.CopyH2D(dst, bt.srcs[i]); err != nil {
			return err // not the batch's fault alone
		}
	}
	if refused {
		p.batchOff.Store(true)
	}
	return nil
}
