package ctl

import (
	"errors"
	"fmt"
	"syscall"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/ctl/abi"
)

// MaxTargets is the number of KV-cache targets one session may register.
const MaxTargets = 64

// Errors of the minor-2 commands (targets and block entries).
var (
	ErrTooManyTargets = errors.New("ctl: too many targets on this handle")              // EMFILE
	ErrBufferBusy     = errors.New("ctl: buffer is part of a registered target")        // EBUSY
	ErrNoTarget       = errors.New("ctl: no such target on this handle")                // ENOENT
	ErrEntryBuffer    = errors.New("ctl: block entry array's buffer is not registered") // ENOENT
)

// blocksErrno maps the errors of targets and block entries; 0 for others.
func blocksErrno(err error) syscall.Errno {
	switch {
	case errors.Is(err, ErrTooManyTargets):
		return syscall.EMFILE
	case errors.Is(err, ErrBufferBusy):
		return syscall.EBUSY
	case errors.Is(err, ErrNoTarget), errors.Is(err, ErrEntryBuffer), errors.Is(err, abi.ErrNoTarget),
		errors.Is(err, abi.ErrBuffer):
		return syscall.ENOENT
	case errors.Is(err, abi.ErrTarget), errors.Is(err, abi.ErrTargetOverlap), errors.Is(err, abi.ErrEntriesInCache),
		errors.Is(err, abi.ErrEntriesAt):
		return syscall.EINVAL
	case errors.Is(err, abi.ErrEntries), errors.Is(err, abi.ErrRange):
		return syscall.ERANGE
	}
	return 0
}

// blocksState is a session's targets. It is guarded by Session.mu.
type blocksState struct {
	targets map[uint32]*target
	next    uint32
	// refs counts, per buffer id, the targets using the buffer: such a
	// buffer cannot be unregistered (EBUSY) until they are.
	refs map[uint32]int
}

// target is a registered KV-cache target: its validated layout and, per
// (layer, kind), the buffer and offset of its region.
type target struct {
	id      uint32
	lay     abi.Layout
	regions []region // [2·(layer − LayerFirst) + kind]
	bufs    []*buffer
	// bounds per distinct buffer: the bytes its regions span, so an entry
	// array can be kept out of the cache memory in O(buffers).
	bounds []bound
	// dev is the device of a target in CUDA memory, nil for host memory.
	dev *gpuDev
}

type region struct {
	b   *buffer
	off uint64
}

type bound struct {
	b      *buffer
	lo, hi uint64
}

// region of (layer, kind); the layer is inside the target.
func (t *target) region(layer uint32, kind int) *region {
	return &t.regions[2*int(layer-t.lay.LayerFirst)+kind]
}

// inCache reports whether [off, off+n) of buffer b meets the span of one of
// the target's regions in b.
func (t *target) inCache(b *buffer, off, n uint64) bool {
	for _, x := range t.bounds {
		if x.b == b && off < x.hi && x.lo < off+n {
			return true
		}
	}
	return false
}

// registerTarget serves REGISTER_TARGET: the whole target is validated
// once (abi.Tile.CheckTarget) against the session's registrations.
func (ss *Session) registerTarget(tg *abi.Target) (uint32, error) {
	s := ss.srv
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.mu.closed {
		return 0, ErrClosed
	}
	bs := &ss.blk
	lay, err := s.tile.CheckTarget(tg, func(id uint32) (uint64, bool) {
		b := ss.mu.bufs[id]
		if b == nil {
			return 0, false
		}
		return b.size(), true
	})
	if err != nil {
		return 0, err
	}
	// A target's regions are all host memory or all CUDA memory of one
	// device: one call then takes one path (the store straight into the
	// tiles, or one device's pipeline).
	var dev *gpuDev
	for i := range tg.Regions[:2*int(tg.LayerCount)] {
		b := ss.mu.bufs[tg.Regions[i].Buffer]
		var d *gpuDev
		if b.cuda != nil {
			d = b.cuda.dev
		}
		if i > 0 && d != dev {
			return 0, fmt.Errorf("%w: regions mix host memory and CUDA memory, or CUDA devices", abi.ErrTarget)
		}
		dev = d
	}
	// The per-file limit comes after every check of the target itself
	// (docs/abi.md, "Targets"): a malformed target is EINVAL however many
	// targets the file holds.
	if len(bs.targets) >= MaxTargets {
		return 0, fmt.Errorf("%w: %d", ErrTooManyTargets, MaxTargets)
	}
	t := &target{lay: lay, regions: make([]region, 2*int(tg.LayerCount)), dev: dev}
	for i := range t.regions {
		r := &tg.Regions[i]
		b := ss.mu.bufs[r.Buffer]
		t.regions[i] = region{b: b, off: r.Offset}
		k := -1
		for j := range t.bounds {
			if t.bounds[j].b == b {
				k = j
			}
		}
		if k < 0 {
			t.bufs = append(t.bufs, b)
			t.bounds = append(t.bounds, bound{b: b, lo: r.Offset, hi: r.Offset + lay.Extent})
			continue
		}
		x := &t.bounds[k]
		x.lo, x.hi = min(x.lo, r.Offset), max(x.hi, r.Offset+lay.Extent)
	}
	if bs.targets == nil {
		bs.targets, bs.refs = map[uint32]*target{}, map[uint32]int{}
	}
	for t.id == 0 || bs.targets[t.id] != nil {
		bs.next++
		t.id = bs.next
	}
	bs.targets[t.id] = t
	for _, b := range t.bufs {
		bs.refs[b.id]++
	}
	s.log.Debug("ctl: target registered", zap.Uint64("session", ss.id), zap.Uint32("target", t.id),
		zap.Uint16("layers", tg.LayerCount), zap.Uint16("heads", tg.HeadCount), zap.Uint32("blocks", tg.NumBlocks))
	return t.id, nil
}

// unregisterTarget serves UNREGISTER_TARGET. A call in flight keeps using
// the target it looked up; its buffers stay mapped until that call ends
// (they are unmapped only by UNREGISTER or Release, which wait for it).
func (ss *Session) unregisterTarget(id uint32) error {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.mu.closed {
		return ErrClosed
	}
	bs := &ss.blk
	t := bs.targets[id]
	if t == nil {
		return fmt.Errorf("%w: %d", ErrNoTarget, id)
	}
	delete(bs.targets, id)
	for _, b := range t.bufs {
		if bs.refs[b.id]--; bs.refs[b.id] <= 0 {
			delete(bs.refs, b.id)
		}
	}
	return nil
}

// bufferBusy reports whether buffer id is part of a target. ss.mu held.
func (ss *Session) bufferBusy(id uint32) bool { return ss.blk.refs[id] > 0 }
