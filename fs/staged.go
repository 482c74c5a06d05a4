package fs

import (
	"context"
	"sort"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// Staged files.
//
// Tools write a file under a temporary name and rename it into place
// (rsync's ".K.XXXXXX", editors, installers). Creating any name other than
// K or V in a head directory makes a staged file: a buffer of at most one
// group, in memory only, never stored by itself. Renaming it onto K or V
// (of any head directory) stores its bytes as that group, with the same
// checks as a close of K or V: exactly the group size, else the rename
// fails with ERANGE ("Numerical result out of range"; not EINVAL, which mv
// reports as moving a directory into itself), and a write past the group
// failed with EFBIG already (the rename fails with EFBIG too). Nothing is
// stored then, and the staged file stays until removed or expired. A staged file that is never renamed disappears: unlink drops
// it, and so does its last close, after Options.StageLinger (5 s; rsync
// closes its temporary file and then renames it), or unmount. At most
// Options.MaxStaged are held at once (ENOSPC beyond).

// stagedKey names a staged file: a head directory and a name in it.
type stagedKey struct {
	layer int
	block uint64
	head  int
	name  string
}

// staged is one staged file. key, opens, timer and gone are guarded by
// FS.mu; the bytes by mu (taken before FS.mu, and held across the store
// call of a commit).
type staged struct {
	ino uint64

	key   stagedKey
	opens int
	timer *time.Timer
	gone  bool // no longer in FS.mu.staged: renamed onto a group, unlinked or expired

	mu        sync.Mutex
	buf       []byte // GroupBytes long once written
	size      int
	failed    syscall.Errno
	mtime     time.Time
	committed *layout.Key // the group it was stored as
}

func (f *FS) stagedAttr(a *fuse.Attr, st *staged) {
	st.mu.Lock()
	size, mtime := st.size, st.mtime
	st.mu.Unlock()
	a.Ino = st.ino
	a.Mode = syscall.S_IFREG | 0o644
	a.Nlink = 1
	a.Size = uint64(size)
	a.Uid, a.Gid = f.uid, f.gid
	a.Blksize = uint32(min(f.geo.GroupBytes(), MaxWrite))
	a.Blocks = uint64(size+511) / 512
	a.SetTimes(&mtime, &mtime, &mtime)
}

func (f *FS) stagedInode(ctx context.Context, d *headDir, st *staged, out *fuse.EntryOut) *gofs.Inode {
	f.stagedAttr(&out.Attr, st)
	// Names of staged files are not cached: they come and go, and a
	// rename turns one into a group.
	out.SetEntryTimeout(0)
	out.SetAttrTimeout(0)
	return d.NewInode(ctx, &stagedFile{fs: f, st: st}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: st.ino})
}

func (f *FS) lookupStaged(ctx context.Context, d *headDir, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f.mu.Lock()
	st, ok := f.mu.staged[d.stagedKey(name)]
	f.mu.Unlock()
	if !ok {
		return nil, syscall.ENOENT
	}
	return f.stagedInode(ctx, d, st, out), 0
}

// stagedEntries lists the staged files of a head directory.
func (f *FS) stagedEntries(layer int, block uint64, head int) []fuse.DirEntry {
	f.mu.Lock()
	var es []fuse.DirEntry
	for k, st := range f.mu.staged {
		if k.layer == layer && k.block == block && k.head == head {
			es = append(es, fuse.DirEntry{Name: k.name, Mode: syscall.S_IFREG, Ino: st.ino})
		}
	}
	f.mu.Unlock()
	sort.Slice(es, func(i, j int) bool { return es[i].Name < es[j].Name })
	return es
}

func (f *FS) hasStaged(layer int, block uint64, head int) bool {
	return len(f.stagedEntries(layer, block, head)) > 0
}

// createStaged makes (or, without O_EXCL, opens) the staged file name.
func (f *FS) createStaged(ctx context.Context, d *headDir, name string, flags uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	if ok, _ := f.headDirExists(d.layer, d.blk(), d.head); !ok {
		return nil, nil, 0, syscall.ENOENT
	}
	k := d.stagedKey(name)
	f.mu.Lock()
	st, ok := f.mu.staged[k]
	switch {
	case ok && flags&syscall.O_EXCL != 0:
		f.mu.Unlock()
		return nil, nil, 0, syscall.EEXIST
	case !ok && len(f.mu.staged) >= f.opts.MaxStaged:
		f.mu.Unlock()
		return nil, nil, 0, syscall.ENOSPC
	case !ok:
		f.mu.stagedN++
		st = &staged{ino: hashIno(tagStaged, f.mu.stagedN, 0, 0), key: k, mtime: f.opts.Now()}
		f.mu.staged[k] = st
	}
	f.openStagedLocked(st)
	f.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 {
		st.truncate(0, f.geo.GroupBytes())
	}
	return f.stagedInode(ctx, d, st, out), &stagedHandle{fs: f, st: st}, fuse.FOPEN_DIRECT_IO, 0
}

