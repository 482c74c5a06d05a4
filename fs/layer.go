package fs

import (
	"context"
	"sort"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvfs/kvfs/layout"
)

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
		return nil, f.refuse("mkdir", d.pathOf(name), "a layer directory holds only block-<16 lowercase hex digits> directories", syscall.EPERM)
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
		return d.fs.refuse("rename", d.pathOf(name), "a block directory moves only into a layer directory", syscall.EPERM)
	}
	to, err := layout.ParseBlockName(newName)
	if err != nil {
		return d.fs.refuse("rename", d.pathOf(name), "a block directory's new name must be block-<16 lowercase hex digits>, not "+newName, syscall.EPERM)
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
		if err := f.io.RenameBlock(from, to); err != nil {
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
