package ctl

import (
	"fmt"
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
}

// buffer is one registration.
type buffer struct {
	id         uint32
	path       string
	mem        []byte
	unregister func() // engine registration, nil when none
}

func (b *buffer) contains(addr uintptr) bool {
	if len(b.mem) == 0 {
		return false
	}
	base := uintptrOf(b.mem)
	return addr >= base && addr-base < uintptr(len(b.mem))
}

func (b *buffer) release() {
	if b.unregister != nil {
		b.unregister()
	}
	_ = unix.Munmap(b.mem)
}

// Ioctl serves one ioctl. in and out are the argument bytes the kernel
// passed in and will copy back; out is filled completely on success. The
// result is 0, except for LOAD and STORE where it is the number of entries
// with status OK.
func (ss *Session) Ioctl(cmd uint32, in, out []byte) (int32, syscall.Errno) {
	s := ss.srv
	req, err := abi.Decode(cmd, in, len(out))
	if err != nil {
		s.m.rejected.Add(1)
		return 0, s.errno("decode", err)
	}
	var res int32
	switch req.Op {
	case abi.OpInfo:
		i := s.info()
		i.Marshal(out)
	case abi.OpRegisterHost:
		var id uint32
		var n uint64
		id, n, err = ss.registerHost(req.Path, req.Register.Length)
		if err == nil {
			r := req.Register
			r.Buffer, r.Length = id, n
			r.Marshal(out)
		}
	case abi.OpUnregister:
		err = ss.unregister(req.Unregister.Buffer)
	case abi.OpLoad, abi.OpStore:
		res, err = ss.batch(&req, in, out)
	}
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
		b.release()
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

func (ss *Session) registerHost(path string, length uint64) (uint32, uint64, error) {
	s := ss.srv
	ss.mu.Lock()
	closed, nbuf, nbytes := ss.mu.closed, len(ss.mu.bufs), ss.mu.bytes
	ss.mu.Unlock()
	if closed {
		return 0, 0, ErrClosed
	}
	if nbuf >= s.opts.MaxBuffers {
		return 0, 0, fmt.Errorf("%w: %d", ErrTooManyBuffers, s.opts.MaxBuffers)
	}
	if length > uint64(s.opts.MaxRegisteredBytes-nbytes) {
		return 0, 0, fmt.Errorf("%w: %d bytes registered, %d more asked, limit %d", ErrQuota, nbytes, length, s.opts.MaxRegisteredBytes)
	}
	f, err := openShm(s.opts.ShmDir, path, ss.uid, ss.gid)
	if err != nil {
		return 0, 0, err
	}
	mem, err := mapShm(f, length)
	unix.Close(f.fd)
	if err != nil {
		return 0, 0, err
	}
	b := &buffer{path: path, mem: mem}
	if s.reg != nil {
		if un, err := s.reg.RegisterMemory(mem); err == nil {
			b.unregister = un
		} else {
			s.log.Debug("ctl: engine did not register buffer; I/O will bounce", zap.String("path", path), zap.Error(err))
		}
	}
	ss.mu.Lock()
	switch {
	case ss.mu.closed:
		err = ErrClosed
	case len(ss.mu.bufs) >= s.opts.MaxBuffers:
		err = fmt.Errorf("%w: %d", ErrTooManyBuffers, s.opts.MaxBuffers)
	case int64(len(mem)) > s.opts.MaxRegisteredBytes-ss.mu.bytes:
		err = fmt.Errorf("%w: %d bytes registered, %d more asked, limit %d", ErrQuota, ss.mu.bytes, len(mem), s.opts.MaxRegisteredBytes)
	}
	if err != nil {
		ss.mu.Unlock()
		b.release()
		return 0, 0, err
	}
	for b.id == 0 || ss.mu.bufs[b.id] != nil {
		b.id = s.nextBuffer.Add(1)
	}
	ss.mu.bufs[b.id] = b
	ss.mu.bytes += int64(len(mem))
	ss.mu.Unlock()
	s.m.buffers.Add(1)
	s.m.bytes.Add(int64(len(mem)))
	s.log.Debug("ctl: registered", zap.Uint64("session", ss.id), zap.Uint32("buffer", b.id),
		zap.String("path", path), zap.Int("bytes", len(mem)), zap.Bool("engine", b.unregister != nil))
	return b.id, uint64(len(mem)), nil
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
	delete(ss.mu.bufs, id)
	ss.mu.bytes -= int64(len(b.mem))
	ss.mu.Unlock()
	// Wait for batches that looked the buffer up before it left the table.
	ss.io.Lock()
	b.release()
	ss.io.Unlock()
	ss.srv.m.buffers.Add(-1)
	ss.srv.m.bytes.Add(-int64(len(b.mem)))
	return nil
}
