package ringowner

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/uring"
)

// leaked holds, for the life of the process, what a failed ring may still
// write into: owners whose requests could not be reaped (their slots name
// the callers' buffers; the owner holds the eventfd read's buffer) and the
// buffers FreeBuffer declined to unmap.
var leaked struct {
	sync.Mutex
	keep []any
}

func keepLeaked(v any) {
	leaked.Lock()
	leaked.keep = append(leaked.keep, v)
	leaked.Unlock()
}

// fail ends the ring goroutine after a ring-level error. The rule: no
// caller is released and no memory is unmapped or reused until every
// request that names it has completed or is known cancelled. So: mark the
// owner broken (new calls fail at once), cancel what is in flight and reap
// until nothing is (bounded by DrainTimeout), and only then fail the
// callers and close the ring. When the requests cannot be reaped (enter
// keeps failing), their memory is leaked on purpose: the pool is never
// unmapped, FreeBuffer stops unmapping, the owner and its slots stay
// referenced, and one Error line says so.
func (o *Owner) fail(cause error, cqes []uring.CQE) {
	err := fmt.Errorf("%s: ring failed: %w", o.name, cause)
	o.mu.Lock()
	o.mu.broken = err
	o.down.Store(true)
	o.pending = append(o.pending, o.mu.queue...)
	o.mu.queue = nil
	o.mu.Unlock()
	o.draining = true
	// Calls that the drain completes still report the ring failure.
	for i := range o.slots {
		if c := o.slots[i].c; c != nil {
			c.err = err
		}
	}
	for _, c := range o.pending {
		c.err = err
	}
	inflight := o.inflight()
	reaped := o.drain(cqes)
	if !reaped {
		o.mu.Lock()
		o.mu.leaked = true
		o.mu.Unlock()
		poolBytes := o.pool.leak()
		var target int
		for i := range o.slots {
			if s := &o.slots[i]; s.c != nil && s.kind == slotIO {
				target += s.n
			}
		}
		keepLeaked(o)
		o.log.Error("ring failed and its requests could not be reaped; leaking their memory on purpose (the buffer pool stays mapped, freed buffers are not unmapped)",
			zap.Error(err), zap.Int("requests_in_flight", o.inflight()), zap.Int("request_bytes", target),
			zap.Int("pool_bytes", poolBytes), zap.Bool("wake_read_in_flight", o.armed))
	} else {
		o.log.Error("ring failed; every request in flight completed or was cancelled",
			zap.Error(err), zap.Int("requests_in_flight", inflight))
	}
	// Fail the callers: requests still in slots (only when leaking), then
	// the rest of every call.
	var calls []*call
	for i := range o.slots {
		s := &o.slots[i]
		if s.c == nil {
			continue
		}
		c := s.c
		calls = append(calls, c)
		if s.kind == slotIO {
			rq := &c.ios[s.i]
			if c.parts != nil && c.parts[s.i] > 1 {
				c.parts[s.i]-- // another piece still holds the IO
			} else {
				if rq.Err == nil {
					rq.Err = err
				}
				c.ioDone(s.i)
			}
		}
	}
	failed := map[*call]bool{}
	for _, c := range calls {
		o.failCall(c, err, failed)
	}
	for _, c := range o.pending {
		o.failCall(c, err, failed)
	}
	o.pending = nil
	if o.closing != nil {
		o.closing.finishOne()
	}
	// Nothing reaped still names memory the process will free; closing
	// the ring makes the kernel cancel whatever it still holds.
	_ = o.ring.Close()
}

// failCall fails the IOs of c never started and releases its waiter.
func (o *Owner) failCall(c *call, err error, failed map[*call]bool) {
	if failed[c] || c.left == 0 {
		return
	}
	failed[c] = true
	c.err = err
	if c.kind == callIO {
		i := c.next
		if c.nextOff > 0 {
			// Some pieces of ios[i] were issued and completed (or are
			// held by a leaked slot, which already failed it).
			if c.parts == nil || c.parts[i] > 0 {
				if c.ios[i].Err == nil {
					c.ios[i].Err = err
				}
				if c.parts != nil {
					c.parts[i] = 0
				}
				c.ioDone(i)
			}
			i++
		}
		for ; i < len(c.ios) && c.left > 0; i++ {
			c.ios[i].Err = err
			c.ioDone(i)
		}
	}
	if c.left > 0 {
		c.left = 0
		if c.done != nil {
			close(c.done)
		}
	}
}

// drain cancels every request in flight (IORING_ASYNC_CANCEL_ANY where the
// kernel has it, else one cancel per user_data) and reaps until none is,
// for at most DrainTimeout or until enter fails several times in a row.
// It reports whether nothing is in flight any more.
func (o *Owner) drain(cqes []uring.CQE) bool {
	deadline := time.Now().Add(o.cfg.DrainTimeout)
	failures := 0
	lastCancel := time.Time{}
	for o.inflight() > 0 || o.armed {
		if time.Since(lastCancel) > 100*time.Millisecond {
			o.cancelAll()
			lastCancel = time.Now()
		}
		if err := o.enter(0); err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
			if failures++; failures >= 8 {
				return false
			}
		} else {
			failures = 0
		}
		if o.reap(cqes) == 0 {
			if time.Now().After(deadline) {
				return false
			}
			time.Sleep(500 * time.Microsecond)
		}
	}
	return true
}

// cancelAll queues cancels for everything in flight.
func (o *Owner) cancelAll() {
	if o.cancelAny {
		if sqe := o.ring.GetSQE(); sqe != nil {
			sqe.PrepCancel(0, uring.AsyncCancelAny|uring.AsyncCancelAll)
			sqe.SetUserData(cancelTag)
			return
		}
	}
	if o.armed {
		if sqe := o.ring.GetSQE(); sqe != nil {
			sqe.PrepCancel(wakeTag, 0)
			sqe.SetUserData(cancelTag)
		}
	}
	for i := range o.slots {
		if o.slots[i].c == nil {
			continue
		}
		sqe := o.ring.GetSQE()
		if sqe == nil {
			return // the rest on the next round
		}
		sqe.PrepCancel(uint64(i), 0)
		sqe.SetUserData(cancelTag)
	}
}
