package uring

import (
	iouring "github.com/kvfs/kvfs/uring"

	"errors"
	"fmt"
	"io"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
)

// EngineOptions configure OpenEngine.
type EngineOptions struct {
	// QueueDepth is the most requests the engine keeps in flight (all
	// callers together). 0 means 64.
	QueueDepth int
	// BufferPool is the size in bytes of the buffer pool registered once
	// with the ring (AllocBuffer carves from it, and I/O on it uses
	// READ_FIXED / WRITE_FIXED). It is rounded up to 2 MiB and backed by
	// transparent huge pages where the kernel allows (physically contiguous
	// buffers: fewer DMA segments). 0 means 64 MiB; negative means none.
	BufferPool int
	// Logger receives the engine's logs; nil means zap.NewNop().
	Logger *zap.Logger
	// Direct opens the file O_DIRECT. A filesystem that refuses O_DIRECT
	// (EINVAL at open, e.g. ramfs) gets a buffered open instead, and
	// Align() is then 1.
	Direct bool
	// ReadOnly opens the file read-only: writes fail per request with
	// EBADF, Sync is a no-op.
	ReadOnly bool

	// Test knobs.
	maxChunk      int  // bytes per iouring.SQE at most (default 1 GiB)
	legacyBuffers bool // re-register the whole table instead of updating it
	refuseDirect  bool // act as if open(O_DIRECT) said EINVAL
	extraSlots    int  // fixed buffer slots for RegisterMemory (default 64)
}

const (
	defaultQueueDepth = 64
	defaultBufferPool = 64 << 20
	defaultExtraSlots = 64
	maxRetries        = 16
	wakeTag           = 1 << 63
)

// ErrClosed is returned by an Engine's methods after Close.
var ErrClosed = errors.New("uring: engine closed")

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
}

func (s EngineStats) String() string {
	return fmt.Sprintf("ios=%d errors=%d bytes=%d sqes=%d fixed=%d resubmits=%d retries=%d enters=%d wakeups=%d syncs=%d",
		s.IOs, s.Errors, s.Bytes, s.SQEs, s.FixedSQEs, s.Resubmits, s.Retries, s.Enters, s.Wakeups, s.Syncs)
}

type engineStats struct {
	ios, errors, bytes, sqes, fixed, resubmits, retries, enters, wakeups, syncs atomic.Uint64
}

type callKind uint8

const (
	callIO callKind = iota
	callSync
	callRegister
	callUnregister
	callClose
)

// call is one request to the ring goroutine: a Do batch, a Sync, a buffer
// (un)registration or Close.
type call struct {
	kind callKind
	ios  []store.IO
	next int // next IO to start
	left int // IOs (or 1 for the other kinds) not complete
	err  error
	done chan struct{} // closed when left reaches 0 (nil for DoAsync)
	cb   func(i int)   // DoAsync: called as each IO completes

	mem   []byte // callRegister
	regID int    // callRegister result, callUnregister argument
}

func newCall(kind callKind, left int) *call {
	return &call{kind: kind, left: left, done: make(chan struct{})}
}

func (c *call) finishOne() {
	c.left--
	if c.left == 0 && c.done != nil {
		close(c.done)
	}
}

// ioDone finishes request i of an IO call.
func (c *call) ioDone(i int) {
	if c.cb != nil {
		c.cb(i)
	}
	c.finishOne()
}

type slotKind uint8

const (
	slotIO slotKind = iota
	slotSync
)

// slot is one request in flight; its index is the iouring.SQE's user_data.
type slot struct {
	kind    slotKind
	c       *call
	i       int // index in c.ios
	done    int // bytes transferred so far
	n       int // bytes asked of the iouring.SQE in flight
	retries int
}

// registration is memory added by RegisterMemory.
type registration struct {
	mem    []byte
	pieces []iouring.FixedBuffer
}

