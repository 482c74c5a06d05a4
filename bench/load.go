package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

// LoadConfig describes an end-to-end measurement of LOAD ioctls on a
// mount: each call is one LOAD of GroupsPerCall groups of whole random
// blocks (all groups of a block, in slot order; the last block of a call
// may be partial) into a registered /dev/shm buffer, packed in order, so the
// store can land coalesced reads straight in it. Jobs callers issue Calls
// calls each, concurrently, on one open control file.
type LoadConfig struct {
	// Client is open on the mount's control file.
	Client *client.Client
	// Mountpoint is where the blocks are listed (its layer directories).
	Mountpoint string
	// GroupsPerCall is the groups of one ioctl, 1 to the daemon's
	// MaxEntries (default 256).
	GroupsPerCall int
	// Calls is the measured calls per job (default 1000).
	Calls int
	// Jobs is the number of concurrent callers (default 1).
	Jobs int
	// Warmup is the unmeasured calls per job before (0: none).
	Warmup int
	// Fill, when above the blocks present, first STOREs random blocks
	// until Fill are present (this writes to the store).
	Fill int
	// FillProgress, when not nil, gets the blocks present so far of Fill
	// after each block the fill stores.
	FillProgress func(done, total int64)
	// Seed seeds the choice of blocks.
	Seed uint64
	// WorkingSet, when above 0, draws the loaded blocks from the first
	// WorkingSet of the mount's blocks in id order (after the fill) rather
	// than from all of them; more than the mount holds wraps ErrFewBlocks.
	WorkingSet int
	// Zipf, when above 0, draws them with Zipf(Zipf) popularity over the
	// working set (the block of rank k, in the working set's order, with
	// probability proportional to 1/(k+1)^Zipf) instead of uniformly.
	Zipf float64
	// BlocksPerCall, when above 0, measures LOAD_BLOCKS (ABI minor 2)
	// instead: each call loads that many random whole blocks into the
	// job's own target of Layout ("nhd", the default, "hnd" or "hf");
	// GroupsPerCall is then ignored.
	BlocksPerCall int
	Layout        string
	// LayersPerCall, with BlocksPerCall, loads that many layers of the
	// blocks per call instead of all: successive calls of a job step
	// through the layers (the next range, wrapping), and a job draws its
	// blocks anew each time it starts again at layer 0, as a layer-by-layer
	// loader fetches one prefix (0: every layer in each call). Loads only.
	LayersPerCall int
	// DaemonPID, when not 0, is the daemon's pid: its CPU time during the
	// measurement (/proc/PID/stat) is reported per GB moved.
	DaemonPID int
	// Devices, when not empty, puts each job's target in GPU memory this
	// process allocates (job j on Devices[j % len]), registered with
	// REGISTER_CUDA; needs BlocksPerCall. The result then has one
	// DeviceResult per device, with the pinned H2D rate measured on it in
	// the same run (H2DChunk bytes per copy, default 4 MiB).
	Devices  []int
	H2DChunk int
	// Pinned, with Devices, keeps the targets in host memory that the
	// client pins for CUDA (cudaclient.PinHost) and copies to an
	// allocation on its device after each call, inside the measured call:
	// the path where the client drives its own H2D copies.
	Pinned bool
	// Store, with BlocksPerCall, measures STORE_BLOCKS instead: each call
	// stores the job's whole target (cache blocks 0..BlocksPerCall-1) as
	// blocks of its own (StoreBlock), durably; this writes to the store.
	Store bool
	// Scatter, with BlocksPerCall, lands each call's blocks in its
	// target's cache blocks in a random order, drawn anew per call (as a
	// paged cache's free list hands them out), instead of block i in
	// cache block i: tiles of neighbouring blocks are then not neighbours
	// on the device.
	Scatter bool
	// StoredPrefixes, with LayersPerCall, has each job first store that
	// many prefixes of BlocksPerCall blocks of its own (PrefixBlock), each
	// with one STORE_BLOCKS from its target, as an engine stores a prefix
	// it computed: a prefix's blocks then lie in consecutive slots (or in
	// the slots eviction freed, in its order), where the fill's random
	// blocks lie anywhere. Its loads take these prefixes in turn instead of
	// blocks of the fill (this writes to the store).
	StoredPrefixes int
}

