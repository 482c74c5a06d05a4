package uring

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options configure a Ring. The zero value is a 64-entry ring with no
// special flags.
type Options struct {
	// Entries is the number of SQ entries (the kernel rounds up to a power
	// of two and clamps to its maximum). 0 means 64.
	Entries uint32
	// CQEntries is the number of CQ entries; 0 lets the kernel pick
	// (twice Entries).
	CQEntries uint32

	// SQPoll starts a kernel thread that polls the SQ, so submissions need
	// no syscall while it is awake. It sleeps after SQPollIdle without work
	// (0: the kernel default, 1 s); Submit wakes it when needed.
	SQPoll     bool
	SQPollIdle time.Duration

	// SQE128 doubles SQEs to 128 bytes (80-byte command area for URING_CMD,
	// needed for NVMe passthrough); CQE32 doubles CQEs to 32 bytes (two
	// extra 64-bit words). Both are required when asked: New fails if the
	// kernel refuses them.
	SQE128 bool
	CQE32  bool

	// SingleIssuer, CoopTaskrun and DeferTaskrun are optimisations that are
	// dropped, in that reverse order, when the kernel refuses them (EINVAL).
	// SingleIssuer and DeferTaskrun tie the ring to the OS thread that
	// creates it: every Submit, wait and Register call must come from that
	// thread (runtime.LockOSThread in the goroutine that calls New), or the
	// kernel answers EEXIST. DeferTaskrun implies SingleIssuer and is
	// ignored with SQPoll. CoopTaskrun delays completion work until the
	// submitting thread enters the kernel; use it only when the submitting
	// thread is also the one that waits.
	SingleIssuer bool
	CoopTaskrun  bool
	DeferTaskrun bool
}

// Ring is one io_uring instance: its SQ and CQ rings and SQE array mapped
// into this process.
//
// A Ring is not safe for concurrent use: one goroutine at a time may use
// the submission side (GetSQE, Prep*, Submit, SubmitAndWait) and one at a
// time the completion side (PeekCQE, WaitCQE, CQAdvance, ReapCQEs); the two
// sides may be different goroutines. Callers that share a ring lock it.
type Ring struct {
	fd       int
	flags    uint32 // setup flags in effect
	features uint32

	sqeSize uintptr // 64 or 128
	cqeSize uintptr // 16 or 32

	sqMem  []byte // SQ ring (and CQ ring with FeatSingleMmap)
	cqMem  []byte // CQ ring when mapped separately
	sqeMem []byte // SQE array

	// Submission side.
	kSQHead   *uint32 // kernel: consumed up to here (load-acquire)
	kSQTail   *uint32 // ours: published up to here (store-release)
	kSQFlags  *uint32
	kDropped  *uint32
	sqMask    uint32
	sqEntries uint32
	sqes      unsafe.Pointer
	sqeTail   uint32 // next SQE handed out by GetSQE (not yet published)

	// Completion side.
	kCQHead   *uint32 // ours: consumed up to here (store-release)
	kCQTail   *uint32 // kernel: posted up to here (load-acquire)
	kOverflow *uint32
	cqMask    uint32
	cqEntries uint32
	cqes      unsafe.Pointer
	cqHeadLoc uint32 // local copy of *kCQHead

	closed bool
}

