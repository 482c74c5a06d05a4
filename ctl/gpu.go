package ctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/cuda"
	"github.com/kvfs/kvfs/internal/par"
	"github.com/kvfs/kvfs/layout"
)

// Errors of the GPU path (docs/abi.md, "REGISTER_CUDA").
var (
	// ErrNoGPU: the daemon has no usable CUDA driver or no such device
	// (ENODEV), or GPU support is disabled (--gpu=false).
	ErrNoGPU = errors.New("ctl: no usable GPU")
	// ErrGPUHandle: the driver refused the IPC handle (EINVAL).
	ErrGPUHandle = errors.New("ctl: CUDA IPC handle could not be opened")
	// ErrGPUOwner: the caller may not use the GPU itself, or the handle
	// is not its own process's (EACCES).
	ErrGPUOwner = errors.New("ctl: GPU memory not the caller's")
)

// GPU is one device as the server uses it: the copy queue, events and
// pinned memory of gpu.Device, and the opening of other processes' exported
// allocations. *gpu.CUDA implements it through OpenCUDA.
type GPU interface {
	gpu.Device
	// OpenIPC maps an allocation exported with cuIpcGetMemHandle (taken at
	// its base); the mapping is the whole allocation.
	OpenIPC(handle [64]byte) (GPUMemory, error)
	// Exporter is the id of the process that exported handle, as the
	// driver recorded it in the handle; ok is false when the handle does
	// not say.
	Exporter(handle [64]byte) (pid uint32, ok bool)
	// Close releases the device (after its pool was closed).
	Close() error
}

// GPUMemory is an opened allocation.
type GPUMemory interface {
	// Range is where the allocation is mapped in the daemon and its size.
	Range() (base uint64, size uint64)
	// Close waits for the device's queued copies and unmaps it.
	Close() error
}

// GPUOptions configure the GPU path. The zero value opens CUDA devices
// through the driver (libcuda.so.1) on first use.
type GPUOptions struct {
	// Disable refuses every GPU request with ENODEV and never loads the
	// driver.
	Disable bool
	// Open opens device ordinal; nil means the CUDA driver (OpenCUDA).
	Open func(ordinal int) (GPU, error)
	// Available reports whether GPU requests can work (INFO's
	// KVFS_CAP_CUDA); nil means the CUDA driver loads and has a device.
	Available func() bool
	// StagingCount and StagingSize size each device's pool of pinned
	// staging buffers (default 16 × 4 MiB).
	StagingCount, StagingSize int
	// Depth is the staging buffers one batch keeps in flight (default 8).
	Depth int
	// ReadAhead is the staging buffers one store read fills (default 4,
	// at most Depth): the storage's I/O in flight per GPU load.
	ReadAhead int
	// Streams is how many copy streams each device gets (default 1): the
	// batches of different callers take them round robin, so their copies
	// do not queue behind each other's.
	Streams int
	// NoBatch queues a load's copies one by one where the driver could
	// batch them (cuMemcpyBatchAsync): for measuring the difference.
	NoBatch bool
	// SpinWait has a load that waits for a staging buffer's copies spin
	// on a core until they complete, where by default it sleeps until the
	// GPU's interrupt (gpu.CUDA.SetSpinWait).
	SpinWait bool
	// VerifyOnGPU checks loaded groups where they land, in GPU memory,
	// with the CRC32C kernel (gpu.GPUVerifier) instead of on the CPU in
	// staging, and has the kernel checksum the groups a STORE staged (the
	// CPU then reads no payload either way). NewVerifier, when set,
	// replaces the kernel (tests).
	VerifyOnGPU bool
	// VerifyFallback, with VerifyOnGPU, has a device whose kernel cannot
	// load checksum on the CPU instead of refusing GPU requests (kvfs
	// mount --gpu-verify auto, the default).
	VerifyFallback bool
	// TrustHandles skips the exporter check: by default a caller may
	// register only a handle its own process exported (GPU.Exporter
	// against the caller's process id). Only for a daemon that serves one
	// trusted client, or tests that export from one process and register
	// from another; kvfs mount never sets it.
	TrustHandles bool
	NewVerifier  func(ordinal int, geo gpu.Geometry) (gpu.Checker, error)
	// NoDirect keeps loads on the staged path where they could copy
	// straight from host memory (with VerifyOnGPU, a store file in tmpfs
	// or ramfs, or the DRAM tier's memory: see gpus.registerHost): for
	// measuring the difference.
	NoDirect bool
	// DirectWorkers is how many goroutines queue one direct load's copies
	// (default 4; gpu.Pipeline.DirectWorkers).
	DirectWorkers int
	// ScratchBudget bounds each device's scratch for direct loads of
	// pitched and scattered tiles (default 512 MiB;
	// gpu.Pipeline.ScratchBudget).
	ScratchBudget int
}

