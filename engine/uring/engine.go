package uring

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/internal/pio"
	"github.com/kvfs/kvfs/engine/internal/ringowner"
	"github.com/kvfs/kvfs/store"
	iouring "github.com/kvfs/kvfs/uring"
)

// EngineOptions configure OpenEngine.
type EngineOptions struct {
	// QueueDepth is the most requests each ring keeps in flight (all
	// callers of that ring together). 0 means 64.
	QueueDepth int
	// Rings is the number of io_uring instances, each with its own
	// goroutine and OS thread; callers are spread over them (see
	// ringowner.Rings). 0 means ringowner.AutoRings (one per 4 usable
	// cores); at most ringowner.MaxRings.
	Rings int
	// BufferPool is the size in bytes of the buffer pool registered with
	// every ring (AllocBuffer carves from it, and I/O on it uses
	// READ_FIXED / WRITE_FIXED). It is rounded up to 2 MiB and backed by
	// transparent huge pages where the kernel allows (physically contiguous
	// buffers: fewer DMA segments). 0 means 64 MiB; negative means none.
	BufferPool int
	// BufferPoolMax lets the pool grow by segments of BufferPool, each
	// registered on every ring, when AllocBuffer finds no room, up to this
	// many bytes in all; past it AllocBuffer returns plain memory. 0 means
	// ringowner.DefaultPoolMax; at most BufferPool (or negative) means no growth.
	BufferPoolMax int
	// Logger receives the engine's logs; nil means zap.NewNop().
	Logger *zap.Logger
	// Direct opens the file O_DIRECT. A filesystem that refuses O_DIRECT
	// (EINVAL at open, e.g. ramfs) gets a buffered open instead, and
	// Align() is then 1.
	Direct bool
	// ReadOnly opens the file read-only: writes fail per request with
	// EBADF, Sync is a no-op.
	ReadOnly bool
	// AsyncReads is "auto" (also ""), "on" or "off": whether reads are
	// submitted with IOSQE_ASYNC. A read the kernel cannot do without
	// blocking-capable context (a buffered read of tmpfs or the page cache)
	// is handed to the ring's io-wq workers; without IOSQE_ASYNC io-wq
	// starts another worker only when the running one sleeps, so copies
	// that never sleep run one at a time per ring (one core). With it each
	// read may get its own worker, and the copies spread over cores. auto:
	// on for page-cache I/O (buffered, or O_DIRECT on tmpfs, which is
	// buffered), off for real O_DIRECT, where the block layer completes
	// reads asynchronously without io-wq.
	AsyncReads string
	// InlineReads is "auto" (also ""), "on" or "off": whether the store
	// may read with ReadInline (store.InlineReader): pread/preadv on the
	// goroutine that verifies the bytes next, instead of a ring. auto: on
	// for a file in memory (tmpfs, ramfs), where a read is a CPU copy
	// either way and doing it on the verifying core spares a pass over
	// memory; off for real O_DIRECT, where the device's DMA moves the
	// bytes, and for buffered files on a disk, which may miss the cache.
	InlineReads string

	// Test knobs.
	maxChunk      int                  // bytes per SQE at most (default 1 GiB)
	legacyBuffers bool                 // re-register the whole table instead of updating it
	refuseDirect  bool                 // act as if open(O_DIRECT) said EINVAL
	extraSlots    int                  // fixed buffer slots for RegisterMemory (default 64)
	enterHook     func(n uint64) error // see ringowner.Config.EnterHook
}

const (
	defaultQueueDepth = 64
	defaultBufferPool = 64 << 20
	defaultExtraSlots = 64
	maxRetries        = 16
)

// EngineStats are counters of an Engine since it was opened.
type EngineStats struct {
	IOs       uint64 // requests completed without error
	Errors    uint64 // requests completed with an error
	Bytes     uint64 // bytes moved by successful requests
	SQEs      uint64 // read/write SQEs submitted (more than IOs when resubmitted or split)
	FixedSQEs uint64 // of which READ_FIXED / WRITE_FIXED
	Resubmits uint64 // short transfers continued
	Retries   uint64 // EAGAIN / EINTR retried
	Enters    uint64 // io_uring_enter calls of the ring goroutine
	Wakeups   uint64 // times a caller woke the ring goroutine through the eventfd
	Syncs     uint64
	// MaxInFlight is the most SQEs in flight at once, over all rings.
	MaxInFlight uint64
	Rings       int    // io_uring instances
	PoolBytes   uint64 // the buffer pool now (it grows by segments)
	// InlineIOs and InlineBytes count the reads done with ReadInline
	// (not through a ring, so not in IOs and Bytes).
	InlineIOs, InlineBytes uint64
	// MappedIOs and MappedBytes count the writes copied into the mapping
	// of a file in memory (not through a ring either).
	MappedIOs, MappedBytes uint64
}

