package ringowner

import (
	"errors"
	"fmt"
	"io"
	"runtime"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// This file is the ring goroutine: it sets up the ring on its own OS
// thread, then fills it from the queue of calls and completes their IOs.

func nextPow2(n int) uint32 {
	p := uint32(1)
	for int(p) < n {
		p <<= 1
	}
	return p
}

func (o *Owner) run(ready chan<- error) {
	defer close(o.exited)
	// The ring is created with SINGLE_ISSUER/DEFER_TASKRUN when the kernel
	// has them: every io_uring call must come from this OS thread. The
	// thread is never unlocked, so it exits with the goroutine.
	runtime.LockOSThread()
	if err := o.setup(); err != nil {
		if o.ring != nil {
			_ = o.ring.Close()
		}
		ready <- err
		return
	}
	ready <- nil
	o.loop()
}

func (o *Owner) setup() error {
	ro := o.cfg.Ring
	ro.Entries = nextPow2(o.qd + 2) // QD requests + the eventfd read + a cancel
	ro.SingleIssuer, ro.DeferTaskrun, ro.CoopTaskrun = true, true, true
	r, err := uring.New(ro)
	if err != nil {
		return fmt.Errorf("%s: %w", o.name, err)
	}
	o.ring = r
	probe, err := r.Probe()
	if err != nil {
		return fmt.Errorf("%s: %w", o.name, err)
	}
	o.cancelAny = probe.Supported(uring.OpAsyncCancel)
	o.syncInline = o.cfg.SyncFallback != nil && !probe.Supported(o.cfg.SyncOp)
	o.slots = make([]slot, o.qd)
	o.iovs = make([][]unix.Iovec, o.qd)
	o.free = make([]int, o.qd)
	for i := range o.free {
		o.free[i] = o.qd - 1 - i
	}
	noFixed, err := o.d.Setup(r, probe)
	if err != nil {
		return err
	}
	if noFixed == "" {
		noFixed = o.cfg.NoFixed
	}
	o.setupBuffers(noFixed)
	o.log.Info("ring ready",
		zap.Int("queue_depth", o.qd), zap.String("ring_flags", fmt.Sprintf("%#x", r.Flags())),
		zap.Int("sq_entries", r.SQEntries()), zap.Bool("fixed_buffers", !o.noFixed),
		zap.Bool("buffer_update", o.sparse), zap.Int("pool_bytes", o.pool.size()))
	return nil
}

func (o *Owner) loop() {
	cqes := make([]uring.CQE, o.ring.CQEntries())
	for {
		o.mu.Lock()
		o.mu.sleeping = false
		o.pending = append(o.pending, o.mu.queue...)
		clear(o.mu.queue)
		o.mu.queue = o.mu.queue[:0]
		o.mu.Unlock()

		o.fill()
		if o.closing != nil && o.inflight() == 0 {
			o.shutdown(cqes)
			return
		}
		if !o.armed {
			o.arm()
		}
		o.mu.Lock()
		wait := len(o.mu.queue) == 0
		o.mu.sleeping = wait
		o.mu.Unlock()
		n := 0
		if wait {
			n = 1
		}
		err := o.enter(n)
		if wait {
			// Awake again: callers (and completion callbacks, which run
			// here) need not write the eventfd.
			o.mu.Lock()
			o.mu.sleeping = false
			o.mu.Unlock()
		}
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
				o.fail(err, cqes)
				return
			}
			// Out of kernel resources or CQ overflow: reap, then go on.
			time.Sleep(50 * time.Microsecond)
		}
		o.reap(cqes)
	}
}

// enter submits the SQ and waits for n completions.
func (o *Owner) enter(n int) error {
	o.enters++
	o.stats.enters.Add(1)
	if h := o.cfg.EnterHook; h != nil {
		if err := h(o.enters - 1); err != nil {
			return err
		}
	}
	_, err := o.ring.SubmitAndWait(n)
	return err
}

// reap completes every CQE ready; it returns how many.
func (o *Owner) reap(cqes []uring.CQE) int {
	total := 0
	for {
		k := o.ring.ReapCQEs(cqes)
		for _, c := range cqes[:k] {
			o.complete(c)
		}
		total += k
		if k < len(cqes) {
			return total
		}
	}
}

func (o *Owner) inflight() int { return o.qd - len(o.free) }

