package nvme

import (
	nvmedev "github.com/kvfs/kvfs/nvme"

	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// EngineOptions configure OpenEngine.
type EngineOptions struct {
	// QueueDepth is the most NVMe commands in flight. 0 means 64.
	QueueDepth int
	// FDP is "auto" (or ""): tag writes with placement identifiers when the
	// namespace's endurance group has FDP enabled; "off": never.
	FDP string
	// BufferPool is the size in bytes of the pool registered with the ring
	// for AllocBuffer (fixed-buffer commands). 0 means 32 MiB; negative
	// means none.
	BufferPool int
	// Logger receives the engine's logs; nil means zap.NewNop().
	Logger *zap.Logger
}

const (
	defaultQueueDepth = 64
	defaultBufferPool = 32 << 20
	memorySlots       = 64 // fixed buffer slots for RegisterMemory
	maxRetries        = 8
	uringCmdFixed     = 1 << 0 // IORING_URING_CMD_FIXED (uring_cmd_flags)
)

// EngineStats are counters of an Engine since it was opened.
type EngineStats struct {
	IOs           uint64 // store IOs completed without error
	Errors        uint64 // store IOs completed with an error
	Bytes         uint64 // bytes moved by successful commands
	Commands      uint64 // read/write commands submitted (IOs split at MaxTransfer)
	FixedCommands uint64 // of which on registered buffers
	Retries       uint64 // EINTR/EAGAIN resubmissions
	Flushes       uint64
	// PlacedBytes counts written bytes per placement handle (index into
	// nvmedev.FDPInfo.Handles); empty without FDP.
	PlacedBytes []uint64
}

func (s EngineStats) String() string {
	return fmt.Sprintf("ios=%d errors=%d bytes=%d commands=%d fixed=%d retries=%d flushes=%d placed=%v",
		s.IOs, s.Errors, s.Bytes, s.Commands, s.FixedCommands, s.Retries, s.Flushes, s.PlacedBytes)
}

// Engine is the NVMe passthrough store engine: reads and writes go to the
// namespace's generic char device as io_uring URING_CMDs (NVME_URING_CMD_IO)
// on a ring with 128-byte SQEs and 32-byte CQEs.
//
// Do and Sync hold Engine.mu for their whole duration: one batch at a time
// owns the ring, on the calling goroutine's OS thread (so the completion
// task work of the passthrough commands runs where the batch waits).
type Engine struct {
	dev       *nvmedev.Device
	log       *zap.Logger
	qd        int
	lba       int
	size      int64
	maxXfer   int
	placement nvmedev.Placement
	fdp       *nvmedev.FDPInfo
	pool      *bufPool
	poolMem   []byte

	stats struct {
		ios, errors, bytes, commands, fixed, retries, flushes atomic.Uint64
		placed                                                []atomic.Uint64
	}

	mu struct {
		sync.Mutex
		closed  bool
		ring    *uring.Ring
		fixed   []fixedRegion // registered memory, sorted by address
		slots   []bool        // which table slots hold a buffer
		useFix  bool
		chunks  []chunk
		queue   []int
		cqes    []uring.CQE
		cmdBuf  [nvmedev.CmdSize]byte
		nextReg int
	}
}

type fixedRegion struct {
	lo, hi uintptr
	index  uint16
	reg    int // RegisterMemory id, 0 for the pool
}

// chunk is one NVMe command of a Do batch.
type chunk struct {
	io      int // index into the batch
	off     int64
	buf     []byte
	retries int
}

var (
	_ store.Engine          = (*Engine)(nil)
	_ store.BufferAllocator = (*Engine)(nil)
	_ store.MemoryRegistrar = (*Engine)(nil)
)

// OpenEngine opens an NVMe namespace for passthrough I/O. path is the
// generic char device /dev/ngXnY or the block device /dev/nvmeXnY (mapped
// to its char device through sysfs).
func OpenEngine(path string, o EngineOptions) (*Engine, error) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	switch o.FDP {
	case "", "auto", "off":
	default:
		return nil, fmt.Errorf("nvme: FDP option %q: want auto or off", o.FDP)
	}
	if err := nvmedev.Available(path); err != nil {
		return nil, err
	}
	dev, err := nvmedev.OpenDevice(path)
	if err != nil {
		return nil, err
	}
	e := &Engine{dev: dev, log: log.With(zap.String("engine", "nvme"), zap.String("dev", dev.Path))}
	if err := e.init(o); err != nil {
		e.closeLocked()
		return nil, err
	}
	return e, nil
}

