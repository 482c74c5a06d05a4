package fs

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"go.uber.org/zap"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/tier"
)

// CtlHandler serves the ioctls of .kvfs/ctl. The fs package only moves
// bytes: it opens one session per open file handle of ctl, forwards every
// ioctl of that handle to it and releases it when the handle is closed (also
// when the client dies), so registrations tied to a session cannot leak.
type CtlHandler interface {
	// Open starts a session for a client with the given credentials. A
	// non-zero errno fails the open(2).
	Open(uid, gid uint32) (CtlSession, syscall.Errno)
}

// Handler makes a CtlHandler of a function that opens sessions of a
// concrete type (ctl.Server.Open): a failed open gives a nil CtlSession,
// never a non-nil interface holding a nil pointer.
func Handler[S CtlSession](open func(uid, gid uint32) (S, syscall.Errno)) CtlHandler {
	return handlerFunc[S](open)
}

type handlerFunc[S CtlSession] func(uid, gid uint32) (S, syscall.Errno)

func (f handlerFunc[S]) Open(uid, gid uint32) (CtlSession, syscall.Errno) {
	s, errno := f(uid, gid)
	if errno != 0 {
		return nil, errno
	}
	return s, 0
}

// CtlSession is one open handle of .kvfs/ctl.
type CtlSession interface {
	// Ioctl serves one restricted ioctl: in holds _IOC_SIZE(cmd) bytes
	// when the command writes, out has room for _IOC_SIZE(cmd) bytes when
	// it reads. The result is ioctl(2)'s return value.
	Ioctl(cmd uint32, in, out []byte) (int32, syscall.Errno)
	// Release is called once, after the last ioctl of the handle returned.
	Release()
}

// CtlCallerSession is a CtlSession that is told which thread issued each
// ioctl: pid is the thread id FUSE reports for the request (0 when the
// caller is outside the daemon's pid namespace). The caller's thread waits
// in the kernel until the ioctl is answered, so the id stays its own while
// IoctlFrom runs. fs calls IoctlFrom instead of Ioctl when the session
// implements it.
type CtlCallerSession interface {
	IoctlFrom(pid uint32, cmd uint32, in, out []byte) (int32, syscall.Errno)
}

// Default values of Options.
const (
	DefaultEntryTimeout = time.Second
	DefaultMaxPending   = 65536
	DefaultCtlMode      = 0o600
	DefaultReadAhead    = 1 << 20
	DefaultCacheBytes   = 32 << 20
	DefaultStageLinger  = 5 * time.Second
	DefaultMaxStaged    = 1024
	// MaxWrite is the FUSE max_write (and max_read): reads and writes up
	// to 1 MiB travel in one request, and ioctls up to the restricted
	// limit of 16383 bytes fit (they need max_pages ≥ their size).
	MaxWrite = 1 << 20
)

// Options control New and Mount. The zero value is usable.
type Options struct {
	// Logger receives the file system's log lines; nil means none.
	Logger *zap.Logger
	// Ctl serves the ioctls of .kvfs/ctl; nil makes every ioctl fail
	// with ENOTTY.
	Ctl CtlHandler
	// CtlMode is the permission of .kvfs/ctl (default 0600).
	CtlMode os.FileMode
	// CtlGID, when set, is the group owning .kvfs/ctl (default: the
	// mounting user's group).
	CtlGID *uint32
	// UID and GID own every node; nil means the mounting process's ids.
	UID, GID *uint32
	// EntryTimeout is how long the kernel may cache names (directory
	// entries) of groups, head directories and the directories that never
	// change (root, layer-<L>, .kvfs), and those directories' attributes
	// (default 1 s; negative means 0). Attributes of groups, block and
	// head directories are never cached, and neither are names that do
	// not exist or that a rename moves in place (block directories, staged
	// files): see the package documentation for why that keeps every
	// answer current.
	EntryTimeout time.Duration
	// ReadAhead is the largest layer extent (K and V of every head of one
	// block and layer) a read of one group reads with it (default 1 MiB;
	// negative turns read-ahead off).
	ReadAhead int
	// CacheBytes bounds the read-ahead cache (default 32 MiB; negative
	// turns it off).
	CacheBytes int
	// MaxPending bounds the empty block directories kept in memory
	// (made by mkdir, or left by rm of their last group); default 65536.
	MaxPending int
	// StageLinger is how long a staged file (a temporary name in a head
	// directory, see staged.go) outlives its last close, so that a tool
	// that closes and then renames it (rsync) finds it (default 5 s;
	// negative means it disappears at its last close).
	StageLinger time.Duration
	// MaxStaged bounds the staged files held at once (default 1024;
	// ENOSPC beyond). Each holds at most one group's bytes in memory.
	MaxStaged int
	// AllowOther lets other users use the mount (mount option
	// allow_other). The kernel then checks permissions
	// (default_permissions).
	AllowOther bool
	// FsName is shown as the source of the mount (default "kvfs").
	FsName string
	// Debug logs every FUSE request.
	Debug bool
	// Now is the clock for directory times; nil means time.Now.
	Now func() time.Time
	// Tier, when set, is the DRAM tier in front of the store (package
	// tier): group files are read through it, and writes, deletes and
	// renames pass through it so that it drops the copies they replace.
	// .kvfs/stats reports its counters (zeros without one).
	Tier *tier.Tier

	// pageCache, for measurements only, serves group files through the
	// kernel page cache (no FOPEN_DIRECT_IO) to compare the policies.
	pageCache bool
}

