package ctl

import (
	"fmt"
	"os"
	"sync"
	"syscall"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
)

// Session is one open file of the control file. Its methods are safe for
// concurrent use: a client may issue ioctls on one descriptor from many
// threads.
type Session struct {
	srv      *Server
	uid, gid uint32
	id       uint64

	io sync.RWMutex // shared: LOAD/STORE I/O in flight; exclusive: unmapping
	mu struct {
		sync.Mutex
		closed bool
		bufs   map[uint32]*buffer
		bytes  int64
	}
	blk blocksState // minor-2 targets (target.go); guarded by mu
}

// buffer is one registration.
type buffer struct {
	id         uint32
	path       string
	mem        []byte
	unregister func()   // engine registration, nil when none
	uid        uint32   // real uid the pinned bytes are charged to
	pinned     int64    // bytes charged to the pinning limits (0: not pinned)
	cuda       *cudaBuf // REGISTER_CUDA: device memory (mem is nil)
}

// size is the registered length.
func (b *buffer) size() uint64 {
	if b.cuda != nil {
		return b.cuda.n
	}
	return uint64(len(b.mem))
}

// base identifies the buffer's address range for ordering tiles: the host
// address of the mapping, or the device address of a CUDA range (unified
// addressing keeps the two apart).
func (b *buffer) base() uint64 {
	if b.cuda != nil {
		return b.cuda.addr
	}
	return uint64(uintptrOf(b.mem))
}

func (b *buffer) contains(addr uintptr) bool {
	if len(b.mem) == 0 {
		return false
	}
	base := uintptrOf(b.mem)
	return addr >= base && addr-base < uintptr(len(b.mem))
}

func (b *buffer) release(s *Server) {
	if b.cuda != nil {
		if err := b.cuda.mem.Close(); err != nil {
			s.log.Warn("ctl: closing a CUDA registration failed", zap.String("buffer", b.path), zap.Error(err))
		}
		return
	}
	if b.unregister != nil {
		b.unregister()
	}
	_ = unix.Munmap(b.mem)
	if b.pinned != 0 {
		s.pins.uncharge(b.uid, b.pinned)
	}
}

// Ioctl serves one ioctl that did not come through FUSE (no caller): the
// register commands fail with ESRCH.
func (ss *Session) Ioctl(cmd uint32, in, out []byte) (int32, syscall.Errno) {
	return ss.IoctlFrom(0, cmd, in, out)
}

// IoctlFrom serves one ioctl issued by thread tid (the pid of the FUSE
// request; 0 when unknown). in and out are the argument bytes the kernel
// passed in and will copy back; out is filled completely on success. The
// result is 0, except for LOAD and STORE where it is the number of entries
// with status OK. It implements fs.CtlCallerSession.
func (ss *Session) IoctlFrom(tid uint32, cmd uint32, in, out []byte) (int32, syscall.Errno) {
	s := ss.srv
	req, err := abi.Decode(cmd, in, len(out))
	if err != nil {
		s.m.rejected.Add(1)
		return 0, s.errno("decode", err)
	}
	res, err := ss.serve(tid, &req, in, out)
	if err != nil {
		s.m.rejected.Add(1)
		return 0, s.errno(req.Op.String(), err)
	}
	return res, 0
}

// Release ends the session: every registration is unmapped and
// unregistered once the I/O in flight on it is done.
func (ss *Session) Release() {
	ss.mu.Lock()
	if ss.mu.closed {
		ss.mu.Unlock()
		return
	}
	ss.mu.closed = true
	bufs := ss.mu.bufs
	ss.mu.bufs = nil
	bytes := ss.mu.bytes
	ss.mu.bytes = 0
	ss.mu.Unlock()

	ss.io.Lock()
	for _, b := range bufs {
		b.release(ss.srv)
	}
	ss.io.Unlock()
	s := ss.srv
	s.m.buffers.Add(-int64(len(bufs)))
	s.m.bytes.Add(-bytes)
	s.m.sessions.Add(-1)
	s.log.Debug("ctl: session released", zap.Uint64("session", ss.id), zap.Int("buffers", len(bufs)))
}