// Engine is the io_uring store engine. See the package documentation for
// its concurrency design: one goroutine, locked to its OS thread, owns the
// ring; Do, Sync and RegisterMemory hand it work and wait.
type Engine struct {
	path     string
	fd       int
	efd      int // eventfd that wakes the ring goroutine
	log      *zap.Logger
	direct   bool
	readOnly bool
	align    int
	isBlock  bool
	qd       int
	pool     *pool
	exited   chan struct{}
	stats    engineStats

	mu struct {
		sync.Mutex
		queue    []*call
		sleeping bool  // the ring goroutine waits in the kernel: wake it
		closed   bool  // Close was called
		broken   error // the ring failed; every call fails with it
	}

	// Owned by the ring goroutine.
	ring          *iouring.Ring
	pending       []*call
	slots         []slot
	free          []int
	armed         bool // the eventfd read is in flight
	wakeBuf       [8]byte
	fixedFile     bool
	canFsync      bool
	maxChunk      int
	sparse        bool                  // buffer table updated in place
	legacy        bool                  // buffer table re-registered whole
	noFixed       bool                  // no fixed buffers at all
	tableUsed     []bool                // sparse: which slots hold a buffer
	poolPieces    []iouring.FixedBuffer // the pool's entries
	fixed         []iouring.FixedBuffer // every entry, sorted by address
	regs          map[int]*registration
	nextReg       int
	extraSlots    int
	closing       *call
	legacyOption  bool
	canRegister   bool
	fixedDisabled string
}

var (
	_ store.Engine          = (*Engine)(nil)
	_ store.BufferAllocator = (*Engine)(nil)
	_ store.MemoryRegistrar = (*Engine)(nil)
)

// OpenEngine opens path (a regular file or a block device) and starts the
// engine's ring.
func OpenEngine(path string, o EngineOptions) (*Engine, error) {
	if err := iouring.Available(); err != nil {
		return nil, err
	}
	if o.QueueDepth <= 0 {
		o.QueueDepth = defaultQueueDepth
	}
	if o.BufferPool == 0 {
		o.BufferPool = defaultBufferPool
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
	e := &Engine{
		path: path, fd: fd, efd: -1, log: log, direct: direct, readOnly: o.ReadOnly,
		align: 1, qd: o.QueueDepth, maxChunk: o.maxChunk, extraSlots: o.extraSlots,
		legacyOption: o.legacyBuffers, regs: map[int]*registration{}, exited: make(chan struct{}),
	}
	fail := func(err error) (*Engine, error) {
		e.release()
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
	var poolMem []byte
	if o.BufferPool > 0 {
		var err error
		if poolMem, err = mapPool(o.BufferPool); err != nil {
			return fail(fmt.Errorf("uring: mmap buffer pool of %d bytes: %w", o.BufferPool, err))
		}
	}
	e.pool = newPool(poolMem, max(unix.Getpagesize(), e.align))
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return fail(fmt.Errorf("uring: eventfd: %w", err))
	}
	e.efd = efd
	ready := make(chan error, 1)
	go e.run(ready)
	if err := <-ready; err != nil {
		<-e.exited
		return fail(err)
	}
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

// release frees what OpenEngine acquired (after the ring goroutine ended).
func (e *Engine) release() {
	if e.efd >= 0 {
		_ = unix.Close(e.efd)
		e.efd = -1
	}
	if e.fd >= 0 {
		_ = unix.Close(e.fd)
		e.fd = -1
	}
	if e.pool != nil {
		if used := e.pool.retire(); used > 0 {
			// Chunks still out may still be in use: the pool stays mapped
			// until the last one is freed.
			e.log.Warn("buffer pool chunks still out at close; unmapping the pool when they are freed", zap.Int("bytes", used))
		}
	}
}

// Name is "uring".
func (e *Engine) Name() string { return "uring" }

// Align is the alignment O_DIRECT needs (1 when buffered).
func (e *Engine) Align() int { return e.align }

// Direct reports whether the file is open O_DIRECT.
func (e *Engine) Direct() bool { return e.direct }

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	s := &e.stats
	return EngineStats{
		IOs: s.ios.Load(), Errors: s.errors.Load(), Bytes: s.bytes.Load(), SQEs: s.sqes.Load(),
		FixedSQEs: s.fixed.Load(), Resubmits: s.resubmits.Load(), Retries: s.retries.Load(),
		Enters: s.enters.Load(), Wakeups: s.wakeups.Load(), Syncs: s.syncs.Load(),
	}
}

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

// enqueue hands c to the ring goroutine, waking it if it sleeps in the
// kernel. The eventfd write happens under the lock, so it cannot race with
// Close closing the eventfd.
func (e *Engine) enqueue(c *call) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.broken != nil {
		return e.mu.broken
	}
	if e.mu.closed {
		return ErrClosed
	}
	e.mu.queue = append(e.mu.queue, c)
	e.wakeLocked()
	return nil
}

