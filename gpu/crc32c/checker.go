package crc32c

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvfs/kvfs/gpu/cuda"
)

// Checker checksums or verifies batches of groups on one stream, keeping
// its pinned host memory between batches, so a batch costs one launch and
// one wait on the stream, and no allocation once it has grown to the
// largest batch. The kernel reads the descriptors and expected CRCs from
// that pinned memory and writes the CRCs into it (pinned memory is mapped
// into every device at its host address): no copy queues behind the
// payload copies on the copy engines (copies of descriptors up and CRCs
// down would make the check of a direct load's chunk wait for every copy
// queued before it, on the same engines). The
// kernel runs after everything already queued on the stream, so a pipeline
// can queue a chunk's payload copies and verify them with one wait. A
// Checker is safe for concurrent use: each running batch has pinned memory
// and an event of its own (a slot), so concurrent batches queue their
// kernels on the stream back to back and each waits only for its own,
// not for the whole of another's launch, kernel and wait.
type Checker struct {
	m *Module
	s cuda.Stream

	mu      sync.Mutex
	idle    []*slot // slots of no running batch
	all     []*slot
	running sync.WaitGroup // batches holding a slot: Close waits for them
	closed  bool
}

// slot is one batch's pinned memory and the event recorded after its
// kernel; a slot is kept for later batches once its batch is over.
type slot struct {
	cap  int    // groups the buffer holds
	host []byte // pinned: cap × perGroup: descriptors (two for Land), want, got
	ev   cuda.Event
}

// NewChecker returns a Checker on stream s of m's context (0: the legacy
// default stream).
func (m *Module) NewChecker(s cuda.Stream) *Checker { return &Checker{m: m, s: s} }

const perGroup = 2*GroupSize + 8

// grow makes room for n groups; the caller owns the slot and holds the
// context.
func (c *slot) grow(n int) error {
	if n <= c.cap {
		return nil
	}
	n = max(n, 2*c.cap, 64)
	if err := c.free(); err != nil {
		return err
	}
	host, err := cuda.MemHostAlloc(n*perGroup, cuda.MemHostAllocPortable|cuda.MemHostAllocDeviceMap)
	if err != nil {
		return fmt.Errorf("crc32c: checker memory: %w", err)
	}
	c.host, c.cap = host, n
	return nil
}

func (c *slot) free() error {
	var err error
	if c.host != nil {
		err = cuda.MemFreeHost(c.host)
	}
	c.host, c.cap = nil, 0
	return err
}

// run queues the batch and waits for it: the kernel reads the
// descriptors (and want) where they lie in pinned memory and writes got
// there. With dst (Land), groups are the sources.
func (c *Checker) run(groups, dst []Group, want, got []uint32) error {
	for i, g := range groups {
		if err := g.Check(); err != nil {
			return fmt.Errorf("crc32c: group %d: %w", i, err)
		}
	}
	for i, g := range dst {
		if err := g.Check(); err != nil {
			return fmt.Errorf("crc32c: destination %d: %w", i, err)
		}
		if s := groups[i]; s.Rows != g.Rows || s.RowBytes != g.RowBytes {
			return fmt.Errorf("crc32c: group %d: %d rows of %d bytes to land in %d rows of %d", i, s.Rows, s.RowBytes, g.Rows, g.RowBytes)
		}
	}
	n := len(groups)
	if n == 0 {
		return nil
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	var sl *slot
	if k := len(c.idle); k > 0 {
		sl, c.idle = c.idle[k-1], c.idle[:k-1]
	} else {
		sl = &slot{}
		c.all = append(c.all, sl)
	}
	c.running.Add(1)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.idle = append(c.idle, sl)
		c.mu.Unlock()
		c.running.Done()
	}()
	return c.m.ctx.Do(func() error {
		if sl.ev == 0 {
			ev, err := cuda.EventCreate(cuda.EventDisableTiming | cuda.EventBlockingSync)
			if err != nil {
				return fmt.Errorf("crc32c: event: %w", err)
			}
			sl.ev = ev
		}
		if err := sl.grow(n); err != nil {
			return err
		}
		// Layout for this batch: n descriptors, n destinations (Land), n
		// want, n got.
		up := putGroups(sl.host, groups)
		up += putGroups(sl.host[up:], dst)
		putUint32s(sl.host[up:], want)
		descDev := cuda.DevicePtr(uintptr(unsafe.Pointer(&sl.host[0])))
		dstDev := descDev + cuda.DevicePtr(n*GroupSize)
		wantDev := dstDev + cuda.DevicePtr(len(dst)*GroupSize)
		gotDev := wantDev + cuda.DevicePtr(4*n)
		gotAt := int(gotDev - descDev)
		down := sl.host[gotAt : gotAt+4*n]
		var err error
		switch {
		case dst != nil:
			err = c.m.LandAsync(c.s, descDev, dstDev, n, wantDev, gotDev)
		case want != nil:
			err = c.m.VerifyAsync(c.s, descDev, n, wantDev, gotDev)
		default:
			err = c.m.SumAsync(c.s, descDev, n, gotDev)
		}
		if err != nil {
			return errors.Join(err, c.s.Synchronize())
		}
		if err := sl.ev.Record(c.s); err != nil {
			return errors.Join(fmt.Errorf("crc32c: %w", err), c.s.Synchronize())
		}
		if err := sl.ev.Synchronize(); err != nil {
			return fmt.Errorf("crc32c: %w", err)
		}
		getUint32s(got, down)
		return nil
	})
}

