package fs

import (
	"context"
	"path"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// Directories: what every directory of the tree shares (dirBase: refusals,
// extended attributes, statfs, attributes and entry timeouts).

// dirBase holds what every directory shares: the file system, and refusals
// of every way of creating, linking or renaming that kvfs does not offer.
type dirBase struct {
	gofs.Inode
	fs *FS
}

// pathOf is the path of name in this directory, relative to the mount's
// root, for the log.
func (d *dirBase) pathOf(name string) string { return path.Join(d.Path(nil), name) }

// notInTree refuses a name this directory has no place for: the tree holds
// only layer-<L>/block-<id>/head-<H>/K|V (and the staged names of a head
// directory) and .kvfs/.
func (d *dirBase) notInTree(op, name string) syscall.Errno {
	return d.fs.refuse(op, d.pathOf(name), "kvfs holds only layer-<L>/block-<16 hex>/head-<H>/{K,V}: nothing else can be made here", syscall.EPERM)
}

func (d *dirBase) Symlink(ctx context.Context, target, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, d.fs.refuse("symlink", d.pathOf(name), "kvfs has no symbolic links", syscall.EPERM)
}

func (d *dirBase) Link(ctx context.Context, target gofs.InodeEmbedder, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, d.fs.refuse("link", d.pathOf(name), "kvfs has no hard links", syscall.EPERM)
}

func (d *dirBase) Mknod(ctx context.Context, name string, mode, dev uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, d.fs.refuse("mknod", d.pathOf(name), "kvfs has no device files, FIFOs or sockets", syscall.EPERM)
}

func (d *dirBase) Rename(ctx context.Context, name string, newParent gofs.InodeEmbedder, newName string, flags uint32) syscall.Errno {
	return d.fs.refuse("rename", d.pathOf(name), "nothing in this directory can be renamed", syscall.EPERM)
}

func (d *dirBase) Create(ctx context.Context, name string, flags, mode uint32, out *fuse.EntryOut) (*gofs.Inode, gofs.FileHandle, uint32, syscall.Errno) {
	return nil, nil, 0, d.notInTree("create", name)
}

func (d *dirBase) Mkdir(ctx context.Context, name string, mode uint32, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	return nil, d.notInTree("mkdir", name)
}

func (d *dirBase) Unlink(ctx context.Context, name string) syscall.Errno {
	return d.fs.refuse("unlink", d.pathOf(name), "nothing in this directory can be removed", syscall.EPERM)
}

func (d *dirBase) Rmdir(ctx context.Context, name string) syscall.Errno {
	return d.fs.refuse("rmdir", d.pathOf(name), "nothing in this directory can be removed", syscall.EPERM)
}

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

// xattrReply answers getxattr and listxattr with v: its length alone for a
// size query or a dest too small (ERANGE), else v copied into dest.
func xattrReply[T ~string | ~[]byte](dest []byte, v T) (uint32, syscall.Errno) {
	if len(dest) < len(v) {
		return uint32(len(v)), syscall.ERANGE
	}
	return uint32(copy(dest, v)), 0
}

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
