package ringowner

import (
	"fmt"
	"sort"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/uring"
)

// The fixed-buffer table: the pool's pieces and every RegisterMemory
// region. A sparse table updated in place where the kernel can
// (IORING_REGISTER_BUFFERS2/UPDATE), else the whole table re-registered on
// each change (which needs a quiet ring). Only the ring goroutine touches
// it.

func (o *Owner) setupBuffers(noFixed string) {
	if noFixed != "" {
		o.noFixed, o.fixedDisabled = true, noFixed
		return
	}
	o.poolMems = o.pool.segments()
	o.poolPieces = uring.SplitBuffers(o.poolMems, 0)
	if !o.cfg.Legacy {
		n := len(o.poolPieces) + o.cfg.ExtraSlots
		if o.cfg.PoolMaxBytes > o.cfg.PoolBytes {
			n += maxSegments
		}
		err := o.ring.RegisterBuffersSparse(n)
		if err == nil && len(o.poolPieces) > 0 {
			if err = o.ring.UpdateBuffers(o.poolPieces); err != nil {
				_ = o.ring.UnregisterBuffers()
			}
		}
		if err == nil {
			o.sparse = true
			o.tableUsed = make([]bool, n)
			for i := range o.poolPieces {
				o.tableUsed[i] = true
			}
			o.fixed = append([]uring.FixedBuffer(nil), o.poolPieces...)
			o.sortFixed()
			return
		}
		o.log.Info("sparse buffer table unavailable; re-registering the table on changes", zap.Error(err))
	}
	o.legacy = true
	if len(o.poolPieces) == 0 {
		return
	}
	if _, err := o.ring.RegisterBuffers(o.poolMems); err != nil {
		o.log.Warn("fixed buffers unavailable; using plain buffers", zap.Error(err))
		o.noFixed, o.fixedDisabled = true, err.Error()
		return
	}
	o.fixed = append([]uring.FixedBuffer(nil), o.poolPieces...)
	o.sortFixed()
}

// DisableFixed stops using fixed buffers (the device refused them). Ring
// goroutine only: call it from Driver.CompleteIO.
func (o *Owner) DisableFixed(reason string) {
	o.noFixed, o.fixedDisabled = true, reason
	o.fixed = nil
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (o *Owner) sortFixed() {
	sort.Slice(o.fixed, func(i, j int) bool { return addrOf(o.fixed[i].Buf) < addrOf(o.fixed[j].Buf) })
}

// lookupFixed finds the registered entry that holds all of b.
func (o *Owner) lookupFixed(b []byte) (uint16, bool) {
	if len(o.fixed) == 0 || len(b) == 0 {
		return 0, false
	}
	a := addrOf(b)
	// Binary search by hand: sort.Search's closure costs an allocation-free
	// but indirect call per step on the hot path.
	lo, hi := 0, len(o.fixed)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if addrOf(o.fixed[m].Buf) > a {
			hi = m
		} else {
			lo = m + 1
		}
	}
	i := lo - 1
	if i < 0 || !o.fixed[i].Contains(b) {
		return 0, false
	}
	return o.fixed[i].Index, true
}

// register adds c.mem to the fixed buffer table.
func (o *Owner) register(c *call) error {
	if o.noFixed {
		return fmt.Errorf("%s: %w (%s): %w", o.name, ErrNoFixed, o.fixedDisabled, unix.EOPNOTSUPP)
	}
	pieces := uring.SplitBuffers([][]byte{c.mem}, 0)
	id := o.nextReg
	o.nextReg++
	if o.sparse {
		// RegisterMemory takes slots up to the pool's and ExtraSlots; grown
		// pool segments take the slots after them.
		lo, hi := 0, len(o.poolPieces)+o.cfg.ExtraSlots
		if c.segment {
			lo, hi = hi, len(o.tableUsed)
		}
		start := o.freeRun(len(pieces), lo, min(hi, len(o.tableUsed)))
		if start < 0 {
			return fmt.Errorf("%s: fixed buffer table full (%d slots): %w", o.name, len(o.tableUsed), unix.ENOSPC)
		}
		for i := range pieces {
			pieces[i].Index = uint16(start + i)
		}
		if err := o.ring.UpdateBuffers(pieces); err != nil {
			return fmt.Errorf("%s: register %d bytes: %w", o.name, len(c.mem), err)
		}
		for i := range pieces {
			o.tableUsed[start+i] = true
		}
		o.regs[id] = &registration{mem: c.mem, pieces: pieces}
	} else {
		o.regs[id] = &registration{mem: c.mem}
		if err := o.reregister(); err != nil {
			delete(o.regs, id)
			if rerr := o.reregister(); rerr != nil {
				o.log.Error("restore fixed buffer table", zap.Error(rerr))
			}
			return fmt.Errorf("%s: register %d bytes: %w", o.name, len(c.mem), err)
		}
	}
	o.rebuildFixed()
	c.regID = id
	return nil
}

func (o *Owner) unregister(id int) error {
	r, ok := o.regs[id]
	if !ok {
		return nil
	}
	delete(o.regs, id)
	var err error
	if o.sparse {
		clr := make([]uring.FixedBuffer, len(r.pieces))
		for i, p := range r.pieces {
			clr[i] = uring.FixedBuffer{Index: p.Index}
		}
		err = o.ring.UpdateBuffers(clr)
		for _, p := range r.pieces {
			o.tableUsed[p.Index] = false
		}
	} else {
		err = o.reregister()
	}
	o.rebuildFixed()
	return err
}

// freeRun finds n consecutive free sparse-table slots in [lo, hi).
func (o *Owner) freeRun(n, lo, hi int) int {
	run := 0
	for i := lo; i < hi; i++ {
		if o.tableUsed[i] {
			run = 0
			continue
		}
		run++
		if run == n {
			return i - n + 1
		}
	}
	return -1
}

// reregister replaces the whole table with the pool and every
// registration, in id order (legacy kernels without buffer update).
func (o *Owner) reregister() error {
	ids := make([]int, 0, len(o.regs))
	for id := range o.regs {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	bufs := append([][]byte{}, o.poolMems...)
	for _, id := range ids {
		bufs = append(bufs, o.regs[id].mem)
	}
	_ = o.ring.UnregisterBuffers() // ENXIO when there was no table
	for _, id := range ids {
		o.regs[id].pieces = nil
	}
	o.poolPieces = nil
	if len(bufs) == 0 {
		return nil
	}
	pieces, err := o.ring.RegisterBuffers(bufs)
	if err != nil {
		return err
	}
	src := len(o.poolMems)
	for _, p := range pieces {
		if p.Source < src {
			o.poolPieces = append(o.poolPieces, p)
			continue
		}
		r := o.regs[ids[p.Source-src]]
		r.pieces = append(r.pieces, p)
	}
	return nil
}

func (o *Owner) rebuildFixed() {
	if o.noFixed {
		return
	}
	o.fixed = append(o.fixed[:0], o.poolPieces...)
	for _, r := range o.regs {
		o.fixed = append(o.fixed, r.pieces...)
	}
	o.sortFixed()
}