// openStagedLocked counts an open handle: the file does not expire while
// one is open.
func (f *FS) openStagedLocked(st *staged) {
	st.opens++
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// releaseStaged drops an open handle; at the last one the file expires
// after StageLinger unless it is opened or renamed meanwhile.
func (f *FS) releaseStaged(st *staged) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st.opens--
	if st.opens > 0 || st.gone {
		return
	}
	if f.opts.StageLinger <= 0 {
		f.dropStagedLocked(st)
		return
	}
	st.timer = time.AfterFunc(f.opts.StageLinger, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if st.opens == 0 {
			f.dropStagedLocked(st)
		}
	})
}

func (f *FS) dropStagedLocked(st *staged) {
	if st.gone {
		return
	}
	st.gone = true
	if f.mu.staged[st.key] == st {
		delete(f.mu.staged, st.key)
	}
	if st.timer != nil {
		st.timer.Stop()
		st.timer = nil
	}
}

// dropStagedName drops the staged file k (unlink); false when there is none.
func (f *FS) dropStagedName(k stagedKey) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.mu.staged[k]
	if ok {
		f.dropStagedLocked(st)
	}
	return ok
}

// renameStaged renames the staged file name of src onto newName in dst:
// onto K or V it is stored as that group; onto another name it is renamed.
func (f *FS) renameStaged(src *headDir, name string, dst *headDir, newName string, noReplace bool) syscall.Errno {
	f.mu.Lock()
	st, ok := f.mu.staged[src.stagedKey(name)]
	f.mu.Unlock()
	if !ok {
		return syscall.ENOENT
	}
	if kind, isGroup := parseKind(newName); isGroup {
		k := dst.key(kind)
		if _, err := f.st.Stat(k); err == nil && noReplace {
			return syscall.EEXIST
		}
		if errno := f.commitStaged(st, k); errno != 0 {
			return errno
		}
		f.m.renames.Add(1)
		return 0
	}
	nk := dst.stagedKey(newName)
	f.mu.Lock()
	defer f.mu.Unlock()
	if st.gone {
		return syscall.ENOENT
	}
	if old, ok := f.mu.staged[nk]; ok && old != st {
		if noReplace {
			return syscall.EEXIST
		}
		f.dropStagedLocked(old)
	}
	delete(f.mu.staged, st.key)
	st.key = nk
	f.mu.staged[nk] = st
	f.m.renames.Add(1)
	return 0
}

// commitStaged stores a staged file's bytes as group k and drops the file.
func (f *FS) commitStaged(st *staged, k layout.Key) syscall.Errno {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.committed != nil {
		return syscall.ENOENT
	}
	if st.failed != 0 {
		f.m.rejected.Add(1)
		return st.failed
	}
	if st.size != f.geo.GroupBytes() {
		// Not EINVAL: mv reads that as "a subdirectory of itself".
		f.m.rejected.Add(1)
		return syscall.ERANGE
	}
	reqs := []store.WriteReq{{Key: k, Data: st.buf}}
	err := f.io.Write(reqs)
	if err == nil {
		err = reqs[0].Err
	}
	if err != nil {
		return f.toErrno("rename", err)
	}
	st.committed = &k
	st.buf = nil
	f.m.stored.Add(1)
	f.m.storedBytes.Add(uint64(f.geo.GroupBytes()))
	f.m.stagedStored.Add(1)
	f.storedGroup(k)
	f.mu.Lock()
	f.dropStagedLocked(st)
	f.mu.Unlock()
	return 0
}

func (st *staged) truncate(size uint64, gb int) syscall.Errno {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.committed != nil {
		return syscall.EBADF
	}
	if size > uint64(gb) {
		return syscall.EFBIG
	}
	if int(size) < st.size {
		clear(st.buf[size:st.size])
	}
	if size > 0 && st.buf == nil {
		st.buf = make([]byte, gb)
	}
	st.size = int(size)
	return 0
}

// committedGroup is the group a staged file was stored as, or nil.
func (st *staged) committedGroup() *layout.Key {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.committed
}

// stagedFile is the node of a staged file. Once the file is stored as a
// group (renamed onto K or V), the node answers for that group until the
// kernel looks the name up again.
type stagedFile struct {
	gofs.Inode
	fs *FS
	st *staged
}

