package fs

import (
	"context"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// rootDir is the mount's root: one layer-<L> directory per layer, and .kvfs/.
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
	return nil, r.fs.refuse("mkdir", name, "the root holds only the layer-<L> directories of the store's geometry and .kvfs", syscall.EPERM)
}
