package ctl

import (
	"errors"
	"syscall"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/store"
)

// Sentinel errors of the server. Together with the decoder's (package abi)
// they are what Errno maps to the errno a client sees; docs/abi.md lists the
// mapping.
var (
	ErrClosed          = errors.New("ctl: session closed")                              // EBADF
	ErrTooManySessions = errors.New("ctl: too many open control files")                 // ENFILE
	ErrTooManyBuffers  = errors.New("ctl: too many registered buffers on this handle")  // EMFILE
	ErrQuota           = errors.New("ctl: registered-bytes limit of this handle")       // EDQUOT
	ErrOutside         = errors.New("ctl: file is not inside the shared-memory dir")    // EPERM
	ErrSymlink         = errors.New("ctl: path has a symbolic link")                    // ELOOP
	ErrNotRegular      = errors.New("ctl: not a regular file")                          // EINVAL
	ErrAccess          = errors.New("ctl: caller may not open the file read-write")     // EACCES
	ErrFilesystem      = errors.New("ctl: file is not on tmpfs or hugetlbfs")           // EXDEV
	ErrLength          = errors.New("ctl: length is zero or beyond the end of file")    // ERANGE
	ErrNoBuffer        = errors.New("ctl: no such buffer on this handle")               // ENOENT
	ErrReadOnly        = errors.New("ctl: store is read-only")                          // EROFS
	ErrFault           = errors.New("ctl: registered memory faulted (file shrunk?)")    // EFAULT
	ErrCaller          = errors.New("ctl: calling process not visible to the daemon")   // ESRCH
	ErrAssume          = errors.New("ctl: daemon cannot take the caller's credentials") // EPERM
	ErrBadFD           = errors.New("ctl: not an open descriptor of the caller")        // EBADF
	ErrTakeFD          = errors.New("ctl: daemon may not take the caller's descriptor") // EPERM
	ErrImmutable       = errors.New("ctl: file is immutable")                           // EPERM
	ErrPinLimit        = errors.New("ctl: pinned-memory limit")                         // ENOMEM
)

// Errno converts an error of this package, of package abi or of the store to
// the errno returned to the client. It is the only place that does so;
// unknown errors become EIO.
func Errno(err error) syscall.Errno {
	var en syscall.Errno
	switch {
	case err == nil:
		return 0
	case blocksErrno(err) != 0:
		return blocksErrno(err)
	case errors.Is(err, abi.ErrCommand):
		return syscall.ENOTTY
	case errors.Is(err, abi.ErrVersion):
		return syscall.EPROTO
	case errors.Is(err, abi.ErrFD), errors.Is(err, ErrBadFD):
		return syscall.EBADF
	case errors.Is(err, ErrCaller):
		return syscall.ESRCH
	case errors.Is(err, ErrAssume), errors.Is(err, ErrTakeFD), errors.Is(err, ErrImmutable):
		return syscall.EPERM
	case errors.Is(err, ErrNoGPU):
		return syscall.ENODEV
	case errors.Is(err, ErrGPUHandle):
		return syscall.EINVAL
	case errors.Is(err, ErrGPUOwner):
		return syscall.EACCES
	case errors.Is(err, ErrPinLimit):
		return syscall.ENOMEM
	case errors.Is(err, abi.ErrSize), errors.Is(err, abi.ErrCount), errors.Is(err, abi.ErrFlags),
		errors.Is(err, abi.ErrReserved), errors.Is(err, abi.ErrPath), errors.Is(err, ErrNotRegular):
		return syscall.EINVAL
	case errors.Is(err, ErrClosed):
		return syscall.EBADF
	case errors.Is(err, ErrTooManySessions):
		return syscall.ENFILE
	case errors.Is(err, ErrTooManyBuffers):
		return syscall.EMFILE
	case errors.Is(err, ErrQuota):
		return syscall.EDQUOT
	case errors.Is(err, ErrOutside):
		return syscall.EPERM
	case errors.Is(err, ErrSymlink):
		return syscall.ELOOP
	case errors.Is(err, ErrAccess):
		return syscall.EACCES
	case errors.Is(err, ErrFilesystem):
		return syscall.EXDEV
	case errors.Is(err, ErrLength):
		return syscall.ERANGE
	case errors.Is(err, ErrNoBuffer):
		return syscall.ENOENT
	case errors.Is(err, ErrReadOnly):
		return syscall.EROFS
	case errors.Is(err, ErrFault):
		return syscall.EFAULT
	case errors.Is(err, store.ErrClosed):
		return syscall.ESHUTDOWN
	case errors.As(err, &en):
		return en
	}
	return syscall.EIO
}

// errno converts err and logs the ones that are the daemon's problem rather
// than the caller's.
func (s *Server) errno(op string, err error) syscall.Errno {
	e := Errno(err)
	if e == syscall.EIO || e == syscall.ESHUTDOWN {
		s.log.Warn("ctl: "+op+" failed", zap.Error(err))
	} else if e != 0 {
		s.log.Debug("ctl: "+op+" rejected", zap.Error(err), zap.String("errno", e.Error()))
	}
	return e
}
