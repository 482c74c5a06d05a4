package nvme

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/internal/ringowner"
	nvmedev "github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// EngineOptions configure OpenEngine.
type EngineOptions struct {
	// QueueDepth is the most NVMe commands in flight per ring, all its
	// callers together. 0 means 64.
	QueueDepth int
	// Rings is the number of io_uring instances (each its own goroutine
	// and OS thread, callers spread over them). 0 means
	// ringowner.AutoRings; at most ringowner.MaxRings.
	Rings int
	// FDP is "auto" (or ""): tag writes with placement identifiers when the
	// namespace's endurance group has FDP enabled; "off": never.
	FDP string
	// BufferPool is the size in bytes of the pool registered with every
	// ring for AllocBuffer (fixed-buffer commands). 0 means 32 MiB;
	// negative means none.
	BufferPool int
	// BufferPoolMax lets the pool grow by segments registered on every
	// ring up to this many bytes; 0 means 1 GiB (or an eighth of the RAM
	// when less); at most BufferPool means no growth.
	BufferPoolMax int
	// Logger receives the engine's logs; nil means zap.NewNop().
	Logger *zap.Logger
}

const (
	defaultQueueDepth = 64
	defaultBufferPool = 32 << 20
	// maxCommandBytes caps one command whatever the device allows. A
	// fabric target reports no MDTS and NVMe/TCP accepts about 256 MiB in
	// one command (the rig's fabric namespace): such a command would hold
	// a queue slot, and on TCP the connection, for the whole transfer, and
	// need that much bounce memory when buffers are not registered.
	maxCommandBytes = 4 << 20
	memorySlots     = 64 // fixed buffer slots for RegisterMemory
	maxRetries      = 8
	uringCmdFixed   = 1 << 0 // IORING_URING_CMD_FIXED (uring_cmd_flags)
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
	// MaxInFlight is the most commands that were in flight at once, over
	// all callers' batches and all rings.
	MaxInFlight uint64
	Rings       int // io_uring instances
	// PlacedBytes counts written bytes per placement handle (index into
	// FDPInfo.Handles); empty without FDP.
	PlacedBytes []uint64
}

func (s EngineStats) String() string {
	return fmt.Sprintf("ios=%d errors=%d bytes=%d commands=%d fixed=%d retries=%d flushes=%d max_inflight=%d placed=%v",
		s.IOs, s.Errors, s.Bytes, s.Commands, s.FixedCommands, s.Retries, s.Flushes, s.MaxInFlight, s.PlacedBytes)
}

// Engine is the NVMe passthrough store engine: reads and writes go to the
// namespace's generic char device as io_uring URING_CMDs (NVME_URING_CMD_IO)
// on a ring with 128-byte SQEs and 32-byte CQEs.
//
// The ring, its goroutine (locked to its OS thread), the queue of callers,
// the fixed-buffer table and the buffer pool belong to a ringowner.Owner,
// shared with the uring engine: concurrent Do batches share the queue
// depth. The Engine supplies the commands (driver): reads and writes split
// at the device's maximum transfer, writes tagged with the FDP placement
// identifier of IO.Stream, Flush for Sync.
type Engine struct {
	dev       *nvmedev.Device
	log       *zap.Logger
	qd        int
	lba       int
	size      int64
	maxXfer   int
	placement nvmedev.Placement
	fdp       *nvmedev.FDPInfo
	attach    *nvmedev.Attachment // nil when sysfs does not say
	ring      *ringowner.Rings
	drvs      []*driver
	placed    []atomic.Uint64 // written bytes per placement handle

	closeOnce sync.Once
	closeErr  error
}