// Buffers is the number of registrations of the session.
func (ss *Session) Buffers() int {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	return len(ss.mu.bufs)
}

// registration is the outcome of a successful REGISTER_HOST/REGISTER_FD.
type registration struct {
	id     uint32
	n      int
	pinned bool
}

// registerHost serves REGISTER_HOST: the path is opened with the calling
// thread's credentials (openShm), so the caller registers only a file it
// could open read-write itself. Checks run in the documented order: path
// policy and resolution (EPERM, EINVAL, ELOOP, EXDEV, ENOENT, EACCES),
// then the length (ERANGE), then the per-handle limits (EMFILE, EDQUOT),
// then the mapping and its residency, then pinning (ENOMEM).
func (ss *Session) registerHost(tid uint32, path string, length uint64) (registration, error) {
	s := ss.srv
	if _, err := splitShm(s.opts.ShmDir, path); err != nil {
		return registration{}, err
	}
	c, err := callerCred(tid)
	if err != nil {
		return registration{}, err
	}
	f, err := openShm(s.opts.ShmDir, path, c)
	if err != nil {
		return registration{}, err
	}
	defer unix.Close(f.fd)
	return ss.register(c, f, path, length)
}

// registerFD serves REGISTER_FD: the daemon takes the calling thread's
// descriptor fd (pidfd_getfd), so the kernel decided, when the caller
// opened the file, that it may read and write it.
func (ss *Session) registerFD(tid uint32, fd int32, length uint64) (registration, error) {
	c, err := callerCred(tid)
	if err != nil {
		return registration{}, err
	}
	nfd, err := takeFD(tid, fd)
	if err != nil {
		return registration{}, err
	}
	defer unix.Close(nfd)
	name := fmt.Sprintf("fd %d of thread %d", fd, tid)
	f, err := checkFile(nfd, name)
	if err != nil {
		return registration{}, err
	}
	if p, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", nfd)); err == nil {
		name = p
	}
	return ss.register(c, f, name, length)
}

// checkRoom refuses a registration of n more bytes that the session has
// no room for: it is closed, at its buffer limit (EMFILE) or over its
// registered-bytes quota (EDQUOT).
func (ss *Session) checkRoom(n uint64) error {
	s := ss.srv
	ss.mu.Lock()
	closed, nbuf, nbytes := ss.mu.closed, len(ss.mu.bufs), ss.mu.bytes
	ss.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if nbuf >= s.opts.MaxBuffers {
		return fmt.Errorf("%w: %d", ErrTooManyBuffers, s.opts.MaxBuffers)
	}
	if n > uint64(max(0, s.opts.MaxRegisteredBytes-nbytes)) {
		return fmt.Errorf("%w: %d bytes registered, %d more asked, limit %d", ErrQuota, nbytes, n, s.opts.MaxRegisteredBytes)
	}
	return nil
}

// register maps an opened, checked file for the session: length, then the
// handle's limits, then mmap and the residency of the mapped range, then
// the pinning limits and the engine.
func (ss *Session) register(c *cred, f *shmFile, name string, length uint64) (registration, error) {
	s := ss.srv
	n, err := checkLength(f, length)
	if err != nil {
		return registration{}, err
	}
	if err := ss.checkRoom(uint64(n)); err != nil {
		return registration{}, err
	}
	b := &buffer{path: name, uid: c.ruid}
	mem, err := mapShm(f, n)
	if err != nil {
		return registration{}, err
	}
	// Pin only memory that exists: pinning a hole would allocate it inside
	// this ioctl. The registered range itself is checked (residentMapping);
	// a range with holes is registered unpinned (its I/O bounces) and is
	// the caller's to fill; a resident one is guarded against holes punched
	// later.
	resident := ss.residentMapping(f, mem, name)
	pin := s.reg != nil && resident
	if pin {
		if err := s.pins.charge(c, int64(n)); err != nil {
			_ = unix.Munmap(mem)
			return registration{}, err
		}
		b.pinned = int64(n)
	}
	b.mem = mem
	if pin {
		// Populate the page tables here, on this ioctl's thread, so the
		// engine's pinning (on its ring thread, which every client's I/O
		// shares) only takes references.
		_ = unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
		if un, err := s.reg.RegisterMemory(mem); err == nil {
			b.unregister = un
		} else {
			s.log.Debug("ctl: engine did not register buffer; I/O will bounce", zap.String("file", name), zap.Error(err))
			s.pins.uncharge(b.uid, b.pinned)
			b.pinned = 0
		}
	}
	return ss.add(b, int64(len(mem)))
}

