package ringowner

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// Driver is what an engine supplies: how to check, prepare and complete
// its requests. Every method runs on the ring goroutine, one at a time.
type Driver interface {
	// Setup runs once on the ring goroutine after the ring is created
	// (register files, check opcodes). An error fails Start; a non-empty
	// noFixed says why the ring must not use fixed buffers.
	Setup(r *uring.Ring, probe *uring.ProbeResult) (noFixed string, err error)
	// Check validates a request before it starts; an error completes it
	// with that error.
	Check(rq *store.IO) error
	// PrepIO fills sqe (zeroed) for the piece buf of rq at device offset
	// off; fixed ≥ 0 is the index of the registered buffer that holds all
	// of buf. The owner sets the user_data. An error completes the piece
	// with it (the SQE becomes a NOP).
	PrepIO(sqe *uring.SQE, rq *store.IO, buf []byte, off int64, fixed int) error
	// CompleteIO interprets the result res of the SQE that asked n bytes
	// of rq starting at byte at of rq.Buf (fixed: on a registered buffer).
	// EAGAIN and EINTR never reach it (the owner retries them). It returns
	// the bytes moved (fewer than n: the owner continues with the rest),
	// or retry to issue the same SQE again, or the piece's error.
	CompleteIO(rq *store.IO, at, n int, fixed bool, res int32) (moved int, retry bool, err error)
	// PrepSync fills sqe for a flush of completed writes.
	PrepSync(sqe *uring.SQE)
	// CompleteSync interprets a flush's result (EAGAIN/EINTR retried).
	CompleteSync(res int32) error
}

// VecDriver is implemented by drivers that serve vector reads (store.IO
// with Vec): PrepReadv fills sqe (zeroed) for a read at device offset off
// into the segments iov, which stay valid until the SQE completes. Results
// are interpreted by the owner (bytes moved, errno, 0 for end of file).
// Without it, a vector read fails with EINVAL.
type VecDriver interface {
	PrepReadv(sqe *uring.SQE, rq *store.IO, iov []unix.Iovec, off int64) error
}

// MaxVecSegments is the most segments of one vector-read SQE (IOV_MAX): a
// store.IO with more is split into pieces of at most this many.
const MaxVecSegments = 1024

// Config configures Start.
type Config struct {
	// Name prefixes errors and logs ("uring", "nvme").
	Name string
	// QueueDepth is the most SQEs in flight, all callers together.
	QueueDepth int
	// Ring has the ring's feature options (SQE128, CQE32); Entries and the
	// taskrun flags are set by the owner.
	Ring uring.Options
	// MaxPiece is the most bytes of one SQE: longer requests are split and
	// their pieces are in flight together. 0 means uring.MaxFixedBuffer.
	MaxPiece int
	// MaxRetries bounds EAGAIN/EINTR resubmissions of one SQE.
	MaxRetries int
	// PoolBytes is the size of the registered first-fit buffer pool
	// (rounded up to 2 MiB, huge pages where allowed); ≤ 0 means none.
	PoolBytes int
	// PoolMaxBytes lets the pool grow, when a request finds no room, by
	// segments of PoolBytes (or the request, rounded up to 2 MiB, when
	// larger) registered as fixed buffers, up to PoolMaxBytes in all.
	// ≤ PoolBytes means the pool never grows. Each segment takes a slot
	// of the fixed-buffer table besides ExtraSlots.
	PoolMaxBytes int
	// PoolGrain is the pool's allocation unit (at least the page size).
	PoolGrain int
	// NoFixed, when not empty, says why fixed buffers are not used.
	NoFixed string
	// ExtraSlots is the room for RegisterMemory in a sparse buffer table.
	ExtraSlots int
	// SyncOp is the opcode Driver.PrepSync uses; when the kernel lacks it,
	// SyncFallback (if set) is called on the ring goroutine instead.
	SyncOp       uring.Opcode
	SyncFallback func() error
	// Logger; nil means none.
	Logger *zap.Logger

	// Test knobs.
	Legacy bool // re-register the whole buffer table instead of updating it
	// EnterHook, when set, runs before each io_uring_enter of the ring
	// goroutine with the count of earlier enters; an error is taken as the
	// enter's failure (the enter is not made).
	EnterHook func(n uint64) error
	// DrainTimeout bounds the wait for cancelled requests after a ring
	// failure; 0 means 5 s.
	DrainTimeout time.Duration

	// shared is set by StartRings: the pool and the in-flight count of all
	// the rings of one engine.
	shared *shared
}

// shared is what the rings of one engine share: the buffer pool and the
// count of SQEs in flight over all of them.
type shared struct {
	pool        *pool
	inflight    atomic.Int64
	maxInFlight atomic.Int64
}