// driver prepares and completes the engine's commands on the ring
// goroutine.
type driver struct {
	e      *Engine
	ring   *uring.Ring
	owner  *ringowner.Owner
	fd     int32
	nsid   uint32
	lba    int
	cmdBuf [nvmedev.CmdSize]byte
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
		_ = dev.Close()
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
	e.maxXfer = int(min(e.dev.Limits.MaxTransfer, maxCommandBytes))
	e.qd = o.QueueDepth
	if e.qd <= 0 {
		e.qd = defaultQueueDepth
	}

	// Placement.
	if o.FDP == "off" {
		e.fdp = &nvmedev.FDPInfo{Supported: e.dev.Ctrl.FDP(), Reason: "FDP off by option"}
	} else if info, err := e.dev.FDP(); err != nil {
		e.log.Warn("FDP discovery failed; writes go untagged", zap.Error(err))
		e.fdp = &nvmedev.FDPInfo{Supported: e.dev.Ctrl.FDP(), Reason: err.Error()}
	} else {
		e.fdp = info
	}
	// How the namespace is attached (local PCIe or a fabric): sysfs, best
	// effort; passthrough works the same over both.
	if a, err := nvmedev.Attach(e.dev.Path); err != nil {
		e.log.Debug("no sysfs attachment", zap.Error(err))
	} else {
		e.attach = a
		if a.Fabric() && !e.fdp.Enabled {
			e.log.Info("namespace is behind an NVMe over Fabrics target without FDP: writes go untagged (no placement, the target's default handle)",
				zap.String("transport", a.Transport()), zap.String("fdp_reason", e.fdp.Reason))
		}
	}
	if e.fdp.Enabled {
		for _, h := range e.fdp.Handles {
			e.placement.PIDs = append(e.placement.PIDs, h.PID)
		}
		e.placed = make([]atomic.Uint64, len(e.fdp.Handles))
	}

	// URING_CMD takes fixed buffers from kernel 6.1
	// (IORING_URING_CMD_FIXED); elsewhere the engine uses plain addresses.
	noFixed := ""
	var u unix.Utsname
	_ = unix.Uname(&u)
	if rel := unix.ByteSliceToString(u.Release[:]); !nvmedev.KernelAtLeast(rel, 6, 1) {
		noFixed = "no fixed buffers for URING_CMD before kernel 6.1 (running " + rel + ")"
	}
	pool := o.BufferPool
	if pool == 0 {
		pool = defaultBufferPool
	}
	if noFixed != "" {
		pool = -1 // a pool is only worth it registered
	}
	poolMax := o.BufferPoolMax
	if poolMax == 0 {
		poolMax = ringowner.DefaultPoolMax(defaultBufferPool)
	}
	if noFixed != "" {
		poolMax = -1
	}
	r, err := ringowner.StartRings(ringowner.Config{
		Name:         "nvme",
		QueueDepth:   e.qd,
		Ring:         uring.Options{SQE128: true, CQE32: true},
		MaxPiece:     e.maxXfer,
		MaxRetries:   maxRetries,
		PoolBytes:    min(pool, uring.MaxFixedBuffer),
		PoolMaxBytes: poolMax,
		PoolGrain:    e.lba,
		NoFixed:      noFixed,
		ExtraSlots:   memorySlots,
		Logger:       e.log,
	}, o.Rings, func(int) ringowner.Driver {
		d := &driver{e: e, fd: int32(e.dev.Fd()), nsid: e.dev.NSID, lba: e.lba}
		e.drvs = append(e.drvs, d)
		return d
	})
	if err != nil {
		return fmt.Errorf("nvme: io_uring with SQE128/CQE32: %w", err)
	}
	e.ring = r
	// A driver reaches its ring only from its ring goroutine, for I/O that
	// starts after OpenEngine returns.
	for i, d := range e.drvs {
		d.owner = r.Ring(i)
	}

	e.log.Info("nvme engine open",
		zap.Uint32("nsid", e.dev.NSID), zap.String("model", e.dev.Ctrl.Model),
		zap.Int64("bytes", e.size), zap.Int("lba", e.lba), zap.Int("max_transfer", e.maxXfer),
		zap.Int("queue_depth", e.qd), zap.Int("rings", r.N()), zap.String("no_fixed", noFixed),
		zap.Bool("fdp", e.fdp.Enabled), zap.Int("handles", len(e.placement.PIDs)), zap.String("fdp_reason", e.fdp.Reason),
		zap.String("attachment", e.attachString()))
	return nil
}

// Rings is the number of io_uring instances.
func (e *Engine) Rings() int { return e.ring.N() }

// Name is "nvme".
func (e *Engine) Name() string { return "nvme" }

// Size is the namespace size in bytes.
func (e *Engine) Size() int64 { return e.size }

// Align is the namespace's LBA size: offsets, lengths and buffer addresses
// must be multiples of it.
func (e *Engine) Align() int { return e.lba }

// MaxTransfer is the largest single command (the device's limit, at most
// 4 MiB); Do splits larger IOs.
func (e *Engine) MaxTransfer() int { return e.maxXfer }

// Device is the open namespace (identify data, limits).
func (e *Engine) Device() *nvmedev.Device { return e.dev }

// Attachment is how the namespace is attached to this host (its
// controller paths with transport and address), nil when sysfs did not say.
func (e *Engine) Attachment() *nvmedev.Attachment { return e.attach }

func (e *Engine) attachString() string {
	if e.attach == nil {
		return "unknown"
	}
	return e.attach.String()
}

// Placement is the stream → placement identifier map in use (empty
// without FDP).
func (e *Engine) Placement() nvmedev.Placement { return e.placement }