func (e *Engine) wakeLocked() {
	if !e.mu.sleeping {
		return
	}
	e.mu.sleeping = false
	one := [8]byte{1}
	for {
		_, err := unix.Write(e.efd, one[:])
		if err != unix.EINTR {
			break
		}
	}
}

// Do performs the batch; see store.Engine. It is safe for concurrent use:
// batches of concurrent callers share the ring's queue depth.
func (e *Engine) Do(ios []store.IO) error {
	if len(ios) == 0 {
		return nil
	}
	c := newCall(callIO, len(ios))
	c.ios = ios
	if err := e.enqueue(c); err != nil {
		return err
	}
	<-c.done
	return c.err
}

// DoAsync starts the batch and returns without waiting for it. done(i) is
// called on the engine's ring goroutine as ios[i] completes (ios[i].Err
// set, as with Do); it must be quick and must not block — in particular it
// must not call Do, Sync, RegisterMemory or Close, which wait for the ring
// goroutine — but it may call DoAsync again, for example to keep a queue
// full: new work is submitted together with the other completions' in one
// io_uring_enter. The caller
// must not touch ios until done was called for each request. A returned
// error (ErrClosed, ring failed) means done will not be called.
func (e *Engine) DoAsync(ios []store.IO, done func(i int)) error {
	if len(ios) == 0 {
		return nil
	}
	c := &call{kind: callIO, ios: ios, left: len(ios), cb: done}
	return e.enqueue(c)
}

// Sync makes completed writes durable (fdatasync through the ring).
func (e *Engine) Sync() error {
	if e.readOnly {
		return nil
	}
	c := newCall(callSync, 1)
	if err := e.enqueue(c); err != nil {
		return err
	}
	<-c.done
	return c.err
}

// AllocBuffer returns n bytes of aligned memory, from the registered pool
// when it has room (so I/O on it uses fixed buffers), else from
// store.AllocAligned. Give it back with FreeBuffer, unchanged (a pool
// chunk still out at Close keeps the pool mapped until it is freed).
func (e *Engine) AllocBuffer(n int) ([]byte, error) {
	if b, ok := e.pool.alloc(n); ok {
		return b, nil
	}
	return store.AllocAligned(n)
}

// FreeBuffer releases a buffer from AllocBuffer.
func (e *Engine) FreeBuffer(b []byte) {
	if !e.pool.release(b) {
		store.FreeAligned(b)
	}
}

// RegisterMemory adds b to the fixed buffer table (split in ≤ 1 GiB
// pieces), so I/O whose buffer lies inside b uses READ_FIXED/WRITE_FIXED.
// b must stay mapped until the returned function has been called (or the
// engine closed). The function is idempotent.
func (e *Engine) RegisterMemory(b []byte) (func(), error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("uring: register empty memory: %w", unix.EINVAL)
	}
	c := newCall(callRegister, 1)
	c.mem = b
	if err := e.enqueue(c); err != nil {
		return nil, err
	}
	<-c.done
	if c.err != nil {
		return nil, c.err
	}
	id := c.regID
	var once sync.Once
	return func() {
		once.Do(func() {
			u := newCall(callUnregister, 1)
			u.regID = id
			if err := e.enqueue(u); err != nil {
				return // closed: the table went with the ring
			}
			<-u.done
			if u.err != nil {
				e.log.Warn("unregister memory", zap.Error(u.err))
			}
		})
	}, nil
}

