package fs

import (
	"context"
	"sort"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// dirBase holds what every directory shares: the file system, and refusals
// of every way of creating, linking or renaming that kvfs does not offer.
type dirBase struct {
	gofs.Inode
	fs *FS
}

func (d *dirBase) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirBase) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirBase) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirBase) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return syscall.EPERM
}

func (d *dirBase) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, syscall.EPERM
}

func (d *dirBase) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, syscall.EPERM
}

func (d *dirBase) Unlink(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (d *dirBase) Rmdir(ctx context.Context, name string) syscall.Errno { return syscall.EPERM }

func (d *dirBase) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	// chmod, chown and times are accepted and ignored (nothing is stored).
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	ga, _ := d.EmbeddedInode().Operations().(gofs.NodeGetattrer)
	return ga.Getattr(ctx, fh, out)
}

func (d *dirBase) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return setxattrErrno(attr, false)
}

func (d *dirBase) Removexattr(ctx context.Context, attr string) syscall.Errno { return syscall.ENODATA }

// setxattrErrno is what setxattr answers: kvfs stores no extended
// attributes. On a group (or staged) file, user.kvfs.* are accepted and
// ignored, like chmod: they are computed, and a restore from a backup made
// with cp -a or rsync -X carries them (rsync -aX, mv across layers). Other
// user.* names are EPERM; other namespaces (system.posix_acl_*,
// security.*, trusted.*) EOPNOTSUPP, as a file system without them
// answers, which cp -a, mv and tar accept quietly.
func setxattrErrno(attr string, group bool) syscall.Errno {
	switch {
	case group && strings.HasPrefix(attr, "user.kvfs."):
		return 0
	case strings.HasPrefix(attr, "user."):
		return syscall.EPERM
	}
	return syscall.EOPNOTSUPP
}

// removexattrErrno: removing an attribute a node has (user.kvfs.* of a
// group) is EPERM; any other is absent (ENODATA).
func removexattrErrno(attr string, has bool) syscall.Errno {
	if has {
		return syscall.EPERM
	}
	return syscall.ENODATA
}

func (d *dirBase) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

func (d *dirBase) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) { return 0, 0 }

func (d *dirBase) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	d.fs.statfs(out)
	return 0
}

func (f *FS) statfs(out *fuse.StatfsOut) {
	in := f.st.Info()
	const bs = 4096
	out.Bsize, out.Frsize = bs, bs
	out.Blocks = uint64(in.Slots*in.SlotBytes) / bs
	out.Bfree = uint64(in.FreeSlots*in.SlotBytes) / bs
	out.Bavail = out.Bfree
	out.Files = uint64(in.Slots) * uint64(f.geo.GroupsPerBlock())
	out.Ffree = uint64(in.FreeSlots) * uint64(f.geo.GroupsPerBlock())
	out.NameLen = 255
}

func (f *FS) dirAttr(a *fuse.Attr, ino uint64, mtime time.Time, nlink uint32) {
	a.Ino = ino
	a.Mode = syscall.S_IFDIR | 0o755
	a.Nlink = nlink
	a.Uid, a.Gid = f.uid, f.gid
	a.SetTimes(&mtime, &mtime, &mtime)
}

// staticEntry sets the cache timeouts of a directory that always exists
// and never changes (root, layer-<L>, .kvfs).
func (f *FS) staticEntry(out *fuse.EntryOut) {
	out.SetEntryTimeout(f.opts.EntryTimeout)
	out.SetAttrTimeout(f.opts.EntryTimeout)
}

// dynamicEntry sets the cache timeouts of a head directory or a group: the
// kernel may skip the LOOKUP of the name for EntryTimeout, but asks for
// the attributes every time (timeout 0). Getattr, Open, Readdir and the
// lookups below fail with ENOENT once the block or group is gone, so a
// cached name never makes an evicted block or group look present.
func (f *FS) dynamicEntry(out *fuse.EntryOut) {
	out.SetEntryTimeout(f.opts.EntryTimeout)
}

