package fs

import (
	"context"
	"sort"
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
	if errno := d.fs.checkOwnership(in, 0o755); errno != 0 {
		return errno
	}
	if _, ok := in.GetSize(); ok {
		return syscall.EISDIR
	}
	ga, _ := d.EmbeddedInode().Operations().(gofs.NodeGetattrer)
	return ga.Getattr(ctx, fh, out)
}

func (d *dirBase) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EPERM
}

func (d *dirBase) Removexattr(ctx context.Context, attr string) syscall.Errno { return syscall.EPERM }

func (d *dirBase) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

func (d *dirBase) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) { return 0, 0 }

func (d *dirBase) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	d.fs.statfs(out)
	return 0
}

// checkOwnership accepts a change of mode, owner or group only when it
// changes nothing (cp -p, rsync -a); times are accepted and ignored.
func (f *FS) checkOwnership(in *fuse.SetAttrIn, perm uint32) syscall.Errno {
	if m, ok := in.GetMode(); ok && m != perm {
		return syscall.EPERM
	}
	if u, ok := in.GetUID(); ok && u != f.uid {
		return syscall.EPERM
	}
	if g, ok := in.GetGID(); ok && g != f.gid {
		return syscall.EPERM
	}
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

// dynamicEntry sets the cache timeouts of a block or head directory or of
// a group: the kernel may skip the LOOKUP of the name for EntryTimeout, but
// asks for the attributes every time (timeout 0). Getattr, Open, Readdir
// and the lookups below fail with ENOENT once the block or group is gone,
// so a cached name never makes an evicted block or group look present.
func (f *FS) dynamicEntry(out *fuse.EntryOut) {
	out.SetEntryTimeout(f.opts.EntryTimeout)
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

// blockDir reports whether directory layer-L/block-B exists: the block has
// a group in the layer, or the directory is pending. mtime is the block's
// latest write (or the pending directory's creation).
func (f *FS) blockDir(layer int, block uint64) (exists bool, groups bool, mtime time.Time) {
	if bi, ok := f.st.Block(block); ok && f.hasLayer(bi, layer) {
		return true, true, bi.MTime
	}
	f.mu.Lock()
	t, ok := f.mu.pending[blockDirKey{layer, block}]
	f.mu.Unlock()
	return ok, false, t
}

// addPending keeps an empty block directory; false when the set is full.
func (f *FS) addPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := blockDirKey{layer, block}
	if _, ok := f.mu.pending[k]; ok {
		return true
	}
	if len(f.mu.pending) >= f.opts.MaxPending {
		return false
	}
	f.mu.pending[k] = f.opts.Now()
	return true
}

func (f *FS) dropPending(layer int, block uint64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := blockDirKey{layer, block}
	_, ok := f.mu.pending[k]
	delete(f.mu.pending, k)
	return ok
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
	f.dynamicEntry(out)
	return d.NewInode(ctx, &blockDir{dirBase{fs: f}, d.layer, block}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino})
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
// block has groups in this layer).
func (d *layerDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	b, err := layout.ParseBlockName(name)
	if err != nil {
		return syscall.ENOENT
	}
	ok, groups, _ := f.blockDir(d.layer, b)
	switch {
	case groups:
		return syscall.ENOTEMPTY
	case !ok:
		return syscall.ENOENT
	}
	f.dropPending(d.layer, b)
	return 0
}

// Block --------------------------------------------------------------------

// blockDir is layer-<L>/block-<id>: it lists every head.
type blockDir struct {
	dirBase
	layer int
	block uint64
}

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
	ok, _, mtime := f.blockDir(d.layer, d.block)
	if !ok {
		return syscall.ENOENT
	}
	f.dirAttr(&out.Attr, inoBlockDir(d.layer, d.block), mtime, uint32(2+f.geo.KVHeads))
	return 0
}

func (d *blockDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	h, err := f.geo.ParseHeadName(name)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	ok, _, mtime := f.blockDir(d.layer, d.block)
	if !ok {
		return nil, syscall.ENOENT
	}
	ino := inoHeadDir(d.layer, d.block, h)
	f.dirAttr(&out.Attr, ino, mtime, 2)
	f.dynamicEntry(out)
	return d.NewInode(ctx, &headDir{dirBase{fs: f}, d.layer, d.block, h}, gofs.StableAttr{Mode: syscall.S_IFDIR, Ino: ino}), 0
}

