package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/kvfs/kvfs/layout"
)

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
	if err := f.io.Delete([]layout.Key{k}); err != nil {
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
		return f.refuse("rename", d.pathOf(name), "a group or staged file moves only into a head directory", syscall.EPERM)
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
		return f.refuse("rename", d.pathOf(name), "a group can be renamed only onto K or V (a temporary name would never be stored), not "+newName, syscall.EPERM)
	}
	if dst.layer == d.layer && dst.blk() == d.blk() && dst.head == d.head && name == newName {
		return 0
	}
	return syscall.EXDEV
}