// PrefixBlock is the block id a StoredPrefixes measurement gives block i
// of prefix k of job j: apart from the fill's blocks and StoreBlock's.
func PrefixBlock(j, k, i int) uint64 { return 2<<56 | uint64(j)<<40 | uint64(k)<<24 | uint64(i) }

// StoreBlock is the block id a --store measurement gives cache block i of
// job j: apart from the blocks a fill stores, and the same in every call,
// so the store replaces them instead of filling up.
func StoreBlock(j, i int) uint64 { return 1<<56 | uint64(j)<<24 | uint64(i) }

// LoadResult is the outcome of RunLoad; its JSON is what kvfs bench-load
// --json prints. Latencies are per ioctl; UsPerGroup is the mean call
// latency per group.
type LoadResult struct {
	Mountpoint    string  `json:"mountpoint"`
	Engine        string  `json:"engine"`
	GroupBytes    int     `json:"group_bytes"`
	GroupsPerCall int     `json:"groups_per_call"`
	Calls         int     `json:"calls"`
	Jobs          int     `json:"jobs"`
	Blocks        int     `json:"blocks"`
	Bytes         int64   `json:"bytes"`
	Seconds       float64 `json:"seconds"`
	GBps          float64 `json:"gbps"`
	UsPerCall     float64 `json:"us_per_call"`
	P50us         float64 `json:"p50_us"`
	P99us         float64 `json:"p99_us"`
	UsPerGroup    float64 `json:"us_per_group"`
	NotOK         int     `json:"not_ok"`
	// WorkingSet is how many blocks the calls drew from (Blocks unless
	// LoadConfig.WorkingSet), Zipf the exponent of their popularity (0:
	// uniform); loads only.
	WorkingSet int     `json:"working_set,omitempty"`
	Zipf       float64 `json:"zipf"`
	// CPUs is the daemon's CPU time over the run (user + system seconds:
	// /proc/PID/stat when LoadConfig.DaemonPID is set, else
	// daemon_cpu_seconds of .kvfs/stats; 0 when neither is there),
	// CPUsPerGB that per 10^9 bytes loaded; ClientCPUs is the callers'
	// (this process's).
	CPUs       float64 `json:"cpu_s"`
	CPUsPerGB  float64 `json:"cpu_s_per_gb"`
	ClientCPUs float64 `json:"client_cpu_s"`
	// MachineIdle is the share of the whole machine's CPU time that was
	// idle over the run (0 to 1, /proc/stat; -1 where unreadable): cores
	// the daemon left unused while calls waited.
	MachineIdle float64 `json:"machine_idle"`
	// DRAMHitRatio is the share of the groups the daemon read during the
	// run that landed from its DRAM tier (kvfs mount --dram), from the
	// dram_hits and dram_misses of .kvfs/stats; absent when the mount has
	// no tier. DRAMHits and DRAMMisses are those differences.
	DRAMHitRatio *float64 `json:"dram_hit_ratio,omitempty"`
	DRAMHits     uint64   `json:"dram_hits,omitempty"`
	DRAMMisses   uint64   `json:"dram_misses,omitempty"`
	// LOAD_BLOCKS runs (BlocksPerCall > 0).
	BlocksPerCall int     `json:"blocks_per_call,omitempty"`
	LayersPerCall int     `json:"layers_per_call,omitempty"`
	Layout        string  `json:"layout,omitempty"`
	UsPerBlock    float64 `json:"us_per_block,omitempty"`
	NotOKBlocks   int     `json:"not_ok_blocks,omitempty"`
	// StoredPrefixes: the loads took prefixes each job stored in one
	// STORE_BLOCKS (LoadConfig.StoredPrefixes), not blocks of the fill.
	StoredPrefixes int `json:"stored_prefixes,omitempty"`
	// Op is "store" for STORE_BLOCKS runs (LoadConfig.Store).
	Op string `json:"op,omitempty"`
	// Evicting is set when the blocks a STORE run writes (twice that in
	// slots while each is replaced) exceed the store's slots: other blocks
	// are evicted and the rate measures eviction too.
	Evicting bool `json:"evicting,omitempty"`
	// Into is "host" or the CUDA devices ("cuda:0,1"); PerDevice their
	// shares.
	Into      string         `json:"into,omitempty"`
	PerDevice []DeviceResult `json:"per_device,omitempty"`
}