// Close waits for the requests in flight, stops the ring and closes the
// file. Later calls fail with ErrClosed; a second Close returns nil.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.mu.closed {
		e.mu.Unlock()
		return nil
	}
	e.mu.closed = true
	c := newCall(callClose, 1)
	if e.mu.broken == nil {
		e.mu.queue = append(e.mu.queue, c)
		e.wakeLocked()
	}
	e.mu.Unlock()
	<-e.exited
	e.release()
	return nil
}

// ---- the ring goroutine ----

func (e *Engine) run(ready chan<- error) {
	defer close(e.exited)
	// The ring is created with SINGLE_ISSUER/DEFER_TASKRUN when the kernel
	// has them: every io_uring call must come from this OS thread. The
	// thread is never unlocked, so it exits with the goroutine.
	runtime.LockOSThread()
	if err := e.setup(); err != nil {
		if e.ring != nil {
			_ = e.ring.Close()
		}
		ready <- err
		return
	}
	ready <- nil
	e.loop()
}

func nextPow2(n int) uint32 {
	p := uint32(1)
	for int(p) < n {
		p <<= 1
	}
	return p
}

func (e *Engine) setup() error {
	r, err := iouring.New(iouring.Options{
		Entries:      nextPow2(e.qd + 1), // QD requests + the eventfd read
		SingleIssuer: true,
		DeferTaskrun: true,
		CoopTaskrun:  true,
	})
	if err != nil {
		return err
	}
	e.ring = r
	probe, err := r.Probe()
	if err != nil {
		return err
	}
	for _, op := range []iouring.Opcode{iouring.OpRead, iouring.OpWrite} {
		if !probe.Supported(op) {
			return fmt.Errorf("uring: kernel lacks %v: %w", op, unix.EOPNOTSUPP)
		}
	}
	e.canFsync = probe.Supported(iouring.OpFsync)
	e.slots = make([]slot, e.qd)
	e.free = make([]int, e.qd)
	for i := range e.free {
		e.free[i] = e.qd - 1 - i
	}
	if err := r.RegisterFiles([]int{e.fd}); err == nil {
		e.fixedFile = true
	} else {
		e.log.Info("fixed file unavailable", zap.Error(err))
	}
	e.setupBuffers(probe)
	e.log.Info("uring engine ready",
		zap.Int("queue_depth", e.qd), zap.Bool("direct", e.direct), zap.Int("align", e.align),
		zap.String("ring_flags", fmt.Sprintf("%#x", r.Flags())), zap.Int("sq_entries", r.SQEntries()),
		zap.Bool("fixed_file", e.fixedFile), zap.Bool("fixed_buffers", !e.noFixed),
		zap.Bool("buffer_update", e.sparse), zap.Int("pool_bytes", len(e.pool.mem)))
	return nil
}

func (e *Engine) setupBuffers(probe *iouring.ProbeResult) {
	if !probe.Supported(iouring.OpReadFixed) || !probe.Supported(iouring.OpWriteFixed) {
		e.noFixed, e.fixedDisabled = true, "kernel lacks READ_FIXED/WRITE_FIXED"
		return
	}
	e.poolPieces = iouring.SplitBuffers([][]byte{e.pool.mem}, 0)
	if !e.legacyOption {
		n := len(e.poolPieces) + e.extraSlots
		err := e.ring.RegisterBuffersSparse(n)
		if err == nil && len(e.poolPieces) > 0 {
			if err = e.ring.UpdateBuffers(e.poolPieces); err != nil {
				_ = e.ring.UnregisterBuffers()
			}
		}
		if err == nil {
			e.sparse = true
			e.tableUsed = make([]bool, n)
			for i := range e.poolPieces {
				e.tableUsed[i] = true
			}
			e.fixed = append([]iouring.FixedBuffer(nil), e.poolPieces...)
			e.sortFixed()
			return
		}
		e.log.Info("sparse buffer table unavailable; re-registering the table on changes", zap.Error(err))
	}
	e.legacy = true
	if len(e.poolPieces) == 0 {
		return
	}
	if _, err := e.ring.RegisterBuffers([][]byte{e.pool.mem}); err != nil {
		e.log.Warn("fixed buffers unavailable; using plain reads and writes", zap.Error(err))
		e.noFixed, e.fixedDisabled = true, err.Error()
		return
	}
	e.fixed = append([]iouring.FixedBuffer(nil), e.poolPieces...)
	e.sortFixed()
}

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