// renamableEntry sets the cache timeouts of a block directory, a name a
// rename moves in place: none. After rename(2) the kernel keeps the
// moved node under the new name; with no entry timeout it asks again
// (LOOKUP) at the next use of the name, gets the node of what the name
// holds now, and drops the moved one. (A LOOKUP is one round trip that
// asks the store's index, no I/O.)
func (f *FS) renamableEntry(out *fuse.EntryOut) {
	out.SetEntryTimeout(0)
}

func staticOut(f *FS, out *fuse.AttrOut) { out.SetTimeout(f.opts.EntryTimeout) }

// layerRange is the range of group indexes of one layer: K of every head,
// then V of every head.
func (f *FS) layerRange(layer int) (lo, hi int) {
	lo = f.geo.Index(layout.Key{Layer: layer, Kind: layout.K})
	return lo, lo + 2*f.geo.KVHeads
}

func (f *FS) hasLayer(bi store.BlockInfo, layer int) bool {
	lo, hi := f.layerRange(layer)
	for i := lo; i < hi; {
		if i%64 == 0 && hi-i >= 64 {
			if bi.Present[i/64] != 0 {
				return true
			}
			i += 64
			continue
		}
		if bi.Has(i) {
			return true
		}
		i++
	}
	return false
}

// pendingDir is a block directory of one layer that exists without a group
// of that layer in the store (made by mkdir, or left by rm of its last
// group), and the head directories in it that exist without a group.
type pendingDir struct {
	mtime time.Time
	heads map[int]bool
}

// blockDir reports whether directory layer-L/block-B exists: the block has
// a group in the layer, or the directory is pending. mtime is the block's
// latest write (or the pending directory's creation).
func (f *FS) blockDir(layer int, block uint64) (exists bool, groups bool, mtime time.Time) {
	if bi, ok := f.st.Block(block); ok && f.hasLayer(bi, layer) {
		return true, true, bi.MTime
	}
	f.mu.Lock()
	p, ok := f.mu.pending[blockDirKey{layer, block}]
	if ok {
		mtime = p.mtime
	}
	f.mu.Unlock()
	return ok, false, mtime
}

// headGroups reports whether head H of block B has a group (K or V) in
// layer L.
func (f *FS) headGroups(bi store.BlockInfo, layer, head int) bool {
	for _, kind := range []layout.Kind{layout.K, layout.V} {
		if bi.Has(f.geo.Index(layout.Key{Block: bi.ID, Layer: layer, Head: head, Kind: kind})) {
			return true
		}
	}
	return false
}

// headDirExists reports whether layer-L/block-B/head-H exists: it holds a
// group, or it is pending (made by mkdir, or left by rm of its last group).
func (f *FS) headDirExists(layer int, block uint64, head int) (bool, time.Time) {
	if bi, ok := f.st.Block(block); ok && f.headGroups(bi, layer, head) {
		return true, bi.MTime
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.mu.pending[blockDirKey{layer, block}]; ok && p.heads[head] {
		return true, p.mtime
	}
	return false, time.Time{}
}

// pendingHeads lists the pending head directories of a block directory.
func (f *FS) pendingHeads(layer int, block uint64) []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.mu.pending[blockDirKey{layer, block}]
	if !ok {
		return nil
	}
	hs := make([]int, 0, len(p.heads))
	for h := range p.heads {
		hs = append(hs, h)
	}
	return hs
}

// addPendingLocked returns the pending entry of a block directory, making
// it; nil when the set is full.
func (f *FS) addPendingLocked(layer int, block uint64) *pendingDir {
	k := blockDirKey{layer, block}
	if p, ok := f.mu.pending[k]; ok {
		return p
	}
	if len(f.mu.pending) >= f.opts.MaxPending {
		return nil
	}
	p := &pendingDir{mtime: f.opts.Now(), heads: map[int]bool{}}
	f.mu.pending[k] = p
	return p
}