func (s EngineStats) String() string {
	return fmt.Sprintf("ios=%d errors=%d bytes=%d sqes=%d fixed=%d resubmits=%d retries=%d enters=%d wakeups=%d syncs=%d max_inflight=%d rings=%d pool=%d inline_ios=%d inline_bytes=%d mapped_ios=%d mapped_bytes=%d",
		s.IOs, s.Errors, s.Bytes, s.SQEs, s.FixedSQEs, s.Resubmits, s.Retries, s.Enters, s.Wakeups, s.Syncs, s.MaxInFlight, s.Rings, s.PoolBytes, s.InlineIOs, s.InlineBytes,
		s.MappedIOs, s.MappedBytes)
}

// Engine is the io_uring store engine: plain READ/WRITE (READ_FIXED /
// WRITE_FIXED on registered memory) and FSYNC on a file or block device.
// The rings (ringowner.Rings: one or more ringowner.Owner, each with its
// goroutine, queue of callers and fixed-buffer table) and the shared buffer
// pool belong to package ringowner; the Engine supplies how its requests
// are checked, prepared and completed (one driver per ring).
type Engine struct {
	path     string
	fd       int
	log      *zap.Logger
	direct   bool
	readOnly bool
	align    int
	isBlock  bool
	ring     *ringowner.Rings
	drvs     []*driver
	inline   bool // InlineReads
	// pageCache: reads are copies from the page cache (buffered, or
	// tmpfs), not DMA.
	pageCache bool
	// inl guards the fd against Close during inline reads.
	inl struct {
		sync.RWMutex
		closed bool
	}
	inlineIOs, inlineBytes atomic.Uint64
	// mapped is the file mapped shared, for writes, when it is in memory
	// (mapped.go); nil otherwise. inl guards it too.
	mapped                 []byte
	mappedIOs, mappedBytes atomic.Uint64
	// inMemory: the file is in tmpfs or ramfs, of size bytes; view is its
	// read-only mapping once HostView made it (inl guards it).
	inMemory bool
	size     int64
	view     []byte
	bg       sync.WaitGroup // populateView, which Close waits for

	closeOnce sync.Once
}

// driver prepares and completes the Engine's SQEs on the ring goroutine.
type driver struct {
	fd        int32
	align     int
	readOnly  bool
	fixedFile bool
	async     bool // reads with IOSQE_ASYNC
	readv     bool // the kernel has IORING_OP_READV
	log       *zap.Logger
}

var (
	_ store.Engine          = (*Engine)(nil)
	_ store.BufferAllocator = (*Engine)(nil)
	_ store.MemoryRegistrar = (*Engine)(nil)
	_ store.VectorReader    = (*Engine)(nil)
	_ store.NotifyEngine    = (*Engine)(nil)
	_ store.InlineReader    = (*Engine)(nil)
)