// RunLoad measures LOAD calls as c describes. Entries that are not ok
// (absent, corrupt or evicted while measuring) are counted in NotOK; a
// failed ioctl ends the run with its error.
func RunLoad(c LoadConfig) (LoadResult, error) {
	if c.GroupsPerCall == 0 {
		c.GroupsPerCall = 256
	}
	if c.Calls == 0 {
		c.Calls = 1000
	}
	if c.Jobs == 0 {
		c.Jobs = 1
	}
	if c.Client == nil {
		return LoadResult{}, fmt.Errorf("%w: no client", ErrConfig)
	}
	info := c.Client.Info()
	switch {
	case c.BlocksPerCall < 0 || c.BlocksPerCall > abi.BlocksMax:
		return LoadResult{}, fmt.Errorf("%w: %d blocks per call (one LOAD_BLOCKS takes 1 to %d)", ErrConfig, c.BlocksPerCall, abi.BlocksMax)
	case c.BlocksPerCall > 0 && !info.Has(abi.CapBlocks):
		return LoadResult{}, fmt.Errorf("%w: the daemon has no LOAD_BLOCKS (ABI minor %d)", ErrConfig, info.ABIMinor)
	case c.BlocksPerCall == 0 && (c.GroupsPerCall < 1 || info.MaxEntries > 0 && c.GroupsPerCall > info.MaxEntries):
		return LoadResult{}, fmt.Errorf("%w: %d groups per call (one LOAD ioctl takes 1 to %d)", ErrConfig, c.GroupsPerCall, info.MaxEntries)
	case c.Store && c.BlocksPerCall == 0:
		return LoadResult{}, fmt.Errorf("%w: stores are measured with --blocks-per-call", ErrConfig)
	case c.Store && c.Pinned:
		return LoadResult{}, fmt.Errorf("%w: --store with --into pinned (the client's own copies) is not measured", ErrConfig)
	case c.Store && !info.Has(abi.CapStore):
		return LoadResult{}, fmt.Errorf("%w: the daemon takes no STORE (mounted read-only)", ErrConfig)
	case len(c.Devices) > 0 && c.BlocksPerCall == 0:
		return LoadResult{}, fmt.Errorf("%w: loads into GPU memory need --blocks-per-call", ErrConfig)
	case len(c.Devices) > 0 && !c.Pinned && !info.Has(abi.CapCUDA):
		return LoadResult{}, fmt.Errorf("%w: the daemon does not report KVFS_CAP_CUDA (no GPU, or mounted with --gpu=false)", ErrConfig)
	case c.Calls < 1 || c.Jobs < 1 || c.Warmup < 0 || c.Fill < 0:
		return LoadResult{}, fmt.Errorf("%w: %d calls, %d jobs, %d warmup calls, fill %d", ErrConfig, c.Calls, c.Jobs, c.Warmup, c.Fill)
	case c.Store && (c.WorkingSet != 0 || c.Zipf != 0):
		return LoadResult{}, fmt.Errorf("%w: a working set and Zipf popularity choose the blocks of loads; stores write blocks of their own", ErrConfig)
	case c.LayersPerCall != 0 && (c.BlocksPerCall == 0 || c.Store):
		return LoadResult{}, fmt.Errorf("%w: layers per call are for loads of --blocks-per-call", ErrConfig)
	case c.StoredPrefixes < 0 || c.StoredPrefixes > 0 && (c.LayersPerCall == 0 || !info.Has(abi.CapStore)):
		return LoadResult{}, fmt.Errorf("%w: %d stored prefixes (for loads of --layers-per-call, from a store that takes STORE)", ErrConfig, c.StoredPrefixes)
	case c.LayersPerCall < 0 || c.LayersPerCall > 0 && info.Geometry.Layers%c.LayersPerCall != 0:
		return LoadResult{}, fmt.Errorf("%w: %d layers per call (want a divisor of the store's %d)", ErrConfig, c.LayersPerCall, info.Geometry.Layers)
	}
	g, gb := info.Geometry, info.GroupBytes
	blocks, err := ListBlocks(c.Mountpoint, g)
	if err != nil {
		return LoadResult{}, err
	}
	if len(blocks) < c.Fill {
		if blocks, err = fillBlocksCtl(c.Client, blocks, c.Fill, c.Seed, c.FillProgress); err != nil {
			return LoadResult{}, err
		}
	}
	perBlock := g.GroupsPerBlock()
	pk, err := newPicker(c, blocks)
	if err != nil {
		return LoadResult{}, err
	}
	if c.BlocksPerCall > 0 {
		if len(pk.blocks) == 0 && !c.Store && c.StoredPrefixes == 0 {
			return LoadResult{}, fmt.Errorf("%w: %s holds no blocks", ErrFewBlocks, c.Mountpoint)
		}
		return runLoadBlocks(c, blocks, pk)
	}
	need := (c.GroupsPerCall + perBlock - 1) / perBlock
	if len(pk.blocks) < need {
		return LoadResult{}, fmt.Errorf("%w: %s holds %d blocks, a call of %d groups needs %d", ErrFewBlocks, c.Mountpoint, len(pk.blocks), c.GroupsPerCall, need)
	}
	callBytes := int64(c.GroupsPerCall * gb)
	buf, err := c.Client.NewHostBuffer("", callBytes*int64(c.Jobs))
	if err != nil {
		return LoadResult{}, err
	}
	defer buf.Close()

	m, err := runCallers(c, func(j int) func() (int, error) {
		rng := rand.New(rand.NewPCG(c.Seed, uint64(j)))
		es := make([]client.Entry, c.GroupsPerCall)
		st := make([]client.Status, c.GroupsPerCall)
		base := uint64(int64(j) * callBytes)
		return func() (int, error) {
			n := 0
			for n < len(es) {
				b := pk.pick(rng)
				for i := 0; i < perBlock && n < len(es); i++ {
					es[n] = client.Entry{Key: g.KeyAt(b, i), Buffer: buf.ID, Offset: base + uint64(n*gb)}
					n++
				}
			}
			nok, err := c.Client.Batch(true, es, st, nil)
			return len(es) - nok, err
		}
	})
	if err != nil {
		return LoadResult{}, err
	}
	res := LoadResult{Mountpoint: c.Mountpoint, Engine: info.Engine, GroupBytes: gb, GroupsPerCall: c.GroupsPerCall,
		Calls: c.Calls, Jobs: c.Jobs, Blocks: len(blocks), NotOK: m.notOK, WorkingSet: len(pk.blocks), Zipf: c.Zipf}
	m.fill(&res, callBytes)
	return res, nil
}

