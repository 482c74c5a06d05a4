package fs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// groupFile is layer-<L>/block-<id>/head-<H>/K or V: one group.
type groupFile struct {
	gofs.Inode
	fs  *FS
	key layout.Key
}

func (g *groupFile) k() layout.Key { return g.key }

var (
	_ = (gofs.NodeGetattrer)((*groupFile)(nil))
	_ = (gofs.NodeSetattrer)((*groupFile)(nil))
	_ = (gofs.NodeOpener)((*groupFile)(nil))
	_ = (gofs.NodeGetxattrer)((*groupFile)(nil))
	_ = (gofs.NodeListxattrer)((*groupFile)(nil))
	_ = (gofs.NodeSetxattrer)((*groupFile)(nil))
	_ = (gofs.NodeRemovexattrer)((*groupFile)(nil))
	_ = (gofs.NodeStatfser)((*groupFile)(nil))
)

// groupAttr fills the attributes of a group file. They are never cached by
// the kernel (timeout 0): a rewrite changes mtime at once.
func (f *FS) groupAttr(a *fuse.Attr, k layout.Key, mtime time.Time, size int64) {
	a.Ino = inoGroup(f.geo, k)
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
	a.Size = uint64(size)
	a.Uid, a.Gid = f.uid, f.gid
	a.Blksize = uint32(min(f.geo.GroupBytes(), MaxWrite))
	a.Blocks = uint64(size+511) / 512
	a.SetTimes(&mtime, &mtime, &mtime)
}

func (g *groupFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f, key := g.fs, g.k()
	gi, err := f.st.Stat(key)
	if err == nil {
		f.groupAttr(&out.Attr, key, gi.MTime, int64(gi.Size))
		return 0
	}
	// A group being written for the first time exists while a handle
	// writes it: for that handle, and by path (cp -a and tar set times by
	// path before they close).
	if errors.Is(err, store.ErrNotFound) {
		h, ok := fh.(*groupHandle)
		if !ok || !h.write {
			h = f.writerOf(key)
		}
		if h != nil {
			f.groupAttr(&out.Attr, key, f.opts.Now(), int64(h.pendingSize()))
			return 0
		}
	}
	return f.toErrno("getattr", err)
}

// Setattr: truncate through a write handle sets the size of what the handle
// will store; mode, owner and times are accepted and ignored (a group has
// mode 0644, the mount's owner, and its write time as every time), so
// cp -a, tar x and rsync -a can restore into the mount.
func (g *groupFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	f := g.fs
	if size, ok := in.GetSize(); ok {
		h, _ := fh.(*groupHandle)
		if h == nil || !h.write {
			// truncate(2) by path: only to the size the group has.
			if gi, err := f.st.Stat(g.k()); err != nil || uint64(gi.Size) != size {
				return f.refuse("truncate", f.geo.Name(g.k()), fmt.Sprintf("a group is always %d bytes; truncate it through a handle open for writing, then write it whole", f.geo.GroupBytes()), syscall.EPERM)
			}
		} else if errno := h.truncate(size); errno != 0 {
			return errno
		}
	}
	return g.Getattr(ctx, fh, out)
}

// Open returns a handle that reads through the store and, when opened for
// writing, buffers what is written until close. Every group handle is
// FOPEN_DIRECT_IO: the kernel keeps no page cache for groups.
func (g *groupFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	f, key := g.fs, g.k()
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		if _, err := f.st.Stat(key); err != nil {
			return nil, 0, f.toErrno("open", err)
		}
	}
	f.m.opens.Add(1)
	return f.newHandle(key, flags), f.groupOpenFlags(flags), 0
}

// Extended attributes -------------------------------------------------------

var xattrNames = []string{
	"user.kvfs.block", "user.kvfs.layer", "user.kvfs.head", "user.kvfs.kind",
	"user.kvfs.dtype", "user.kvfs.shape", "user.kvfs.crc32c", "user.kvfs.slot",
}

var xattrList = func() []byte {
	var b []byte
	for _, n := range xattrNames {
		b = append(b, n...)
		b = append(b, 0)
	}
	return b
}()

func (g *groupFile) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	f, k := g.fs, g.k()
	gi, err := f.st.Stat(k)
	if err != nil {
		return 0, f.toErrno("getxattr", err)
	}
	var v string
	switch attr {
	case "user.kvfs.block":
		v = fmt.Sprintf("%016x", k.Block)
	case "user.kvfs.layer":
		v = strconv.Itoa(k.Layer)
	case "user.kvfs.head":
		v = strconv.Itoa(k.Head)
	case "user.kvfs.kind":
		v = k.Kind.String()
	case "user.kvfs.dtype":
		v = f.geo.DType.String()
	case "user.kvfs.shape":
		v = f.geo.Shape()
	case "user.kvfs.crc32c":
		v = fmt.Sprintf("%08x", gi.CRC)
	case "user.kvfs.slot":
		v = strconv.FormatInt(gi.Slot, 10)
	default:
		return 0, syscall.ENODATA
	}
	return xattrReply(dest, v)
}