// maxSegments bounds the pool's segments (fixed-buffer table slots).
const maxSegments = 64

// poolConfig makes the pool cfg describes; growth needs onGrow set later.
func poolConfig(cfg Config, name string) (*pool, error) {
	var poolMem []byte
	if cfg.PoolBytes > 0 {
		var err error
		if poolMem, err = mapPool(cfg.PoolBytes); err != nil {
			return nil, fmt.Errorf("%s: mmap buffer pool of %d bytes: %w", name, cfg.PoolBytes, err)
		}
	}
	p := newPool(poolMem, max(unix.Getpagesize(), cfg.PoolGrain))
	if cfg.PoolBytes > 0 && cfg.PoolMaxBytes > len(poolMem) {
		seg := max(cfg.PoolBytes, cfg.PoolMaxBytes/maxSegments)
		p.setGrowth(seg, cfg.PoolMaxBytes)
	}
	return p, nil
}

// ErrNoFixed is wrapped by RegisterMemory when the ring has no fixed
// buffers.
var ErrNoFixed = errors.New("fixed buffers unavailable")

const (
	wakeTag   = 1 << 63
	cancelTag = 1<<63 | 1
	noSlot    = -1
)

// Stats are the owner's counters.
type Stats struct {
	IOs, Errors, Bytes, SQEs, FixedSQEs, Resubmits, Retries, Enters, Wakeups, Syncs uint64
	// MaxInFlight is the most SQEs (of requests and flushes) that were in
	// flight at once, over all callers (and all rings of a Rings).
	MaxInFlight uint64
	// PoolBytes is the size of the buffer pool now (it grows by segments);
	// PoolSegments counts grown segments registered on this ring (summed
	// over the rings of a Rings).
	PoolBytes, PoolSegments uint64
}