func (e *Engine) init(o EngineOptions) error {
	ns := e.dev.NS
	if f := ns.Format(); f.MetaSize != 0 {
		return fmt.Errorf("%w: %s: LBA format %d has %d bytes of metadata per block (reformat to a format without metadata)", nvmedev.ErrUnsupported, e.dev.Path, ns.FormatIndex, f.MetaSize)
	}
	e.lba = ns.LBASize()
	if e.lba > unix.Getpagesize() {
		return fmt.Errorf("%w: %s: LBA size %d above the page size", nvmedev.ErrUnsupported, e.dev.Path, e.lba)
	}
	e.size = ns.Size()
	e.maxXfer = int(e.dev.Limits.MaxTransfer)
	e.qd = o.QueueDepth
	if e.qd <= 0 {
		e.qd = defaultQueueDepth
	}

	// nvmedev.Placement.
	if o.FDP == "off" {
		e.fdp = &nvmedev.FDPInfo{Supported: e.dev.Ctrl.FDP(), Reason: "FDP off by option"}
	} else if info, err := e.dev.FDP(); err != nil {
		e.log.Warn("FDP discovery failed; writes go untagged", zap.Error(err))
		e.fdp = &nvmedev.FDPInfo{Supported: e.dev.Ctrl.FDP(), Reason: err.Error()}
	} else {
		e.fdp = info
	}
	if e.fdp.Enabled {
		for _, h := range e.fdp.Handles {
			e.placement.PIDs = append(e.placement.PIDs, h.PID)
		}
		e.stats.placed = make([]atomic.Uint64, len(e.fdp.Handles))
	}

	ring, err := uring.New(uring.Options{Entries: uint32(e.qd), SQE128: true, CQE32: true})
	if err != nil {
		return fmt.Errorf("nvme: io_uring with SQE128/CQE32: %w", err)
	}
	e.mu.ring = ring
	e.mu.cqes = make([]uring.CQE, 2*e.qd)
	e.setupFixed(o)

	e.log.Info("nvme engine open",
		zap.Uint32("nsid", e.dev.NSID), zap.String("model", e.dev.Ctrl.Model),
		zap.Int64("bytes", e.size), zap.Int("lba", e.lba), zap.Int("max_transfer", e.maxXfer),
		zap.Int("queue_depth", e.qd), zap.Bool("fixed_buffers", e.mu.useFix),
		zap.Bool("fdp", e.fdp.Enabled), zap.Int("handles", len(e.placement.PIDs)), zap.String("fdp_reason", e.fdp.Reason))
	return nil
}

// setupFixed registers the buffer pool as fixed buffer 0 of a sparse table
// with room for RegisterMemory. URING_CMD takes fixed buffers from kernel
// 6.1 (IORING_URING_CMD_FIXED); elsewhere, or when registration fails, the
// engine uses plain user addresses.
func (e *Engine) setupFixed(o EngineOptions) {
	var u unix.Utsname
	_ = unix.Uname(&u)
	if rel := unix.ByteSliceToString(u.Release[:]); !nvmedev.KernelAtLeast(rel, 6, 1) {
		e.log.Info("no fixed buffers for URING_CMD before kernel 6.1", zap.String("kernel", rel))
		return
	}
	if err := e.mu.ring.RegisterBuffersSparse(1 + memorySlots); err != nil {
		e.log.Info("no fixed buffer table", zap.Error(err))
		return
	}
	e.mu.slots = make([]bool, 1+memorySlots)
	e.mu.useFix = true
	n := o.BufferPool
	if n == 0 {
		n = defaultBufferPool
	}
	if n < 0 {
		return
	}
	n = min(n, uring.MaxFixedBuffer)
	mem, err := store.AllocAligned(n)
	if err != nil {
		e.log.Warn("no buffer pool", zap.Error(err))
		return
	}
	if err := e.mu.ring.UpdateBuffers([]uring.FixedBuffer{{Index: 0, Buf: mem}}); err != nil {
		e.log.Warn("registering the buffer pool failed", zap.Error(err))
		store.FreeAligned(mem)
		return
	}
	e.poolMem = mem
	e.pool = newBufPool(mem, unix.Getpagesize())
	e.mu.slots[0] = true
	e.mu.fixed = append(e.mu.fixed, regionOf(mem, 0, 0))
}