// residentMapping reports whether every page of mem, the daemon's mapping
// of f, is allocated in the file, and if so leaves the mapping guarded
// against holes punched later (holeGuard): a LOAD into such a hole then
// fails with EFAULT rather than allocate. The guard itself decides:
// populating the guarded mapping fails on the first hole, allocating
// nothing, and succeeds on pages that are in the file, written or only
// fallocated (mincore and SEEK_HOLE count the latter as holes). A mapping
// with a hole is unguarded again: it is registered with its holes, for
// LOADs to fill. Without a guard (no userfaultfd for the daemon) only
// mincore is left, which errs on the careful side: fallocated but unwritten
// pages, and hugetlbfs pages this mapping has not touched, count as holes.
func (ss *Session) residentMapping(f *shmFile, mem []byte, name string) bool {
	s := ss.srv
	if err := s.holes.guard(mem); err != nil {
		s.log.Debug("ctl: registration not guarded against punched holes", zap.String("file", name), zap.Error(err))
		return !f.hugetlb && residentPages(mem)
	}
	if unix.Madvise(mem, unix.MADV_POPULATE_WRITE) != nil {
		s.holes.unguard(mem)
		return false
	}
	return true
}

// add enters a prepared registration in the session's table after checking
// the handle's limits again (another registration may have raced this one);
// on failure it releases b.
func (ss *Session) add(b *buffer, n int64) (registration, error) {
	s := ss.srv
	var err error
	ss.mu.Lock()
	switch {
	case ss.mu.closed:
		err = ErrClosed
	case len(ss.mu.bufs) >= s.opts.MaxBuffers:
		err = fmt.Errorf("%w: %d", ErrTooManyBuffers, s.opts.MaxBuffers)
	case n > s.opts.MaxRegisteredBytes-ss.mu.bytes:
		err = fmt.Errorf("%w: %d bytes registered, %d more asked, limit %d", ErrQuota, ss.mu.bytes, n, s.opts.MaxRegisteredBytes)
	}
	if err != nil {
		ss.mu.Unlock()
		b.release(s)
		return registration{}, err
	}
	for b.id == 0 || ss.mu.bufs[b.id] != nil {
		b.id = s.nextBuffer.Add(1)
	}
	ss.mu.bufs[b.id] = b
	ss.mu.bytes += n
	ss.mu.Unlock()
	s.m.buffers.Add(1)
	s.m.bytes.Add(n)
	s.log.Debug("ctl: registered", zap.Uint64("session", ss.id), zap.Uint32("buffer", b.id),
		zap.String("file", b.path), zap.Int64("bytes", n), zap.Bool("engine", b.unregister != nil))
	return registration{id: b.id, n: int(n), pinned: b.unregister != nil}, nil
}

func (ss *Session) unregister(id uint32) error {
	ss.mu.Lock()
	if ss.mu.closed {
		ss.mu.Unlock()
		return ErrClosed
	}
	b := ss.mu.bufs[id]
	if b == nil {
		ss.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrNoBuffer, id)
	}
	if ss.bufferBusy(id) {
		ss.mu.Unlock()
		return fmt.Errorf("%w: %d", ErrBufferBusy, id)
	}
	delete(ss.mu.bufs, id)
	ss.mu.bytes -= int64(b.size())
	ss.mu.Unlock()
	// Wait for batches that looked the buffer up before it left the table.
	ss.io.Lock()
	b.release(ss.srv)
	ss.io.Unlock()
	ss.srv.m.buffers.Add(-1)
	ss.srv.m.bytes.Add(-int64(b.size()))
	return nil
}