// Land checks each group src[i] (in device memory: a tile as it lies in
// the store, copied to device scratch) against want[i] and copies it to
// dst[i] (the tile in the client's cache, pitched rows or packed), after
// the work already queued on the stream; a group that differs lands as
// zeros. It returns the failed groups' indexes in ascending order; got, if
// not nil, receives the CRCs the GPU computed. The checksum and the
// scatter of a token-major (NHD) tile are one pass of the kernel.
func (c *Checker) Land(src, dst []Group, want, got []uint32) (bad []int, err error) {
	if len(dst) != len(src) || len(want) != len(src) || (got != nil && len(got) != len(src)) {
		return nil, fmt.Errorf("crc32c: %d groups, %d destinations, %d checksums", len(src), len(dst), len(want))
	}
	return c.check(src, dst, want, got)
}

// Sum sets got[i] to the CRC32C of groups[i] (device addresses), computed
// after the work already queued on the stream.
func (c *Checker) Sum(groups []Group, got []uint32) error {
	if len(got) != len(groups) {
		return fmt.Errorf("crc32c: %d groups, room for %d checksums", len(groups), len(got))
	}
	return c.run(groups, nil, nil, got)
}

// Verify checks groups[i] against want[i] after the work already queued on
// the stream, zeroes in place every group that differs, and returns their
// indexes in ascending order. got, if not nil, receives the CRCs the GPU
// computed.
func (c *Checker) Verify(groups []Group, want, got []uint32) (bad []int, err error) {
	if len(want) != len(groups) || (got != nil && len(got) != len(groups)) {
		return nil, fmt.Errorf("crc32c: %d groups, %d checksums", len(groups), len(want))
	}
	return c.check(groups, nil, want, got)
}

// check runs a Verify (dst nil) or Land batch and returns the indexes of
// the groups whose CRC differs from want, ascending; got (allocated when
// nil) receives the CRCs.
func (c *Checker) check(groups, dst []Group, want, got []uint32) (bad []int, err error) {
	if got == nil {
		got = make([]uint32, len(groups))
	}
	if err := c.run(groups, dst, want, got); err != nil {
		return nil, err
	}
	for i := range got {
		if got[i] != want[i] {
			bad = append(bad, i)
		}
	}
	return bad, nil
}

// Close frees the Checker's memory once the batches running are over
// (later ones get ErrClosed); the stream and the Module stay.
func (c *Checker) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	c.running.Wait()
	return c.m.ctx.Do(func() error {
		var err error
		for _, sl := range c.all {
			err = errors.Join(err, sl.free())
			if sl.ev != 0 {
				err = errors.Join(err, sl.ev.Destroy())
			}
		}
		return err
	})
}

// nativeLayout reports whether a Group in Go memory is byte for byte its
// device encoding (a little-endian machine, no padding): then a batch's
// descriptors, checksums and results move as whole slices instead of
// field by field (half a million groups per GPU load of 1,024 blocks).
var nativeLayout = binary.NativeEndian.Uint16([]byte{1, 0}) == 1 && unsafe.Sizeof(Group{}) == GroupSize

// putGroups writes the device encoding of gs at the start of b (pinned
// memory: 8-byte aligned) and returns the bytes written.
func putGroups(b []byte, gs []Group) int {
	if len(gs) == 0 {
		return 0
	}
	if nativeLayout {
		copy(unsafe.Slice((*Group)(unsafe.Pointer(&b[0])), len(gs)), gs)
	} else {
		AppendGroups(b[:0], gs)
	}
	return len(gs) * GroupSize
}

// putUint32s writes vs little endian at the start of b.
func putUint32s(b []byte, vs []uint32) {
	if len(vs) == 0 {
		return
	}
	if nativeLayout {
		copy(unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(vs)), vs)
		return
	}
	for i, v := range vs {
		binary.LittleEndian.PutUint32(b[4*i:], v)
	}
}

// getUint32s reads len(vs) little-endian values from b into vs.
func getUint32s(vs []uint32, b []byte) {
	if len(vs) == 0 {
		return
	}
	if nativeLayout {
		copy(vs, unsafe.Slice((*uint32)(unsafe.Pointer(&b[0])), len(vs)))
		return
	}
	for i := range vs {
		vs[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
}