// OpenEngine opens path (a regular file or a block device) and starts the
// engine's ring.
func OpenEngine(path string, o EngineOptions) (*Engine, error) {
	if err := iouring.Available(); err != nil {
		return nil, err
	}
	switch o.AsyncReads {
	case "", "auto", "on", "off":
	default:
		return nil, fmt.Errorf("uring: AsyncReads %q: want auto, on or off: %w", o.AsyncReads, unix.EINVAL)
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = defaultQueueDepth
	}
	if o.BufferPool == 0 {
		o.BufferPool = defaultBufferPool
	}
	if o.BufferPoolMax == 0 {
		o.BufferPoolMax = ringowner.DefaultPoolMax(defaultBufferPool)
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.maxChunk <= 0 {
		o.maxChunk = iouring.MaxFixedBuffer
	}
	if o.extraSlots <= 0 {
		o.extraSlots = defaultExtraSlots
	}
	log := o.Logger.With(zap.String("engine", "uring"), zap.String("path", path))

	flags := unix.O_RDWR | unix.O_CLOEXEC
	if o.ReadOnly {
		flags = unix.O_RDONLY | unix.O_CLOEXEC
	}
	fd, direct := -1, false
	if o.Direct {
		var err error
		if o.refuseDirect {
			err = unix.EINVAL
		} else {
			fd, err = unix.Open(path, flags|unix.O_DIRECT, 0)
		}
		switch {
		case err == nil:
			direct = true
		case errors.Is(err, unix.EINVAL):
			log.Info("filesystem refuses O_DIRECT; using buffered I/O")
		default:
			return nil, fmt.Errorf("uring: open %s: %w", path, err)
		}
	}
	if fd < 0 {
		var err error
		if fd, err = unix.Open(path, flags, 0); err != nil {
			return nil, fmt.Errorf("uring: open %s: %w", path, err)
		}
	}
	e := &Engine{path: path, fd: fd, log: log, direct: direct, readOnly: o.ReadOnly, align: 1}
	fail := func(err error) (*Engine, error) {
		e.unmap()
		_ = unix.Close(fd)
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fail(fmt.Errorf("uring: stat %s: %w", path, err))
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFBLK:
		e.isBlock = true
	default:
		return fail(fmt.Errorf("uring: %s is neither a regular file nor a block device: %w", path, unix.EINVAL))
	}
	if direct {
		e.align = dioAlign(fd, e.isBlock)
	}
	var sf unix.Statfs_t
	inMemory := !e.isBlock && unix.Fstatfs(fd, &sf) == nil && (sf.Type == unix.TMPFS_MAGIC || sf.Type == unix.RAMFS_MAGIC)
	pageCache := !direct || inMemory
	async := o.AsyncReads == "on" || (o.AsyncReads != "off" && pageCache)
	switch o.InlineReads {
	case "", "auto", "on", "off":
	default:
		return fail(fmt.Errorf("uring: InlineReads %q: want auto, on or off: %w", o.InlineReads, unix.EINVAL))
	}
	// auto: only where a read never waits for a device (tmpfs, ramfs):
	// a buffered file on a disk may miss the page cache, and a few
	// goroutines' 64 KiB preads are a poor queue for a disk.
	e.inline = o.InlineReads == "on" || (o.InlineReads != "off" && inMemory)
	e.pageCache = pageCache
	e.inMemory, e.size = inMemory, st.Size
	if inMemory && e.inline && !o.ReadOnly {
		e.mapForWrites(fd, st.Size, log)
	}
	cfg := ringowner.Config{
		Name:         "uring",
		QueueDepth:   o.QueueDepth,
		MaxPiece:     o.maxChunk,
		MaxRetries:   maxRetries,
		PoolBytes:    o.BufferPool,
		PoolMaxBytes: o.BufferPoolMax,
		PoolGrain:    e.align,
		ExtraSlots:   o.extraSlots,
		Logger:       log,
		Legacy:       o.legacyBuffers,
		SyncOp:       iouring.OpFsync,
		SyncFallback: func() error {
			if err := unix.Fdatasync(fd); err != nil {
				return fmt.Errorf("uring: fdatasync: %w", err)
			}
			return nil
		},
		EnterHook: o.enterHook,
	}
	r, err := ringowner.StartRings(cfg, o.Rings, func(int) ringowner.Driver {
		d := &driver{fd: int32(fd), align: e.align, readOnly: o.ReadOnly, async: async, log: log}
		e.drvs = append(e.drvs, d)
		return d
	})
	if err != nil {
		return fail(err)
	}
	e.ring = r
	log.Info("uring engine ready", zap.Bool("direct", e.direct), zap.Int("align", e.align),
		zap.Bool("fixed_file", e.drvs[0].fixedFile), zap.Int("rings", r.N()), zap.Int("queue_depth_per_ring", o.QueueDepth),
		zap.Bool("async_reads", async), zap.Bool("mapped_writes", e.mapped != nil))
	return e, nil
}

// dioAlign is the O_DIRECT alignment of fd: the logical block size of a
// block device, statx's DIO alignment for a file, 1 on tmpfs (where
// O_DIRECT is page-cache I/O), 4096 when unknown.
func dioAlign(fd int, isBlock bool) int {
	if isBlock {
		if n, err := unix.IoctlGetInt(fd, unix.BLKSSZGET); err == nil && n > 0 {
			return n
		}
		return 4096
	}
	var sx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &sx); err == nil &&
		sx.Mask&unix.STATX_DIOALIGN != 0 && sx.Dio_offset_align > 0 {
		return int(max(sx.Dio_offset_align, sx.Dio_mem_align))
	}
	var sf unix.Statfs_t
	if err := unix.Fstatfs(fd, &sf); err == nil && sf.Type == unix.TMPFS_MAGIC {
		return 1
	}
	return 4096
}

