package fs

import (
	"context"
	"fmt"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

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
		return nil, f.refuse("mkdir", d.pathOf(name), fmt.Sprintf("a block directory holds only head-<H> directories, H below %d (%s to %s)",
			f.geo.KVHeads, f.geo.HeadName(0), f.geo.HeadName(f.geo.KVHeads-1)), syscall.EPERM)
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
		return d.fs.refuse("rename", d.pathOf(name), "a head directory moves only into a block directory", syscall.EPERM)
	}
	if _, err := d.fs.geo.ParseHeadName(newName); err != nil {
		return d.fs.refuse("rename", d.pathOf(name), "a head directory's new name must be head-<H>, not "+newName, syscall.EPERM)
	}
	return syscall.EXDEV
}