// OpenCUDA opens a CUDA device for the server.
func OpenCUDA(ordinal int) (GPU, error) {
	g, err := gpu.OpenCUDA(ordinal)
	if err != nil {
		return nil, err
	}
	return cudaGPU{g}, nil
}

type cudaGPU struct{ *gpu.CUDA }

// Exporter reads the exporting process's id from a legacy CUDA IPC handle:
// the driver stores it, little-endian, in bytes 8..11 (not documented by
// NVIDIA; observed with driver 580).
// The driver does not rely on it when opening (a handle with the field
// rewritten still opens), so the check it enables stops a process that was
// merely given another's handle, not one that forges the field: the handle
// stays a bearer capability (docs/abi.md, "What is trusted").
func (g cudaGPU) Exporter(h [64]byte) (uint32, bool) {
	pid := binary.LittleEndian.Uint32(h[8:12])
	return pid, pid != 0
}

func (g cudaGPU) OpenIPC(h [64]byte) (GPUMemory, error) {
	m, err := g.CUDA.OpenIPC(h)
	if err != nil {
		return nil, err
	}
	return cudaMem{m}, nil
}

type cudaMem struct{ *gpu.IPCMemory }

func (m cudaMem) Range() (uint64, uint64) { return m.Base, uint64(m.Size) }

// gpuDev is the server's state for one device ordinal, created on the first
// registration that names it and kept until the server closes: the device
// (context and copy stream), its staging pool and the pipeline over it.
type gpuDev struct {
	ordinal int
	g       GPU
	pool    *gpu.Pool
	pipe    *gpu.Pipeline
	vclose  func() error // the GPU verifier's, nil without one
}

// gpus is the server's per-device table.
type gpus struct {
	opts  GPUOptions
	log   *zap.Logger
	reg   gpu.Registrar
	geo   gpu.Geometry
	avail struct {
		once sync.Once
		ok   bool
	}
	mu   sync.Mutex
	devs map[int]*gpuDev
	// hostView is the store's file in host memory (store.Store.HostView;
	// nil result: none). host is its registration with the GPUs.
	hostView func() []byte
	host     hostReg
	// noteCorrupt counts groups a device's checks found corrupt in the
	// store's corrupt count (store.Store.NoteCorrupt).
	noteCorrupt func(n int)
	// cache is what GPU loads read from when it is a cache in host memory
	// (the DRAM tier, gpuSource; nil otherwise), and arena the
	// registration of its memory with the GPUs.
	cache gpuCache
	arena hostReg
}

// gpuCache is a cache in host memory GPU loads may copy hits straight
// from (tier.Tier): Arena is its memory.
type gpuCache interface {
	gpu.Cache
	Arena() []byte
}

// setSource tells the GPUs what their loads read from (Server.gpuSource):
// a cache in host memory (the DRAM tier) is registered with them like the
// store's file in memory.
func (g *gpus) setSource(r gpu.Reader) {
	g.cache, _ = r.(gpuCache)
}

// hostReg is a range of host memory registered with the GPUs for direct
// loads (the store's file in memory, the DRAM tier's memory): made once,
// in the background, when the first device that verifies on the GPU
// opens; undone at close. The gpus' mu guards it.
type hostReg struct {
	started, closed bool
	view            []byte // registered; nil until then
	unreg           func() error
	wg              sync.WaitGroup
}