func (g *groupFile) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	return xattrReply(dest, xattrList)
}

func (g *groupFile) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return setxattrErrno(attr, true)
}

func (g *groupFile) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return removexattrErrno(attr, slices.Contains(xattrNames, attr))
}

func (g *groupFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	g.fs.statfs(out)
	return 0
}

// Handles --------------------------------------------------------------------

// snapshot is a group's bytes as read from the store, with the identity of
// the version they belong to. Its data is never modified once published.
type snapshot struct {
	crc   uint32
	mtime int64
	slot  int64
	data  []byte
}

func (s *snapshot) is(gi store.GroupInfo) bool {
	return s != nil && s.crc == gi.CRC && s.mtime == gi.MTime.UnixNano() && s.slot == gi.Slot
}

// groupHandle is one open file of a group.
//
// Reading: the first READ reads the whole group through store.Read (checksum
// verified) into a snapshot; every READ first checks the store's index
// (store.Stat, no I/O) and reads the group again if it was rewritten since,
// or fails with ESTALE if it was deleted or evicted. So a handle never
// serves a version older than the one current when the READ arrived.
//
// Writing: every handle buffers its own bytes; Flush (close) stores them
// with one store.Write when they are exactly one group, so two writers of
// the same group never mix: the last complete close wins.
type groupHandle struct {
	fs    *FS
	key   layout.Key
	write bool // opened for writing (O_WRONLY or O_RDWR)

	mu     sync.Mutex
	snap   *snapshot
	buf    []byte // write buffer, GroupBytes long once allocated
	size   int    // bytes of buf that belong to the file
	loaded bool   // buf starts from the group's old content or from empty
	dirty  bool   // something to store at the next Flush
	failed syscall.Errno
}

var (
	_ = (gofs.FileReader)((*groupHandle)(nil))
	_ = (gofs.FileWriter)((*groupHandle)(nil))
	_ = (gofs.FileFlusher)((*groupHandle)(nil))
	_ = (gofs.FileFsyncer)((*groupHandle)(nil))
	_ = (gofs.FileReleaser)((*groupHandle)(nil))
)

func (f *FS) newHandle(k layout.Key, flags uint32) *groupHandle {
	acc := flags & syscall.O_ACCMODE
	h := &groupHandle{fs: f, key: k, write: acc != syscall.O_RDONLY}
	if h.write {
		f.mu.Lock()
		f.mu.writers[k] = append(f.mu.writers[k], h)
		f.mu.Unlock()
	}
	if h.write && flags&(syscall.O_TRUNC|syscall.O_CREAT) != 0 {
		// O_TRUNC, or a file created by this open: the handle starts
		// empty and must be filled with exactly one group.
		h.loaded, h.dirty = true, true
	}
	return h
}

// writerOf is a handle open for writing group k, or nil.
func (f *FS) writerOf(k layout.Key) *groupHandle {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ws := f.mu.writers[k]; len(ws) > 0 {
		return ws[len(ws)-1]
	}
	return nil
}

func (h *groupHandle) pendingSize() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.size
}

func (h *groupHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	f := h.fs
	h.mu.Lock()
	if h.write && h.dirty {
		// O_RDWR with unstored writes: the handle reads its own bytes.
		n := 0
		if off < int64(h.size) {
			n = copy(dest, h.buf[off:h.size])
		}
		h.mu.Unlock()
		return fuse.ReadResultData(dest[:n]), 0
	}
	h.mu.Unlock()
	gb := int64(f.geo.GroupBytes())
	if off >= gb {
		return fuse.ReadResultData(nil), 0
	}
	data, errno := h.current()
	if errno != 0 {
		return nil, errno
	}
	end := min(off+int64(len(dest)), gb)
	f.m.reads.Add(1)
	f.m.readBytes.Add(uint64(end - off))
	return fuse.ReadResultData(data[off:end]), 0
}

// current returns the bytes of the group's current version.
func (h *groupHandle) current() ([]byte, syscall.Errno) {
	f := h.fs
	gi, err := f.st.Stat(h.key)
	if errors.Is(err, store.ErrNotFound) {
		err = fmt.Errorf("%w: %v", errGone, h.key)
	}
	if err != nil {
		return nil, f.toErrno("read", err)
	}
	h.mu.Lock()
	s := h.snap
	h.mu.Unlock()
	if s.is(gi) {
		return s.data, 0
	}
	// The bytes are at least as new as gi (labelled before the read):
	// that can only cause one needless re-read later, never a stale one.
	s, err = f.snapshotOf(h.key, gi)
	if err != nil {
		return nil, f.toErrno("read", err)
	}
	h.mu.Lock()
	h.snap = s
	h.mu.Unlock()
	return s.data, 0
}