// addPending keeps an empty block directory; false when the set is full.
func (f *FS) addPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addPendingLocked(layer, block) != nil
}

// addPendingHead keeps an empty head directory (and its block directory);
// false when the set is full.
func (f *FS) addPendingHead(layer int, block uint64, head int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.addPendingLocked(layer, block)
	if p == nil {
		return false
	}
	p.heads[head] = true
	return true
}

func (f *FS) dropPendingHead(layer int, block uint64, head int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p, ok := f.mu.pending[blockDirKey{layer, block}]; ok {
		delete(p.heads, head)
	}
}

func (f *FS) dropPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := blockDirKey{layer, block}
	_, ok := f.mu.pending[k]
	delete(f.mu.pending, k)
	return ok
}

// storedGroup forgets the pending state a stored group makes redundant:
// its head directory, and its block directory once no pending head is left.
func (f *FS) storedGroup(k layout.Key) {
	f.mu.Lock()
	defer f.mu.Unlock()
	bk := blockDirKey{k.Layer, k.Block}
	if p, ok := f.mu.pending[bk]; ok {
		delete(p.heads, k.Head)
		if len(p.heads) == 0 {
			delete(f.mu.pending, bk)
		}
	}
}

// movePending moves the pending entries of block from to block to, in
// every layer (after the block was re-keyed in the store).
func (f *FS) movePending(from, to uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, p := range f.mu.pending {
		if k.block != from {
			continue
		}
		delete(f.mu.pending, k)
		nk := blockDirKey{k.layer, to}
		if q, ok := f.mu.pending[nk]; ok {
			for h := range p.heads {
				q.heads[h] = true
			}
			continue
		}
		f.mu.pending[nk] = p
	}
}

// Root ---------------------------------------------------------------------

type rootDir struct{ dirBase }

var (
	_ = (gofs.NodeLookuper)((*rootDir)(nil))
	_ = (gofs.NodeReaddirer)((*rootDir)(nil))
	_ = (gofs.NodeGetattrer)((*rootDir)(nil))
	_ = (gofs.NodeSetattrer)((*rootDir)(nil))
	_ = (gofs.NodeMkdirer)((*rootDir)(nil))
	_ = (gofs.NodeRmdirer)((*rootDir)(nil))
	_ = (gofs.NodeUnlinker)((*rootDir)(nil))
	_ = (gofs.NodeCreater)((*rootDir)(nil))
	_ = (gofs.NodeSymlinker)((*rootDir)(nil))
	_ = (gofs.NodeLinker)((*rootDir)(nil))
	_ = (gofs.NodeMknoder)((*rootDir)(nil))
	_ = (gofs.NodeRenamer)((*rootDir)(nil))
	_ = (gofs.NodeGetxattrer)((*rootDir)(nil))
	_ = (gofs.NodeListxattrer)((*rootDir)(nil))
	_ = (gofs.NodeSetxattrer)((*rootDir)(nil))
	_ = (gofs.NodeRemovexattrer)((*rootDir)(nil))
	_ = (gofs.NodeStatfser)((*rootDir)(nil))
)

const kvfsDirName = ".kvfs"

func (r *rootDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	r.fs.dirAttr(&out.Attr, inoRoot, r.fs.start, uint32(3+r.fs.geo.Layers))
	staticOut(r.fs, out)
	return 0
}