func (o *Owner) getSlot() int {
	i := o.free[len(o.free)-1]
	o.free = o.free[:len(o.free)-1]
	n := o.sh.inflight.Add(1)
	for {
		m := o.sh.maxInFlight.Load()
		if n <= m || o.sh.maxInFlight.CompareAndSwap(m, n) {
			break
		}
	}
	return i
}

func (o *Owner) putSlot(i int) {
	o.slots[i] = slot{}
	o.free = append(o.free, i)
	o.sh.inflight.Add(-1)
}

// arm keeps a read of the eventfd in flight, so that a caller's write
// ends the ring goroutine's wait in io_uring_enter.
func (o *Owner) arm() {
	sqe := o.ring.GetSQE()
	if sqe == nil {
		return // SQ full: the wait ends with a completion anyway
	}
	sqe.PrepRead(int32(o.efd), o.wakeBuf[:], 0)
	sqe.SetUserData(wakeTag)
	o.armed = true
}

// fill starts pending work while slots are free, in FIFO order.
func (o *Owner) fill() {
	for len(o.pending) > 0 {
		c := o.pending[0]
		switch c.kind {
		case callIO:
			for c.next < len(c.ios) && len(o.free) > 0 {
				i := c.next
				rq := &c.ios[i]
				if c.nextOff == 0 {
					rq.Err = nil
					if err := o.d.Check(rq); err != nil {
						c.next++
						rq.Err = err
						o.stats.errors.Add(1)
						c.ioDone(i)
						continue
					}
					if rq.Vec != nil {
						if err := o.checkVec(rq); err != nil {
							c.next++
							rq.Err = err
							o.stats.errors.Add(1)
							c.ioDone(i)
							continue
						}
					}
					if rq.VecLen() == 0 {
						c.next++
						o.stats.ios.Add(1)
						c.ioDone(i)
						continue
					}
					if parts := o.pieces(rq); parts > 1 {
						if c.parts == nil {
							c.parts = make([]int32, len(c.ios))
						}
						c.parts[i] = int32(parts)
					}
				}
				si := o.getSlot()
				if rq.Vec != nil {
					s1, n := vecPiece(rq.Vec, c.nextSeg, o.maxPiece)
					o.slots[si] = slot{kind: slotIO, c: c, i: i, off: c.nextOff, n: n, seg0: c.nextSeg, seg1: s1}
					c.nextOff += n
					if c.nextSeg = s1; s1 >= len(rq.Vec) {
						c.next++
						c.nextOff, c.nextSeg = 0, 0
					}
				} else {
					n := min(o.maxPiece, len(rq.Buf)-c.nextOff)
					o.slots[si] = slot{kind: slotIO, c: c, i: i, off: c.nextOff, n: n}
					if c.nextOff += n; c.nextOff >= len(rq.Buf) {
						c.next++
						c.nextOff = 0
					}
				}
				o.prepIO(si)
			}
			if c.next < len(c.ios) {
				return // out of slots
			}
		case callSync:
			if o.syncInline {
				c.err = o.cfg.SyncFallback()
				o.stats.syncs.Add(1)
				c.finishOne()
				break
			}
			if len(o.free) == 0 {
				return
			}
			si := o.getSlot()
			o.slots[si] = slot{kind: slotSync, c: c}
			o.prepSync(si)
		case callRegister, callUnregister:
			if o.legacy && o.inflight() > 0 {
				return // replacing the whole table wants a quiet ring
			}
			if c.kind == callRegister {
				c.err = o.register(c)
				if c.segment { // nobody waits
					if c.err != nil && !errors.Is(c.err, ErrNoFixed) {
						o.log.Warn("buffer pool segment not registered; I/O on it uses plain buffers", zap.Int("bytes", len(c.mem)), zap.Error(c.err))
					} else {
						o.stats.segments.Add(1)
					}
				}
			} else {
				c.err = o.unregister(c.regID)
			}
			c.finishOne()
		case callClose:
			if o.inflight() > 0 {
				return
			}
			o.closing = c
		}
		o.pending[0] = nil
		o.pending = o.pending[1:]
	}
}

func (o *Owner) getSQE() *uring.SQE {
	sqe := o.ring.GetSQE()
	if sqe == nil {
		// Cannot happen with SQ entries > QD, but stay correct: push the
		// SQ to the kernel and try again.
		_, _ = o.ring.Submit()
		sqe = o.ring.GetSQE()
	}
	return sqe
}