// callers is what runCallers measured.
type callers struct {
	lat       [][]time.Duration // per job, per call
	notOK     int               // sum of what the calls reported not ok
	wall      time.Duration
	clientCPU float64
	daemonCPU float64
	daemonOK  bool
	idle      float64 // the machine's idle share, -1 when unknown
	// dram: the DRAM tier's group hits and misses over the run, when the
	// mount has a tier.
	dram                 bool
	dramHits, dramMisses uint64
}

// runCallers runs c.Jobs concurrent callers. Each gets its call from
// newCall(j) (made before the clock starts), runs it c.Warmup times, then,
// all released at once, c.Calls times, each timed. A call returns how many
// of its items were not ok. The wall time and the CPU of this process and
// of the daemon are measured around the timed calls only.
func runCallers(c LoadConfig, newCall func(j int) func() (int, error)) (callers, error) {
	m := callers{lat: make([][]time.Duration, c.Jobs)}
	notOK := make([]int, c.Jobs)
	errs := make([]error, c.Jobs)
	var ready, wg sync.WaitGroup
	gate := make(chan struct{})
	for j := range c.Jobs {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			call := newCall(j)
			for range c.Warmup {
				if _, err := call(); err != nil {
					errs[j] = err
				}
			}
			ready.Done()
			<-gate
			m.lat[j] = make([]time.Duration, 0, c.Calls)
			for range c.Calls {
				t0 := time.Now()
				bad, err := call()
				m.lat[j] = append(m.lat[j], time.Since(t0))
				if err != nil {
					errs[j] = err
					return
				}
				notOK[j] += bad
			}
		}()
	}
	ready.Wait()
	s0, sok0 := ReadMountStats(c.Mountpoint)
	d0, dok0 := daemonCPU(c, s0, sok0)
	cpu0 := CPUSeconds()
	i0, t0, jok0 := MachineJiffies()
	start := time.Now()
	close(gate)
	wg.Wait()
	m.wall = time.Since(start)
	i1, t1, jok1 := MachineJiffies()
	m.clientCPU = CPUSeconds() - cpu0
	s1, sok1 := ReadMountStats(c.Mountpoint)
	d1, dok1 := daemonCPU(c, s1, sok1)
	if sok0 && sok1 && s1.Bytes > 0 {
		m.dram = true
		m.dramHits, m.dramMisses = s1.Hits-s0.Hits, s1.Misses-s0.Misses
	}
	m.idle = -1
	if jok0 && jok1 && t1 > t0 {
		m.idle = float64(i1-i0) / float64(t1-t0)
	}
	if err := errors.Join(errs...); err != nil {
		return callers{}, err
	}
	for _, n := range notOK {
		m.notOK += n
	}
	m.daemonCPU, m.daemonOK = d1-d0, dok0 && dok1
	return m, nil
}