// registerHost starts registering host memory with dev (portably: every
// device may then DMA from it) for the server's direct loads: the store's
// file in memory, and the DRAM tier's memory when loads read through it.
// g.mu is held.
func (g *gpus) registerHost(dev GPU) {
	if g.opts.NoDirect {
		return
	}
	if g.hostView != nil {
		g.register(dev, &g.host, g.hostView, "the store file in memory", (*gpu.Pipeline).SetHost)
	}
	if g.cache != nil {
		g.register(dev, &g.arena, g.cache.Arena, "the DRAM tier", (*gpu.Pipeline).SetCache)
	}
}

// register registers the memory view returns with dev, once per server,
// on a goroutine of its own: pinning many gigabytes takes a while (up to
// about a second for a few GiB), and loads go through staging until it is
// done. Once registered, the pipelines of every device that verifies on
// the GPU load straight from it (set: gpu.Pipeline.SetHost or SetCache):
// packed tiles into place, pitched ones through device scratch. g.mu is
// held.
func (g *gpus) register(dev GPU, r *hostReg, view func() []byte, what string, set func(*gpu.Pipeline, []byte)) {
	hr, ok := dev.(gpu.HostRegistrar)
	if r.started || !ok {
		return
	}
	r.started = true
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		v := view()
		if v == nil {
			return
		}
		t := time.Now()
		unreg, err := hr.RegisterHost(v)
		took := time.Since(t)
		g.mu.Lock()
		defer g.mu.Unlock()
		if err != nil {
			g.log.Warn("ctl: cannot register "+what+" with the GPU; loads from it go through staging", zap.Error(err))
			return
		}
		if r.closed {
			_ = unreg()
			return
		}
		r.view, r.unreg = v, unreg
		for _, d := range g.devs {
			if d.vclose != nil {
				set(d.pipe, v)
			}
		}
		g.log.Info("ctl: GPU loads copy straight from "+what, zap.Int("bytes", len(v)), zap.Duration("registering_took", took))
	}()
}

// direct is how many groups loads copied straight from host memory by
// count (gpu.Pipeline.Direct: the store's file; Cached: the DRAM tier's
// memory, served), and whether r (g.host, g.arena) is registered.
func (g *gpus) direct(count func(*gpu.Pipeline) uint64, r *hostReg) (groups uint64, registered bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range g.devs {
		groups += count(d.pipe)
	}
	return groups, r.view != nil
}

func (g *gpus) available() bool {
	if g.opts.Disable {
		return false
	}
	g.avail.once.Do(func() {
		if g.opts.Available != nil {
			g.avail.ok = g.opts.Available()
			return
		}
		g.avail.ok = cuda.Available()
	})
	return g.avail.ok
}