// checkVec validates a vector read: a driver that serves them, no empty
// segment.
func (o *Owner) checkVec(rq *store.IO) error {
	if _, ok := o.d.(VecDriver); !ok || rq.Op != store.OpRead || rq.Buf != nil {
		return fmt.Errorf("%s: vector %v at offset %d: not supported: %w", o.name, rq.Op, rq.Off, unix.EINVAL)
	}
	for _, v := range rq.Vec {
		if len(v) == 0 {
			return fmt.Errorf("%s: vector read at offset %d: empty segment: %w", o.name, rq.Off, unix.EINVAL)
		}
	}
	return nil
}

// pieces is the number of SQEs rq is split into.
func (o *Owner) pieces(rq *store.IO) int {
	if rq.Vec == nil {
		return (len(rq.Buf) + o.maxPiece - 1) / o.maxPiece
	}
	n := 0
	for s := 0; s < len(rq.Vec); n++ {
		s, _ = vecPiece(rq.Vec, s, o.maxPiece)
	}
	return n
}

// vecPiece is the piece of vec starting at segment s0: it ends before
// segment s1 and holds n bytes (at most MaxVecSegments segments and, past
// the first, maxPiece bytes).
func vecPiece(vec [][]byte, s0, maxPiece int) (s1, n int) {
	s1 = s0
	for s1 < len(vec) && s1-s0 < MaxVecSegments && (s1 == s0 || n+len(vec[s1]) <= maxPiece) {
		n += len(vec[s1])
		s1++
	}
	return s1, n
}

func (o *Owner) prepIO(si int) {
	s := &o.slots[si]
	rq := &s.c.ios[s.i]
	if rq.Vec != nil {
		o.prepVec(si)
		return
	}
	at := s.off + s.done
	b := rq.Buf[at : s.off+s.n]
	sqe := o.getSQE()
	if sqe == nil {
		o.finishPiece(si, fmt.Errorf("%s: %v at offset %d: submission queue full: %w", o.name, rq.Op, rq.Off, unix.EBUSY))
		return
	}
	fixed := -1
	if idx, ok := o.lookupFixed(b); ok {
		fixed = int(idx)
	}
	if err := o.d.PrepIO(sqe, rq, b, rq.Off+int64(at), fixed); err != nil {
		sqe.PrepNop()
		s.perr = err
	} else {
		o.stats.sqes.Add(1)
		if fixed >= 0 {
			o.stats.fixed.Add(1)
		}
	}
	sqe.SetUserData(uint64(si))
	s.asked = len(b)
	s.fixed = fixed >= 0
}

// prepVec prepares a vector read of the rest of slot si's piece: its
// segments past the bytes already moved.
func (o *Owner) prepVec(si int) {
	s := &o.slots[si]
	rq := &s.c.ios[s.i]
	sqe := o.getSQE()
	if sqe == nil {
		o.finishPiece(si, fmt.Errorf("%s: %v at offset %d: submission queue full: %w", o.name, rq.Op, rq.Off, unix.EBUSY))
		return
	}
	iov := o.iovs[si][:0]
	skip := s.done
	for _, v := range rq.Vec[s.seg0:s.seg1] {
		if skip >= len(v) {
			skip -= len(v)
			continue
		}
		v = v[skip:]
		skip = 0
		var e unix.Iovec
		e.Base = &v[0]
		e.SetLen(len(v))
		iov = append(iov, e)
	}
	o.iovs[si] = iov
	if err := o.d.(VecDriver).PrepReadv(sqe, rq, iov, rq.Off+int64(s.off+s.done)); err != nil {
		sqe.PrepNop()
		s.perr = err
	} else {
		o.stats.sqes.Add(1)
	}
	sqe.SetUserData(uint64(si))
	s.asked = s.n - s.done
	s.fixed = false
}

// vecResult interprets the result of a vector read's SQE that asked n
// bytes at byte at of rq's segments.
func (o *Owner) vecResult(rq *store.IO, at, n int, res int32) (int, error) {
	switch {
	case res < 0:
		return 0, fmt.Errorf("%s: vector read of %d bytes at offset %d: %w", o.name, n, rq.Off+int64(at), unix.Errno(-res))
	case res == 0:
		return 0, fmt.Errorf("%s: vector read at offset %d: end of file after %d bytes: %w", o.name, rq.Off, at, io.ErrUnexpectedEOF)
	}
	return int(res), nil
}