type counters struct {
	ios, errors, bytes, sqes, fixed, resubmits, retries, enters, wakeups, syncs, segments atomic.Uint64
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
	kind    callKind
	ios     []store.IO
	next    int     // next IO to start
	nextOff int     // bytes of ios[next] already handed out as pieces
	nextSeg int     // segments of ios[next].Vec already handed out
	parts   []int32 // pieces not complete per IO (only for split IOs)
	left    int     // IOs (or 1 for the other kinds) not complete
	err     error
	done    chan struct{} // closed when left reaches 0 (nil for DoAsync)
	cb      func(i int)   // DoAsync: called as each IO completes

	mem     []byte // callRegister
	segment bool   // callRegister of a grown pool segment (its own table slots)
	regID   int    // callRegister result, callUnregister argument
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

// slot is one SQE in flight; its index is the SQE's user_data.
type slot struct {
	c       *call
	i       int // index in c.ios
	off     int // the piece's first byte in c.ios[i].Buf (or in Vec's bytes)
	n       int // the piece's length
	seg0    int // a vector read: the piece is segments [seg0, seg1) of Vec
	seg1    int
	done    int // bytes of the piece moved so far
	asked   int // bytes asked of the SQE in flight
	kind    slotKind
	fixed   bool
	retries int
	perr    error // PrepIO failed: the SQE is a NOP that completes with this
}

// Owner owns one io_uring instance on one goroutine locked to its OS
// thread. Callers hand it work through a queue and wait (Do, Sync,
// RegisterMemory, Close) or get callbacks (DoAsync). See the package
// documentation for its invariants.
type Owner struct {
	name   string
	cfg    Config
	d      Driver
	log    *zap.Logger
	qd     int
	efd    int
	pool   *pool
	sh     *shared
	ownSh  bool // the shared state is this owner's alone (Start)
	exited chan struct{}
	stats  counters
	closed error // the wrapped store.ErrEngineClosed

	// down is set (under mu) with mu.broken or mu.closed, so that picking
	// a ring (Rings.pick) reads one atomic instead of taking every
	// ring's lock: concurrent callers contended on it.
	down atomic.Bool

	mu struct {
		sync.Mutex
		queue    []*call
		sleeping bool  // the ring goroutine waits in the kernel: wake it
		closed   bool  // Close was called
		broken   error // the ring failed; every call fails with it
		leaked   bool  // requests were never reaped: memory stays mapped
	}

	// Owned by the ring goroutine.
	ring          *uring.Ring
	pending       []*call
	slots         []slot
	free          []int
	armed         bool // the eventfd read is in flight
	wakeBuf       [8]byte
	draining      bool // after a ring failure: no retries, no new SQEs
	maxPiece      int
	maxRetries    int
	iovs          [][]unix.Iovec // per slot: a vector read's segments in flight
	sparse        bool           // buffer table updated in place
	legacy        bool           // buffer table re-registered whole
	noFixed       bool
	fixedDisabled string
	tableUsed     []bool // sparse: which slots hold a buffer
	poolPieces    []uring.FixedBuffer
	fixed         []uring.FixedBuffer // every entry, sorted by address
	regs          map[int]*registration
	nextReg       int
	closing       *call
	enters        uint64
	cancelAny     bool     // the kernel takes IORING_ASYNC_CANCEL_ANY
	syncInline    bool     // flush through Config.SyncFallback
	poolMems      [][]byte // the pool's segments when the ring started
}

// registration is memory added by RegisterMemory.
type registration struct {
	mem    []byte
	pieces []uring.FixedBuffer
}

// Start creates the ring and its goroutine.
func Start(cfg Config, d Driver) (*Owner, error) {
	if cfg.QueueDepth <= 0 {
		return nil, fmt.Errorf("%s: queue depth %d: %w", cfg.Name, cfg.QueueDepth, unix.EINVAL)
	}
	if cfg.MaxPiece <= 0 {
		cfg.MaxPiece = uring.MaxFixedBuffer
	}
	if cfg.MaxRetries <= 0 {
		cfg.MaxRetries = 16
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 5 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	o := &Owner{
		name: cfg.Name, cfg: cfg, d: d, log: cfg.Logger, qd: cfg.QueueDepth, efd: -1,
		exited: make(chan struct{}), maxPiece: cfg.MaxPiece, maxRetries: cfg.MaxRetries,
		regs:   map[int]*registration{},
		closed: fmt.Errorf("%s: %w", cfg.Name, store.ErrEngineClosed),
		sh:     cfg.shared,
	}
	if o.sh == nil {
		p, err := poolConfig(cfg, o.name)
		if err != nil {
			return nil, err
		}
		o.sh, o.ownSh = &shared{pool: p}, true
		p.onGrow = o.registerSegment
	}
	o.pool = o.sh.pool
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		if o.ownSh {
			o.pool.retire()
		}
		return nil, fmt.Errorf("%s: eventfd: %w", o.name, err)
	}
	o.efd = efd
	ready := make(chan error, 1)
	go o.run(ready)
	if err := <-ready; err != nil {
		<-o.exited
		o.release()
		return nil, err
	}
	return o, nil
}

// release frees what Start acquired, after the ring goroutine ended.
func (o *Owner) release() {
	if o.efd >= 0 {
		_ = unix.Close(o.efd)
		o.efd = -1
	}
	if !o.ownSh {
		return // the Rings retires the shared pool
	}
	if used := o.pool.retire(); used > 0 {
		// Chunks still out may still be in use: the pool stays mapped
		// until the last one is freed.
		o.log.Warn("buffer pool chunks still out at close; unmapping the pool when they are freed", zap.Int("bytes", used))
	}
}

// Stats returns the counters.
func (o *Owner) Stats() Stats {
	s := &o.stats
	return Stats{
		IOs: s.ios.Load(), Errors: s.errors.Load(), Bytes: s.bytes.Load(), SQEs: s.sqes.Load(),
		FixedSQEs: s.fixed.Load(), Resubmits: s.resubmits.Load(), Retries: s.retries.Load(),
		Enters: s.enters.Load(), Wakeups: s.wakeups.Load(), Syncs: s.syncs.Load(),
		MaxInFlight: uint64(o.sh.maxInFlight.Load()), PoolBytes: uint64(o.pool.size()),
		PoolSegments: s.segments.Load(),
	}
}

// PoolMem is the pool's first segment (for tests and logs); nil when
// there is none or it was unmapped.
func (o *Owner) PoolMem() []byte {
	o.pool.mu.Lock()
	defer o.pool.mu.Unlock()
	if len(o.pool.segs) == 0 {
		return nil
	}
	return o.pool.segs[0].mem
}

// PoolSize is the bytes of all the pool's segments.
func (o *Owner) PoolSize() int { return o.pool.size() }

// PoolOwns reports whether b was carved out of the pool.
func (o *Owner) PoolOwns(b []byte) bool { return o.pool.owns(b) }

// PoolInUse is the bytes of the pool handed out.
func (o *Owner) PoolInUse() int { return o.pool.inUse() }

// PoolFreeExtents is the number of free extents of the pool (1 when
// fully coalesced).
func (o *Owner) PoolFreeExtents() int { return o.pool.freeExtents() }

// Leaked reports whether a ring failure left requests that could not be
// reaped (their memory is never unmapped).
func (o *Owner) Leaked() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.mu.leaked
}