// loadLocked gives a handle opened without O_TRUNC the group's current
// content before its first change, so partial overwrites (dd conv=notrunc)
// modify the group rather than replace it.
func (h *groupHandle) loadLocked() syscall.Errno {
	f := h.fs
	if h.buf == nil {
		h.buf = make([]byte, f.geo.GroupBytes())
	}
	if h.loaded {
		return 0
	}
	reqs := []store.ReadReq{{Key: h.key, Buf: h.buf}}
	err := f.io.Read(reqs)
	if err == nil {
		err = reqs[0].Err
	}
	switch {
	case err == nil:
		h.size = len(h.buf)
	case errors.Is(err, store.ErrNotFound):
		clear(h.buf)
		h.size = 0
	default:
		clear(h.buf)
		return f.toErrno("write", err)
	}
	h.loaded = true
	return 0
}

func (h *groupHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	if !h.write {
		return 0, syscall.EBADF
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failed != 0 {
		return 0, h.failed
	}
	gb := int64(h.fs.geo.GroupBytes())
	end := off + int64(len(data))
	if off < 0 || end > gb {
		// The file would be larger than a group: fail this write and
		// every later close, so nothing of it is ever stored.
		h.failed = syscall.EFBIG
		return 0, h.fs.refuse("write", h.fs.geo.Name(h.key), fmt.Sprintf("a write to bytes %d..%d passes the end of the group (%d bytes): nothing of this file will be stored", off, end, gb), syscall.EFBIG)
	}
	if errno := h.loadLocked(); errno != 0 {
		return 0, errno
	}
	copy(h.buf[off:], data)
	h.size = max(h.size, int(end))
	h.dirty = true
	return uint32(len(data)), 0
}

func (h *groupHandle) truncate(size uint64) syscall.Errno {
	h.mu.Lock()
	defer h.mu.Unlock()
	if size > uint64(h.fs.geo.GroupBytes()) {
		return syscall.EFBIG
	}
	if errno := h.loadLocked(); errno != 0 {
		return errno
	}
	if int(size) < h.size {
		clear(h.buf[size:h.size])
	}
	h.size = int(size)
	h.dirty = true
	return 0
}

// Flush stores the handle's bytes when they changed: exactly one group's
// bytes are stored durably before close(2) returns; any other total size
// stores nothing and close(2) fails with EINVAL (EFBIG after a write past
// the group).
func (h *groupHandle) Flush(ctx context.Context) syscall.Errno {
	if !h.write {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.storeLocked()
}

func (h *groupHandle) storeLocked() syscall.Errno {
	f := h.fs
	if h.failed != 0 {
		f.m.rejected.Add(1)
		return h.failed
	}
	if !h.dirty {
		return 0
	}
	if h.size != f.geo.GroupBytes() {
		f.m.rejected.Add(1)
		return syscall.EINVAL // Release logs it, once the file is closed for good
	}
	reqs := []store.WriteReq{{Key: h.key, Data: h.buf}}
	err := f.io.Write(reqs)
	if err == nil {
		err = reqs[0].Err
	}
	if err != nil {
		return f.toErrno("store", err)
	}
	h.dirty = false
	h.snap = nil
	f.m.stored.Add(1)
	f.m.storedBytes.Add(uint64(len(h.buf)))
	f.storedGroup(h.key)
	return 0
}

// Fsync stores what Flush would (store.Write is durable when it returns).
func (h *groupHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno {
	if !h.write {
		return 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.storeLocked()
}

// Release ends the handle. A handle closed for good holding other than one
// group's bytes stored nothing: every close(2) of it failed with EINVAL,
// and the log says so once, here (a shell's redirection ignores close's
// error, and a close of a dup'd descriptor flushes before the writes).
func (h *groupHandle) Release(ctx context.Context) syscall.Errno {
	if h.write {
		h.mu.Lock()
		if h.dirty && h.failed == 0 && h.size != h.fs.geo.GroupBytes() {
			h.fs.refuse("close", h.fs.geo.Name(h.key), fmt.Sprintf("the file was closed holding %d bytes, a group %d: a group file is stored only when written whole, so nothing was stored",
				h.size, h.fs.geo.GroupBytes()), syscall.EINVAL)
		}
		h.mu.Unlock()
		f := h.fs
		f.mu.Lock()
		ws := slices.DeleteFunc(f.mu.writers[h.key], func(w *groupHandle) bool { return w == h })
		if len(ws) == 0 {
			delete(f.mu.writers, h.key)
		} else {
			f.mu.writers[h.key] = ws
		}
		f.mu.Unlock()
	}
	h.mu.Lock()
	h.buf, h.snap = nil, nil
	h.mu.Unlock()
	return 0
}