func (d *blockDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fs
	if ok, _, _ := f.blockDir(d.layer, d.block); !ok {
		return nil, syscall.ENOENT
	}
	es := make([]fuse.DirEntry, 0, f.geo.KVHeads)
	for h := range f.geo.KVHeads {
		es = append(es, fuse.DirEntry{Name: f.geo.HeadName(h), Mode: syscall.S_IFDIR, Ino: inoHeadDir(d.layer, d.block, h)})
	}
	return gofs.NewListDirStream(es), 0
}

func (d *blockDir) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	if _, err := d.fs.geo.ParseHeadName(name); err != nil {
		return nil, syscall.EPERM
	}
	if ok, _, _ := d.fs.blockDir(d.layer, d.block); !ok {
		return nil, syscall.ENOENT
	}
	return nil, syscall.EEXIST
}

// Rmdir of head-<H> succeeds once the head has no group in this layer (rm -r
// removes the groups first); the directory stays listed as long as the
// block directory exists, since a block directory lists every head.
func (d *blockDir) Rmdir(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	h, err := f.geo.ParseHeadName(name)
	if err != nil {
		return syscall.ENOENT
	}
	bi, ok := f.st.Block(d.block)
	if ok {
		for _, kind := range []layout.Kind{layout.K, layout.V} {
			if bi.Has(f.geo.Index(layout.Key{Block: d.block, Layer: d.layer, Head: h, Kind: kind})) {
				return syscall.ENOTEMPTY
			}
		}
	}
	if ok, _, _ := f.blockDir(d.layer, d.block); !ok {
		return syscall.ENOENT
	}
	return 0
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
	return layout.Key{Block: d.block, Layer: d.layer, Head: d.head, Kind: kind}
}

func (d *headDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := d.fs
	ok, _, mtime := f.blockDir(d.layer, d.block)
	if !ok {
		return syscall.ENOENT
	}
	f.dirAttr(&out.Attr, inoHeadDir(d.layer, d.block, d.head), mtime, 2)
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

func (d *headDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	kind, ok := parseKind(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	k := d.key(kind)
	gi, err := f.st.Stat(k)
	if err != nil {
		return nil, f.toErrno("lookup", err)
	}
	f.groupAttr(&out.Attr, k, gi.MTime, int64(gi.Size))
	f.dynamicEntry(out)
	return d.NewInode(ctx, &groupFile{fs: f, key: k}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: inoGroup(f.geo, k)}), 0
}

func (d *headDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	f := d.fs
	var es []fuse.DirEntry
	if bi, ok := f.st.Block(d.block); ok {
		for _, kind := range []layout.Kind{layout.K, layout.V} {
			k := d.key(kind)
			if bi.Has(f.geo.Index(k)) {
				es = append(es, fuse.DirEntry{Name: kind.String(), Mode: syscall.S_IFREG, Ino: inoGroup(f.geo, k)})
			}
		}
	}
	return gofs.NewListDirStream(es), 0
}

// Create of K or V opens a write handle; the group is stored when the file
// is closed (see groupHandle.Flush). Any other name: EPERM.
func (d *headDir) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	f := d.fs
	kind, ok := parseKind(name)
	if !ok {
		return nil, nil, 0, syscall.EPERM
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
	node := d.NewInode(ctx, &groupFile{fs: f, key: k}, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: inoGroup(f.geo, k)})
	return node, h, f.groupOpenFlags(flags), 0
}

// Unlink of K or V deletes the group, durably. A block directory emptied
// this way stays (empty, pending) until it is removed with rmdir, as any
// directory would, so that rm -r can finish with its rmdir.
func (d *headDir) Unlink(ctx context.Context, name string) syscall.Errno {
	f := d.fs
	kind, ok := parseKind(name)
	if !ok {
		return syscall.ENOENT
	}
	k := d.key(kind)
	if err := f.st.Delete([]layout.Key{k}); err != nil {
		return f.toErrno("unlink", err)
	}
	f.m.deletes.Add(1)
	if ok, _, _ := f.blockDir(d.layer, d.block); !ok {
		f.addPending(d.layer, d.block)
	}
	return 0
}