// Name is "uring".
func (e *Engine) Name() string { return "uring" }

// Align is the alignment O_DIRECT needs (1 when buffered).
func (e *Engine) Align() int { return e.align }

// Direct reports whether the file is open O_DIRECT.
func (e *Engine) Direct() bool { return e.direct }

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	s := e.ring.Stats()
	return EngineStats{
		IOs: s.IOs, Errors: s.Errors, Bytes: s.Bytes, SQEs: s.SQEs, FixedSQEs: s.FixedSQEs,
		Resubmits: s.Resubmits, Retries: s.Retries, Enters: s.Enters, Wakeups: s.Wakeups, Syncs: s.Syncs,
		MaxInFlight: s.MaxInFlight, Rings: e.ring.N(), PoolBytes: s.PoolBytes,
		InlineIOs: e.inlineIOs.Load(), InlineBytes: e.inlineBytes.Load(),
		MappedIOs: e.mappedIOs.Load(), MappedBytes: e.mappedBytes.Load(),
	}
}

// InlineReads implements store.InlineReader: true for a file in memory
// (tmpfs, ramfs) unless EngineOptions.InlineReads is off, or when it is on.
func (e *Engine) InlineReads() bool { return e.inline }

// ReadInline implements store.InlineReader: one read (Buf or Vec) with
// pread/preadv on the calling goroutine.
func (e *Engine) ReadInline(rq *store.IO) error {
	if rq.Op != store.OpRead {
		return fmt.Errorf("uring: inline %v: %w", rq.Op, unix.EINVAL)
	}
	e.inl.RLock()
	defer e.inl.RUnlock()
	if e.inl.closed {
		return fmt.Errorf("uring: %w", store.ErrEngineClosed)
	}
	if err := pio.Do(e.fd, rq, e.align, "uring"); err != nil {
		return err
	}
	e.inlineIOs.Add(1)
	e.inlineBytes.Add(uint64(rq.VecLen()))
	return nil
}

// VectorReads implements store.VectorReader: reads with IO.Vec are served
// with IORING_OP_READV (split at IOV_MAX segments) where the kernel has it,
// for page-cache I/O only. With real O_DIRECT the store bounces runs whose
// destinations are apart instead: DMA into a client's scattered 4 KiB pages
// takes a segment per page, and on a virtio disk loaded slower than the
// bounce into the physically contiguous pool (see docs/performance.md,
// 'Disk store').
func (e *Engine) VectorReads() bool {
	if !e.pageCache {
		return false
	}
	for _, d := range e.drvs {
		if !d.readv {
			return false
		}
	}
	return len(e.drvs) > 0
}

// Rings is the number of io_uring instances.
func (e *Engine) Rings() int { return e.ring.N() }

// Size is the file's current size, or the block device's size. It is 0
// when the size cannot be read (logged).
func (e *Engine) Size() int64 {
	if e.isBlock {
		n, err := unix.IoctlGetUint64(e.fd, unix.BLKGETSIZE64)
		if err != nil {
			e.log.Error("BLKGETSIZE64", zap.Error(err))
			return 0
		}
		return int64(n)
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.fd, &st); err != nil {
		e.log.Error("fstat", zap.Error(err))
		return 0
	}
	return st.Size
}

// Do performs the batch; see store.Engine. It is safe for concurrent use:
// concurrent callers are spread over the rings, and share each ring's
// queue depth; a large batch is split over the rings.
func (e *Engine) Do(ios []store.IO) error {
	if e.mappable(ios) {
		return e.writeMapped(ios)
	}
	return e.ring.Do(ios)
}