func regionOf(b []byte, index uint16, reg int) fixedRegion {
	lo := uintptr(unsafe.Pointer(&b[0]))
	return fixedRegion{lo: lo, hi: lo + uintptr(len(b)), index: index, reg: reg}
}

// Name is "nvme".
func (e *Engine) Name() string { return "nvme" }

// Size is the namespace size in bytes.
func (e *Engine) Size() int64 { return e.size }

// Align is the namespace's LBA size: offsets, lengths and buffer addresses
// must be multiples of it.
func (e *Engine) Align() int { return e.lba }

// MaxTransfer is the largest single command; Do splits larger IOs.
func (e *Engine) MaxTransfer() int { return e.maxXfer }

// nvmedev.Device is the open namespace (identify data, limits).
func (e *Engine) Device() *nvmedev.Device { return e.dev }

// nvmedev.Placement is the stream → placement identifier map in use (empty
// without FDP).
func (e *Engine) Placement() nvmedev.Placement { return e.placement }

// nvmedev.FDPInfo reports the namespace's FDP state with fresh reclaim unit handle
// status (available space per handle).
func (e *Engine) FDPInfo() (*nvmedev.FDPInfo, error) {
	info := *e.fdp
	if !info.Enabled {
		return &info, nil
	}
	h, err := e.dev.RUHStatus()
	if err != nil {
		return nil, err
	}
	info.Handles = h
	return &info, nil
}

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	s := EngineStats{
		IOs: e.stats.ios.Load(), Errors: e.stats.errors.Load(), Bytes: e.stats.bytes.Load(),
		Commands: e.stats.commands.Load(), FixedCommands: e.stats.fixed.Load(),
		Retries: e.stats.retries.Load(), Flushes: e.stats.flushes.Load(),
	}
	for i := range e.stats.placed {
		s.PlacedBytes = append(s.PlacedBytes, e.stats.placed[i].Load())
	}
	return s
}