func (o *Options) ensureDefaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.CtlMode == 0 {
		o.CtlMode = DefaultCtlMode
	}
	if o.EntryTimeout == 0 {
		o.EntryTimeout = DefaultEntryTimeout
	}
	if o.EntryTimeout < 0 {
		o.EntryTimeout = 0
	}
	if o.ReadAhead == 0 {
		o.ReadAhead = DefaultReadAhead
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
	}
	if o.CacheBytes < 0 {
		o.ReadAhead = -1
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	if o.StageLinger == 0 {
		o.StageLinger = DefaultStageLinger
	}
	if o.StageLinger < 0 {
		o.StageLinger = 0
	}
	if o.MaxStaged <= 0 {
		o.MaxStaged = DefaultMaxStaged
	}
	if o.FsName == "" {
		o.FsName = "kvfs"
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// groupIO is what the file system reads and changes groups through: the
// store, or the DRAM tier in front of it (Options.Tier). Everything else
// (Stat, Block, Blocks) it asks the store.
type groupIO interface {
	Read(reqs []store.ReadReq) error
	Write(reqs []store.WriteReq) error
	Delete(keys []layout.Key) error
	RenameBlock(from, to uint64) error
}

// blockDirKey names one block directory: a block as seen from one layer.
type blockDirKey struct {
	layer int
	block uint64
}

// FS is the kvfs file system over one open store. It keeps no state the
// store already has: the tree is computed from the store's index on every
// lookup. The only state of its own is the set of pending (empty) block
// directories and counters.
type FS struct {
	st    *store.Store
	io    groupIO // st, or Options.Tier
	geo   layout.Geometry
	opts  Options
	log   *zap.Logger
	uid   uint32
	gid   uint32
	ctlG  uint32
	start time.Time
	align int // buffer alignment that lets store reads land without a copy

	cache *snapCache

	mu struct {
		sync.Mutex
		// pending holds the block and head directories that exist
		// without a group in the store (made by mkdir, or left by rm of
		// their last group), until rmdir or unmount.
		pending map[blockDirKey]*pendingDir
		staged  map[stagedKey]*staged         // temporary files in head directories
		stagedN uint64                        // staged files made, for inode numbers
		writers map[layout.Key][]*groupHandle // handles open for writing, by group
	}
	m counters
}

type counters struct {
	lookups, opens, reads, readBytes, stored, storedBytes, deletes,
	rejected, corrupt, errors, panics, ioctls, ctlOpen, ctlSessions,
	cacheHits, cacheMisses, stagedStored, renames atomic.Uint64
}

// Metrics is a snapshot of the file system's own counters (the store keeps
// its own: store.Metrics).
type Metrics struct {
	Lookups      uint64 // LOOKUP requests
	Opens        uint64 // group files opened
	Reads        uint64 // READ requests on group files
	ReadBytes    uint64 // bytes returned by them
	Stored       uint64 // groups stored through files (close of a write)
	StoredBytes  uint64
	Deletes      uint64 // groups removed through unlink
	Rejected     uint64 // closes refused (wrong size, EFBIG)
	Corrupt      uint64 // reads answered EIO for a checksum mismatch
	Errors       uint64 // unexpected errors answered EIO
	Panics       uint64 // requests that panicked (answered EIO, logged)
	CacheHits    uint64 // group reads served by the read-ahead cache
	CacheMisses  uint64 // group reads that went to the store
	Ioctls       uint64 // ioctls on .kvfs/ctl
	CtlOpen      uint64 // ctl sessions open now
	CtlSessions  uint64 // ctl sessions opened in total
	PendingDirs  uint64 // block directories held in memory without a group
	Staged       uint64 // staged (temporary) files held now
	StagedStored uint64 // staged files stored as a group by a rename
	Renames      uint64 // renames done (staged files, groups, blocks)
	MountSeconds float64
}

// New returns the file system over st. The store must stay open until the
// file system is unmounted.
func New(st *store.Store, o Options) *FS {
	o.ensureDefaults()
	f := &FS{st: st, io: st, geo: st.Geometry(), opts: o, log: o.Logger, start: o.Now()}
	if o.Tier != nil {
		f.io = o.Tier
	}
	f.uid, f.gid = uint32(os.Getuid()), uint32(os.Getgid())
	if o.UID != nil {
		f.uid = *o.UID
	}
	if o.GID != nil {
		f.gid = *o.GID
	}
	f.ctlG = f.gid
	if o.CtlGID != nil {
		f.ctlG = *o.CtlGID
	}
	f.align = max(st.Engine().Align(), 8)
	f.mu.pending = map[blockDirKey]*pendingDir{}
	f.mu.staged = map[stagedKey]*staged{}
	f.mu.writers = map[layout.Key][]*groupHandle{}
	f.cache = newSnapCache(o.CacheBytes)
	return f
}

// groupOpenFlags are the FUSE open flags of a group file opened with
// flags: direct I/O (no page cache), and no FLUSH on close for a handle
// that cannot write (it has nothing to store).
func (f *FS) groupOpenFlags(flags uint32) uint32 {
	var ff uint32 = fuse.FOPEN_DIRECT_IO
	if f.opts.pageCache {
		ff = 0
	}
	if flags&syscall.O_ACCMODE == syscall.O_RDONLY {
		ff |= fuse.FOPEN_NOFLUSH
	}
	return ff
}

// Metrics returns the file system's counters.
func (f *FS) Metrics() Metrics {
	f.mu.Lock()
	pending := len(f.mu.pending)
	staged := len(f.mu.staged)
	f.mu.Unlock()
	return Metrics{
		Lookups: f.m.lookups.Load(), Opens: f.m.opens.Load(), Reads: f.m.reads.Load(),
		ReadBytes: f.m.readBytes.Load(), Stored: f.m.stored.Load(), StoredBytes: f.m.storedBytes.Load(),
		Deletes: f.m.deletes.Load(), Rejected: f.m.rejected.Load(), Corrupt: f.m.corrupt.Load(),
		Errors: f.m.errors.Load(), Panics: f.m.panics.Load(),
		CacheHits: f.m.cacheHits.Load(), CacheMisses: f.m.cacheMisses.Load(), Ioctls: f.m.ioctls.Load(), CtlOpen: f.m.ctlOpen.Load(),
		CtlSessions: f.m.ctlSessions.Load(), PendingDirs: uint64(pending),
		Staged: uint64(staged), StagedStored: f.m.stagedStored.Load(), Renames: f.m.renames.Load(),
		MountSeconds: f.opts.Now().Sub(f.start).Seconds(),
	}
}

// Root is the root node of the tree, for gofs.Mount or gofs.NewNodeFS.
func (f *FS) Root() gofs.InodeEmbedder { return &rootDir{dirBase: dirBase{fs: f}} }

// GoFuseOptions are the go-fuse options the file system is meant to run
// with (timeouts are set per node; see the package documentation).
func (f *FS) GoFuseOptions() *gofs.Options {
	zero := time.Duration(0)
	mo := fuse.MountOptions{
		FsName:               f.opts.FsName,
		Name:                 "kvfs",
		MaxWrite:             MaxWrite,
		AllowOther:           f.opts.AllowOther,
		DirectMountStrict:    os.Geteuid() == 0,
		IgnoreSecurityLabels: true,
		ExtraCapabilities:    fuse.CAP_ATOMIC_O_TRUNC,
		Debug:                f.opts.Debug,
		Logger:               zap.NewStdLog(f.log.Named("fuse")),
		PanicHandler:         f.panicked,
	}
	if f.opts.AllowOther {
		mo.Options = append(mo.Options, "default_permissions")
	}
	return &gofs.Options{
		MountOptions:    mo,
		EntryTimeout:    &zero,
		AttrTimeout:     &zero,
		NegativeTimeout: &zero,
		UID:             f.uid,
		GID:             f.gid,
		Logger:          zap.NewStdLog(f.log.Named("fuse")),
		RootStableAttr:  &gofs.StableAttr{Ino: inoRoot},
	}
}

// panicked answers a request whose handler panicked: EIO, logged with the
// stack, counted. The daemon goes on serving.
func (f *FS) panicked(v any) fuse.Status {
	f.m.panics.Add(1)
	f.log.Error("fs: request panicked, returning EIO", zap.Any("panic", v), zap.Stack("stack"))
	return fuse.EIO
}

// Server is a mounted kvfs.
type Server struct {
	*fuse.Server
	FS         *FS
	Mountpoint string
}

// Mount mounts a kvfs over st on mountpoint and starts serving it. As root
// it mounts with mount(2) directly; otherwise through fusermount3. Unmount
// the returned server (or umount the mountpoint) and Wait for it before
// closing the store.
func Mount(mountpoint string, st *store.Store, o Options) (*Server, error) {
	f := New(st, o)
	opts := f.GoFuseOptions()
	srv, err := fuse.NewServer(gofs.NewNodeFS(f.Root(), opts), mountpoint, &opts.MountOptions)
	if err != nil {
		return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
	}
	go srv.Serve()
	if err := srv.WaitMount(); err != nil {
		_ = srv.Unmount()
		return nil, fmt.Errorf("fs: mount %s: %w", mountpoint, err)
	}
	f.log.Info("fs: mounted", zap.String("mountpoint", mountpoint), zap.String("geometry", f.geo.String()))
	return &Server{Server: srv, FS: f, Mountpoint: mountpoint}, nil
}