// enqueue hands c to the ring goroutine, waking it if it sleeps in the
// kernel. The eventfd write happens under the lock, so it cannot race with
// Close closing the eventfd.
func (o *Owner) enqueue(c *call) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.mu.broken != nil {
		return o.mu.broken
	}
	if o.mu.closed {
		return o.closed
	}
	o.mu.queue = append(o.mu.queue, c)
	o.wakeLocked()
	return nil
}

func (o *Owner) wakeLocked() {
	if !o.mu.sleeping {
		return
	}
	o.mu.sleeping = false
	one := [8]byte{1}
	for {
		_, err := unix.Write(o.efd, one[:])
		if err != unix.EINTR {
			break
		}
	}
}

// Do performs the batch and waits for it; see store.Engine. Batches of
// concurrent callers share the queue depth.
func (o *Owner) Do(ios []store.IO) error { return o.DoNotify(ios, nil) }

// DoNotify is Do that also calls done(i) (when not nil) on the ring
// goroutine as ios[i] completes; see Rings.DoNotify.
func (o *Owner) DoNotify(ios []store.IO, done func(i int)) error {
	if len(ios) == 0 {
		return nil
	}
	c := newCall(callIO, len(ios))
	c.ios = ios
	c.cb = done
	if err := o.enqueue(c); err != nil {
		return err
	}
	<-c.done
	return c.err
}

// DoAsync starts the batch; done(i) runs on the ring goroutine as ios[i]
// completes. See the engines' DoAsync.
func (o *Owner) DoAsync(ios []store.IO, done func(i int)) error {
	if len(ios) == 0 {
		return nil
	}
	return o.enqueue(&call{kind: callIO, ios: ios, left: len(ios), cb: done})
}

// Sync flushes completed writes through the ring.
func (o *Owner) Sync() error {
	c := newCall(callSync, 1)
	if err := o.enqueue(c); err != nil {
		return err
	}
	<-c.done
	return c.err
}

// AllocBuffer returns n bytes from the registered pool when it has room,
// else from store.AllocAligned.
func (o *Owner) AllocBuffer(n int) ([]byte, error) {
	if b, ok := o.pool.alloc(n); ok {
		return b, nil
	}
	return store.AllocAligned(n)
}

// FreeBuffer releases a buffer from AllocBuffer. After a ring failure that
// left requests unreaped, buffers outside the pool are leaked, not
// unmapped: the kernel may still write into them.
func (o *Owner) FreeBuffer(b []byte) {
	if o.pool.release(b) {
		return
	}
	if o.Leaked() {
		keepLeaked(b)
		return
	}
	store.FreeAligned(b)
}

// RegisterMemory adds b to the fixed buffer table; see the engines'.
// Without fixed buffers the error wraps ErrNoFixed.
func (o *Owner) RegisterMemory(b []byte) (func(), error) {
	if len(b) == 0 {
		return nil, fmt.Errorf("%s: register empty memory: %w", o.name, unix.EINVAL)
	}
	c := newCall(callRegister, 1)
	c.mem = b
	if err := o.enqueue(c); err != nil {
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
			if err := o.enqueue(u); err != nil {
				return // closed or failed: the table went with the ring
			}
			<-u.done
			if u.err != nil {
				o.log.Warn("unregister memory", zap.Error(u.err))
			}
		})
	}, nil
}

// registerSegment registers a grown pool segment with the ring, without
// waiting (AllocBuffer may run anywhere, even on a ring goroutine). Until it
// is registered, I/O on it uses plain buffers. On a closed or failed ring
// it does nothing: the table went with the ring.
func (o *Owner) registerSegment(mem []byte) {
	if o.noFixedCfg() {
		return
	}
	_ = o.enqueue(&call{kind: callRegister, left: 1, mem: mem, segment: true})
}

// noFixedCfg reports whether the configuration rules out fixed buffers.
func (o *Owner) noFixedCfg() bool { return o.cfg.NoFixed != "" }

// Close waits for the requests in flight, stops the ring and releases the
// eventfd and the pool (which stays mapped while chunks are out, or for
// good after a leak). A second Close returns nil.
func (o *Owner) Close() error {
	o.mu.Lock()
	if o.mu.closed {
		o.mu.Unlock()
		return nil
	}
	o.mu.closed = true
	o.down.Store(true)
	c := newCall(callClose, 1)
	enqueued := o.mu.broken == nil
	if enqueued {
		o.mu.queue = append(o.mu.queue, c)
		o.wakeLocked()
	}
	o.mu.Unlock()
	<-o.exited
	o.release()
	if enqueued {
		<-c.done
		if o.brokenErr() == nil {
			return c.err
		}
	}
	return nil // a failed ring was reported when it failed
}
