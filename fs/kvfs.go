package fs

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"
)

// kvfsDir is .kvfs/: ctl, stats and geometry.
type kvfsDir struct{ dirBase }

var (
	_ = (gofs.NodeLookuper)((*kvfsDir)(nil))
	_ = (gofs.NodeReaddirer)((*kvfsDir)(nil))
	_ = (gofs.NodeGetattrer)((*kvfsDir)(nil))
	_ = (gofs.NodeCreater)((*kvfsDir)(nil))
	_ = (gofs.NodeMkdirer)((*kvfsDir)(nil))
	_ = (gofs.NodeUnlinker)((*kvfsDir)(nil))
	_ = (gofs.NodeStatfser)((*kvfsDir)(nil))
)

type kvfsEntry struct {
	name string
	ino  uint64
	node func(f *FS) gofs.InodeEmbedder
}

var kvfsEntries = []kvfsEntry{
	{"ctl", inoCtl, func(f *FS) gofs.InodeEmbedder { return &ctlFile{leafBase{fs: f}} }},
	{"geometry", inoGeometry, func(f *FS) gofs.InodeEmbedder {
		return &textFile{leafBase: leafBase{fs: f}, ino: inoGeometry, render: f.geometryJSON}
	}},
	{"stats", inoStats, func(f *FS) gofs.InodeEmbedder {
		return &textFile{leafBase: leafBase{fs: f}, ino: inoStats, render: f.statsJSON}
	}},
}

func (d *kvfsDir) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	d.fs.dirAttr(&out.Attr, inoKvfs, d.fs.start, 2)
	staticOut(d.fs, out)
	return 0
}

func (d *kvfsDir) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*gofs.Inode, syscall.Errno) {
	f := d.fs
	f.m.lookups.Add(1)
	for _, e := range kvfsEntries {
		if e.name != name {
			continue
		}
		node := e.node(f)
		ga := node.(gofs.NodeGetattrer)
		var ao fuse.AttrOut
		ga.Getattr(ctx, nil, &ao)
		out.Attr = ao.Attr
		f.staticEntry(out)
		out.SetAttrTimeout(0)
		return d.NewInode(ctx, node, gofs.StableAttr{Mode: syscall.S_IFREG, Ino: e.ino}), 0
	}
	return nil, syscall.ENOENT
}

func (d *kvfsDir) Readdir(ctx context.Context) (gofs.DirStream, syscall.Errno) {
	es := make([]fuse.DirEntry, 0, len(kvfsEntries))
	for _, e := range kvfsEntries {
		es = append(es, fuse.DirEntry{Name: e.name, Mode: syscall.S_IFREG, Ino: e.ino})
	}
	return gofs.NewListDirStream(es), 0
}

// textFile is a read-only file whose content is rendered at open (stats,
// geometry). Each handle keeps the text it was opened with, so a reader
// sees one consistent snapshot however it reads.
type textFile struct {
	leafBase
	ino    uint64
	render func() []byte
}

var (
	_ = (gofs.NodeGetattrer)((*textFile)(nil))
	_ = (gofs.NodeOpener)((*textFile)(nil))
	_ = (gofs.NodeReader)((*textFile)(nil))
	_ = (gofs.NodeSetattrer)((*textFile)(nil))
	_ = (gofs.NodeGetxattrer)((*textFile)(nil))
	_ = (gofs.NodeListxattrer)((*textFile)(nil))
	_ = (gofs.NodeSetxattrer)((*textFile)(nil))
	_ = (gofs.NodeRemovexattrer)((*textFile)(nil))
	_ = (gofs.NodeStatfser)((*textFile)(nil))
)

// leafBase is what the .kvfs files share: no extended attributes, and
// none can be set.
type leafBase struct {
	gofs.Inode
	fs *FS
}

func (l *leafBase) Getxattr(ctx context.Context, attr string, dest []byte) (uint32, syscall.Errno) {
	return 0, syscall.ENODATA
}

func (l *leafBase) Listxattr(ctx context.Context, dest []byte) (uint32, syscall.Errno) { return 0, 0 }

func (l *leafBase) Setxattr(ctx context.Context, attr string, data []byte, flags uint32) syscall.Errno {
	return syscall.EPERM
}

func (l *leafBase) Removexattr(ctx context.Context, attr string) syscall.Errno { return syscall.EPERM }

func (l *leafBase) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	l.fs.statfs(out)
	return 0
}

func (t *textFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := t.fs
	size := len(t.render())
	if h, ok := fh.(*textHandle); ok {
		size = len(h.b)
	}
	now := f.opts.Now()
	out.Ino = t.ino
	out.Mode = syscall.S_IFREG | 0o444
	out.Nlink = 1
	out.Size = uint64(size)
	out.Uid, out.Gid = f.uid, f.gid
	out.SetTimes(&now, &now, &now)
	return 0
}

func (t *textFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	return syscall.EPERM
}

func (t *textFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	if flags&syscall.O_ACCMODE != syscall.O_RDONLY {
		return nil, 0, syscall.EACCES
	}
	return &textHandle{t.render()}, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NOFLUSH, 0
}