// DoNotify implements store.NotifyEngine: Do, with done(i) called on a
// ring goroutine as ios[i] completes (see ringowner.Rings.DoNotify).
func (e *Engine) DoNotify(ios []store.IO, done func(i int)) error {
	return e.ring.DoNotify(ios, done)
}

// DoAsync starts the batch and returns without waiting for it. done(i) is
// called on the engine's ring goroutine as ios[i] completes (ios[i].Err
// set, as with Do); it must be quick and must not block — in particular it
// must not call Do, Sync, RegisterMemory or Close, which wait for the ring
// goroutine — but it may call DoAsync again, for example to keep a queue
// full: new work is submitted together with the other completions' in one
// io_uring_enter. The caller must not touch ios until done was called for
// each request. A returned error (store.ErrEngineClosed, ring failed)
// means done will not be called.
func (e *Engine) DoAsync(ios []store.IO, done func(i int)) error {
	return e.ring.DoAsync(ios, done)
}

// Sync makes completed writes durable (fdatasync through the ring).
func (e *Engine) Sync() error {
	if e.readOnly {
		return nil
	}
	return e.ring.Sync()
}

// AllocBuffer returns n bytes of aligned memory, from the registered pool
// when it has room or may grow (so I/O on it uses fixed buffers), else
// from store.AllocAligned. Give it back with FreeBuffer, unchanged (a pool
// chunk still out at Close keeps the pool mapped until it is freed).
func (e *Engine) AllocBuffer(n int) ([]byte, error) { return e.ring.AllocBuffer(n) }

// FreeBuffer releases a buffer from AllocBuffer.
func (e *Engine) FreeBuffer(b []byte) { e.ring.FreeBuffer(b) }

// RegisterMemory adds b to the fixed buffer table (split in ≤ 1 GiB
// pieces), so I/O whose buffer lies inside b uses READ_FIXED/WRITE_FIXED.
// b must stay mapped until the returned function has been called (or the
// engine closed). The function is idempotent.
func (e *Engine) RegisterMemory(b []byte) (func(), error) { return e.ring.RegisterMemory(b) }

// Close waits for the requests in flight, stops the ring and closes the
// file. Later calls fail with store.ErrEngineClosed; a second Close
// returns nil.
func (e *Engine) Close() error {
	err := e.ring.Close()
	e.inl.Lock() // inline reads and mapped writes in progress finish first
	if !e.inl.closed {
		e.inl.closed = true
		e.unmap() // once: the range may be another mapping's afterwards
	}
	e.inl.Unlock()
	e.bg.Wait()
	e.closeOnce.Do(func() {
		_ = unix.Close(e.fd)
		e.fd = -1 // Size after Close fails instead of asking a reused fd
	})
	return err
}

// ---- the driver: runs on the ring goroutine ----

func (d *driver) Setup(r *iouring.Ring, probe *iouring.ProbeResult) (string, error) {
	for _, op := range []iouring.Opcode{iouring.OpRead, iouring.OpWrite} {
		if !probe.Supported(op) {
			return "", fmt.Errorf("uring: kernel lacks %v: %w", op, unix.EOPNOTSUPP)
		}
	}
	d.readv = probe.Supported(iouring.OpReadv)
	if err := r.RegisterFiles([]int{int(d.fd)}); err == nil {
		d.fixedFile = true
	} else {
		d.log.Info("fixed file unavailable", zap.Error(err))
	}
	if !probe.Supported(iouring.OpReadFixed) || !probe.Supported(iouring.OpWriteFixed) {
		return "kernel lacks READ_FIXED/WRITE_FIXED", nil
	}
	return "", nil
}