var (
	_ = (gofs.NodeGetattrer)((*stagedFile)(nil))
	_ = (gofs.NodeSetattrer)((*stagedFile)(nil))
	_ = (gofs.NodeOpener)((*stagedFile)(nil))
	_ = (gofs.NodeGetxattrer)((*stagedFile)(nil))
	_ = (gofs.NodeListxattrer)((*stagedFile)(nil))
	_ = (gofs.NodeSetxattrer)((*stagedFile)(nil))
	_ = (gofs.NodeRemovexattrer)((*stagedFile)(nil))
	_ = (gofs.NodeStatfser)((*stagedFile)(nil))
)

// group is the groupFile standing for the group the file was stored as,
// or nil while it is staged.
func (s *stagedFile) group() *groupFile {
	if k := s.st.committedGroup(); k != nil {
		return &groupFile{fs: s.fs, key: *k}
	}
	return nil
}

func (s *stagedFile) alive() bool {
	s.fs.mu.Lock()
	defer s.fs.mu.Unlock()
	return !s.st.gone
}

func (s *stagedFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	if g := s.group(); g != nil {
		return g.Getattr(ctx, nil, out)
	}
	if _, open := fh.(*stagedHandle); !open && !s.alive() {
		return syscall.ENOENT
	}
	s.fs.stagedAttr(&out.Attr, s.st)
	return 0
}

// Setattr: truncate sets the size (at most the group size, EFBIG beyond);
// mode, owner and times are accepted and ignored.
func (s *stagedFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if g := s.group(); g != nil {
		return g.Setattr(ctx, nil, in, out)
	}
	if size, ok := in.GetSize(); ok {
		if errno := s.st.truncate(size, s.fs.geo.GroupBytes()); errno != 0 {
			return errno
		}
	}
	return s.Getattr(ctx, fh, out)
}

func (s *stagedFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if g := s.group(); g != nil {
		return g.Open(ctx, flags)
	}
	f := s.fs
	f.mu.Lock()
	if s.st.gone {
		f.mu.Unlock()
		return nil, 0, syscall.ENOENT
	}
	f.openStagedLocked(s.st)
	f.mu.Unlock()
	if flags&syscall.O_TRUNC != 0 && flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		s.st.truncate(0, f.geo.GroupBytes())
	}
	return &stagedHandle{fs: f, st: s.st}, fuse.FOPEN_DIRECT_IO, 0
}

func (s *stagedFile) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	if g := s.group(); g != nil {
		return g.Getxattr(ctx, attr, dest)
	}
	return 0, syscall.ENODATA
}

func (s *stagedFile) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) {
	if g := s.group(); g != nil {
		return g.Listxattr(ctx, dest)
	}
	return 0, 0
}

func (s *stagedFile) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return setxattrErrno(attr, true)
}

func (s *stagedFile) Removexattr(ctx context.Context, attr string) syscall.Errno {
	return syscall.ENODATA
}

func (s *stagedFile) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	s.fs.statfs(out)
	return 0
}

// stagedHandle is an open staged file.
type stagedHandle struct {
	fs   *FS
	st   *staged
	once sync.Once
}

var (
	_ = (gofs.FileReader)((*stagedHandle)(nil))
	_ = (gofs.FileWriter)((*stagedHandle)(nil))
	_ = (gofs.FileFlusher)((*stagedHandle)(nil))
	_ = (gofs.FileFsyncer)((*stagedHandle)(nil))
	_ = (gofs.FileReleaser)((*stagedHandle)(nil))
	_ = (gofs.FileGetattrer)((*stagedHandle)(nil))
)

func (h *stagedHandle) Getattr(ctx context.Context, out *fuse.AttrOut) syscall.Errno {
	h.fs.stagedAttr(&out.Attr, h.st)
	return 0
}

func (h *stagedHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	st := h.st
	st.mu.Lock()
	defer st.mu.Unlock()
	n := 0
	if off < int64(st.size) {
		n = copy(dest, st.buf[off:st.size])
	}
	return fuse.ReadResultData(dest[:n]), 0
}

func (h *stagedHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	st := h.st
	gb := h.fs.geo.GroupBytes()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.committed != nil {
		return 0, syscall.EBADF
	}
	end := off + int64(len(data))
	if off < 0 || end > int64(gb) {
		// More than a group: this write fails, and so will the rename.
		st.failed = syscall.EFBIG
		return 0, syscall.EFBIG
	}
	if st.buf == nil {
		st.buf = make([]byte, gb)
	}
	copy(st.buf[off:], data)
	st.size = max(st.size, int(end))
	st.mtime = h.fs.opts.Now()
	return uint32(len(data)), 0
}

// Flush and Fsync store nothing: a staged file is stored only by a rename.
func (h *stagedHandle) Flush(ctx context.Context) syscall.Errno { return 0 }

func (h *stagedHandle) Fsync(ctx context.Context, flags uint32) syscall.Errno { return 0 }

func (h *stagedHandle) Release(ctx context.Context) syscall.Errno {
	h.once.Do(func() { h.fs.releaseStaged(h.st) })
	return 0
}