// check validates one IO; a non-nil error goes to IO.Err.
func (e *Engine) check(io_ *store.IO) error {
	n := int64(len(io_.Buf))
	switch {
	case io_.Op != store.OpRead && io_.Op != store.OpWrite:
		return fmt.Errorf("nvme: unknown op %d: %w", io_.Op, nvmedev.ErrInvalidCommand)
	case n == 0:
		return nil
	case io_.Off < 0 || io_.Off%int64(e.lba) != 0 || n%int64(e.lba) != 0 || addrOf(io_.Buf)%uint64(e.lba) != 0:
		return fmt.Errorf("%w: %s of %d bytes at %d (buffer %#x), LBA size %d", nvmedev.ErrAlign, io_.Op, n, io_.Off, addrOf(io_.Buf), e.lba)
	case io_.Off+n > e.size:
		if io_.Op == store.OpRead {
			return fmt.Errorf("nvme: read of %d bytes at %d past the namespace end %d: %w", n, io_.Off, e.size, io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("%w: write of %d bytes at %d past the namespace end %d", nvmedev.ErrRange, n, io_.Off, e.size)
	}
	return nil
}

// Do performs the batch: each IO is split at MaxTransfer, up to QueueDepth
// commands are in flight, writes carry the placement identifier of
// IO.Stream when FDP is enabled. nvmedev.Device status comes back per IO as a
// wrapped *nvmedev.StatusError.
func (e *Engine) Do(ios []store.IO) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nvmedev.ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	chunks := e.mu.chunks[:0]
	left := make([]int, len(ios)) // commands not complete per IO
	for i := range ios {
		io_ := &ios[i]
		io_.Err = e.check(io_)
		if io_.Err != nil {
			e.stats.errors.Add(1)
			continue
		}
		if len(io_.Buf) == 0 {
			e.stats.ios.Add(1)
			continue
		}
		for off := 0; off < len(io_.Buf); off += e.maxXfer {
			end := min(off+e.maxXfer, len(io_.Buf))
			chunks = append(chunks, chunk{io: i, off: io_.Off + int64(off), buf: io_.Buf[off:end:end]})
			left[i]++
		}
	}
	e.mu.chunks = chunks
	queue := e.mu.queue[:0]
	for i := range chunks {
		queue = append(queue, i)
	}
	defer func() {
		clear(e.mu.chunks) // drop buffer references
		e.mu.queue = queue[:0]
	}()
	ring := e.mu.ring
	inflight := 0
	for len(queue) > 0 || inflight > 0 {
		for len(queue) > 0 && inflight < e.qd {
			sqe := ring.GetSQE()
			if sqe == nil {
				break
			}
			ci := queue[0]
			if err := e.prep(sqe, &chunks[ci], ios[chunks[ci].io].Op, ios[chunks[ci].io].Stream); err != nil {
				// Undo nothing: an unused zeroed SQE would be a NOP-less
				// hole, so turn it into a NOP that completes as ci.
				sqe.PrepNop()
				sqe.SetUserData(uint64(ci) | 1<<63)
				if ios[chunks[ci].io].Err == nil {
					ios[chunks[ci].io].Err = err
				}
			} else {
				sqe.SetUserData(uint64(ci))
			}
			queue = queue[1:]
			inflight++
		}
		if _, err := ring.SubmitAndWait(1); err != nil {
			return e.broken(fmt.Errorf("nvme: submit: %w", err))
		}
		n := ring.ReapCQEs(e.mu.cqes)
		if n == 0 {
			c, err := ring.WaitCQE()
			if err != nil {
				return e.broken(fmt.Errorf("nvme: wait: %w", err))
			}
			ring.CQAdvance(1)
			e.mu.cqes[0] = c
			n = 1
		}
		for _, c := range e.mu.cqes[:n] {
			inflight--
			nop := c.UserData&(1<<63) != 0
			ci := int(c.UserData &^ (1 << 63))
			if ci >= len(chunks) {
				return e.broken(fmt.Errorf("nvme: completion for unknown command %d", c.UserData))
			}
			ch := &chunks[ci]
			io_ := &ios[ch.io]
			if !nop {
				if retry := e.complete(c, ch, io_); retry {
					queue = append(queue, ci)
					continue
				}
			}
			left[ch.io]--
			if left[ch.io] == 0 {
				if io_.Err == nil {
					e.stats.ios.Add(1)
				} else {
					e.stats.errors.Add(1)
				}
			}
		}
	}
	return nil
}

// prep fills sqe with the NVMe command of ch.
func (e *Engine) prep(sqe *uring.SQE, ch *chunk, op store.Op, stream uint16) error {
	rw := nvmedev.RW{
		NSID: e.dev.NSID,
		SLBA: uint64(ch.off) / uint64(e.lba),
		NLB:  uint32(len(ch.buf) / e.lba),
		Addr: addrOf(ch.buf),
		Len:  uint32(len(ch.buf)),
	}
	var (
		c   nvmedev.Command
		err error
	)
	if op == store.OpWrite {
		if len(e.placement.PIDs) > 0 {
			rw.DType, rw.DSpec = nvmedev.DTypePlacement, e.placement.PID(stream)
		}
		c, err = nvmedev.WriteCmd(rw)
	} else {
		c, err = nvmedev.ReadCmd(rw)
	}
	if err != nil {
		return err
	}
	c.Encode(e.mu.cmdBuf[:])
	if err := e.mu.ring.PrepURingCmd(sqe, int32(e.dev.Fd()), nvmedev.URingCmdIO, e.mu.cmdBuf[:]); err != nil {
		return err
	}
	if idx, ok := e.fixedIndexLocked(ch.buf); ok {
		sqe.OpFlags = uringCmdFixed
		sqe.BufIndex = idx
		e.stats.fixed.Add(1)
	}
	e.stats.commands.Add(1)
	return nil
}

// complete handles the CQE of ch; it returns true to resubmit.
func (e *Engine) complete(c uring.CQE, ch *chunk, io_ *store.IO) bool {
	op := io_.Op
	switch {
	case c.Res == 0:
		e.stats.bytes.Add(uint64(len(ch.buf)))
		if op == store.OpWrite && len(e.stats.placed) > 0 {
			e.stats.placed[e.placement.Handle(io_.Stream)].Add(uint64(len(ch.buf)))
		}
		return false
	case c.Res < 0:
		errno := unix.Errno(-c.Res)
		if (errno == unix.EINTR || errno == unix.EAGAIN) && ch.retries < maxRetries {
			ch.retries++
			e.stats.retries.Add(1)
			return true
		}
		if errno == unix.EINVAL && e.mu.useFix && ch.retries == 0 {
			if _, fixed := e.fixedIndexLocked(ch.buf); fixed {
				e.log.Warn("URING_CMD with a fixed buffer refused (EINVAL); using plain buffers from now on")
				e.mu.useFix = false
				ch.retries++
				return true
			}
		}
		if io_.Err == nil {
			io_.Err = fmt.Errorf("nvme: %s of %d bytes at %d: %w", op, len(ch.buf), ch.off, errno)
		}
	default:
		opc := nvmedev.OpRead
		if op == store.OpWrite {
			opc = nvmedev.OpWrite
		}
		if io_.Err == nil {
			io_.Err = fmt.Errorf("nvme: %s of %d bytes at %d: %w", op, len(ch.buf), ch.off, &nvmedev.StatusError{Opcode: opc, Status: nvmedev.Status(c.Res)})
		}
	}
	return false
}

func (e *Engine) broken(err error) error {
	e.log.Error("ring failed; closing the engine", zap.Error(err))
	e.closeLocked()
	return err
}

// Sync sends an NVMe Flush: every write completed before the call is on
// stable media when it returns. (Writes do not use FUA: the store makes
// whole batches durable at once, which one Flush does for the price of a
// single command.)
func (e *Engine) Sync() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nvmedev.ErrClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for try := 0; ; try++ {
		c := nvmedev.FlushCmd(e.dev.NSID)
		c.Encode(e.mu.cmdBuf[:])
		sqe := e.mu.ring.GetSQE()
		if sqe == nil {
			return e.broken(errors.New("nvme: no SQE free for flush"))
		}
		if err := e.mu.ring.PrepURingCmd(sqe, int32(e.dev.Fd()), nvmedev.URingCmdIO, e.mu.cmdBuf[:]); err != nil {
			return err
		}
		if _, err := e.mu.ring.SubmitAndWait(1); err != nil {
			return e.broken(fmt.Errorf("nvme: submit flush: %w", err))
		}
		cqe, err := e.mu.ring.WaitCQE()
		if err != nil {
			return e.broken(fmt.Errorf("nvme: wait flush: %w", err))
		}
		e.mu.ring.CQAdvance(1)
		e.stats.flushes.Add(1)
		switch {
		case cqe.Res == 0:
			return nil
		case cqe.Res < 0:
			errno := unix.Errno(-cqe.Res)
			if (errno == unix.EINTR || errno == unix.EAGAIN) && try < maxRetries {
				continue
			}
			return fmt.Errorf("nvme: flush: %w", errno)
		default:
			return fmt.Errorf("nvme: flush: %w", &nvmedev.StatusError{Opcode: nvmedev.OpFlush, Status: nvmedev.Status(cqe.Res)})
		}
	}
}