// fill sets r's measured fields (bytes, GB/s, latencies, CPU) from m, each
// call having moved callBytes of r.GroupsPerCall groups.
func (m callers) fill(r *LoadResult, callBytes int64) {
	all := slices.Concat(m.lat...)
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	slices.Sort(all)
	r.Seconds = m.wall.Seconds()
	r.Bytes = int64(len(all)) * callBytes
	r.GBps = float64(r.Bytes) / m.wall.Seconds() / 1e9
	r.UsPerCall = Micros(sum) / float64(len(all))
	r.P50us, r.P99us = Micros(Percentile(all, 50)), Micros(Percentile(all, 99))
	r.UsPerGroup = r.UsPerCall / float64(r.GroupsPerCall)
	r.ClientCPUs = m.clientCPU
	r.MachineIdle = m.idle
	if m.dram {
		r.DRAMHits, r.DRAMMisses = m.dramHits, m.dramMisses
		ratio := 0.0
		if n := m.dramHits + m.dramMisses; n > 0 {
			ratio = float64(m.dramHits) / float64(n)
		}
		r.DRAMHitRatio = &ratio
	}
	if m.daemonOK {
		r.CPUs = m.daemonCPU
		r.CPUsPerGB = PerGB(r.CPUs, r.Bytes)
	}
}

func (r LoadResult) String() string {
	s := fmt.Sprintf("bench-load %s (engine %s): %d jobs × %d calls × %d groups of %d bytes from %d blocks\n",
		r.Mountpoint, r.Engine, r.Jobs, r.Calls, r.GroupsPerCall, r.GroupBytes, r.Blocks)
	if r.BlocksPerCall > 0 {
		what := "whole blocks"
		if r.LayersPerCall > 0 {
			what = fmt.Sprintf("blocks' %d layers", r.LayersPerCall)
		}
		s = fmt.Sprintf("bench-load %s (engine %s): %d jobs × %d LOAD_BLOCKS × %d %s (%d groups of %d bytes) into %s targets, from %d blocks\n",
			r.Mountpoint, r.Engine, r.Jobs, r.Calls, r.BlocksPerCall, what, r.GroupsPerCall, r.GroupBytes, r.Layout, r.Blocks)
		if r.Op == "store" {
			s = fmt.Sprintf("bench-load %s (engine %s): %d jobs × %d STORE_BLOCKS × %d whole blocks (%d groups of %d bytes) from %s targets\n",
				r.Mountpoint, r.Engine, r.Jobs, r.Calls, r.BlocksPerCall, r.GroupsPerCall, r.GroupBytes, r.Layout)
		}
	}
	if r.Op != "store" {
		s += "  " + describeDraw(r) + "\n"
	}
	s += fmt.Sprintf("  %.2f GB/s   %.1f µs/ioctl (p50 %.1f, p99 %.1f)   %.3f µs/group   %d bytes in %.3f s",
		r.GBps, r.UsPerCall, r.P50us, r.P99us, r.UsPerGroup, r.Bytes, r.Seconds)
	if r.BlocksPerCall > 0 {
		s += fmt.Sprintf("   %.2f µs/block", r.UsPerBlock)
	}
	s += fmt.Sprintf("\n  daemon cpu %.2f s (%.3f s/GB), callers' cpu %.2f s", r.CPUs, r.CPUsPerGB, r.ClientCPUs)
	if r.MachineIdle >= 0 {
		s += fmt.Sprintf(", machine idle %.1f %%", 100*r.MachineIdle)
	}
	if r.DRAMHitRatio != nil {
		s += fmt.Sprintf("\n  DRAM tier: hit ratio %.3f (%d of %d groups read landed from it)",
			*r.DRAMHitRatio, r.DRAMHits, r.DRAMHits+r.DRAMMisses)
	}
	if r.NotOK > 0 {
		s += fmt.Sprintf("\n  %d groups not ok (absent, corrupt or evicted while measuring)", r.NotOK)
	}
	if r.NotOKBlocks > 0 {
		s += fmt.Sprintf("\n  %d blocks not ok (absent, corrupt or evicted while measuring)", r.NotOKBlocks)
	}
	if r.Evicting {
		s += fmt.Sprintf("\n  note: %d callers store %d blocks each, %d slots while they are replaced: more than the store has, so other blocks were evicted (a larger store measures the STORE path alone)",
			r.Jobs, r.BlocksPerCall, 2*r.Jobs*r.BlocksPerCall)
	}
	for _, d := range r.PerDevice {
		ratio := 0.0
		if d.H2DGBps > 0 {
			ratio = d.GBps / d.H2DGBps
		}
		s += fmt.Sprintf("\n  cuda:%d (%s): %d jobs, %.2f GB/s; pinned H2D %.2f GB/s at %d bytes per copy (ratio %.2f)",
			d.Device, d.Name, d.Jobs, d.GBps, d.H2DGBps, d.H2DChunk, ratio)
	}
	return s
}