func (e *Engine) sortFixed() {
	sort.Slice(e.fixed, func(i, j int) bool { return addrOf(e.fixed[i].Buf) < addrOf(e.fixed[j].Buf) })
}

// lookupFixed finds the registered entry that holds all of b.
func (e *Engine) lookupFixed(b []byte) (uint16, bool) {
	if len(e.fixed) == 0 || len(b) == 0 {
		return 0, false
	}
	a := addrOf(b)
	i := sort.Search(len(e.fixed), func(i int) bool { return addrOf(e.fixed[i].Buf) > a }) - 1
	if i < 0 || !e.fixed[i].Contains(b) {
		return 0, false
	}
	return e.fixed[i].Index, true
}

func (e *Engine) loop() {
	cqes := make([]iouring.CQE, e.ring.CQEntries())
	for {
		e.mu.Lock()
		e.mu.sleeping = false
		e.pending = append(e.pending, e.mu.queue...)
		clear(e.mu.queue)
		e.mu.queue = e.mu.queue[:0]
		e.mu.Unlock()

		e.fill()
		if e.closing != nil && e.inflight() == 0 {
			e.shutdown()
			return
		}
		if !e.armed {
			e.arm()
		}
		e.mu.Lock()
		wait := len(e.mu.queue) == 0
		e.mu.sleeping = wait
		e.mu.Unlock()
		n := 0
		if wait {
			n = 1
		}
		_, err := e.ring.SubmitAndWait(n)
		e.stats.enters.Add(1)
		if wait {
			// Awake again: callers (and completion callbacks, which run
			// here) need not write the eventfd.
			e.mu.Lock()
			e.mu.sleeping = false
			e.mu.Unlock()
		}
		if err != nil {
			if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
				e.fail(err)
				return
			}
			// Out of kernel resources or CQ overflow: reap, then go on.
			time.Sleep(50 * time.Microsecond)
		}
		for {
			k := e.ring.ReapCQEs(cqes)
			for _, c := range cqes[:k] {
				e.complete(c)
			}
			if k < len(cqes) {
				break
			}
		}
	}
}

func (e *Engine) inflight() int { return e.qd - len(e.free) }

func (e *Engine) getSlot() int {
	i := e.free[len(e.free)-1]
	e.free = e.free[:len(e.free)-1]
	return i
}

func (e *Engine) putSlot(i int) {
	e.slots[i] = slot{}
	e.free = append(e.free, i)
}

// arm keeps a read of the eventfd in flight, so that a caller's write
// ends the ring goroutine's wait in io_uring_enter.
func (e *Engine) arm() {
	sqe := e.ring.GetSQE()
	if sqe == nil {
		return // SQ full: the wait ends with a completion anyway
	}
	sqe.PrepRead(int32(e.efd), e.wakeBuf[:], 0)
	sqe.SetUserData(wakeTag)
	e.armed = true
}

// fill starts pending work while slots are free, in FIFO order.
func (e *Engine) fill() {
	for len(e.pending) > 0 {
		c := e.pending[0]
		switch c.kind {
		case callIO:
			for c.next < len(c.ios) && len(e.free) > 0 {
				i := c.next
				c.next++
				rq := &c.ios[i]
				rq.Err = nil
				if err := e.check(rq); err != nil {
					rq.Err = err
					e.stats.errors.Add(1)
					c.ioDone(i)
					continue
				}
				if len(rq.Buf) == 0 {
					e.stats.ios.Add(1)
					c.ioDone(i)
					continue
				}
				si := e.getSlot()
				e.slots[si] = slot{kind: slotIO, c: c, i: i}
				e.prepIO(si)
			}
			if c.next < len(c.ios) {
				return // out of slots
			}
		case callSync:
			if !e.canFsync {
				if err := unix.Fdatasync(e.fd); err != nil {
					c.err = fmt.Errorf("uring: fdatasync: %w", err)
				}
				e.stats.syncs.Add(1)
				c.finishOne()
				break
			}
			if len(e.free) == 0 {
				return
			}
			si := e.getSlot()
			e.slots[si] = slot{kind: slotSync, c: c}
			e.prepSync(si)
		case callRegister, callUnregister:
			if e.legacy && e.inflight() > 0 {
				return // replacing the whole table wants a quiet ring
			}
			if c.kind == callRegister {
				c.err = e.register(c)
			} else {
				c.err = e.unregister(c.regID)
			}
			c.finishOne()
		case callClose:
			if e.inflight() > 0 {
				return
			}
			e.closing = c
		}
		e.pending[0] = nil
		e.pending = e.pending[1:]
	}
}

