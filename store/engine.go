package store

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Op is the kind of one engine request.
type Op uint8

// Engine operations.
const (
	OpRead Op = iota
	OpWrite
)

func (o Op) String() string {
	if o == OpWrite {
		return "write"
	}
	return "read"
}

// Placement streams passed in IO.Stream. Engines without data placement
// (posix, uring) ignore them; the nvme engine maps them onto FDP placement
// handles. StreamMeta carries superblocks and slot headers; payloads use
// StreamData+n for n in [0, DataStreams), chosen by the store so that slots
// likely to be evicted together share a stream.
const (
	StreamMeta  uint16 = 0
	StreamData  uint16 = 1
	DataStreams        = 7
)

// IO is one request of a batch given to Engine.Do.
type IO struct {
	Op     Op
	Off    int64  // byte offset on the device; a multiple of Engine.Align()
	Buf    []byte // address and length multiples of Engine.Align()
	Stream uint16 // placement stream (see StreamMeta)
	// Vec, only on an OpRead given to an engine whose VectorReads reports
	// true, replaces Buf (which is then nil): the bytes at Off land in
	// Vec's segments one after another, as preadv(2) does. Every
	// segment's address and length are multiples of Align(); there may be
	// more segments than IOV_MAX (the engine splits them).
	Vec [][]byte

	// Err is set by the engine: nil when all of Buf was transferred. A
	// transfer that stays short after retries is an error (io.ErrUnexpectedEOF
	// for reads past the end).
	Err error
}

// Engine moves bytes between memory and the store's backing device. All I/O
// of the store goes through this seam, so tests can swap in fault-injecting
// and crash-simulating engines.
type Engine interface {
	// Name is the engine's name: posix, uring, nvme, …
	Name() string
	// Do performs every request of the batch, with as many in flight as the
	// engine allows, and returns once all are complete. Per-request failures
	// are reported in IO.Err; the returned error is for failures of the
	// engine as a whole (closed, ring broken), in which case no IO.Err is
	// meaningful.
	Do(ios []IO) error
	// Sync makes every write completed before the call durable.
	Sync() error
	// Size is the usable size of the device or file in bytes.
	Size() int64
	// Align is the alignment of offsets, lengths and buffer addresses the
	// engine needs (1 for none). It is at most the store's align.
	Align() int
	Close() error
}

// BufferAllocator is implemented by engines that prefer their own buffers
// (for example buffers registered with io_uring). The store allocates its
// bounce buffers through it when present.
type BufferAllocator interface {
	AllocBuffer(n int) ([]byte, error)
	FreeBuffer(b []byte)
}

// VectorReader is implemented by engines that can scatter one read into
// several memory segments (IO.Vec): the store then lands a run of groups
// whose destinations are not one contiguous range (pitched rows, tiles
// apart from each other) straight into them, with no bounce copy. Wrappers
// report their inner engine's answer.
type VectorReader interface {
	VectorReads() bool
}

// NotifyEngine is implemented by engines that can tell, during a Do, which
// request has just completed: DoNotify performs the batch as Do does and
// calls done(i) as ios[i] completes (its Err set), on a goroutine of the
// engine's, so that the store verifies each run's bytes while the others
// are still in flight (and while they are still in the CPU's caches).
// done must be quick and must not block. DoNotify returns once every
// request started has completed and done has returned for it; when it
// returns an error done may not have been called for some requests.
type NotifyEngine interface {
	DoNotify(ios []IO, done func(i int)) error
}

// InlineReader is implemented by engines whose reads are copies made by
// the CPU (a file in memory, tmpfs or ramfs): ReadInline performs one read (Buf
// or Vec) on the calling goroutine, safe for concurrent use. When
// InlineReads reports true the store reads each run with it on the
// goroutine that then verifies the run, so the checksum reads bytes the
// copy has just left in that core's cache instead of memory: one pass
// over DRAM fewer than a read by another thread followed by a check.
type InlineReader interface {
	InlineReads() bool
	ReadInline(io *IO) error
}

// VecLen is the number of bytes an IO moves: len(Buf), or the sum of Vec's
// segment lengths.
func (io *IO) VecLen() int {
	if io.Vec == nil {
		return len(io.Buf)
	}
	n := 0
	for _, v := range io.Vec {
		n += len(v)
	}
	return n
}

// MemoryRegistrar is implemented by engines that can register caller memory
// (for example a client's shared-memory buffer) for zero-copy fixed-buffer
// I/O. The returned function undoes the registration.
type MemoryRegistrar interface {
	RegisterMemory(b []byte) (unregister func(), err error)
}

// AllocAligned returns n bytes (rounded up to the page size) of anonymous,
// page-aligned memory outside the Go heap. Free it with FreeAligned.
func AllocAligned(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("store: alloc of %d bytes", n)
	}
	size := (n + unix.Getpagesize() - 1) &^ (unix.Getpagesize() - 1)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("store: mmap %d bytes: %w", size, err)
	}
	return b[:n], nil
}

// FreeAligned releases memory from AllocAligned.
func FreeAligned(b []byte) {
	if cap(b) > 0 {
		_ = unix.Munmap(b[:cap(b)])
	}
}

// MakeAligned returns n zero bytes of Go memory at an address that is a
// multiple of a: for I/O that needs alignment but no memory outside the
// heap (a read by a system call on the calling goroutine, not DMA that
// could outlive it).
func MakeAligned(n, a int) []byte {
	a = max(a, 1)
	raw := make([]byte, n+a)
	off := (a - int(uintptr(unsafe.Pointer(unsafe.SliceData(raw))))%a) % a
	return raw[off : off+n : off+n]
}

// Aligned reports whether b's address and length are multiples of a.
func Aligned(b []byte, a int) bool {
	if a <= 1 {
		return true
	}
	if len(b) == 0 {
		return true
	}
	return uintptr(unsafe.Pointer(&b[0]))%uintptr(a) == 0 && len(b)%a == 0
}

// ErrEngineClosed is the one error every engine returns (wrapped) for a
// call after Close. Check it with errors.Is.
var ErrEngineClosed = errors.New("store: engine closed")