// FDPInfo reports the namespace's FDP state with fresh reclaim unit handle
// status (available space per handle).
func (e *Engine) FDPInfo() (*nvmedev.FDPInfo, error) {
	info := *e.fdp
	if !info.Enabled {
		return &info, nil
	}
	h, err := e.dev.RUHStatus()
	if errors.Is(err, nvmedev.ErrClosed) {
		return nil, fmt.Errorf("%w: %w", store.ErrEngineClosed, err)
	}
	if err != nil {
		return nil, err
	}
	info.Handles = h
	return &info, nil
}

// Stats returns the engine's counters.
func (e *Engine) Stats() EngineStats {
	r := e.ring.Stats()
	s := EngineStats{
		IOs: r.IOs, Errors: r.Errors, Bytes: r.Bytes, Commands: r.SQEs, FixedCommands: r.FixedSQEs,
		Retries: r.Retries, Flushes: r.Syncs, MaxInFlight: r.MaxInFlight, Rings: e.ring.N(),
	}
	for i := range e.placed {
		s.PlacedBytes = append(s.PlacedBytes, e.placed[i].Load())
	}
	return s
}

// Do performs the batch: each IO is split at MaxTransfer, up to QueueDepth
// commands are in flight (over all callers' batches), writes carry the
// placement identifier of IO.Stream when FDP is enabled. Device status
// comes back per IO as a wrapped *nvme.StatusError. It is safe for
// concurrent use.
func (e *Engine) Do(ios []store.IO) error { return e.ring.Do(ios) }

// DoNotify implements store.NotifyEngine: Do, with done(i) called on a
// ring goroutine as ios[i] completes (see ringowner.Rings.DoNotify).
func (e *Engine) DoNotify(ios []store.IO, done func(i int)) error {
	return e.ring.DoNotify(ios, done)
}

// DoAsync starts the batch and calls done(i) on the ring goroutine as
// ios[i] completes; the rules are those of the uring engine's DoAsync.
func (e *Engine) DoAsync(ios []store.IO, done func(i int)) error {
	return e.ring.DoAsync(ios, done)
}

// Sync sends an NVMe Flush: every write completed before the call is on
// stable media when it returns. (Writes do not use FUA: the store makes
// whole batches durable at once, which one Flush does for the price of a
// single command.)
func (e *Engine) Sync() error { return e.ring.Sync() }

// Close waits for the commands in flight, stops the ring and closes the
// device. Later calls fail with store.ErrEngineClosed; a second Close
// returns nil.
func (e *Engine) Close() error {
	first := false
	e.closeOnce.Do(func() {
		first = true
		e.closeErr = errors.Join(e.ring.Close(), e.dev.Close())
	})
	if !first {
		return nil
	}
	return e.closeErr
}

// AllocBuffer returns n bytes from the registered pool (I/O on them uses
// fixed-buffer commands), or from plain anonymous memory when the pool is
// exhausted or absent.
func (e *Engine) AllocBuffer(n int) ([]byte, error) { return e.ring.AllocBuffer(n) }

// FreeBuffer returns a buffer from AllocBuffer.
func (e *Engine) FreeBuffer(b []byte) { e.ring.FreeBuffer(b) }

// RegisterMemory registers b (for example a client's shared memory) as
// fixed buffers so that I/O on it avoids per-command page pinning. The
// memory must stay mapped until the returned function has run. Without
// fixed buffers (old kernel) it registers nothing and succeeds: plain
// addresses work as well, just slower.
func (e *Engine) RegisterMemory(b []byte) (func(), error) {
	if len(b) == 0 {
		return func() {}, nil
	}
	un, err := e.ring.RegisterMemory(b)
	if errors.Is(err, ringowner.ErrNoFixed) {
		return func() {}, nil
	}
	return un, err
}

// String describes the engine for logs and `kvfs info`.
func (e *Engine) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "nvme %s nsid %d (%s), %d bytes, lba %d, max transfer %d, qd %d per ring, %d rings",
		e.dev.Path, e.dev.NSID, e.dev.Ctrl.Model, e.size, e.lba, e.maxXfer, e.qd, e.ring.N())
	if e.fdp.Enabled {
		fmt.Fprintf(&b, ", FDP config %d with %d handles", e.fdp.ConfigIndex, len(e.placement.PIDs))
	} else {
		fmt.Fprintf(&b, ", no FDP (%s)", e.fdp.Reason)
	}
	if e.attach != nil {
		fmt.Fprintf(&b, ", %s", e.attach)
	}
	return b.String()
}

// ---- the driver: runs on the ring goroutine ----

func (d *driver) Setup(r *uring.Ring, probe *uring.ProbeResult) (string, error) {
	if !probe.Supported(uring.OpURingCmd) {
		return "", fmt.Errorf("nvme: kernel lacks URING_CMD: %w", unix.EOPNOTSUPP)
	}
	d.ring = r
	return "", nil
}