// check validates one request before it is started.
func (e *Engine) check(rq *store.IO) error {
	if rq.Op != store.OpRead && rq.Op != store.OpWrite {
		return fmt.Errorf("uring: unknown op %d at offset %d: %w", rq.Op, rq.Off, unix.EINVAL)
	}
	if rq.Op == store.OpWrite && e.readOnly {
		return fmt.Errorf("uring: write at offset %d: engine is read-only: %w", rq.Off, unix.EBADF)
	}
	if rq.Off < 0 {
		return fmt.Errorf("uring: %v at offset %d: %w", rq.Op, rq.Off, unix.EINVAL)
	}
	if e.align > 1 && (rq.Off%int64(e.align) != 0 || !store.Aligned(rq.Buf, e.align)) {
		return fmt.Errorf("uring: %v of %d bytes at offset %d: not aligned to %d for O_DIRECT: %w",
			rq.Op, len(rq.Buf), rq.Off, e.align, unix.EINVAL)
	}
	return nil
}

func (e *Engine) getSQE() *iouring.SQE {
	sqe := e.ring.GetSQE()
	if sqe == nil {
		// Cannot happen with SQ entries > QD, but stay correct: push the
		// SQ to the kernel and try again.
		_, _ = e.ring.Submit()
		sqe = e.ring.GetSQE()
	}
	return sqe
}

func (e *Engine) prepIO(si int) {
	s := &e.slots[si]
	rq := &s.c.ios[s.i]
	b := rq.Buf[s.done:]
	if len(b) > e.maxChunk {
		b = b[:e.maxChunk]
	}
	sqe := e.getSQE()
	if sqe == nil {
		e.finishIO(si, fmt.Errorf("uring: %v at offset %d: submission queue full: %w", rq.Op, rq.Off, unix.EBUSY))
		return
	}
	off := uint64(rq.Off) + uint64(s.done)
	fd := int32(e.fd)
	idx, fixed := e.lookupFixed(b)
	switch {
	case rq.Op == store.OpWrite && fixed:
		sqe.PrepWriteFixed(fd, b, off, idx)
	case rq.Op == store.OpWrite:
		sqe.PrepWrite(fd, b, off)
	case fixed:
		sqe.PrepReadFixed(fd, b, off, idx)
	default:
		sqe.PrepRead(fd, b, off)
	}
	if e.fixedFile {
		sqe.Fd = 0
		sqe.SetFlags(iouring.SQEFixedFile)
	}
	sqe.SetUserData(uint64(si))
	s.n = len(b)
	e.stats.sqes.Add(1)
	if fixed {
		e.stats.fixed.Add(1)
	}
}

func (e *Engine) prepSync(si int) {
	sqe := e.getSQE()
	if sqe == nil {
		s := &e.slots[si]
		s.c.err = fmt.Errorf("uring: fdatasync: submission queue full: %w", unix.EBUSY)
		s.c.finishOne()
		e.putSlot(si)
		return
	}
	if e.fixedFile {
		sqe.PrepFsync(0, iouring.FsyncDatasync)
		sqe.SetFlags(iouring.SQEFixedFile)
	} else {
		sqe.PrepFsync(int32(e.fd), iouring.FsyncDatasync)
	}
	sqe.SetUserData(uint64(si))
}

func retryable(errno unix.Errno) bool { return errno == unix.EAGAIN || errno == unix.EINTR }

