package ctl

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/tier"
)

// Options control a Server. The zero value is usable.
type Options struct {
	// Logger receives the server's log lines; nil means none.
	Logger *zap.Logger
	// MaxSessions bounds open control files (default 1024).
	MaxSessions int
	// MaxBuffers bounds registrations per session (default 1024: a target
	// may name up to 1,016 regions, and engines such as vLLM allocate one
	// tensor per layer, so a large model's cache is 80+ allocations; bytes
	// are bounded apart, by MaxRegisteredBytes and the pinning limits).
	MaxBuffers int
	// MaxRegisteredBytes bounds the bytes registered per session
	// (default 1 TiB; registrations are mappings, not copies).
	MaxRegisteredBytes int64
	// MaxStagingBytes bounds the daemon memory one STORE uses to copy the
	// tiles being stored (default 64 MiB); a larger batch is processed in
	// several store calls. LOAD needs none: tiles are read into in place.
	MaxStagingBytes int
	// ShmDir is the only directory whose files may be registered (default
	// /dev/shm). It must be on tmpfs or hugetlbfs and not be a symlink.
	ShmDir string
	// ReadOnly refuses STORE with EROFS.
	ReadOnly bool
	// NoRegisterMemory skips registering client buffers with an engine that
	// implements store.MemoryRegistrar.
	NoRegisterMemory bool
	// MaxPinnedBytes caps the registered memory the engine pins (fixed
	// buffers) for all callers together (default: half the machine's RAM).
	MaxPinnedBytes int64
	// MaxPinnedPerUID is one uid's share of MaxPinnedBytes (default: half
	// of it). A caller without CAP_IPC_LOCK is also held to its
	// RLIMIT_MEMLOCK.
	MaxPinnedPerUID int64
	// GPU configures REGISTER_CUDA and loads into GPU memory.
	GPU GPUOptions
	// Tier, when set, is the DRAM tier in front of the store (package
	// tier): loads into host memory (LOAD, LOAD_BLOCKS) read through it
	// and stores from host memory write through it; loads into GPU memory
	// read through it, by staging, unless the store's file is in memory
	// (then they load from that, as without a tier), and stores from GPU
	// memory write through it.
	Tier *tier.Tier
}

// groupIO is what host loads and stores move groups through: the store,
// or the DRAM tier in front of it (Options.Tier).
type groupIO interface {
	Read(reqs []store.ReadReq) error
	Write(reqs []store.WriteReq) error
}

// EnsureDefaults fills in zero fields.
func (o *Options) EnsureDefaults() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.MaxSessions <= 0 {
		o.MaxSessions = 1024
	}
	if o.MaxBuffers <= 0 {
		o.MaxBuffers = 1024
	}
	if o.MaxRegisteredBytes <= 0 {
		o.MaxRegisteredBytes = 1 << 40
	}
	if o.MaxStagingBytes <= 0 {
		o.MaxStagingBytes = 64 << 20
	}
	if o.ShmDir == "" {
		o.ShmDir = "/dev/shm"
	}
	if o.MaxPinnedBytes <= 0 {
		o.MaxPinnedBytes = max(physicalMemory()/2, 1<<30)
	}
	if o.MaxPinnedPerUID <= 0 {
		o.MaxPinnedPerUID = o.MaxPinnedBytes / 2
	}
	o.MaxPinnedPerUID = min(o.MaxPinnedPerUID, o.MaxPinnedBytes)
}

// Metrics is a snapshot of the server's counters.
type Metrics struct {
	Sessions        int64  // open now
	Buffers         int64  // registered now
	RegisteredBytes int64  // registered now
	PinnedBytes     int64  // of which pinned by the engine now
	Loads           uint64 // LOAD ioctls served
	Stores          uint64 // STORE ioctls served
	GroupsLoaded    uint64 // entries with status OK
	GroupsStored    uint64
	BadEntries      uint64 // entries with status BadRequest
	Rejected        uint64 // ioctls failed as a whole
	Faults          uint64 // accesses to registered memory that faulted
	BatchNanos      uint64 // time spent serving LOAD and STORE ioctls
	StoreNanos      uint64 // of which inside store.Read and store.Write
	// GPUSummed counts groups STOREd from GPU memory whose checksums the
	// device computed over staging (VerifyOnGPU); GPUSumFailed those whose
	// device checksum failed, so the store computed them.
	GPUSummed, GPUSumFailed uint64
	// GPUDirect counts groups loaded into GPU memory straight from the
	// store's file in memory (no staging); GPUHostRegistered reports
	// whether that file is registered with the GPUs for it.
	GPUDirect         uint64
	GPUHostRegistered bool
	// GPUTierDirect counts groups loaded into GPU memory straight from
	// the DRAM tier's memory (hits, with no staging); GPUTierRegistered
	// reports whether that memory is registered with the GPUs for it.
	GPUTierDirect     uint64
	GPUTierRegistered bool
	// Lookups counts LOOKUP ioctls served, LookedUp their pairs and
	// LookupHits the pairs answered present.
	Lookups, LookedUp, LookupHits uint64
}

