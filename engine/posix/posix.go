package posix

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/internal/pio"
	"github.com/kvfs/kvfs/store"
)

// Options control Open.
type Options struct {
	ReadOnly bool
	// Buffered disables O_DIRECT. Without it O_DIRECT is tried first and
	// dropped only where the file system refuses it (tmpfs, for example).
	Buffered bool
	// InlineReads is "auto" (also ""), "on" or "off": whether the store
	// may read with ReadInline from its verifying goroutines (concurrent
	// preads) rather than through Do, one request at a time. auto: on for
	// a file in memory (tmpfs, ramfs).
	InlineReads string
}

// errClosed is returned after Close.
var errClosed = fmt.Errorf("posix: %w", store.ErrEngineClosed)

// Engine is the baseline engine: pread and pwrite, one request at a time
// (queue depth 1), O_DIRECT with aligned buffers where the file system
// allows it, fdatasync for durability.
type Engine struct {
	f      *os.File
	size   int64
	align  int
	direct bool
	inline bool
	mu     sync.RWMutex
	closed bool
}

var _ store.Engine = (*Engine)(nil)

// Open opens a regular file or a block device.
func Open(path string, o Options) (*Engine, error) {
	f, direct, err := openDirect(path, o.ReadOnly, !o.Buffered)
	if err != nil {
		return nil, err
	}
	size, err := deviceSize(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	p := &Engine{f: f, size: size, align: 1, direct: direct}
	if direct {
		p.align = directAlign(f)
	}
	var sf unix.Statfs_t
	inMemory := unix.Fstatfs(int(f.Fd()), &sf) == nil && (sf.Type == unix.TMPFS_MAGIC || sf.Type == unix.RAMFS_MAGIC)
	switch o.InlineReads {
	case "", "auto":
		p.inline = inMemory
	case "on":
		p.inline = true
	case "off":
	default:
		f.Close()
		return nil, fmt.Errorf("posix: InlineReads %q: want auto, on or off: %w", o.InlineReads, unix.EINVAL)
	}
	return p, nil
}

// openDirect opens path read-write (or read-only), with O_DIRECT when
// wantDirect and the file system accepts it. It reports whether O_DIRECT is on.
func openDirect(path string, readOnly, wantDirect bool) (*os.File, bool, error) {
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
			return nil, false, fmt.Errorf("posix: open %s: %w", path, err)
		}
	}
	f, err := os.OpenFile(path, flags|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, fmt.Errorf("posix: open %s: %w", path, err)
	}
	return f, false, nil
}

// deviceSize is the size of a regular file or block device.
func deviceSize(f *os.File) (int64, error) {
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("posix: stat %s: %w", f.Name(), err)
	}
	if st.Mode()&os.ModeDevice != 0 {
		size, err := unix.IoctlGetUint64(int(f.Fd()), unix.BLKGETSIZE64)
		if err != nil {
			return 0, fmt.Errorf("posix: size of %s: %w", f.Name(), err)
		}
		return int64(size), nil
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("posix: %s is neither a regular file nor a block device", f.Name())
	}
	return st.Size(), nil
}

// directAlign is the O_DIRECT alignment of f: the logical block size of a
// block device, statx's DIO alignment for a file, else 4096.
func directAlign(f *os.File) int {
	var stx unix.Statx_t
	if err := unix.Statx(int(f.Fd()), "", unix.AT_EMPTY_PATH, unix.STATX_DIOALIGN, &stx); err == nil &&
		stx.Mask&unix.STATX_DIOALIGN != 0 && stx.Dio_offset_align > 0 {
		a := int(max(stx.Dio_offset_align, stx.Dio_mem_align))
		if a <= store.SuperblockSize {
			return a
		}
	}
	if n, err := unix.IoctlGetInt(int(f.Fd()), unix.BLKSSZGET); err == nil && n > 0 {
		return n
	}
	return 4096
}

// Name is "posix".
func (p *Engine) Name() string { return "posix" }

// Size implements store.Engine.
func (p *Engine) Size() int64 { return p.size }

// Align implements store.Engine.
func (p *Engine) Align() int { return p.align }

// Direct reports whether the file is open with O_DIRECT.
func (p *Engine) Direct() bool { return p.direct }

// Do implements store.Engine: each request in turn.
func (p *Engine) Do(ios []store.IO) error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	for i := range ios {
		ios[i].Err = p.one(&ios[i])
	}
	return nil
}

// VectorReads implements store.VectorReader: reads with IO.Vec are served
// by preadv(2).
func (p *Engine) VectorReads() bool { return true }

var _ store.VectorReader = (*Engine)(nil)

// InlineReads implements store.InlineReader (see Options.InlineReads).
func (p *Engine) InlineReads() bool { return p.inline }

// ReadInline implements store.InlineReader: one read on the calling
// goroutine; concurrent calls read concurrently.
func (p *Engine) ReadInline(r *store.IO) error {
	if r.Op != store.OpRead {
		return fmt.Errorf("posix: inline %v: %w", r.Op, unix.EINVAL)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	return p.one(r)
}

var _ store.InlineReader = (*Engine)(nil)

func (p *Engine) one(r *store.IO) error {
	return pio.Do(int(p.f.Fd()), r, p.align, "posix")
}

// Sync implements store.Engine.
func (p *Engine) Sync() error {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return errClosed
	}
	for {
		err := unix.Fdatasync(int(p.f.Fd()))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("posix: fdatasync: %w", err)
		}
		return nil
	}
}

// Close implements store.Engine.
func (p *Engine) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.f.Close()
}