func (e *Engine) complete(cqe iouring.CQE) {
	if cqe.UserData == wakeTag {
		e.armed = false
		if cqe.Res > 0 {
			e.stats.wakeups.Add(1)
		}
		return
	}
	si := int(cqe.UserData)
	s := &e.slots[si]
	if s.kind == slotSync {
		if cqe.Res < 0 {
			errno := unix.Errno(-cqe.Res)
			if retryable(errno) && s.retries < maxRetries {
				s.retries++
				e.stats.retries.Add(1)
				e.prepSync(si)
				return
			}
			s.c.err = fmt.Errorf("uring: fdatasync: %w", errno)
		}
		e.stats.syncs.Add(1)
		s.c.finishOne()
		e.putSlot(si)
		return
	}
	rq := &s.c.ios[s.i]
	switch res := int(cqe.Res); {
	case res < 0:
		errno := unix.Errno(-res)
		if retryable(errno) && s.retries < maxRetries {
			s.retries++
			e.stats.retries.Add(1)
			e.prepIO(si)
			return
		}
		e.finishIO(si, fmt.Errorf("uring: %v of %d bytes at offset %d: %w", rq.Op, len(rq.Buf)-s.done, rq.Off+int64(s.done), errno))
	case res == 0:
		e.finishIO(si, e.shortErr(rq, s.done))
	default:
		s.done += res
		if s.done >= len(rq.Buf) {
			e.finishIO(si, nil)
			return
		}
		if res < s.n {
			// Short transfer: continue with the rest. Under O_DIRECT a
			// continuation off the alignment (a partial block at end of
			// file) cannot be issued; it is the end of the file.
			if e.align > 1 && !e.alignedAt(rq, s.done) {
				e.finishIO(si, e.shortErr(rq, s.done))
				return
			}
			e.stats.resubmits.Add(1)
		}
		e.prepIO(si)
	}
}

func (e *Engine) alignedAt(rq *store.IO, done int) bool {
	return (rq.Off+int64(done))%int64(e.align) == 0 && store.Aligned(rq.Buf[done:], e.align)
}