// Close releases the ring, the registered memory and the device.
func (e *Engine) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nvmedev.ErrClosed
	}
	return e.closeLocked()
}

func (e *Engine) closeLocked() error {
	e.mu.closed = true
	var errs []error
	if e.mu.ring != nil {
		errs = append(errs, e.mu.ring.Close())
		e.mu.ring = nil
	}
	if e.poolMem != nil {
		store.FreeAligned(e.poolMem)
		e.poolMem = nil
	}
	if e.dev.Fd() >= 0 {
		errs = append(errs, e.dev.Close())
	}
	return errors.Join(errs...)
}

// fixedIndexLocked finds the registered buffer holding all of b.
func (e *Engine) fixedIndexLocked(b []byte) (uint16, bool) {
	if !e.mu.useFix || len(b) == 0 {
		return 0, false
	}
	p := uintptr(unsafe.Pointer(&b[0]))
	i := sort.Search(len(e.mu.fixed), func(i int) bool { return e.mu.fixed[i].hi > p })
	if i < len(e.mu.fixed) && e.mu.fixed[i].lo <= p && p+uintptr(len(b)) <= e.mu.fixed[i].hi {
		return e.mu.fixed[i].index, true
	}
	return 0, false
}

// AllocBuffer returns n bytes from the registered pool (I/O on them uses
// fixed-buffer commands), or from plain anonymous memory when the pool is
// exhausted or absent.
func (e *Engine) AllocBuffer(n int) ([]byte, error) {
	if e.pool != nil {
		if b, ok := e.pool.alloc(n); ok {
			return b, nil
		}
	}
	return store.AllocAligned(n)
}

// FreeBuffer returns a buffer from AllocBuffer.
func (e *Engine) FreeBuffer(b []byte) {
	if e.pool != nil && e.pool.release(b) {
		return
	}
	store.FreeAligned(b)
}