// Check validates one IO; a non-nil error goes to IO.Err.
func (d *driver) Check(io_ *store.IO) error {
	n := int64(len(io_.Buf))
	switch {
	case io_.Op != store.OpRead && io_.Op != store.OpWrite:
		return fmt.Errorf("nvme: unknown op %d: %w", io_.Op, nvmedev.ErrInvalidCommand)
	case n == 0:
		return nil
	case io_.Off < 0 || io_.Off%int64(d.lba) != 0 || n%int64(d.lba) != 0 || addrOf(io_.Buf)%uint64(d.lba) != 0:
		return fmt.Errorf("%w: %s of %d bytes at %d (buffer %#x), LBA size %d", nvmedev.ErrAlign, io_.Op, n, io_.Off, addrOf(io_.Buf), d.lba)
	case io_.Off+n > d.e.size:
		if io_.Op == store.OpRead {
			return fmt.Errorf("nvme: read of %d bytes at %d past the namespace end %d: %w", n, io_.Off, d.e.size, io.ErrUnexpectedEOF)
		}
		return fmt.Errorf("%w: write of %d bytes at %d past the namespace end %d", nvmedev.ErrRange, n, io_.Off, d.e.size)
	}
	return nil
}

// PrepIO fills sqe with the read or write command of buf.
func (d *driver) PrepIO(sqe *uring.SQE, rq *store.IO, buf []byte, off int64, fixed int) error {
	rw := nvmedev.RW{
		NSID: d.nsid,
		SLBA: uint64(off) / uint64(d.lba),
		NLB:  uint32(len(buf) / d.lba),
		Addr: addrOf(buf),
		Len:  uint32(len(buf)),
	}
	var (
		c   nvmedev.Command
		err error
	)
	if rq.Op == store.OpWrite {
		if pl := &d.e.placement; len(pl.PIDs) > 0 {
			rw.DType, rw.DSpec = nvmedev.DTypePlacement, pl.PID(rq.Stream)
		}
		c, err = nvmedev.WriteCmd(rw)
	} else {
		c, err = nvmedev.ReadCmd(rw)
	}
	if err != nil {
		return err
	}
	c.Encode(d.cmdBuf[:])
	if err := d.ring.PrepURingCmd(sqe, d.fd, nvmedev.URingCmdIO, d.cmdBuf[:]); err != nil {
		return err
	}
	if fixed >= 0 {
		sqe.OpFlags = uringCmdFixed
		sqe.BufIndex = uint16(fixed)
	}
	return nil
}

// CompleteIO handles the CQE of one command of n bytes.
func (d *driver) CompleteIO(rq *store.IO, at, n int, fixed bool, res int32) (int, bool, error) {
	switch {
	case res == 0:
		if rq.Op == store.OpWrite && len(d.e.placed) > 0 {
			d.e.placed[d.e.placement.Handle(rq.Stream)].Add(uint64(n))
		}
		return n, false, nil
	case res < 0:
		errno := unix.Errno(-res)
		if errno == unix.EINVAL && fixed {
			d.e.log.Warn("URING_CMD with a fixed buffer refused (EINVAL); using plain buffers from now on")
			d.owner.DisableFixed("the device refused URING_CMD with a fixed buffer (EINVAL)")
			return 0, true, nil
		}
		return 0, false, fmt.Errorf("nvme: %s of %d bytes at %d: %w", rq.Op, n, rq.Off+int64(at), errno)
	default:
		opc := nvmedev.OpRead
		if rq.Op == store.OpWrite {
			opc = nvmedev.OpWrite
		}
		return 0, false, fmt.Errorf("nvme: %s of %d bytes at %d: %w", rq.Op, n, rq.Off+int64(at), &nvmedev.StatusError{Opcode: opc, Status: nvmedev.Status(res)})
	}
}

// PrepSync fills sqe with a Flush.
func (d *driver) PrepSync(sqe *uring.SQE) {
	c := nvmedev.FlushCmd(d.nsid)
	c.Encode(d.cmdBuf[:])
	// The command area of a 128-byte SQE always fits the 72-byte command.
	_ = d.ring.PrepURingCmd(sqe, d.fd, nvmedev.URingCmdIO, d.cmdBuf[:])
}

// CompleteSync interprets a Flush's completion.
func (d *driver) CompleteSync(res int32) error {
	switch {
	case res == 0:
		return nil
	case res < 0:
		return fmt.Errorf("nvme: flush: %w", unix.Errno(-res))
	default:
		return fmt.Errorf("nvme: flush: %w", &nvmedev.StatusError{Opcode: nvmedev.OpFlush, Status: nvmedev.Status(res)})
	}
}

func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}