func (e *Engine) shortErr(rq *store.IO, done int) error {
	if rq.Op == store.OpRead {
		return fmt.Errorf("uring: read of %d bytes at offset %d: end of file after %d: %w", len(rq.Buf), rq.Off, done, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("uring: write of %d bytes at offset %d: wrote %d: %w", len(rq.Buf), rq.Off, done, io.ErrShortWrite)
}

func (e *Engine) finishIO(si int, err error) {
	s := &e.slots[si]
	rq := &s.c.ios[s.i]
	rq.Err = err
	if err != nil {
		e.stats.errors.Add(1)
	} else {
		e.stats.ios.Add(1)
		e.stats.bytes.Add(uint64(len(rq.Buf)))
	}
	c, i := s.c, s.i
	e.putSlot(si) // first: the callback may start more work
	c.ioDone(i)
}

// fail ends the ring goroutine after a ring-level error: every call not
// finished fails with it, and so does every later call.
func (e *Engine) fail(err error) {
	err = fmt.Errorf("uring: ring failed: %w", err)
	e.log.Error("ring failed", zap.Error(err))
	e.mu.Lock()
	e.mu.broken = err
	e.pending = append(e.pending, e.mu.queue...)
	e.mu.queue = nil
	e.mu.Unlock()
	failed := map[*call]bool{}
	failCall := func(c *call) {
		if c == nil || failed[c] || c.left == 0 {
			return
		}
		failed[c] = true
		c.err = err
		if c.cb != nil {
			// Report every request not completed yet: those in flight
			// and those never started.
			for i := range e.slots {
				if e.slots[i].c == c && e.slots[i].kind == slotIO {
					c.ios[e.slots[i].i].Err = err
					c.cb(e.slots[i].i)
				}
			}
			for i := c.next; i < len(c.ios); i++ {
				c.ios[i].Err = err
				c.cb(i)
			}
		}
		c.left = 0
		if c.done != nil {
			close(c.done)
		}
	}
	for i := range e.slots {
		failCall(e.slots[i].c)
	}
	for _, c := range e.pending {
		failCall(c)
	}
	e.pending = nil
	// Closing the ring makes the kernel cancel what is still in flight.
	_ = e.ring.Close()
}

// shutdown retires the eventfd read and closes the ring; nothing else is
// in flight.
func (e *Engine) shutdown() {
	if e.armed {
		one := [8]byte{1}
		_, _ = unix.Write(e.efd, one[:])
		cqes := make([]iouring.CQE, e.ring.CQEntries())
		for e.armed {
			if _, err := e.ring.SubmitAndWait(1); err != nil && !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EBUSY) {
				break
			}
			for _, c := range cqes[:e.ring.ReapCQEs(cqes)] {
				e.complete(c)
			}
		}
	}
	if err := e.ring.Close(); err != nil {
		e.closing.err = err
	}
	e.closing.finishOne()
}

// register adds c.mem to the fixed buffer table.
func (e *Engine) register(c *call) error {
	if e.noFixed {
		return fmt.Errorf("uring: fixed buffers unavailable (%s): %w", e.fixedDisabled, unix.EOPNOTSUPP)
	}
	pieces := iouring.SplitBuffers([][]byte{c.mem}, 0)
	id := e.nextReg
	e.nextReg++
	if e.sparse {
		start := e.freeRun(len(pieces))
		if start < 0 {
			return fmt.Errorf("uring: fixed buffer table full (%d slots): %w", len(e.tableUsed), unix.ENOSPC)
		}
		for i := range pieces {
			pieces[i].Index = uint16(start + i)
		}
		if err := e.ring.UpdateBuffers(pieces); err != nil {
			return err
		}
		for i := range pieces {
			e.tableUsed[start+i] = true
		}
		e.regs[id] = &registration{mem: c.mem, pieces: pieces}
	} else {
		e.regs[id] = &registration{mem: c.mem}
		if err := e.reregister(); err != nil {
			delete(e.regs, id)
			if rerr := e.reregister(); rerr != nil {
				e.log.Error("restore fixed buffer table", zap.Error(rerr))
			}
			return err
		}
	}
	e.rebuildFixed()
	c.regID = id
	return nil
}

func (e *Engine) unregister(id int) error {
	r, ok := e.regs[id]
	if !ok {
		return nil
	}
	delete(e.regs, id)
	var err error
	if e.sparse {
		clr := make([]iouring.FixedBuffer, len(r.pieces))
		for i, p := range r.pieces {
			clr[i] = iouring.FixedBuffer{Index: p.Index}
		}
		err = e.ring.UpdateBuffers(clr)
		for _, p := range r.pieces {
			e.tableUsed[p.Index] = false
		}
	} else {
		err = e.reregister()
	}
	e.rebuildFixed()
	return err
}

// freeRun finds n consecutive free sparse-table slots.
func (e *Engine) freeRun(n int) int {
	run := 0
	for i, used := range e.tableUsed {
		if used {
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
func (e *Engine) reregister() error {
	ids := make([]int, 0, len(e.regs))
	for id := range e.regs {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	bufs := [][]byte{}
	if len(e.pool.mem) > 0 {
		bufs = append(bufs, e.pool.mem)
	}
	for _, id := range ids {
		bufs = append(bufs, e.regs[id].mem)
	}
	_ = e.ring.UnregisterBuffers() // ENXIO when there was no table
	for _, id := range ids {
		e.regs[id].pieces = nil
	}
	e.poolPieces = nil
	if len(bufs) == 0 {
		return nil
	}
	pieces, err := e.ring.RegisterBuffers(bufs)
	if err != nil {
		return err
	}
	src := 0
	if len(e.pool.mem) > 0 {
		src = 1
	}
	for _, p := range pieces {
		if p.Source < src {
			e.poolPieces = append(e.poolPieces, p)
			continue
		}
		r := e.regs[ids[p.Source-src]]
		r.pieces = append(r.pieces, p)
	}
	return nil
}

func (e *Engine) rebuildFixed() {
	e.fixed = append(e.fixed[:0], e.poolPieces...)
	for _, r := range e.regs {
		e.fixed = append(e.fixed, r.pieces...)
	}
	e.sortFixed()
}
