package gpu

import (
	"errors"
)

// Sentinel errors.
var (
	// ErrCopy: a copy between staging and the GPU failed.
	ErrCopy = errors.New("gpu: copy failed")
	// ErrClosed: the pool or device is closed.
	ErrClosed = errors.New("gpu: closed")
	// ErrConfig: bad pool or pipeline configuration.
	ErrConfig = errors.New("gpu: bad configuration")
)

// Device is what the pipeline needs of one GPU: copies on one ordered queue
// (a CUDA stream), events recorded on it, and host memory the GPU can DMA.
// Its methods are safe for concurrent use.
type Device interface {
	// CopyH2D queues a copy of src to device address dst.
	CopyH2D(dst uint64, src []byte) error
	// CopyD2H queues a copy of len(dst) bytes from device address src.
	CopyD2H(dst []byte, src uint64) error
	// NewEvent creates an event on the queue.
	NewEvent() (Event, error)
	// Synchronize waits for everything queued (the fallback when an event
	// cannot be recorded).
	Synchronize() error
	// AllocHost returns n bytes of pinned host memory and its release.
	AllocHost(n int) (mem []byte, free func() error, err error)
}

// DeviceAllocator is implemented by devices that allocate device memory
// of their own (CUDA: cuMemAlloc): the scratch a direct load of pitched
// tiles copies groups into before Land scatters them.
type DeviceAllocator interface {
	AllocDevice(n int) (addr uint64, free func() error, err error)
}

// Copier2D is implemented by devices that copy a pitched tile (rows of
// width bytes, rows apart by a pitch on each side) with one operation
// (CUDA: cuMemcpy2DAsync). The pipeline uses it when Can2D reports true,
// and copies row by row otherwise.
type Copier2D interface {
	Can2D() bool
	CopyH2D2D(dst uint64, dstPitch int, src []byte, srcPitch, width, rows int) error
	CopyD2H2D(dst []byte, dstPitch int, src uint64, srcPitch, width, rows int) error
}

// Batcher is implemented by devices that queue many host-to-device copies
// with one call (CUDA ≥ 12.8: cuMemcpyBatchAsync); the pipeline uses it,
// when CanBatch reports true, for the copies of a chunk that no 2D copy
// takes (tiles of cache blocks scattered over the device). The copies of a
// batch may run in any order among themselves; their destinations must be
// disjoint. On an error none may be taken as queued.
type Batcher interface {
	CanBatch() bool
	CopyH2DBatch(dsts []uint64, srcs [][]byte) error
}

// Laner is implemented by devices with several copy queues (CUDA streams).
// Lane(i) is a view of the device whose copies, event records (through
// LaneRecorder) and Synchronize go to queue i mod Lanes(). The pipeline
// gives each batch one lane for all its copies, so batches of different
// callers do not queue behind each other; the device's own Synchronize
// waits for every lane.
type Laner interface {
	Lanes() int
	Lane(i int) Device
}

// LaneRecorder is implemented by lane views: RecordOn records ev (one of
// the device's events) on the lane's queue.
type LaneRecorder interface {
	RecordOn(ev Event) error
}

// Binder is implemented by devices whose calls need per-thread setup (CUDA
// makes its context current on a locked OS thread). Bind runs fn with the
// setup done once; fn queues its copies through q, valid only inside fn,
// which the pipeline uses for a chunk's copies.
type Binder interface {
	Bind(fn func(q Device) error) error
}

// Event marks a point in the device's queue.
type Event interface {
	// Record marks everything queued so far.
	Record() error
	// Query reports whether the recorded work has completed; the error is
	// the failure of that work.
	Query() (done bool, err error)
	// Wait blocks until the recorded work has completed.
	Wait() error
	// Destroy frees the event.
	Destroy() error
}

// Registrar registers host memory with the store's engine (fixed buffers);
// store.MemoryRegistrar implements it.
type Registrar interface {
	RegisterMemory(b []byte) (unregister func(), err error)
}
