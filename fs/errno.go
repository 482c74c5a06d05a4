package fs

import (
	"errors"
	"syscall"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// errGone marks a group that was present when its file was opened and has
// since been deleted or evicted: reads of such a handle fail with ESTALE
// rather than serve bytes the store no longer holds.
var errGone = errors.New("fs: group deleted or evicted since open")

// refuse logs why a request naming path is refused and returns errno. The
// errno alone ("Invalid argument", "Operation not permitted") rarely tells
// a user what kvfs expected, and a shell ignores the error of the close(2)
// that refuses a short write, so the daemon's log says it.
func (f *FS) refuse(op, path, why string, errno syscall.Errno) syscall.Errno {
	f.log.Warn("fs: refused", zap.String("op", op), zap.String("path", path),
		zap.String("why", why), zap.String("errno", errno.Error()))
	return errno
}

// toErrno converts an error from the store or layout into the errno a FUSE
// request returns. It is the only place where errors become errnos. Errors
// it does not know are logged (with op, the request that failed) and become
// EIO, so a surprise never takes the daemon down and never passes
// unexplained.
func (f *FS) toErrno(op string, err error) syscall.Errno {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errGone):
		return syscall.ESTALE
	case errors.Is(err, store.ErrNotFound),
		errors.Is(err, layout.ErrName), errors.Is(err, layout.ErrRange):
		return syscall.ENOENT
	case errors.Is(err, store.ErrCorrupt):
		f.m.corrupt.Add(1)
		f.log.Warn("fs: checksum mismatch, returning EIO", zap.String("op", op), zap.Error(err))
		return syscall.EIO
	case errors.Is(err, store.ErrSize), errors.Is(err, store.ErrInvalid):
		return syscall.EINVAL
	case errors.Is(err, store.ErrBlockExists):
		return syscall.ENOTEMPTY // rename onto a block: a non-empty directory
	case errors.Is(err, store.ErrFull):
		return syscall.ENOSPC
	case errors.Is(err, store.ErrClosed):
		return syscall.ESHUTDOWN
	}
	f.m.errors.Add(1)
	f.log.Error("fs: request failed, returning EIO", zap.String("op", op), zap.Error(err))
	return syscall.EIO
}