// RegisterMemory registers b (for example a client's shared memory) as
// fixed buffers so that I/O on it avoids per-command page pinning. The
// memory must stay mapped until the returned function has run.
func (e *Engine) RegisterMemory(b []byte) (func(), error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		return nil, nvmedev.ErrClosed
	}
	if !e.mu.useFix || len(b) == 0 {
		return func() {}, nil // plain addresses work as well, just slower
	}
	pieces := uring.SplitBuffers([][]byte{b}, 0)
	first := -1
	for i := 0; i+len(pieces) <= len(e.mu.slots); i++ {
		free := true
		for j := range pieces {
			free = free && !e.mu.slots[i+j]
		}
		if free {
			first = i
			break
		}
	}
	if first < 0 {
		return nil, fmt.Errorf("nvme: register %d bytes: no %d free fixed buffer slots", len(b), len(pieces))
	}
	for j := range pieces {
		pieces[j].Index = uint16(first + j)
	}
	if err := e.mu.ring.UpdateBuffers(pieces); err != nil {
		return nil, fmt.Errorf("nvme: register %d bytes: %w", len(b), err)
	}
	e.mu.nextReg++
	reg := e.mu.nextReg
	for _, p := range pieces {
		e.mu.slots[p.Index] = true
		e.mu.fixed = append(e.mu.fixed, regionOf(p.Buf, p.Index, reg))
	}
	sort.Slice(e.mu.fixed, func(i, j int) bool { return e.mu.fixed[i].lo < e.mu.fixed[j].lo })
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			defer e.mu.Unlock()
			if e.mu.closed {
				return
			}
			keep := e.mu.fixed[:0]
			var clearP []uring.FixedBuffer
			for _, f := range e.mu.fixed {
				if f.reg == reg {
					e.mu.slots[f.index] = false
					clearP = append(clearP, uring.FixedBuffer{Index: f.index})
				} else {
					keep = append(keep, f)
				}
			}
			e.mu.fixed = keep
			sort.Slice(clearP, func(i, j int) bool { return clearP[i].Index < clearP[j].Index })
			if err := e.mu.ring.UpdateBuffers(clearP); err != nil {
				e.log.Warn("unregistering memory failed", zap.Error(err))
			}
		})
	}, nil
}

// String describes the engine for logs and `kvfs info`.
func (e *Engine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nvme %s nsid %d (%s), %d bytes, lba %d, max transfer %d, qd %d",
		e.dev.Path, e.dev.NSID, e.dev.Ctrl.Model, e.size, e.lba, e.maxXfer, e.qd)
	if e.fdp.Enabled {
		fmt.Fprintf(&b, ", FDP config %d with %d handles", e.fdp.ConfigIndex, len(e.placement.PIDs))
	} else {
		fmt.Fprintf(&b, ", no FDP (%s)", e.fdp.Reason)
	}
	return b.String()
}

// bufPool carves grain-aligned buffers out of one registered region:
// first fit over a sorted, coalesced free list.
type bufPool struct {
	mu    sync.Mutex
	mem   []byte
	grain int
	free  [][2]int // (offset, length), sorted by offset, never adjacent
}

func newBufPool(mem []byte, grain int) *bufPool {
	return &bufPool{mem: mem, grain: grain, free: [][2]int{{0, len(mem)}}}
}

func (p *bufPool) alloc(n int) ([]byte, bool) {
	if n <= 0 {
		return nil, false
	}
	size := (n + p.grain - 1) / p.grain * p.grain
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, f := range p.free {
		if f[1] >= size {
			if f[1] == size {
				p.free = append(p.free[:i], p.free[i+1:]...)
			} else {
				p.free[i] = [2]int{f[0] + size, f[1] - size}
			}
			return p.mem[f[0] : f[0]+n : f[0]+size], true
		}
	}
	return nil, false
}

// release returns b to the pool; false when b is not from it.
func (p *bufPool) release(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	base := uintptr(unsafe.Pointer(&p.mem[0]))
	ptr := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	if ptr < base || ptr >= base+uintptr(len(p.mem)) {
		return false
	}
	off, size := int(ptr-base), cap(b)
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i][0] > off })
	p.free = append(p.free, [2]int{})
	copy(p.free[i+1:], p.free[i:])
	p.free[i] = [2]int{off, size}
	// Coalesce with the neighbours.
	if i+1 < len(p.free) && p.free[i][0]+p.free[i][1] == p.free[i+1][0] {
		p.free[i][1] += p.free[i+1][1]
		p.free = append(p.free[:i+1], p.free[i+2:]...)
	}
	if i > 0 && p.free[i-1][0]+p.free[i-1][1] == p.free[i][0] {
		p.free[i-1][1] += p.free[i][1]
		p.free = append(p.free[:i], p.free[i+1:]...)
	}
	return true
}

func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