// device returns ordinal's state, creating it on first use. Devices are
// independent: creating or using one never waits on another's copies (the
// table lock is held only while a device is opened, and a failure is not
// cached so a transient one can be retried).
func (g *gpus) device(ordinal int) (*gpuDev, error) {
	if g.opts.Disable {
		return nil, fmt.Errorf("%w: GPU support disabled", ErrNoGPU)
	}
	if ordinal < 0 {
		return nil, fmt.Errorf("%w: device %d", ErrNoGPU, ordinal)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if d := g.devs[ordinal]; d != nil {
		return d, nil
	}
	open := g.opts.Open
	if open == nil {
		open = OpenCUDA
	}
	dev, err := open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("%w: device %d: %w", ErrNoGPU, ordinal, err)
	}
	if w, ok := dev.(interface{ SetSpinWait(bool) }); ok {
		w.SetSpinWait(g.opts.SpinWait)
	}
	if l, ok := dev.(interface{ AddLanes(int) error }); ok && g.opts.Streams > 1 {
		if err := l.AddLanes(g.opts.Streams); err != nil {
			_ = dev.Close()
			return nil, fmt.Errorf("%w: device %d streams: %w", ErrNoGPU, ordinal, err)
		}
	}
	pool, err := gpu.NewPool(dev, gpu.PoolConfig{Count: g.opts.StagingCount, Size: g.opts.StagingSize, Registrar: g.reg})
	if err != nil {
		_ = dev.Close()
		return nil, fmt.Errorf("%w: device %d staging: %w", ErrNoGPU, ordinal, err)
	}
	d := &gpuDev{ordinal: ordinal, g: dev, pool: pool,
		pipe: &gpu.Pipeline{Dev: dev, Pool: pool, Geo: g.geo, Depth: g.opts.Depth, ReadAhead: g.opts.ReadAhead, NoBatch: g.opts.NoBatch, DirectWorkers: g.opts.DirectWorkers,
			ScratchBudget: g.opts.ScratchBudget}}
	if d.pipe.Depth <= 0 {
		d.pipe.Depth = 8
	}
	if g.opts.VerifyOnGPU {
		nv := g.opts.NewVerifier
		if nv == nil {
			nv = func(o int, geo gpu.Geometry) (gpu.Checker, error) { return gpu.NewGPUVerifier(o, geo) }
		}
		chk, err := nv(ordinal, g.geo)
		switch {
		case err != nil && !g.opts.VerifyFallback:
			_ = pool.Close()
			_ = dev.Close()
			return nil, fmt.Errorf("%w: device %d: GPU checksum kernel: %w", ErrNoGPU, ordinal, err)
		case err != nil:
			g.log.Warn("ctl: the GPU checksum kernel cannot load; loads into this GPU are checksummed on the CPU, in staging",
				zap.Int("device", ordinal), zap.Error(err))
		default:
			d.pipe.Verify, d.pipe.Sum, d.vclose = chk.Verify, chk.Sum, chk.Close
			d.pipe.Corrupt = g.noteCorrupt
			if l, ok := chk.(gpu.Lander); ok {
				d.pipe.Land = l.Land
			}
			d.pipe.SetHost(g.host.view)
			d.pipe.SetCache(g.arena.view)
			g.registerHost(dev)
		}
	}
	if g.devs == nil {
		g.devs = map[int]*gpuDev{}
	}
	g.devs[ordinal] = d
	g.log.Info("ctl: GPU device opened", zap.Int("device", ordinal),
		zap.Int("staging", pool.Count()), zap.Int("staging_bytes", pool.BufferSize()), zap.Int("fixed", pool.Registered()),
		zap.Bool("verify_on_gpu", d.vclose != nil))
	return d, nil
}

// close frees every device's pool and releases the devices.
// summed is how many staged groups of STOREs the devices checksummed
// (VerifyOnGPU), and on how many their checksum failed.
func (g *gpus) summed() (ok, failed uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, d := range g.devs {
		o, f := d.pipe.Summed()
		ok, failed = ok+o, failed+f
	}
	return ok, failed
}

func (g *gpus) close() error {
	g.mu.Lock()
	g.host.closed, g.arena.closed = true, true
	g.mu.Unlock()
	// A registration under way ends (and undoes itself).
	g.host.wg.Wait()
	g.arena.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	var err error
	for _, d := range g.devs {
		d.pipe.SetHost(nil)
		d.pipe.SetCache(nil)
	}
	// Before the devices go: the registrations are in a device's context.
	for _, r := range []*hostReg{&g.host, &g.arena} {
		if r.unreg != nil {
			err = errors.Join(err, r.unreg())
			r.view, r.unreg = nil, nil
		}
	}
	for o, d := range g.devs {
		d.pipe.Close()
		if d.vclose != nil {
			err = errors.Join(err, d.vclose())
		}
		err = errors.Join(err, d.pool.Close(), d.g.Close())
		delete(g.devs, o)
	}
	return err
}

// cudaBuf is a registered range of another process's allocation.
type cudaBuf struct {
	dev  *gpuDev
	mem  GPUMemory
	addr uint64 // device address of the registered range's first byte
	n    uint64
}

// gpuDeviceFiles are the files a process opens to use an NVIDIA GPU at
// all; a caller that may not open them read-write could not use the
// allocation it names itself.
var gpuDeviceFiles = []string{"/dev/nvidiactl", "/dev/nvidia-uvm"}