// Check validates one request before it is started.
func (d *driver) Check(rq *store.IO) error {
	if rq.Op != store.OpRead && rq.Op != store.OpWrite {
		return fmt.Errorf("uring: unknown op %d at offset %d: %w", rq.Op, rq.Off, unix.EINVAL)
	}
	if rq.Op == store.OpWrite && d.readOnly {
		return fmt.Errorf("uring: write at offset %d: engine is read-only: %w", rq.Off, unix.EBADF)
	}
	if rq.Off < 0 {
		return fmt.Errorf("uring: %v at offset %d: %w", rq.Op, rq.Off, unix.EINVAL)
	}
	if rq.Vec != nil {
		if !d.readv {
			return fmt.Errorf("uring: vector read at offset %d: kernel lacks IORING_OP_READV: %w", rq.Off, unix.EOPNOTSUPP)
		}
		for _, v := range rq.Vec {
			if !store.Aligned(v, d.align) {
				return fmt.Errorf("uring: vector read at offset %d: a %d-byte segment not aligned to %d for O_DIRECT: %w",
					rq.Off, len(v), d.align, unix.EINVAL)
			}
		}
	}
	if d.align > 1 && (rq.Off%int64(d.align) != 0 || !store.Aligned(rq.Buf, d.align)) {
		return fmt.Errorf("uring: %v of %d bytes at offset %d: not aligned to %d for O_DIRECT: %w",
			rq.Op, len(rq.Buf), rq.Off, d.align, unix.EINVAL)
	}
	return nil
}

func (d *driver) PrepIO(sqe *iouring.SQE, rq *store.IO, b []byte, off int64, fixed int) error {
	fd := d.fd
	switch {
	case rq.Op == store.OpWrite && fixed >= 0:
		sqe.PrepWriteFixed(fd, b, uint64(off), uint16(fixed))
	case rq.Op == store.OpWrite:
		sqe.PrepWrite(fd, b, uint64(off))
	case fixed >= 0:
		sqe.PrepReadFixed(fd, b, uint64(off), uint16(fixed))
	default:
		sqe.PrepRead(fd, b, uint64(off))
	}
	if d.fixedFile {
		sqe.Fd = 0
		sqe.SetFlags(iouring.SQEFixedFile)
	}
	if d.async && rq.Op == store.OpRead {
		sqe.SetFlags(iouring.SQEAsync)
	}
	return nil
}

// PrepReadv prepares IORING_OP_READV into iov (ringowner.VecDriver).
func (d *driver) PrepReadv(sqe *iouring.SQE, _ *store.IO, iov []unix.Iovec, off int64) error {
	sqe.PrepRW(iouring.OpReadv, d.fd, uintptr(unsafe.Pointer(&iov[0])), uint32(len(iov)), uint64(off))
	if d.fixedFile {
		sqe.Fd = 0
		sqe.SetFlags(iouring.SQEFixedFile)
	}
	if d.async {
		sqe.SetFlags(iouring.SQEAsync)
	}
	return nil
}

func (d *driver) CompleteIO(rq *store.IO, at, n int, _ bool, res int32) (int, bool, error) {
	switch {
	case res < 0:
		return 0, false, fmt.Errorf("uring: %v of %d bytes at offset %d: %w", rq.Op, n, rq.Off+int64(at), unix.Errno(-res))
	case res == 0:
		return 0, false, shortErr(rq, at)
	case int(res) < n && d.align > 1 && !alignedAt(rq, at+int(res), d.align):
		// A short transfer whose continuation would be off the O_DIRECT
		// alignment (a partial block at the end of the file) is the end
		// of the file.
		return 0, false, shortErr(rq, at+int(res))
	}
	return int(res), false, nil
}

func (d *driver) PrepSync(sqe *iouring.SQE) {
	if d.fixedFile {
		sqe.PrepFsync(0, iouring.FsyncDatasync)
		sqe.SetFlags(iouring.SQEFixedFile)
		return
	}
	sqe.PrepFsync(d.fd, iouring.FsyncDatasync)
}

func (d *driver) CompleteSync(res int32) error {
	if res < 0 {
		return fmt.Errorf("uring: fdatasync: %w", unix.Errno(-res))
	}
	return nil
}

func alignedAt(rq *store.IO, done, align int) bool {
	return (rq.Off+int64(done))%int64(align) == 0 && store.Aligned(rq.Buf[done:], align)
}

func shortErr(rq *store.IO, done int) error {
	if rq.Op == store.OpRead {
		return fmt.Errorf("uring: read of %d bytes at offset %d: end of file after %d: %w", len(rq.Buf), rq.Off, done, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("uring: write of %d bytes at offset %d: wrote %d: %w", len(rq.Buf), rq.Off, done, io.ErrShortWrite)
}