func (o *Owner) prepSync(si int) {
	sqe := o.getSQE()
	if sqe == nil {
		s := &o.slots[si]
		s.c.err = fmt.Errorf("%s: flush: submission queue full: %w", o.name, unix.EBUSY)
		s.c.finishOne()
		o.putSlot(si)
		return
	}
	o.d.PrepSync(sqe)
	sqe.SetUserData(uint64(si))
}

func retryable(errno unix.Errno) bool { return errno == unix.EAGAIN || errno == unix.EINTR }

func (o *Owner) complete(cqe uring.CQE) {
	switch cqe.UserData {
	case wakeTag:
		o.armed = false
		if cqe.Res > 0 {
			o.stats.wakeups.Add(1)
		}
		return
	case cancelTag:
		if cqe.Res == -int32(unix.EINVAL) {
			o.cancelAny = false // no IORING_ASYNC_CANCEL_ANY: cancel one by one
		}
		return
	}
	si := int(cqe.UserData)
	s := &o.slots[si]
	if s.kind == slotSync {
		if cqe.Res < 0 && retryable(unix.Errno(-cqe.Res)) && s.retries < o.maxRetries && !o.draining {
			s.retries++
			o.stats.retries.Add(1)
			o.prepSync(si)
			return
		}
		s.c.err = o.d.CompleteSync(cqe.Res)
		o.stats.syncs.Add(1)
		s.c.finishOne()
		o.putSlot(si)
		return
	}
	if s.perr != nil {
		o.finishPiece(si, s.perr)
		return
	}
	if cqe.Res < 0 && retryable(unix.Errno(-cqe.Res)) && s.retries < o.maxRetries && !o.draining {
		s.retries++
		o.stats.retries.Add(1)
		o.prepIO(si)
		return
	}
	rq := &s.c.ios[s.i]
	var moved int
	var retry bool
	var err error
	if rq.Vec != nil {
		moved, err = o.vecResult(rq, s.off+s.done, s.asked, cqe.Res)
	} else {
		moved, retry, err = o.d.CompleteIO(rq, s.off+s.done, s.asked, s.fixed, cqe.Res)
	}
	switch {
	case err != nil:
		o.finishPiece(si, err)
	case o.draining && (retry || s.done+moved < s.n):
		o.finishPiece(si, o.brokenErr())
	case retry:
		s.retries++
		o.stats.retries.Add(1)
		o.prepIO(si)
	default:
		s.done += moved
		if s.done >= s.n {
			o.finishPiece(si, nil)
			return
		}
		if moved < s.asked {
			o.stats.resubmits.Add(1)
		}
		o.prepIO(si)
	}
}

// finishPiece ends one piece; the IO completes with its last piece.
func (o *Owner) finishPiece(si int, err error) {
	s := &o.slots[si]
	c, i, n := s.c, s.i, s.n
	rq := &c.ios[i]
	o.putSlot(si) // first: the callback may start more work
	if err != nil {
		if rq.Err == nil {
			rq.Err = err
		}
	} else {
		o.stats.bytes.Add(uint64(n))
	}
	if c.parts != nil && c.parts[i] > 1 {
		c.parts[i]--
		return
	}
	if rq.Err != nil {
		o.stats.errors.Add(1)
	} else {
		o.stats.ios.Add(1)
	}
	c.ioDone(i)
}

func (o *Owner) brokenErr() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.broken
}

// shutdown retires the eventfd read and closes the ring; nothing else is
// in flight.
func (o *Owner) shutdown(cqes []uring.CQE) {
	if o.armed {
		one := [8]byte{1}
		_, _ = unix.Write(o.efd, one[:])
		deadline := time.Now().Add(o.cfg.DrainTimeout)
		for o.armed && time.Now().Before(deadline) {
			if err := o.enter(1); err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
				break
			}
			o.reap(cqes)
		}
		if o.armed {
			// The eventfd read names only wakeBuf, in the Owner, which
			// keepLeaked keeps alive.
			o.log.Error("ring: the wake-up read did not complete at close; keeping its buffer")
			keepLeaked(o)
		}
	}
	if err := o.ring.Close(); err != nil {
		o.closing.err = fmt.Errorf("%s: %w", o.name, err)
	}
	o.closing.finishOne()
}