// textHandle holds the text a textFile was opened with.
type textHandle struct{ b []byte }

func (t *textFile) Read(ctx context.Context, fh gofs.FileHandle, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	h, ok := fh.(*textHandle)
	if !ok {
		return nil, syscall.EBADF
	}
	b := h.b
	if off >= int64(len(b)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(b[off:min(int64(len(b)), off+int64(len(dest)))]), 0
}

// GeometryFile is the content of .kvfs/geometry, as JSON: the store's
// geometry and layout as the mount serves them. kvfs info of a mounted
// store reads it back.
type GeometryFile struct {
	Layers         int    `json:"layers"`
	KVHeads        int    `json:"kv_heads"`
	HeadDim        int    `json:"head_dim"`
	BlockTokens    int    `json:"block_tokens"`
	DType          string `json:"dtype"`
	Align          int    `json:"align"`
	Shape          string `json:"shape"`
	GroupBytes     int    `json:"group_bytes"`
	GroupStride    int64  `json:"group_stride"`
	GroupsPerBlock int    `json:"groups_per_block"`
	SlotBytes      int64  `json:"slot_bytes"`
	Slots          int64  `json:"slots"`
	UUID           string `json:"uuid"`
	Version        uint32 `json:"format_version"`
	HeaderBytes    int64  `json:"header_bytes"`
	Size           int64  `json:"size"`
	Created        string `json:"created"` // RFC 3339, UTC
}

// geometryJSON renders .kvfs/geometry.
func (f *FS) geometryJSON() []byte {
	in := f.st.Info()
	g := f.geo
	v := GeometryFile{g.Layers, g.KVHeads, g.HeadDim, g.BlockTokens, g.DType.String(), g.Align, g.Shape(),
		g.GroupBytes(), g.GroupStride(), g.GroupsPerBlock(), in.SlotBytes, in.Slots, in.UUID, in.Version,
		in.HeaderBytes, in.Size, in.Created.UTC().Format(time.RFC3339Nano)}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		f.log.Error("fs: geometry", zap.Error(err))
	}
	return append(b, '\n')
}

// b2i is 1 for true, 0 for false: .kvfs/stats holds numbers only, so a
// reader may decode it into a map of numbers.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// statsJSON renders .kvfs/stats: one JSON object of counters and sizes,
// keys in a fixed order (the same convention as .kvfs/geometry; the
// Prometheus text of the same counters is at --metrics-addr's /metrics).
func (f *FS) statsJSON() []byte {
	in := f.st.Info()
	sm := f.st.Metrics()
	fm := f.Metrics()
	blocks := f.st.Blocks()
	groups := 0
	for _, b := range blocks {
		groups += b.Groups
	}
	var sb strings.Builder
	sb.WriteString("{")
	sep := "\n"
	field := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			f.log.Error("fs: stats", zap.String("field", name), zap.Error(err))
			return
		}
		fmt.Fprintf(&sb, "%s  %q: %s", sep, name, b)
		sep = ",\n"
	}
	field("engine", in.Engine)
	field("uuid", in.UUID)
	field("slots", in.Slots)
	field("slots_used", in.UsedSlots)
	field("slots_free", in.FreeSlots)
	field("slot_bytes", in.SlotBytes)
	field("blocks", len(blocks))
	field("groups", groups)
	field("group_bytes", in.GroupBytes)
	field("store_reads", sm.Reads)
	field("store_writes", sm.Writes)
	field("store_bytes_read", sm.BytesRead)
	field("store_bytes_written", sm.BytesWritten)
	field("store_hits", sm.Hits)
	field("store_misses", sm.Misses)
	field("store_evictions", sm.Evictions)
	field("store_corrupt", sm.Corrupt)
	field("store_tag_mismatch", sm.TagMismatch)
	field("store_io_errors", sm.IOErrors)
	// The DRAM tier (zeros without one): hits and misses count groups
	// read, promoted bytes those read from the store into the tier,
	// written bytes those of whole blocks written through it that it
	// kept; huge_pages and registered (1 or 0) say how its memory is held.
	tm := f.opts.Tier.Metrics()
	field("dram_bytes", tm.Bytes)
	field("dram_blocks", tm.Blocks)
	field("dram_hits", tm.Hits)
	field("dram_misses", tm.Misses)
	field("dram_evictions", tm.Evictions)
	field("dram_invalidations", tm.Invalidations)
	field("dram_promoted_bytes", tm.PromotedBytes)
	field("dram_corrupt", tm.Corrupt)
	field("dram_written_bytes", tm.WrittenBytes)
	field("dram_huge_pages", b2i(tm.HugePages))
	field("dram_registered", b2i(tm.Registered))
	field("fs_lookups", fm.Lookups)
	field("fs_opens", fm.Opens)
	field("fs_reads", fm.Reads)
	field("fs_read_bytes", fm.ReadBytes)
	field("fs_stored", fm.Stored)
	field("fs_stored_bytes", fm.StoredBytes)
	field("fs_deletes", fm.Deletes)
	field("fs_rejected", fm.Rejected)
	field("fs_corrupt", fm.Corrupt)
	field("fs_errors", fm.Errors)
	field("fs_panics", fm.Panics)
	field("fs_cache_hits", fm.CacheHits)
	field("fs_cache_misses", fm.CacheMisses)
	field("fs_pending_dirs", fm.PendingDirs)
	field("fs_staged", fm.Staged)
	field("fs_staged_stored", fm.StagedStored)
	field("fs_renames", fm.Renames)
	field("ctl_sessions_open", fm.CtlOpen)
	field("ctl_sessions", fm.CtlSessions)
	field("ctl_ioctls", fm.Ioctls)
	field("uptime_seconds", int64(math.Round(fm.MountSeconds)))
	// The daemon's CPU time (getrusage RUSAGE_SELF, user + system): bench-load
	// reports its difference over a run as cpu_s.
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		us := (ru.Utime.Sec+ru.Stime.Sec)*1e6 + int64(ru.Utime.Usec+ru.Stime.Usec)
		field("daemon_cpu_seconds", float64(us)/1e6)
	}
	sb.WriteString("\n}\n")
	return []byte(sb.String())
}