// Server answers control ioctls for one store.
type Server struct {
	st   *store.Store
	geo  layout.Geometry
	tile abi.Tile
	gb   int
	opts Options
	log  *zap.Logger
	reg  store.MemoryRegistrar // nil when the engine has none (or disabled)

	io groupIO // st, or Options.Tier
	// hostView: the store's file is in host memory (store.Store.HostView
	// at NewServer), where GPU loads bypass a tier (gpuSource).
	hostView bool

	nextSession atomic.Uint64
	nextBuffer  atomic.Uint32
	stage       stagePool
	pins        pins
	holes       holeGuard
	scratch     sync.Pool // *scratch
	gpus        gpus

	m struct {
		sessions, buffers, bytes           atomic.Int64
		loads, stores, loaded, stored, bad atomic.Uint64
		rejected, faults                   atomic.Uint64
		batchNs, storeNs                   atomic.Uint64
		lookups, lookedUp, lookupHits      atomic.Uint64
	}
}

// NewServer returns a server for s. The store must stay open while the
// server has sessions.
func NewServer(s *store.Store, o Options) *Server {
	o.EnsureDefaults()
	g := s.Geometry()
	srv := &Server{
		st: s, io: s, geo: g, gb: g.GroupBytes(), opts: o, log: o.Logger,
		tile: abi.Tile{Layers: uint32(g.Layers), KVHeads: uint32(g.KVHeads), Rows: uint32(g.BlockTokens), RowBytes: uint32(g.RowBytes())},
	}
	if r, ok := s.Engine().(store.MemoryRegistrar); ok && !o.NoRegisterMemory {
		srv.reg = r
	}
	if o.Tier != nil {
		srv.io = o.Tier
		srv.hostView = s.HostView() != nil
	}
	srv.stage.max = 8
	srv.gpus.opts, srv.gpus.log = o.GPU, o.Logger
	srv.gpus.geo = gpu.Geometry{GroupBytes: srv.gb, Rows: g.BlockTokens, RowBytes: g.RowBytes()}
	srv.gpus.hostView = s.HostView
	srv.gpus.noteCorrupt = s.NoteCorrupt
	srv.gpus.setSource(srv.gpuSource())
	if srv.reg != nil {
		srv.gpus.reg = srv.reg
	}
	srv.pins.max, srv.pins.perUID = o.MaxPinnedBytes, o.MaxPinnedPerUID
	srv.scratch.New = func() any { return new(scratch) }
	return srv
}

// Open starts a session for a process with uid and gid opening the control
// file. Its signature matches fs.CtlHandler's except for the concrete
// session type.
func (s *Server) Open(uid, gid uint32) (*Session, syscall.Errno) {
	if n := s.m.sessions.Add(1); n > int64(s.opts.MaxSessions) {
		s.m.sessions.Add(-1)
		return nil, s.errno("open", fmt.Errorf("%w: %d", ErrTooManySessions, s.opts.MaxSessions))
	}
	ss := &Session{srv: s, uid: uid, gid: gid, id: s.nextSession.Add(1)}
	ss.mu.bufs = map[uint32]*buffer{}
	s.log.Debug("ctl: session open", zap.Uint64("session", ss.id), zap.Uint32("uid", uid), zap.Uint32("gid", gid))
	return ss, 0
}

// Sessions is the number of open sessions.
func (s *Server) Sessions() int { return int(s.m.sessions.Load()) }

