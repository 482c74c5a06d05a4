package bench

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/client/cudaclient"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu/cuda"
)

// Layouts of a bench-load --blocks-per-call target.
var Layouts = []string{"nhd", "hnd", "hf"}

// SweepJobs are the caller counts of a sweep.
var SweepJobs = []int{1, 2, 4, 8, 16}

// SweepDepthMax is the deepest queue of kvfs bench --sweep by default.
const SweepDepthMax = 64

// SweepDepths are the queue depths of a depth sweep up to max: the powers
// of two below it, then max itself.
func SweepDepths(max int) []int {
	var ds []int
	for d := 1; d < max; d *= 2 {
		ds = append(ds, d)
	}
	return append(ds, max)
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100
// on every Linux architecture Go supports).
const clockTicks = 100

// ProcessCPU is the CPU time (user + system) process pid has used, from
// /proc/PID/stat.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("bench: daemon cpu: %w", err)
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bench: daemon cpu: malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("bench: daemon cpu: short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64) // field 14
	st, err2 := strconv.ParseUint(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("bench: daemon cpu: /proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// blocksTarget registers, for one job, a target of n cache blocks in the
// layout named lay, in one host buffer, or in one allocation on CUDA
// device dev (≥ 0); free releases the memory (after the target and the
// buffer are unregistered).
func blocksTarget(c *client.Client, lay string, n, dev int, pinned bool) (client.TargetID, client.Target, func(), func() error, error) {
	info := c.Info()
	var t client.Target
	switch lay {
	case "nhd":
		t = info.NHD(n, 0, info.Geometry.KVHeads)
	case "hnd":
		t = info.HND(n, 0, info.Geometry.KVHeads)
	case "hf":
		t = info.HF(n*info.Geometry.BlockTokens, 0, info.Geometry.KVHeads)
	default:
		return 0, t, nil, nil, fmt.Errorf("%w: layout %q (want nhd, hnd or hf)", ErrConfig, lay)
	}
	tensor := t.RegionBytes(info)
	size := 2 * int64(info.Geometry.Layers) * tensor
	var bufID client.BufferID
	var free func()
	var after func() error // the client's own copy after each call (pinned)
	switch {
	case dev < 0 || pinned:
		buf, err := c.NewHostBuffer("", size)
		if err != nil {
			return 0, t, nil, nil, err
		}
		bufID, free = buf.ID, func() { buf.Close() }
		if pinned {
			if err := cudaclient.PinHost(buf, dev); err != nil {
				free()
				return 0, t, nil, nil, err
			}
			a, err := newCUDAAlloc(dev, int(size))
			if err != nil {
				free()
				return 0, t, nil, nil, err
			}
			free = func() { buf.Close(); a.free() }
			after = func() error { return a.copyTo(buf.Mem) }
		}
	default:
		a, err := newCUDAAlloc(dev, int(size))
		if err != nil {
			return 0, t, nil, nil, err
		}
		if bufID, err = a.register(c, dev); err != nil {
			a.free()
			return 0, t, nil, nil, err
		}
		free = func() { c.Unregister(bufID); a.free() }
	}
	for i := range 2 * info.Geometry.Layers {
		t.Regions = append(t.Regions, client.Region{Buffer: bufID, Offset: uint64(int64(i) * tensor)})
	}
	id, err := c.RegisterTarget(t)
	if err != nil {
		free()
		return 0, t, nil, nil, err
	}
	return id, t, free, after, nil
}

// runLoadBlocks is RunLoad with LOAD_BLOCKS: each call loads BlocksPerCall
// random whole blocks into cache blocks 0..BlocksPerCall-1 of the job's own
// target (inline up to abi.BlocksInlineMax entries, else through the job's
// entry array); with c.Store each call stores those cache blocks as
// blocks StoreBlock(job, i) instead.
func runLoadBlocks(c LoadConfig, blocks []uint64, pk picker) (LoadResult, error) {
	info := c.Client.Info()
	g, gb := info.Geometry, info.GroupBytes
	if c.Layout == "" {
		c.Layout = "nhd"
	}
	n := c.BlocksPerCall
	layers := g.Layers
	if c.LayersPerCall > 0 {
		layers = c.LayersPerCall
		if c.StoredPrefixes == 0 && n > len(pk.blocks) {
			return LoadResult{}, fmt.Errorf("%w: %d different blocks per call from a working set of %d", ErrFewBlocks, n, len(pk.blocks))
		}
	}
	callBytes := int64(n * g.GroupsPerBlock() / g.Layers * layers * gb)
	type job struct {
		id    client.TargetID
		t     client.Target
		free  func()
		after func() error
		arr   *client.HostBuffer
		dev   int
	}
	jobs := make([]job, c.Jobs)
	defer func() {
		for _, j := range jobs {
			if j.free != nil {
				c.Client.UnregisterTarget(j.id)
				j.free()
			}
			if j.arr != nil {
				j.arr.Close()
			}
		}
	}()
	var per []DeviceResult
	if c.H2DChunk <= 0 {
		c.H2DChunk = 4 << 20
	}
	for _, d := range c.Devices {
		r := DeviceResult{Device: d, H2DChunk: c.H2DChunk}
		var err error
		if r.H2DGBps, err = PinnedH2D(d, c.H2DChunk, 500*time.Millisecond); err != nil {
			return LoadResult{}, fmt.Errorf("bench: pinned H2D on device %d: %w", d, err)
		}
		if cd, err := cuda.GetDevice(d); err == nil {
			r.Name, _ = cd.Name()
		}
		per = append(per, r)
	}
	for i := range jobs {
		var err error
		jobs[i].dev = -1
		if len(c.Devices) > 0 {
			jobs[i].dev = c.Devices[i%len(c.Devices)]
			per[i%len(c.Devices)].Jobs++
		}
		if jobs[i].id, jobs[i].t, jobs[i].free, jobs[i].after, err = blocksTarget(c.Client, c.Layout, n, jobs[i].dev, c.Pinned); err != nil {
			return LoadResult{}, err
		}
		if n > abi.BlocksInlineMax {
			if jobs[i].arr, err = c.Client.NewHostBuffer("", int64(n*abi.BlockEntrySize)); err != nil {
				return LoadResult{}, err
			}
		}
	}

	for j := range jobs {
		if err := storePrefixes(c, j, jobs[j].id, jobs[j].t, jobs[j].arr); err != nil {
			return LoadResult{}, err
		}
	}
	if err := checkPrefixes(c); err != nil {
		return LoadResult{}, err
	}
	m, err := runCallers(c, func(j int) func() (int, error) {
		rng := rand.New(rand.NewPCG(c.Seed, uint64(j)))
		jb := &jobs[j]
		es := make([]client.BlockEntry, n)
		cache := make([]int, n)
		for i := range cache {
			cache[i] = i
		}
		first := 0 // the first layer of this call (LayersPerCall)
		var prefix []uint64
		round := 0 // prefixes begun (StoredPrefixes)
		if c.LayersPerCall > 0 {
			prefix = make([]uint64, n)
		}
		return func() (int, error) {
			if first == 0 {
				if c.Scatter {
					rng.Shuffle(n, func(a, b int) { cache[a], cache[b] = cache[b], cache[a] })
				}
				switch {
				case c.StoredPrefixes > 0: // the job's own, in turn
					for i := range prefix {
						prefix[i] = PrefixBlock(j, round%c.StoredPrefixes, i)
					}
					round++
				case prefix != nil:
					pk.pickDistinct(rng, prefix) // one prefix's blocks, each once
				}
				for i := range es {
					b := StoreBlock(j, i)
					switch {
					case prefix != nil:
						b = prefix[i]
					case !c.Store:
						b = pk.pick(rng)
					}
					es[i] = jb.t.WholeBlock(b, cache[i])
				}
			}
			if layers < g.Layers { // layers divides g.Layers (RunLoad checks)
				for i := range es {
					es[i].LayerFirst, es[i].LayerCount = uint16(first), uint16(layers)
				}
				if first += layers; first == g.Layers {
					first = 0
				}
			}
			var nok int
			var err error
			switch {
			case jb.arr != nil:
				nok, err = c.Client.BlocksIn(!c.Store, jb.id, jb.arr, 0, es)
			case c.Store:
				nok, err = c.Client.StoreBlocks(jb.id, es)
			default:
				nok, err = c.Client.LoadBlocks(jb.id, es)
			}
			if err == nil && jb.after != nil {
				err = jb.after()
			}
			return len(es) - nok, err
		}
	})
	if err != nil {
		return LoadResult{}, err
	}
	res := LoadResult{Mountpoint: c.Mountpoint, Engine: info.Engine, GroupBytes: gb, GroupsPerCall: int(callBytes) / gb,
		BlocksPerCall: n, LayersPerCall: c.LayersPerCall, StoredPrefixes: c.StoredPrefixes, Layout: c.Layout, Calls: c.Calls, Jobs: c.Jobs, Blocks: len(blocks),
		NotOKBlocks: m.notOK}
	if !c.Store {
		res.WorkingSet, res.Zipf = len(pk.blocks), c.Zipf
	}
	m.fill(&res, callBytes)
	res.UsPerBlock = res.UsPerCall / float64(n)
	if c.Store {
		res.Op = "store"
		res.Evicting = int64(2*c.Jobs*n) > info.Slots
	}
	res.Into = "host"
	if len(c.Devices) > 0 {
		var names []string
		for k := range per {
			names = append(names, strconv.Itoa(per[k].Device))
			for j := range jobs {
				if j%len(c.Devices) == k {
					per[k].Bytes += int64(len(m.lat[j])) * callBytes
				}
			}
			per[k].GBps = float64(per[k].Bytes) / m.wall.Seconds() / 1e9
		}
		res.Into, res.PerDevice = "cuda:"+strings.Join(names, ","), per
		if c.Pinned {
			res.Into = "pinned:" + strings.Join(names, ",")
		}
	}
	return res, nil
}

// daemonCPU is the daemon's CPU seconds so far: ProcessCPU of
// c.DaemonPID when set (any daemon, old ones too), else the
// daemon_cpu_seconds of st, the mount's stats read just now (ok: read);
// false when neither can be read.
func daemonCPU(c LoadConfig, st MountStats, ok bool) (float64, bool) {
	if c.DaemonPID != 0 {
		d, err := ProcessCPU(c.DaemonPID)
		return d.Seconds(), err == nil
	}
	if !ok || st.CPU == nil {
		return 0, false
	}
	return *st.CPU, true
}

// RunLoadSweep runs RunLoad once per caller count in jobs (SweepJobs when
// nil), on the same store and blocks.
func RunLoadSweep(c LoadConfig, jobs []int) ([]LoadResult, error) {
	if jobs == nil {
		jobs = SweepJobs
	}
	var out []LoadResult
	for _, j := range jobs {
		c.Jobs = j
		r, err := RunLoad(c)
		if err != nil {
			return out, fmt.Errorf("bench: sweep at %d callers: %w", j, err)
		}
		out = append(out, r)
		c.Fill = 0 // filled once
	}
	return out, nil
}

// SweepTable formats a sweep: one row per caller count.
func SweepTable(rs []LoadResult) string {
	if len(rs) == 0 {
		return ""
	}
	r0 := rs[0]
	var b strings.Builder
	what := fmt.Sprintf("%d groups per LOAD", r0.GroupsPerCall)
	if r0.BlocksPerCall > 0 {
		what = fmt.Sprintf("%d blocks (%d groups) per LOAD_BLOCKS into %s targets", r0.BlocksPerCall, r0.GroupsPerCall, r0.Layout)
		if r0.LayersPerCall > 0 {
			what = fmt.Sprintf("%d blocks' %d layers (%d groups) per LOAD_BLOCKS into %s targets", r0.BlocksPerCall,
				r0.LayersPerCall, r0.GroupsPerCall, r0.Layout)
		}
		if r0.Op == "store" {
			what = fmt.Sprintf("%d blocks (%d groups) per STORE_BLOCKS from %s targets", r0.BlocksPerCall, r0.GroupsPerCall, r0.Layout)
		}
	}
	if r0.Into != "" && r0.Into != "host" {
		what += " in " + r0.Into
	}
	draw := ""
	if r0.Op != "store" {
		draw = "; " + describeDraw(r0)
	}
	fmt.Fprintf(&b, "bench-load %s (engine %s): %s, %d calls per caller, %d blocks in the store%s\n",
		r0.Mountpoint, r0.Engine, what, r0.Calls, r0.Blocks, draw)
	fmt.Fprintf(&b, "%8s %9s %12s %10s %10s %12s %14s %6s\n", "callers", "GB/s", "µs/call", "p50 µs", "p99 µs", "µs/group", "core-s/GB", "idle")
	for _, r := range rs {
		cpu, idle := "-", "-"
		if r.CPUs > 0 {
			cpu = fmt.Sprintf("%.3f", r.CPUsPerGB)
		}
		if r.MachineIdle >= 0 {
			idle = fmt.Sprintf("%.0f%%", 100*r.MachineIdle)
		}
		fmt.Fprintf(&b, "%8d %9.2f %12.1f %10.1f %10.1f %12.3f %14s %6s\n", r.Jobs, r.GBps, r.UsPerCall, r.P50us, r.P99us, r.UsPerGroup, cpu, idle)
		for _, d := range r.PerDevice {
			fmt.Fprintf(&b, "%8s cuda:%d %.2f GB/s (%d jobs), pinned H2D %.2f GB/s at %d B\n", "", d.Device, d.GBps, d.Jobs, d.H2DGBps, d.H2DChunk)
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// storePrefixes stores job j's c.StoredPrefixes prefixes of
// c.BlocksPerCall blocks (PrefixBlock), each with one STORE_BLOCKS from
// the job's target t (id; through arr when the entries do not go
// inline): the bytes the target holds, under the checksums the daemon
// computes.
func storePrefixes(c LoadConfig, j int, id client.TargetID, t client.Target, arr *client.HostBuffer) error {
	n := c.BlocksPerCall
	if c.StoredPrefixes == 0 {
		return nil
	}
	es := make([]client.BlockEntry, n)
	for k := range c.StoredPrefixes {
		for i := range es {
			es[i] = t.WholeBlock(PrefixBlock(j, k, i), i)
		}
		var nok int
		var err error
		if arr != nil {
			nok, err = c.Client.BlocksIn(false, id, arr, 0, es)
		} else {
			nok, err = c.Client.StoreBlocks(id, es)
		}
		if err != nil {
			return fmt.Errorf("bench: storing prefix %d of job %d: %w", k, j, err)
		}
		if nok != n {
			return fmt.Errorf("bench: storing prefix %d of job %d: %d of %d blocks stored", k, j, nok, n)
		}
	}
	return nil
}

// checkPrefixes fails when a prefix storePrefixes stored is no longer
// whole once every job's are (LOOKUP): a store too small for them all
// evicts the first ones, and the loads would miss.
func checkPrefixes(c LoadConfig) error {
	if c.StoredPrefixes == 0 || !c.Client.HasLookup() {
		return nil
	}
	n := c.BlocksPerCall
	ps := make([]client.LookupPair, n)
	for j := range c.Jobs {
		for k := range c.StoredPrefixes {
			for i := range ps {
				ps[i] = client.LookupPair{Block: PrefixBlock(j, k, i)}
			}
			r, err := c.Client.Lookup(ps)
			if err != nil {
				return fmt.Errorf("bench: looking up prefix %d of job %d: %w", k, j, err)
			}
			if r.Present != n {
				return fmt.Errorf("%w: prefix %d of job %d: %d of its %d blocks stored once all prefixes were (the store is too small for %d jobs × %d prefixes)",
					ErrFewBlocks, k, j, r.Present, n, c.Jobs, c.StoredPrefixes)
			}
		}
	}
	return nil
}