// ctl ------------------------------------------------------------------------

// ctlFile is .kvfs/ctl: every open creates a CtlSession, every ioctl on the
// handle goes to it, and closing the handle releases it.
type ctlFile struct{ leafBase }

var (
	_ = (gofs.NodeGetattrer)((*ctlFile)(nil))
	_ = (gofs.NodeOpener)((*ctlFile)(nil))
	_ = (gofs.NodeSetattrer)((*ctlFile)(nil))
	_ = (gofs.NodeGetxattrer)((*ctlFile)(nil))
	_ = (gofs.NodeListxattrer)((*ctlFile)(nil))
	_ = (gofs.NodeSetxattrer)((*ctlFile)(nil))
	_ = (gofs.NodeRemovexattrer)((*ctlFile)(nil))
	_ = (gofs.NodeStatfser)((*ctlFile)(nil))
)

func (c *ctlFile) Getattr(ctx context.Context, fh gofs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	f := c.fs
	out.Ino = inoCtl
	out.Mode = syscall.S_IFREG | uint32(f.opts.CtlMode.Perm())
	out.Nlink = 1
	out.Uid, out.Gid = f.uid, f.ctlG
	out.SetTimes(&f.start, &f.start, &f.start)
	return 0
}

func (c *ctlFile) Setattr(ctx context.Context, fh gofs.FileHandle, in *fuse.SetAttrIn, out *fuse.AttrOut) syscall.Errno {
	if _, ok := in.GetSize(); ok {
		return 0 // O_TRUNC on open: there is nothing to truncate
	}
	return syscall.EPERM
}

func (c *ctlFile) Open(ctx context.Context, flags uint32) (gofs.FileHandle, uint32, syscall.Errno) {
	f := c.fs
	h := &ctlHandle{fs: f}
	if f.opts.Ctl != nil {
		var uid, gid uint32
		if caller, ok := fuse.FromContext(ctx); ok {
			uid, gid = caller.Uid, caller.Gid
		}
		s, errno := f.opts.Ctl.Open(uid, gid)
		if errno != 0 {
			return nil, 0, errno
		}
		h.s = s
		f.m.ctlOpen.Add(1)
		f.m.ctlSessions.Add(1)
	}
	return h, fuse.FOPEN_DIRECT_IO | fuse.FOPEN_NONSEEKABLE, 0
}

type ctlHandle struct {
	fs   *FS
	once sync.Once
	s    CtlSession // nil without a handler
}

var (
	_ = (gofs.FileIoctler)((*ctlHandle)(nil))
	_ = (gofs.FileReleaser)((*ctlHandle)(nil))
	_ = (gofs.FileReader)((*ctlHandle)(nil))
	_ = (gofs.FileWriter)((*ctlHandle)(nil))
)

func (h *ctlHandle) Ioctl(ctx context.Context, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	if h.s == nil {
		return 0, syscall.ENOTTY
	}
	h.fs.m.ioctls.Add(1)
	if cs, ok := h.s.(CtlCallerSession); ok {
		var pid uint32
		if caller, ok := fuse.FromContext(ctx); ok {
			pid = caller.Pid
		}
		return cs.IoctlFrom(pid, cmd, input, output)
	}
	return h.s.Ioctl(cmd, input, output)
}

func (h *ctlHandle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	return fuse.ReadResultData(nil), 0
}

func (h *ctlHandle) Write(ctx context.Context, data []byte, off int64) (uint32, syscall.Errno) {
	return 0, syscall.EINVAL
}

func (h *ctlHandle) Release(ctx context.Context) syscall.Errno {
	h.once.Do(func() {
		if h.s != nil {
			h.s.Release()
			h.fs.m.ctlOpen.Add(^uint64(0))
		}
	})
	return 0
}