// checkGPUAccess opens the GPU device files with the caller's credentials
// (asCaller): the daemon maps a GPU allocation only for a caller the
// kernel would let use the GPU itself. Files missing on this machine (the
// fake devices of tests) are skipped.
func checkGPUAccess(c *cred) error {
	return asCaller(c, func() error {
		for _, f := range gpuDeviceFiles {
			fd, err := unix.Open(f, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
			if err == unix.ENOENT {
				continue
			}
			if err != nil {
				return fmt.Errorf("%w: %s: %w", ErrGPUOwner, f, err)
			}
			unix.Close(fd)
		}
		return nil
	})
}

// registerCUDA serves REGISTER_CUDA: check the caller, open the device's
// state, open the handle, check offset and length against the allocation
// the driver reports, then add the registration to the session.
func (ss *Session) registerCUDA(tid uint32, r *abi.RegisterCUDA) (registration, error) {
	s := ss.srv
	if s.gpus.opts.Disable {
		return registration{}, fmt.Errorf("%w: GPU support disabled", ErrNoGPU)
	}
	c, err := callerCred(tid)
	if err != nil {
		return registration{}, err
	}
	if err := checkGPUAccess(c); err != nil {
		return registration{}, err
	}
	if err := ss.checkRoom(r.Length); err != nil {
		return registration{}, err
	}
	d, err := s.gpus.device(int(r.Device))
	if err != nil {
		return registration{}, err
	}
	if !s.gpus.opts.TrustHandles {
		pid, ok := d.g.Exporter(r.Handle)
		if !ok {
			return registration{}, fmt.Errorf("%w: the handle names no exporting process", ErrGPUOwner)
		}
		if !c.isProcess(pid) {
			return registration{}, fmt.Errorf("%w: the handle was exported by process %d, not by the caller (process %d)", ErrGPUOwner, pid, c.tgid)
		}
	}
	m, err := d.g.OpenIPC(r.Handle)
	if err != nil {
		return registration{}, fmt.Errorf("%w: device %d: %w", ErrGPUHandle, r.Device, err)
	}
	base, size := m.Range()
	if r.Offset > size || r.Length > size-r.Offset {
		_ = m.Close()
		return registration{}, fmt.Errorf("%w: %d bytes at offset %d of a %d-byte allocation", ErrLength, r.Length, r.Offset, size)
	}
	b := &buffer{path: fmt.Sprintf("cuda:%d", r.Device), uid: c.ruid,
		cuda: &cudaBuf{dev: d, mem: m, addr: base + r.Offset, n: r.Length}}
	return ss.add(b, int64(r.Length))
}

// gpuBatch moves the valid entries of ents that name CUDA buffers through
// their devices' pipelines (package gpu): LOAD reads into pinned staging
// and copies to the device, STORE copies from the device into staging and
// writes from there. Each device's entries run on their own goroutine, so
// one device's copies never wait on another's. The store verifies every
// group's CRC32C in staging before it is copied (a corrupt group is zeroed
// there, copied as zeros and reported Corrupt), or, with VerifyOnGPU, the
// kernel verifies it on the device once copied and zeroes it there;
// STORE's checksums are of the staging bytes written.
func (ss *Session) gpuBatch(ents []ent, load bool) error {
	s := ss.srv
	var devs []*gpuDev
	var idx [][]int
	for i := range ents {
		e := &ents[i]
		if !e.valid || e.b.cuda == nil {
			continue
		}
		k := 0
		for k < len(devs) && devs[k] != e.b.cuda.dev {
			k++
		}
		if k == len(devs) {
			devs = append(devs, e.b.cuda.dev)
			idx = append(idx, nil)
		}
		idx[k] = append(idx[k], i)
	}
	if len(devs) == 0 {
		return nil
	}
	run := func(d *gpuDev, idx []int) error {
		items := make([]gpu.Item, len(idx))
		for k, i := range idx {
			e := &ents[i]
			items[k] = gpu.Item{Key: e.key(), Dst: e.b.cuda.addr + e.e.Offset, Pitch: int(e.e.Pitch), Mapping: e.b.cuda.addr}
		}
		err := ss.gpuMove(d, items, load, false)
		for k, i := range idx {
			e := &ents[i]
			if load {
				e.st, e.det = ss.loadOutcome(items[k].Err, d)
			} else {
				e.st, e.det = storeStatus(items[k].Err)
			}
		}
		return err
	}
	t0 := time.Now()
	defer func() { s.m.storeNs.Add(uint64(time.Since(t0))) }()
	if len(devs) == 1 {
		return run(devs[0], idx[0])
	}
	errs := make([]error, len(devs))
	par.Pieces(len(devs), 1, len(devs), func(k, _ int) { errs[k] = run(devs[k], idx[k]) })
	return errors.Join(errs...)
}

// gpuBlocks serves LOAD_BLOCKS and STORE_BLOCKS on a target in CUDA memory:
// every group of the valid entries becomes one pipeline item (its tile's
// device address and the target's row pitch) — or, for a load the
// pipeline takes as tiles (tileHeads), every (layer, kind) of an entry one
// item of all its heads. The target's device pipeline moves them in one
// call, and each entry then reports its groups' outcomes as on the host
// path.
func (ss *Session) gpuBlocks(t *target, ents []blockEnt, metas entMetas, load bool, sc *blockScratch) error {
	s := ss.srv
	n, groups := 0, 0
	tiled := load && !noTiles && ss.tileHeads(t)
	for i := range ents {
		if e := &ents[i]; e.valid {
			n += e.items(tiled)
			groups += int(e.groups)
		}
	}
	if n == 0 {
		return nil
	}
	pitch := 0
	if !t.lay.Packed {
		pitch = int(t.lay.RowPitch)
	}
	// From the call's scratch: 1,024 blocks of a Llama-3-8B-class model
	// are half a million items, 40 MiB to allocate and fault in per call.
	// A scratch the free list dropped makes them at the size needed at
	// once, never grown by append: growing them cost a one-caller GPU
	// load a quarter of its rate (docs/performance.md, "LOAD_BLOCKS into
	// GPU memory").
	if cap(sc.items) < n {
		sc.items = make([]gpu.Item, 0, n)
	}
	if cap(sc.owner) < n {
		sc.owner = make([]int32, 0, n)
	}
	if tiled && cap(sc.crcs) < groups {
		sc.crcs = make([]uint32, 0, groups)
	}
	if tiled && cap(sc.tiles) < n {
		sc.tiles = make([]gpu.Tile, 0, n)
	}
	items, owner, crcs, tiles := sc.items[:n], sc.owner[:n], sc.crcs[:0], sc.tiles[:0]
	if tiled {
		crcs, tiles = sc.crcs[:groups], sc.tiles[:n]
	}
	// Not cleared after the call (40 MiB): the items name device
	// addresses, the store's errors and the call's tiles and checksum
	// scratch, no client memory, and the next call writes each one it uses
	// whole.
	defer func() { sc.items, sc.owner, sc.crcs, sc.tiles = items[:0], owner[:0], crcs[:0], tiles[:0] }()
	// Building half a million items, and reading their outcomes back,
	// takes one core milliseconds before the first copy and after the
	// last, a large share of a direct load of that size: large calls do
	// both in parts, one goroutine each, split between entries.
	parts := splitGroups(ents, n, sc.parts[:0], tiled)
	sc.parts = parts
	// Each part writes exactly its own items: an entry whose groups
	// were miscounted would otherwise leave an item of an earlier call in
	// place (its device address) or write into the next part's.
	var miscounted atomic.Bool
	hs := int(t.lay.HeadStride)
	eachPart(parts, func(pt entPart) {
		k, end := pt.first, pt.first+pt.items
		g := pt.firstGroup
		for i := pt.lo; i < pt.hi; i++ {
			e := &ents[i]
			if !e.valid {
				continue
			}
			meta := metas.meta(i)
			if e.tiles(tiled) {
				// A tile's checksums: its heads' share of crcs.
				h := int(e.e.HeadCount)
				tilesOf(t, &e.e, func(key layout.Key, r *region, off uint64) {
					if k < end && g+h <= len(crcs) {
						tiles[k] = gpu.Tile{Heads: h, HeadStride: hs, CRCs: crcs[g : g+h : g+h]}
						items[k] = gpu.Item{Key: key, Dst: r.b.cuda.addr + off, Pitch: pitch, Mapping: r.b.cuda.addr, Tile: &tiles[k], Meta: meta}
						owner[k] = int32(i)
					}
					k, g = k+1, g+h
				})
				continue
			}
			groupsOf(t, &e.e, func(key layout.Key, r *region, off uint64) {
				if k < end {
					items[k] = gpu.Item{Key: key, Dst: r.b.cuda.addr + off, Pitch: pitch, Mapping: r.b.cuda.addr, Meta: meta}
					owner[k] = int32(i)
				}
				k, g = k+1, g+1
			})
		}
		if k != end || g != pt.firstGroup+pt.groups {
			miscounted.Store(true)
		}
	})
	if miscounted.Load() {
		return fmt.Errorf("ctl: GPU blocks call: the entries' groups do not add up to the %d counted (a bug)", n)
	}
	t0 := time.Now()
	err := ss.gpuMove(t.dev, items, load, tiled)
	s.m.storeNs.Add(uint64(time.Since(t0)))
	if err != nil {
		return err
	}
	// Each part's items belong to its own entries: the parts tally
	// them at once.
	eachPart(parts, func(pt entPart) {
		for k := pt.first; k < pt.first+pt.items; k++ {
			it := &items[k]
			e := &ents[owner[k]]
			if t := it.Tile; t != nil {
				failed := t.Failed
				if it.Err != nil && failed == 0 {
					failed = t.Heads // an outcome without a count: none landed
				}
				e.ok += uint32(t.Heads - failed)
			}
			if it.Err == nil {
				if it.Tile == nil {
					e.ok++
				}
				continue
			}
			if load {
				e.tally(ss.loadOutcome(it.Err, t.dev))
			} else {
				e.tally(storeStatus(it.Err))
			}
		}
	})
	return nil
}

// noTiles turns tiles off (tests compare loads with and without).
var noTiles = false

// tileHeads reports whether a load into t goes to its device's pipeline as
// tiles (gpu.Item.Tile): where the pipeline takes them (checked on the
// GPU: through staging, or packed ones direct from the store's file in
// memory or the DRAM tier's; gpu.Pipeline.TakesTiles), and each head's
// group of a (layer, kind) is either contiguous (packed: head-major HND,
// one head after another, or a Hugging Face cache, heads a whole sequence
// apart) or the heads' rows lie side by side (token-major NHD, HeadStride
// one row). The pipeline stages a Hugging Face cache's tiles so that one
// head's consecutive cache blocks move with one copy, and direct loads
// copy them packed into device scratch for the kernel to place
// (gpu.Pipeline.Load). Other pitched layouts move a group per item.
func (ss *Session) tileHeads(t *target) bool {
	s := ss.srv
	if t.dev == nil || int(s.tile.Rows)*int(s.tile.RowBytes) != s.gb {
		return false
	}
	hs := int(t.lay.HeadStride)
	switch {
	case t.lay.Packed && hs >= s.gb, !t.lay.Packed && hs == int(s.tile.RowBytes):
	default:
		return false
	}
	return t.dev.pipe.TakesTiles(s.gpuSource(), !t.lay.Packed)
}

// entPart is a share of a call's entries, [lo, hi), whose items are
// [first, first+items) and whose groups are [firstGroup,
// firstGroup+groups) of the call's.
type entPart struct {
	lo, hi             int
	first, items       int
	firstGroup, groups int
}

// partGroups is the fewest groups worth a goroutine of their own when a
// call's items are built and tallied in parts.
var partGroups = 64 << 10

// maxParts bounds the parts (goroutines) of one call.
const maxParts = 4

// splitGroups splits the valid entries' n items (one per group, or when
// tiled one per (layer, kind) of an entry of several heads) into up to
// maxParts parts of about equal items, at entry boundaries, appended to
// parts.
func splitGroups(ents []blockEnt, n int, parts []entPart, tiled bool) []entPart {
	w := min(maxParts, max(1, n/partGroups))
	want := (n + w - 1) / w
	cur := entPart{}
	for i := range ents {
		if ents[i].valid {
			cur.items += ents[i].items(tiled)
			cur.groups += int(ents[i].groups)
		}
		if cur.items >= want && len(parts) < w-1 {
			cur.hi = i + 1
			parts = append(parts, cur)
			cur = entPart{lo: i + 1, first: cur.first + cur.items, firstGroup: cur.firstGroup + cur.groups}
		}
	}
	cur.hi = len(ents)
	return append(parts, cur)
}

// eachPart runs f over the parts, each on a goroutine of its own when
// there are several (par: a panic in one is raised in the caller once all
// stopped).
func eachPart(parts []entPart, f func(entPart)) {
	par.Pieces(len(parts), 1, len(parts), func(k, _ int) { f(parts[k]) })
}
