package store

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// PosixOptions control OpenPosix.
type PosixOptions struct {
	ReadOnly bool
	// Buffered disables O_DIRECT. Without it O_DIRECT is tried first and
	// dropped only where the file system refuses it (tmpfs, for example).
	Buffered bool
}

// Posix is the baseline engine: pread and pwrite, one request at a time
// (queue depth 1), O_DIRECT with aligned buffers where the file system
// allows it, fdatasync for durability.
type Posix struct {
	f      *os.File
	size   int64
	align  int
	direct bool
	mu     sync.RWMutex
	closed bool
}

var _ Engine = (*Posix)(nil)

// OpenPosix opens a regular file or a block device.
func OpenPosix(path string, o PosixOptions) (*Posix, error) {
	f, direct, err := OpenDirect(path, o.ReadOnly, !o.Buffered)
	if err != nil {
		return nil, err
	}
	size, err := DeviceSize(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &Posix{f: f, size: size, align: 1, direct: direct}
	if direct {
		p.align = DirectAlign(f)
	}
	return p, nil
}

// OpenDirect opens path read-write (or read-only), with O_DIRECT when
// wantDirect and the file system accepts it. It reports whether O_DIRECT is on.
func OpenDirect(path string, readOnly, wantDirect bool) (*os.File, bool, error) {
	flags := os.O_RDWR
	if readOnly {
		flags = os.O_RDONLY
	}
	if wantDirect {
		f, err := os.OpenFile(path, flags|unix.O_DIRECT|unix.O_CLOEXEC, 0)
		if err == nil {
			return f, true, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return nil, false, fmt.Errorf("store: open %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("store: open %s: %w", path, err)
	}
	return f, false, nil
}

// DeviceSize is the size of a regular file or block device.
func DeviceSize(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("store: stat %s: %w", f.Name(), err)
	}
	if st.Mode()&os.ModeDevice != 0 {
		var size uint64
		if err := ioctlPtr(f.Fd(), unix.BLKGETSIZE64, &size); err != nil {
			return 0, fmt.Errorf("store: size of %s: %w", f.Name(), err)
		}
		return int64(size), nil
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("store: %s is neither a regular file nor a block device", f.Name())
	}
	return st.Size(), nil
}

// DirectAlign is the O_DIRECT alignment of f: the logical block size of a
// block device, statx's DIO alignment for a file, else 4096.
func DirectAlign(f *os.File) int {
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err == nil &&
		stx.Mask&unix.STATX_DIOALIGN != 0 && stx.Dio_offset_align > 0 {
		a := int(max(stx.Dio_offset_align, stx.Dio_mem_align))
		if a <= SuperblockSize {
			return a
		}
	}
	if n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && n > 0 {
		return n
	}
	return 4096
}

// Name implements Engine.
func (p *Posix) Name() string { return "posix" }

// Size implements Engine.
func (p *Posix) Size() int64 { return p.size }

// Align implements Engine.
func (p *Posix) Align() int { return p.align }

// Direct reports whether the file is open with O_DIRECT.
func (p *Posix) Direct() bool { return p.direct }

// Do implements Engine: each request in turn.
func (p *Posix) Do(ios []IO) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errEngineClosed
	}
	for i := range ios {
		ios[i].Err = p.one(&ios[i])
	}
	return nil
}

func (p *Posix) one(r *IO) error {
	if !Aligned(r.Buf, p.align) || r.Off%int64(p.align) != 0 {
		return fmt.Errorf("store: posix %s of %d bytes at %d: %w (alignment %d)", r.Op, len(r.Buf), r.Off, unix.EINVAL, p.align)
	}
	done := 0
	for done < len(r.Buf) {
		var n int
		var err error
		if r.Op == OpWrite {
			n, err = unix.Pwrite(int(p.f.Fd()), r.Buf[done:], r.Off+int64(done))
		} else {
			n, err = unix.Pread(int(p.f.Fd()), r.Buf[done:], r.Off+int64(done))
		}
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("store: posix %s at %d: %w", r.Op, r.Off+int64(done), err)
		}
		if n == 0 {
			return fmt.Errorf("store: posix %s at %d: %w", r.Op, r.Off+int64(done), io.ErrUnexpectedEOF)
		}
		done += n
	}
	return nil
}

// Sync implements Engine.
func (p *Posix) Sync() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errEngineClosed
	}
	for {
		err := unix.Fdatasync(int(p.f.Fd()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("store: fdatasync: %w", err)
		}
		return nil
	}
}

// Close implements Engine.
func (p *Posix) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.f.Close()
}