func (r *rootDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := r.fs
	f.m.lookups.Add(1)
	if name == kvfsDirName {
		f.dirAttr(&out.Attr, inoKvfs, f.start, 2)
		f.staticEntry(out)
		return r.NewInode(ctx, &kvfsDir{dirBase{fs: f}}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: inoKvfs}), 0
	}
	l, err := f.geo.ParseLayerName(name)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	ino := uint64(inoLayer0 + l)
	f.dirAttr(&out.Attr, ino, f.start, 2)
	f.staticEntry(out)
	return r.NewInode(ctx, &layerDir{dirBase{fs: f}, l}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

func (r *rootDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := r.fs
	es := make([]fuse.DirEntry, 0, f.geo.Layers+1)
	es = append(es, fuse.DirEntry{Name: kvfsDirName, Mode: syscall.S_IFDIR, Ino: inoKvfs})
	for l := range f.geo.Layers {
		es = append(es, fuse.DirEntry{Name: f.geo.LayerName(l), Mode: syscall.S_IFDIR, Ino: uint64(inoLayer0 + l)})
	}
	return gofs.NewListDirStream(es), 0
}

func (r *rootDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if _, err := r.fs.geo.ParseLayerName(name); err == nil || name == kvfsDirName {
		return nil, syscall.EEXIST
	}
	return nil, syscall.EPERM
}

// Layer --------------------------------------------------------------------

// layerDir is layer-<L>: it lists the blocks having at least one group in
// layer L, and the pending (empty) block directories of the layer.
type layerDir struct {
	dirBase
	layer int
}

var (
	_ = (gofs.NodeLookuper)((*layerDir)(nil))
	_ = (gofs.NodeReaddirer)((*layerDir)(nil))
	_ = (gofs.NodeGetattrer)((*layerDir)(nil))
	_ = (gofs.NodeSetattrer)((*layerDir)(nil))
	_ = (gofs.NodeMkdirer)((*layerDir)(nil))
	_ = (gofs.NodeRmdirer)((*layerDir)(nil))
	_ = (gofs.NodeUnlinker)((*layerDir)(nil))
	_ = (gofs.NodeCreater)((*layerDir)(nil))
	_ = (gofs.NodeSymlinker)((*layerDir)(nil))
	_ = (gofs.NodeLinker)((*layerDir)(nil))
	_ = (gofs.NodeMknoder)((*layerDir)(nil))
	_ = (gofs.NodeRenamer)((*layerDir)(nil))
	_ = (gofs.NodeGetxattrer)((*layerDir)(nil))
	_ = (gofs.NodeListxattrer)((*layerDir)(nil))
	_ = (gofs.NodeStatfser)((*layerDir)(nil))
)

func (d *layerDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fs.dirAttr(&out.Attr, uint64(inoLayer0+d.layer), d.fs.start, 2)
	staticOut(d.fs, out)
	return 0
}

func (d *layerDir) blockInode(ctx context.Context, block uint64, mtime time.Time, out *fuse.EntryOut) *gofs.Inode {
	f := d.fs
	ino := inoBlockDir(d.layer, block)
	f.dirAttr(&out.Attr, ino, mtime, uint32(2+f.geo.KVHeads))
	f.renamableEntry(out)
	return d.NewInode(ctx, &blockDir{dirBase: dirBase{fs: f}, layer: d.layer, block: block}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
}

func (d *layerDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	b, err := layout.ParseBlockName(name)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	ok, _, mtime := f.blockDir(d.layer, b)
	if !ok {
		return nil, syscall.ENOENT
	}
	return d.blockInode(ctx, b, mtime, out), 0
}

func (d *layerDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fs
	var ids []uint64
	for _, bi := range f.st.Blocks() {
		if f.hasLayer(bi, d.layer) {
			ids = append(ids, bi.ID)
		}
	}
	f.mu.Lock()
	for k := range f.mu.pending {
		if k.layer == d.layer {
			ids = append(ids, k.block)
		}
	}
	f.mu.Unlock()
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	es := make([]fuse.DirEntry, 0, len(ids))
	for i, id := range ids {
		if i > 0 && ids[i-1] == id {
			continue
		}
		es = append(es, fuse.DirEntry{Name: layout.BlockName(id), Mode: syscall.S_IFDIR, Ino: inoBlockDir(d.layer, id)})
	}
	return gofs.NewListDirStream(es), 0
}

// Mkdir of block-<id> makes a pending block directory: it lives in memory
// only, until a group is written into it (the block then exists in the
// store) or it is removed.
func (d *layerDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	b, err := layout.ParseBlockName(name)
	if err != nil {
		return nil, syscall.EPERM
	}
	if ok, _, _ := f.blockDir(d.layer, b); ok {
		return nil, syscall.EEXIST
	}
	if !f.addPending(d.layer, b) {
		return nil, syscall.ENOSPC
	}
	return d.blockInode(ctx, b, f.opts.Now(), out), 0
}

// Rmdir of block-<id> removes an empty block directory (ENOTEMPTY while the
// block has groups in this layer or head directories).
func (d *layerDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	b, err := layout.ParseBlockName(name)
	if err != nil {
		return syscall.ENOENT
	}
	ok, groups, _ := f.blockDir(d.layer, b)
	switch {
	case groups || len(f.pendingHeads(d.layer, b)) > 0:
		return syscall.ENOTEMPTY
	case !ok:
		return syscall.ENOENT
	}
	f.dropPending(d.layer, b)
	return 0
}

// checkRenameFlags refuses what kvfs does not do: RENAME_EXCHANGE and
// RENAME_WHITEOUT (EINVAL). It reports RENAME_NOREPLACE.
func checkRenameFlags(flags uint32) (noReplace bool, errno syscall.Errno) {
	const noreplace, exchange, whiteout = 1, 2, 4
	if flags&(exchange|whiteout) != 0 || flags&^(noreplace|exchange|whiteout) != 0 {
		return false, syscall.EINVAL
	}
	return flags&noreplace != 0, 0
}

// Rename of block-<A> to block-<B> in the same layer re-keys the block in
// the store (store.RenameBlock: one header write, no payload moved). A
// block holds every layer, so it moves in every layer. It is refused with
// ENOTEMPTY when B is a block already (in any layer), and a move to another
// layer is EXDEV, so mv falls back to copying and deleting. A block
// directory without groups (pending) moves in this layer only.
func (d *layerDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := d.fs
	noReplace, errno := checkRenameFlags(flags)
	if errno != 0 {
		return errno
	}
	from, err := layout.ParseBlockName(name)
	if err != nil {
		return syscall.ENOENT
	}
	dst, ok := newParent.(*layerDir)
	if !ok {
		return syscall.EPERM
	}
	to, err := layout.ParseBlockName(newName)
	if err != nil {
		return syscall.EPERM
	}
	exists, groups, _ := f.blockDir(d.layer, from)
	if !exists {
		return syscall.ENOENT
	}
	if dst.layer != d.layer {
		return syscall.EXDEV
	}
	if from == to {
		return 0
	}
	toExists, toGroups, _ := f.blockDir(d.layer, to)
	_, toStored := f.st.Block(to)
	switch {
	case toExists && noReplace:
		return syscall.EEXIST
	case toStored && groups:
		// A block holds every layer: B is a non-empty block even where
		// this layer shows no directory. (Not EEXIST: with RENAME_NOREPLACE
		// mv reads that as "the name exists here" and says so wrongly.)
		return syscall.ENOTEMPTY
	case toGroups || len(f.pendingHeads(d.layer, to)) > 0:
		return syscall.ENOTEMPTY
	}
	if groups {
		if err := f.st.RenameBlock(from, to); err != nil {
			return f.toErrno("rename", err)
		}
		f.dropPending(d.layer, to)
		f.movePending(from, to)
	} else {
		// Only a pending directory of this layer: move it.
		f.mu.Lock()
		p, ok := f.mu.pending[blockDirKey{d.layer, from}]
		if ok {
			delete(f.mu.pending, blockDirKey{d.layer, from})
			f.mu.pending[blockDirKey{d.layer, to}] = p
		}
		f.mu.Unlock()
		if !ok {
			return syscall.ENOENT
		}
	}
	f.m.renames.Add(1)
	return 0
}

// Block --------------------------------------------------------------------

// blockDir is layer-<L>/block-<id>: it lists every head.
type blockDir struct {
	dirBase
	layer int
	block uint64
}

func (d *blockDir) id() uint64 { return d.block }

var (
	_ = (gofs.NodeLookuper)((*blockDir)(nil))
	_ = (gofs.NodeReaddirer)((*blockDir)(nil))
	_ = (gofs.NodeGetattrer)((*blockDir)(nil))
	_ = (gofs.NodeSetattrer)((*blockDir)(nil))
	_ = (gofs.NodeMkdirer)((*blockDir)(nil))
	_ = (gofs.NodeRmdirer)((*blockDir)(nil))
	_ = (gofs.NodeUnlinker)((*blockDir)(nil))
	_ = (gofs.NodeCreater)((*blockDir)(nil))
	_ = (gofs.NodeSymlinker)((*blockDir)(nil))
	_ = (gofs.NodeLinker)((*blockDir)(nil))
	_ = (gofs.NodeMknoder)((*blockDir)(nil))
	_ = (gofs.NodeRenamer)((*blockDir)(nil))
	_ = (gofs.NodeGetxattrer)((*blockDir)(nil))
	_ = (gofs.NodeListxattrer)((*blockDir)(nil))
	_ = (gofs.NodeStatfser)((*blockDir)(nil))
)

func (d *blockDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := d.fs
	ok, _, mtime := f.blockDir(d.layer, d.id())
	if !ok {
		return syscall.ENOENT
	}
	f.dirAttr(&out.Attr, inoBlockDir(d.layer, d.id()), mtime, uint32(2+f.geo.KVHeads))
	return 0
}

func (d *blockDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	h, err := f.geo.ParseHeadName(name)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	ok, mtime := f.headDirExists(d.layer, d.id(), h)
	if !ok {
		return nil, syscall.ENOENT
	}
	return d.headInode(ctx, h, mtime, out), 0
}

func (d *blockDir) headInode(ctx context.Context, h int, mtime time.Time, out *fuse.EntryOut) *gofs.Inode {
	f := d.fs
	ino := inoHeadDir(d.layer, d.id(), h)
	f.dirAttr(&out.Attr, ino, mtime, 2)
	f.dynamicEntry(out)
	return d.NewInode(ctx, &headDir{dirBase: dirBase{fs: f}, layer: d.layer, block: d.id(), head: h}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
}

// Readdir lists the heads that have a group in this layer, and the pending
// head directories.
func (d *blockDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fs
	if ok, _, _ := f.blockDir(d.layer, d.id()); !ok {
		return nil, syscall.ENOENT
	}
	heads := make([]bool, f.geo.KVHeads)
	if bi, ok := f.st.Block(d.id()); ok {
		for h := range f.geo.KVHeads {
			heads[h] = f.headGroups(bi, d.layer, h)
		}
	}
	for _, h := range f.pendingHeads(d.layer, d.id()) {
		heads[h] = true
	}
	var es []fuse.DirEntry
	for h, ok := range heads {
		if ok {
			es = append(es, fuse.DirEntry{Name: f.geo.HeadName(h), Mode: syscall.S_IFDIR, Ino: inoHeadDir(d.layer, d.id(), h)})
		}
	}
	return gofs.NewListDirStream(es), 0
}

// Mkdir of head-<H> makes a pending head directory (in memory, until a
// group is written into it, rmdir or unmount); EEXIST when it exists.
func (d *blockDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	h, err := f.geo.ParseHeadName(name)
	if err != nil {
		return nil, syscall.EPERM
	}
	if ok, _, _ := f.blockDir(d.layer, d.id()); !ok {
		return nil, syscall.ENOENT
	}
	if ok, _ := f.headDirExists(d.layer, d.id(), h); ok {
		return nil, syscall.EEXIST
	}
	if !f.addPendingHead(d.layer, d.id(), h) {
		return nil, syscall.ENOSPC
	}
	return d.headInode(ctx, h, f.opts.Now(), out), 0
}

// Rmdir of head-<H> succeeds once the head has no group in this layer and
// no staged file (rm -r removes them first); the directory is then gone.
func (d *blockDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	h, err := f.geo.ParseHeadName(name)
	if err != nil {
		return syscall.ENOENT
	}
	if bi, ok := f.st.Block(d.id()); ok && f.headGroups(bi, d.layer, h) {
		return syscall.ENOTEMPTY
	}
	if f.hasStaged(d.layer, d.id(), h) {
		return syscall.ENOTEMPTY
	}
	if ok, _ := f.headDirExists(d.layer, d.id(), h); !ok {
		return syscall.ENOENT
	}
	f.dropPendingHead(d.layer, d.id(), h)
	return 0
}

// Rename of a head directory is EXDEV (mv copies and deletes instead).
func (d *blockDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	if _, errno := checkRenameFlags(flags); errno != 0 {
		return errno
	}
	h, err := d.fs.geo.ParseHeadName(name)
	if err != nil {
		return syscall.ENOENT
	}
	if ok, _ := d.fs.headDirExists(d.layer, d.id(), h); !ok {
		return syscall.ENOENT
	}
	if _, ok := newParent.(*blockDir); !ok {
		return syscall.EPERM
	}
	if _, err := d.fs.geo.ParseHeadName(newName); err != nil {
		return syscall.EPERM
	}
	return syscall.EXDEV
}

// Head ---------------------------------------------------------------------

// headDir is layer-<L>/block-<id>/head-<H>: it lists the groups present, K
// and V, and is where groups are created and removed.
type headDir struct {
	dirBase
	layer int
	block uint64
	head  int
}

func (d *headDir) blk() uint64 { return d.block }

var (
	_ = (gofs.NodeLookuper)((*headDir)(nil))
	_ = (gofs.NodeReaddirer)((*headDir)(nil))
	_ = (gofs.NodeGetattrer)((*headDir)(nil))
	_ = (gofs.NodeSetattrer)((*headDir)(nil))
	_ = (gofs.NodeMkdirer)((*headDir)(nil))
	_ = (gofs.NodeRmdirer)((*headDir)(nil))
	_ = (gofs.NodeUnlinker)((*headDir)(nil))
	_ = (gofs.NodeCreater)((*headDir)(nil))
	_ = (gofs.NodeSymlinker)((*headDir)(nil))
	_ = (gofs.NodeLinker)((*headDir)(nil))
	_ = (gofs.NodeMknoder)((*headDir)(nil))
	_ = (gofs.NodeRenamer)((*headDir)(nil))
	_ = (gofs.NodeGetxattrer)((*headDir)(nil))
	_ = (gofs.NodeListxattrer)((*headDir)(nil))
	_ = (gofs.NodeStatfser)((*headDir)(nil))
)

func (d *headDir) key(kind layout.Kind) layout.Key {
	return layout.Key{Block: d.blk(), Layer: d.layer, Head: d.head, Kind: kind}
}

func (d *headDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := d.fs
	ok, mtime := f.headDirExists(d.layer, d.blk(), d.head)
	if !ok {
		return syscall.ENOENT
	}
	f.dirAttr(&out.Attr, inoHeadDir(d.layer, d.blk(), d.head), mtime, 2)
	return 0
}

// parseKind accepts exactly the canonical names K and V.
func parseKind(name string) (layout.Kind, bool) {
	switch name {
	case "K":
		return layout.K, true
	case "V":
		return layout.V, true
	}
	return 0, false
}

func (d *headDir) stagedKey(name string) stagedKey {
	return stagedKey{d.layer, d.blk(), d.head, name}
}

// groupInode returns the node of group k.
func (d *headDir) groupInode(ctx context.Context, k layout.Key) *gofs.Inode {
	f := d.fs
	return d.NewInode(ctx, &groupFile{fs: f, key: k}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: inoGroup(f.geo, k)})
}

func (d *headDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	kind, ok := parseKind(name)
	if !ok {
		return f.lookupStaged(ctx, d, name, out)
	}
	k := d.key(kind)
	gi, err := f.st.Stat(k)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	f.groupAttr(&out.Attr, k, gi.MTime, int64(gi.Size))
	f.dynamicEntry(out)
	return d.groupInode(ctx, k), 0
}

func (d *headDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fs
	var es []fuse.DirEntry
	if bi, ok := f.st.Block(d.blk()); ok {
		for _, kind := range []layout.Kind{layout.K, layout.V} {
			k := d.key(kind)
			if bi.Has(f.geo.Index(k)) {
				es = append(es, fuse.DirEntry{Name: kind.String(), Mode: syscall.S_IFREG, Ino: inoGroup(f.geo, k)})
			}
		}
	}
	es = append(es, f.stagedEntries(d.layer, d.blk(), d.head)...)
	return gofs.NewListDirStream(es), 0
}

// Create of K or V opens a write handle; the group is stored when the file
// is closed (see groupHandle.Flush). Any other name makes a staged file
// (staged.go): bytes held in memory until a rename onto K or V stores them.
func (d *headDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	f := d.fs
	kind, ok := parseKind(name)
	if !ok {
		return f.createStaged(ctx, d, name, flags, out)
	}
	k := d.key(kind)
	gi, err := f.st.Stat(k)
	switch {
	case err == nil && flags&syscall.O_EXCL != 0:
		return nil, nil, 0, syscall.EEXIST
	case err == nil:
		f.groupAttr(&out.Attr, k, gi.MTime, int64(gi.Size))
	default:
		f.groupAttr(&out.Attr, k, f.opts.Now(), 0)
	}
	h := f.newHandle(k, flags)
	return d.groupInode(ctx, k), h, f.groupOpenFlags(flags), 0
}

// Unlink of K or V deletes the group, durably; of a staged name, drops it.
// A head or block directory emptied this way stays (pending) until it is
// removed with rmdir, as any directory would, so that rm -r can finish
// with its rmdir.
func (d *headDir) Unlink(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	kind, ok := parseKind(name)
	if !ok {
		if !f.dropStagedName(d.stagedKey(name)) {
			return syscall.ENOENT
		}
		return 0
	}
	k := d.key(kind)
	if err := f.st.Delete([]layout.Key{k}); err != nil {
		return f.toErrno("unlink", err)
	}
	f.m.deletes.Add(1)
	if bi, ok := f.st.Block(d.blk()); !ok || !f.headGroups(bi, d.layer, d.head) {
		f.addPendingHead(d.layer, d.blk(), d.head)
	}
	return 0
}

// Rename, with both names in head directories:
//   - a staged file onto K or V stores it as that group (its size must be
//     the group size: ERANGE otherwise, EFBIG after a write past it), in
//     any head directory; onto another temporary name it is renamed;
//   - a group onto K or V (the other kind of its head, or another head,
//     layer or block) is EXDEV: mv copies the group's bytes (one group,
//     through the write path) and deletes the old one, as across file
//     systems. (Renaming in place would leave the kernel's cached entry of
//     the new name on the old group's node for up to EntryTimeout; group
//     names are cached because every file open walks them.)
//   - a group onto a temporary name is EPERM (the bytes would go to a
//     staged file, which is never stored).
func (d *headDir) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	f := d.fs
	noReplace, errno := checkRenameFlags(flags)
	if errno != 0 {
		return errno
	}
	dst, ok := newParent.(*headDir)
	if !ok {
		return syscall.EPERM
	}
	srcKind, srcGroup := parseKind(name)
	_, dstGroup := parseKind(newName)
	if !srcGroup {
		return f.renameStaged(d, name, dst, newName, noReplace)
	}
	if _, err := f.st.Stat(d.key(srcKind)); err != nil {
		return f.toErrno("rename", err)
	}
	if !dstGroup {
		return syscall.EPERM
	}
	if dst.layer == d.layer && dst.blk() == d.blk() && dst.head == d.head && name == newName {
		return 0
	}
	return syscall.EXDEV
}