// MountStats is what bench-load reads of a mount's .kvfs/stats: the
// daemon's CPU time and its DRAM tier's counters.
type MountStats struct {
	CPU *float64 `json:"daemon_cpu_seconds"` // nil when the daemon does not report it
	DRAMStats
}

// DRAMStats are the DRAM tier's counters of a mount's .kvfs/stats; Bytes is
// 0 when the mount has no tier.
type DRAMStats struct {
	Bytes  uint64 `json:"dram_bytes"`
	Hits   uint64 `json:"dram_hits"`
	Misses uint64 `json:"dram_misses"`
}

// ReadMountStats reads the mount's .kvfs/stats once; false when it cannot
// be read.
func ReadMountStats(mountpoint string) (MountStats, bool) {
	var st MountStats
	data, err := os.ReadFile(filepath.Join(mountpoint, ".kvfs", "stats"))
	if err != nil || json.Unmarshal(data, &st) != nil {
		return MountStats{}, false
	}
	return st, true
}

// DaemonCPUSeconds reads the daemon's CPU time from the mount's
// .kvfs/stats (daemon_cpu_seconds); false when it is not there.
func DaemonCPUSeconds(mountpoint string) (float64, bool) {
	st, ok := ReadMountStats(mountpoint)
	if !ok || st.CPU == nil {
		return 0, false
	}
	return *st.CPU, true
}

// ListBlocks returns the blocks present under mountpoint (the union over
// its layer directories), sorted.
func ListBlocks(mountpoint string, g layout.Geometry) ([]uint64, error) {
	seen := map[uint64]bool{}
	for l := range g.Layers {
		des, err := os.ReadDir(filepath.Join(mountpoint, g.LayerName(l)))
		if err != nil {
			return nil, err
		}
		for _, de := range des {
			if b, err := layout.ParseBlockName(de.Name()); err == nil {
				seen[b] = true
			}
		}
	}
	out := make([]uint64, 0, len(seen))
	for b := range seen {
		out = append(out, b)
	}
	slices.Sort(out)
	return out, nil
}

// fillBlocksCtl stores random whole blocks through STORE until want blocks
// are present.
func fillBlocksCtl(c *client.Client, have []uint64, want int, seed uint64, progress func(done, total int64)) ([]uint64, error) {
	info := c.Info()
	g, gb, per := info.Geometry, info.GroupBytes, info.Geometry.GroupsPerBlock()
	buf, err := c.NewHostBuffer("", int64(per*gb))
	if err != nil {
		return nil, err
	}
	defer buf.Close()
	rng := rand.New(rand.NewPCG(seed, 0xf111))
	for i := range buf.Mem {
		buf.Mem[i] = byte(rng.Uint32())
	}
	present := map[uint64]bool{}
	for _, b := range have {
		present[b] = true
	}
	es := make([]client.Entry, per)
	for len(have) < want {
		b := rng.Uint64()
		if present[b] {
			continue
		}
		for i := range es {
			es[i] = client.Entry{Key: g.KeyAt(b, i), Buffer: buf.ID, Offset: uint64(i * gb)}
		}
		st, err := c.Store(es)
		if err != nil {
			return nil, err
		}
		for _, s := range st {
			if s != client.OK {
				return nil, fmt.Errorf("bench: fill: storing block %016x: %v", b, s)
			}
		}
		present[b] = true
		have = append(have, b)
		if progress != nil {
			progress(int64(len(have)), int64(want))
		}
	}
	return have, nil
}