// Metrics returns the server's counters.
func (s *Server) Metrics() Metrics {
	summed, sumFailed := s.gpus.summed()
	direct, registered := s.gpus.direct((*gpu.Pipeline).Direct, &s.gpus.host)
	tierDirect, tierRegistered := s.gpus.direct((*gpu.Pipeline).Cached, &s.gpus.arena)
	return Metrics{
		GPUSummed: summed, GPUSumFailed: sumFailed, GPUDirect: direct, GPUHostRegistered: registered,
		GPUTierDirect: tierDirect, GPUTierRegistered: tierRegistered,
		Sessions: s.m.sessions.Load(), Buffers: s.m.buffers.Load(), RegisteredBytes: s.m.bytes.Load(),
		PinnedBytes: s.pins.pinned(),
		Loads:       s.m.loads.Load(), Stores: s.m.stores.Load(),
		GroupsLoaded: s.m.loaded.Load(), GroupsStored: s.m.stored.Load(),
		BadEntries: s.m.bad.Load(), Rejected: s.m.rejected.Load(), Faults: s.m.faults.Load(),
		BatchNanos: s.m.batchNs.Load(), StoreNanos: s.m.storeNs.Load(),
		Lookups: s.m.lookups.Load(), LookedUp: s.m.lookedUp.Load(), LookupHits: s.m.lookupHits.Load(),
	}
}

// Close frees the server's staging memory. Sessions still open keep working
// (staging is then allocated per call) but should have been released.
func (s *Server) Close() error {
	s.stage.close()
	s.holes.close()
	return s.gpus.close()
}

// info builds the INFO reply.
func (s *Server) info() abi.Info {
	in := s.st.Info()
	g := s.geo
	caps := abi.CapHost | abi.CapPitch | abi.CapRegisterFD | abi.CapLimits | abi.CapBlocks
	if in.Version >= 2 {
		// Tags and parents (and LOOKUP, served on every store): a
		// format version 1 store has no room to record them.
		caps |= abi.CapPrefix
	}
	if !s.opts.ReadOnly {
		caps |= abi.CapStore
	}
	if s.reg != nil {
		caps |= abi.CapFixedBuffers
	}
	if s.gpus.available() {
		caps |= abi.CapCUDA
	}
	i := abi.Info{
		ABI: abi.Version, Size: abi.InfoSize, Caps: caps,
		Layers: uint32(g.Layers), KVHeads: uint32(g.KVHeads), HeadDim: uint32(g.HeadDim),
		BlockTokens: uint32(g.BlockTokens), DType: uint32(g.DType), DTypeBytes: uint32(g.DType.Size()),
		Align: uint32(g.Align), GroupBytes: uint32(s.gb), GroupStride: uint64(g.GroupStride()),
		GroupsPerBlock: uint32(g.GroupsPerBlock()), RowBytes: uint32(g.RowBytes()),
		MaxEntries: abi.BatchMax, MaxEntriesSmall: abi.BatchSmallMax,
		MaxBuffers: uint32(s.opts.MaxBuffers), MaxRegisteredBytes: uint64(s.opts.MaxRegisteredBytes),
		Slots: uint64(in.Slots), UsedSlots: uint64(in.UsedSlots),
		UUID:     s.st.Superblock().UUID,
		ABIMinor: abi.Minor, MaxBlockEntries: abi.BlocksMax,
	}
	if s.reg != nil {
		i.MaxPinnedBytes, i.MaxPinnedPerUID = uint64(s.opts.MaxPinnedBytes), uint64(s.opts.MaxPinnedPerUID)
		i.PinnedBytes = uint64(s.pins.pinned())
	}
	copy(i.Engine[:len(i.Engine)-1], in.Engine)
	return i
}

// stagePool keeps a few page-aligned staging buffers outside the Go heap, so
// an engine with alignment needs can read straight into them.
type stagePool struct {
	mu   sync.Mutex
	free [][]byte
	max  int
}

func (p *stagePool) get(n int) ([]byte, error) {
	p.mu.Lock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if b := p.free[i]; cap(b) >= n {
			p.free = append(p.free[:i], p.free[i+1:]...)
			p.mu.Unlock()
			return b[:n], nil
		}
	}
	p.mu.Unlock()
	return store.AllocAligned(n)
}

func (p *stagePool) put(b []byte) {
	if b == nil {
		return
	}
	p.mu.Lock()
	if len(p.free) < p.max {
		p.free = append(p.free, b[:cap(b)])
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	store.FreeAligned(b)
}

func (p *stagePool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range p.free {
		store.FreeAligned(b)
	}
	p.free = nil
	p.max = 0
}