// New sets up a ring. Errors are unix.Errno values wrapped with context.
func New(o Options) (*Ring, error) {
	entries := o.Entries
	if entries == 0 {
		entries = 64
	}
	var flags uint32 = SetupClamp
	if o.CQEntries != 0 {
		flags |= SetupCQSize
	}
	if o.SQPoll {
		flags |= SetupSQPoll
	}
	if o.SQE128 {
		flags |= SetupSQE128
	}
	if o.CQE32 {
		flags |= SetupCQE32
	}
	// Optional flags, dropped one at a time from the front on EINVAL (an
	// older kernel, or a combination it refuses).
	var optional []uint32
	if o.DeferTaskrun && !o.SQPoll {
		optional = append(optional, SetupDeferTaskrun|SetupTaskrunFlag)
	}
	if o.SingleIssuer || (o.DeferTaskrun && !o.SQPoll) {
		optional = append(optional, SetupSingleIssuer)
	}
	if o.CoopTaskrun {
		optional = append(optional, SetupCoopTaskrun|SetupTaskrunFlag)
	}
	var (
		p   params
		fd  int
		err error
	)
	for {
		extra := uint32(0)
		for _, f := range optional {
			extra |= f
		}
		p = params{Flags: flags | extra, CQEntries: o.CQEntries}
		if o.SQPoll {
			p.SQThreadIdle = uint32(o.SQPollIdle / time.Millisecond)
		}
		fd, err = sysSetup(entries, &p)
		if err == nil {
			break
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if !errors.Is(err, unix.EINVAL) || len(optional) == 0 {
			return nil, fmt.Errorf("uring: io_uring_setup(entries=%d, flags=%#x): %w", entries, flags|extra, err)
		}
		optional = optional[1:]
	}
	r := &Ring{fd: fd, flags: p.Flags, features: p.Features, sqeSize: 64, cqeSize: 16}
	if p.Flags&SetupSQE128 != 0 {
		r.sqeSize = 128
	}
	if p.Flags&SetupCQE32 != 0 {
		r.cqeSize = 32
	}
	if err := r.mmap(&p); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func (r *Ring) mmap(p *params) error {
	sqSize := uintptr(p.SQOff.Array) + uintptr(p.SQEntries)*4
	cqSize := uintptr(p.CQOff.Cqes) + uintptr(p.CQEntries)*r.cqeSize
	single := p.Features&FeatSingleMmap != 0
	if single && cqSize > sqSize {
		sqSize = cqSize
	}
	var err error
	r.sqMem, err = unix.Mmap(r.fd, offSQRing, int(sqSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQ ring: %w", err)
	}
	cqBase := r.sqMem
	if !single {
		r.cqMem, err = unix.Mmap(r.fd, offCQRing, int(cqSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
		if err != nil {
			return fmt.Errorf("uring: mmap CQ ring: %w", err)
		}
		cqBase = r.cqMem
	}
	r.sqeMem, err = unix.Mmap(r.fd, offSQEs, int(uintptr(p.SQEntries)*r.sqeSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return fmt.Errorf("uring: mmap SQEs: %w", err)
	}
	sq := unsafe.Pointer(&r.sqMem[0])
	r.kSQHead = (*uint32)(unsafe.Add(sq, p.SQOff.Head))
	r.kSQTail = (*uint32)(unsafe.Add(sq, p.SQOff.Tail))
	r.kSQFlags = (*uint32)(unsafe.Add(sq, p.SQOff.Flags))
	r.kDropped = (*uint32)(unsafe.Add(sq, p.SQOff.Dropped))
	r.sqMask = *(*uint32)(unsafe.Add(sq, p.SQOff.RingMask))
	r.sqEntries = *(*uint32)(unsafe.Add(sq, p.SQOff.RingEntries))
	r.sqes = unsafe.Pointer(&r.sqeMem[0])
	// The SQ index array maps ring slots to SQEs; keep it the identity so
	// that slot i always uses SQE i.
	array := unsafe.Slice((*uint32)(unsafe.Add(sq, p.SQOff.Array)), r.sqEntries)
	for i := range array {
		array[i] = uint32(i)
	}
	r.sqeTail = atomic.LoadUint32(r.kSQTail)

	cq := unsafe.Pointer(&cqBase[0])
	r.kCQHead = (*uint32)(unsafe.Add(cq, p.CQOff.Head))
	r.kCQTail = (*uint32)(unsafe.Add(cq, p.CQOff.Tail))
	r.kOverflow = (*uint32)(unsafe.Add(cq, p.CQOff.Overflow))
	r.cqMask = *(*uint32)(unsafe.Add(cq, p.CQOff.RingMask))
	r.cqEntries = *(*uint32)(unsafe.Add(cq, p.CQOff.RingEntries))
	r.cqes = unsafe.Add(cq, p.CQOff.Cqes)
	r.cqHeadLoc = atomic.LoadUint32(r.kCQHead)
	return nil
}

// Close unmaps the rings and closes the ring fd. Requests still in flight
// are cancelled by the kernel; their buffers must stay valid until Close
// returns.
func (r *Ring) Close() error {
	if r.closed {
		return nil
	}
	r.closed = true
	for _, m := range [][]byte{r.sqeMem, r.cqMem, r.sqMem} {
		if m != nil {
			_ = unix.Munmap(m)
		}
	}
	r.sqeMem, r.cqMem, r.sqMem = nil, nil, nil
	if r.fd >= 0 {
		err := unix.Close(r.fd)
		r.fd = -1
		if err != nil {
			return fmt.Errorf("uring: close ring: %w", err)
		}
	}
	return nil
}

// Fd is the ring's file descriptor.
func (r *Ring) Fd() int { return r.fd }

// Flags are the setup flags in effect (after any fallback).
func (r *Ring) Flags() uint32 { return r.flags }

// Features are the IORING_FEAT_* bits the kernel reported.
func (r *Ring) Features() uint32 { return r.features }

// SQEntries and CQEntries are the ring sizes the kernel chose.
func (r *Ring) SQEntries() int { return int(r.sqEntries) }

// CQEntries is the number of CQ entries.
func (r *Ring) CQEntries() int { return int(r.cqEntries) }

// SQESize is 64, or 128 with SQE128.
func (r *Ring) SQESize() int { return int(r.sqeSize) }

// Dropped is the kernel's count of invalid SQEs it skipped.
func (r *Ring) Dropped() uint32 { return atomic.LoadUint32(r.kDropped) }

// SQSpace is the number of SQEs GetSQE can hand out now.
func (r *Ring) SQSpace() int {
	return int(r.sqEntries - (r.sqeTail - atomic.LoadUint32(r.kSQHead)))
}

// SQPending is the number of SQEs handed out or published that the kernel
// has not consumed yet.
func (r *Ring) SQPending() int {
	return int(r.sqeTail - atomic.LoadUint32(r.kSQHead))
}

// GetSQE returns the next free SQE, zeroed (all 64 or 128 bytes), or nil
// when the SQ is full (Submit, then try again). It stays unpublished until
// the next Submit.
func (r *Ring) GetSQE() *SQE {
	head := atomic.LoadUint32(r.kSQHead)
	if r.sqeTail-head >= r.sqEntries {
		return nil
	}
	p := unsafe.Add(r.sqes, uintptr(r.sqeTail&r.sqMask)*r.sqeSize)
	r.sqeTail++
	*(*SQE)(p) = SQE{}
	if r.sqeSize == 128 {
		*(*[64]byte)(unsafe.Add(p, 64)) = [64]byte{}
	}
	return (*SQE)(p)
}

// CmdArea is the command area of an SQE for URING_CMD: 16 bytes, or 80
// with SQE128. It starts at byte 48 of the SQE.
func (r *Ring) CmdArea(s *SQE) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(s), 48)), int(r.sqeSize)-48)
}

// PrepURingCmd prepares IORING_OP_URING_CMD with cmdOp (for example
// NVMeURingCmdIO) and copies cmd into the command area. The SQE is zeroed
// first (all of it), so the unused part of the area is zero.
func (r *Ring) PrepURingCmd(s *SQE, fd int32, cmdOp uint32, cmd []byte) error {
	area := r.CmdArea(s)
	if len(cmd) > len(area) {
		return fmt.Errorf("uring: URING_CMD command of %d bytes, room for %d (SQE128 gives 80): %w", len(cmd), len(area), unix.EINVAL)
	}
	*s = SQE{Opcode: OpURingCmd, Fd: fd, Off: uint64(cmdOp)}
	if r.sqeSize == 128 {
		*(*[64]byte)(unsafe.Add(unsafe.Pointer(s), 64)) = [64]byte{}
	}
	copy(area, cmd)
	return nil
}

// flush publishes the SQEs handed out since the last flush (store-release
// of the SQ tail) and returns how many the kernel has yet to consume.
func (r *Ring) flush() uint32 {
	atomic.StoreUint32(r.kSQTail, r.sqeTail)
	return r.sqeTail - atomic.LoadUint32(r.kSQHead)
}

// Submit publishes the prepared SQEs and tells the kernel about them. It
// returns the number of SQEs the kernel consumed (with SQPoll: the number
// published for the poll thread).
func (r *Ring) Submit() (int, error) { return r.SubmitAndWait(0) }

// SubmitAndWait is Submit followed, in the same io_uring_enter call, by a
// wait until at least n completions are available. EINTR is retried. The
// wait may end early when a signal arrives after something was submitted;
// callers loop on PeekCQE / WaitCQE.
func (r *Ring) SubmitAndWait(n int) (int, error) {
	if r.closed {
		return 0, fmt.Errorf("uring: submit on closed ring: %w", unix.EBADF)
	}
	toSubmit := r.flush()
	var flags uint32
	enter := false
	if r.flags&SetupSQPoll != 0 {
		// The tail store above is a full barrier (XCHG on amd64, DMB on
		// arm64 for a seq-cst store), so this flags load cannot pass it.
		if atomic.LoadUint32(r.kSQFlags)&sqNeedWakeup != 0 {
			flags |= enterSQWakeup
			enter = true
		}
	} else if toSubmit > 0 {
		enter = true
	}
	if n > 0 || r.cqNeedsEnter() {
		flags |= enterGetEvents
		enter = true
	}
	if !enter {
		return int(toSubmit), nil
	}
	for {
		got, err := sysEnter(r.fd, toSubmit, uint32(n), flags)
		if err == nil {
			if r.flags&SetupSQPoll != 0 {
				return int(toSubmit), nil
			}
			return got, nil
		}
		if errors.Is(err, unix.EINTR) {
			toSubmit = r.sqeTail - atomic.LoadUint32(r.kSQHead)
			continue
		}
		return 0, fmt.Errorf("uring: io_uring_enter(submit=%d, wait=%d): %w", toSubmit, n, err)
	}
}

// cqNeedsEnter reports whether completions are held in the kernel (CQ
// overflow list, or deferred task work) and need an io_uring_enter with
// GETEVENTS to be posted.
func (r *Ring) cqNeedsEnter() bool {
	if r.flags&SetupDeferTaskrun != 0 {
		return true
	}
	return atomic.LoadUint32(r.kSQFlags)&(sqCQOverflow|sqTaskrun) != 0
}

// CQE is a completion, copied out of the ring.
type CQE struct {
	UserData uint64
	Res      int32
	Flags    uint32
	// Big holds the two extra words of a 32-byte CQE (CQE32 rings; for an
	// NVMe passthrough command, Big[0] is the command's result dword 0).
	Big [2]uint64
}

// Err is nil for Res >= 0, otherwise the errno the kernel returned.
func (c CQE) Err() error {
	if c.Res >= 0 {
		return nil
	}
	return unix.Errno(-c.Res)
}

type cqe16 struct {
	UserData uint64
	Res      int32
	Flags    uint32
}

func (r *Ring) cqeAt(i uint32) CQE {
	p := unsafe.Add(r.cqes, uintptr(i&r.cqMask)*r.cqeSize)
	c := (*cqe16)(p)
	out := CQE{UserData: c.UserData, Res: c.Res, Flags: c.Flags}
	if r.cqeSize == 32 {
		out.Big = *(*[2]uint64)(unsafe.Add(p, 16))
	}
	return out
}

// CQReady is the number of completions in the CQ ring.
func (r *Ring) CQReady() int {
	return int(atomic.LoadUint32(r.kCQTail) - r.cqHeadLoc)
}

// PeekCQE returns the completion at the head of the CQ without consuming
// it (call CQAdvance(1) when done), or false when there is none. When the
// kernel holds completions back (CQ overflow, deferred task work) it
// enters the kernel once, without waiting, to have them posted.
func (r *Ring) PeekCQE() (CQE, bool, error) {
	if atomic.LoadUint32(r.kCQTail) != r.cqHeadLoc {
		return r.cqeAt(r.cqHeadLoc), true, nil
	}
	if !r.cqNeedsEnter() {
		return CQE{}, false, nil
	}
	if err := r.getEvents(0); err != nil {
		return CQE{}, false, err
	}
	if atomic.LoadUint32(r.kCQTail) != r.cqHeadLoc {
		return r.cqeAt(r.cqHeadLoc), true, nil
	}
	return CQE{}, false, nil
}

// WaitCQE waits for a completion and returns it without consuming it
// (call CQAdvance(1) when done).
func (r *Ring) WaitCQE() (CQE, error) {
	for {
		if atomic.LoadUint32(r.kCQTail) != r.cqHeadLoc {
			return r.cqeAt(r.cqHeadLoc), nil
		}
		if err := r.getEvents(1); err != nil {
			return CQE{}, err
		}
	}
}

func (r *Ring) getEvents(n uint32) error {
	if r.closed {
		return fmt.Errorf("uring: wait on closed ring: %w", unix.EBADF)
	}
	for {
		_, err := sysEnter(r.fd, 0, n, enterGetEvents)
		if err == nil || errors.Is(err, unix.EINTR) {
			return nil
		}
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EBUSY) {
			// Nothing to wait for that will complete, or CQ overflow
			// being flushed: let the caller look at the ring.
			return nil
		}
		return fmt.Errorf("uring: io_uring_enter(wait=%d): %w", n, err)
	}
}

// CQAdvance consumes n completions (store-release of the CQ head), making
// room for the kernel to post more.
func (r *Ring) CQAdvance(n int) {
	r.cqHeadLoc += uint32(n)
	atomic.StoreUint32(r.kCQHead, r.cqHeadLoc)
}

// ReapCQEs copies up to len(dst) ready completions into dst, consumes
// them, and returns how many. It does not wait and does not enter the
// kernel (see PeekCQE for rings that hold completions back).
func (r *Ring) ReapCQEs(dst []CQE) int {
	tail := atomic.LoadUint32(r.kCQTail)
	n := 0
	for r.cqHeadLoc+uint32(n) != tail && n < len(dst) {
		dst[n] = r.cqeAt(r.cqHeadLoc + uint32(n))
		n++
	}
	if n > 0 {
		r.CQAdvance(n)
	}
	return n
}
