package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/benchplot"
	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/progress"
)

// kvfs load and kvfs bench-load: clients of the control ioctls of a mount.
// The requests file is parsed by package client, the bench-load harness is
// bench.RunLoad; kvfs mount serves them (mount.go wires package ctl).

// loadOptions are the flags of kvfs load.
type loadOptions struct {
	requests string
	into     string
	out      string
	json     bool
}

func init() {
	var o loadOptions
	c := &cobra.Command{
		Use:   "load MOUNTPOINT --requests FILE [--into SHMFILE] [--out FILE] [--json]",
		Short: "Load groups through the control ioctls into shared memory",
		Long: `Load the groups listed in --requests from the kvfs mounted on MOUNTPOINT
into host shared memory, through .kvfs/ctl (the batched LOAD ioctl: up to 511
groups per call, checksums verified, straight into the registered memory).

The requests file ("-" for stdin) has one group per line, either

    BLOCK LAYER HEAD KIND [OFFSET [PITCH]]

(BLOCK in hex, LAYER and HEAD in decimal, KIND K or V, OFFSET and PITCH in
bytes, units like 64KiB allowed) or a JSON object per line:

    {"block": "00ab", "layer": 0, "head": 1, "kind": "V", "offset": 4096, "pitch": 0}

Blank lines and lines starting with # are skipped. OFFSET is where the
tile's first row goes in the buffer; without it, groups are packed one after
the other in file order. PITCH 0 (the default) means the tile's rows are
contiguous; otherwise row r goes to OFFSET + r*PITCH.

--into SHMFILE loads into that file of /dev/shm (created, mode 0600, when
missing; it must be large enough when it exists) and leaves it there.
Without it a temporary /dev/shm file is used and removed; --out FILE ("-"
for stdout) saves the loaded buffer. Entries that are not ok are listed on
stderr (all of them as JSON on stdout with --json); the exit status is 1
when any entry is not ok.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || args[0] == "" {
				return usageErrorf("load takes one MOUNTPOINT argument, got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := c.Flags()
	f.StringVar(&o.requests, "requests", "", "file of groups to load, one per line (- for stdin)")
	f.StringVar(&o.into, "into", "", "load into this /dev/shm file (kept)")
	f.StringVar(&o.out, "out", "", "write the loaded buffer to FILE (- for stdout)")
	f.BoolVar(&o.json, "json", false, "print every entry and its status as JSON")
	addCommand(c)
}

// loadEntry is one entry of kvfs load --json: the request and its outcome.
type loadEntry struct {
	client.Request
	Status string `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`
}

func (o *loadOptions) run(cmd *cobra.Command, mountpoint string) (err error) {
	if o.requests == "" {
		return usageErrorf("load needs --requests FILE (- for stdin)")
	}
	if o.json && o.out == "-" {
		return usageErrorf("--json and --out - both write to stdout")
	}
	if o.into != "" {
		abs, err := filepath.Abs(o.into)
		if err != nil {
			return err
		}
		if rel, ok := strings.CutPrefix(abs, client.ShmDir+"/"); !ok || rel == "" {
			return usageErrorf("--into %s: the file must be in %s", o.into, client.ShmDir)
		}
		o.into = abs
	}
	var in io.Reader = cmd.InOrStdin()
	if o.requests != "-" {
		f, err := os.Open(o.requests)
		if err != nil {
			return err
		}
		defer f.Close()
		in = f
	}
	reqs, err := client.ParseRequests(in)
	if err != nil {
		return usageError{err}
	}
	if len(reqs) == 0 {
		return usageErrorf("--requests %s lists no groups", o.requests)
	}
	c, err := client.Open(mountpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	info := c.Info()
	size, err := client.PlaceRequests(reqs, info)
	if err != nil {
		return usageError{err}
	}

	var buf *client.HostBuffer
	if o.into != "" {
		buf, err = openInto(c, o.into, size)
	} else {
		buf, err = c.NewHostBuffer("", size)
	}
	if err != nil {
		return err
	}
	defer func() {
		if cerr := buf.Close(); err == nil {
			err = cerr
		}
	}()

	es := make([]client.Entry, len(reqs))
	for i := range reqs {
		es[i] = reqs[i].Entry(buf.ID)
	}
	st := make([]client.Status, len(es))
	det := make([]client.Detail, len(es))
	start := time.Now()
	nok, err := c.Batch(true, es, st, det)
	if err != nil {
		return err
	}
	took := time.Since(start)
	counts := map[client.Status]int{}
	stderr := cmd.ErrOrStderr()
	entries := make([]loadEntry, len(reqs))
	for i := range reqs {
		entries[i] = loadEntry{Request: reqs[i], Status: st[i].String(), Detail: det[i].String()}
		counts[st[i]]++
		if st[i] != client.OK && !o.json {
			q := reqs[i]
			fmt.Fprintf(stderr, "line %d: %s %d %d %s: %s", q.Line, q.Block, q.Layer, q.Head, q.Kind, st[i])
			if det[i] != 0 {
				fmt.Fprintf(stderr, " (%s)", det[i])
			}
			fmt.Fprintln(stderr)
		}
	}
	if o.out != "" {
		if o.out == "-" {
			_, err = cmd.OutOrStdout().Write(buf.Mem)
		} else {
			err = writeFileAtomic(o.out, buf.Mem)
		}
		if err != nil {
			return err
		}
	}
	if o.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		if err := enc.Encode(struct {
			OK      int         `json:"ok"`
			Total   int         `json:"total"`
			Buffer  string      `json:"buffer"`
			Seconds float64     `json:"seconds"`
			Entries []loadEntry `json:"entries"`
		}{nok, len(reqs), buf.Path, took.Seconds(), entries}); err != nil {
			return err
		}
	}
	summary := fmt.Sprintf("loaded %d of %d groups (%d bytes) in %v", nok, len(reqs), nok*info.GroupBytes, took.Round(time.Microsecond))
	for _, s := range []client.Status{client.Absent, client.Corrupt, client.BadRequest, client.IOError} {
		if counts[s] > 0 {
			summary += fmt.Sprintf(", %d %s", counts[s], s)
		}
	}
	if o.into != "" {
		summary += " into " + buf.Path
	}
	fmt.Fprintln(stderr, summary)
	if nok != len(reqs) {
		return fmt.Errorf("%d of %d groups not loaded", len(reqs)-nok, len(reqs))
	}
	return nil
}

// openInto opens (or creates) the --into file (an absolute path in
// /dev/shm) with at least size bytes and registers all of it.
func openInto(c *client.Client, path string, size int64) (*client.HostBuffer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && st.Size() < size {
		if st.Size() == 0 {
			err = f.Truncate(size)
		} else {
			err = fmt.Errorf("--into %s has %d bytes, the requests need %d", path, st.Size(), size)
		}
	}
	f.Close()
	if err != nil {
		return nil, err
	}
	return c.OpenHostBuffer(path, 0)
}

// benchLoadOptions are the flags of kvfs bench-load.
type benchLoadOptions struct {
	groupsPerCall int
	calls         int
	jobs          int
	warmup        int
	fill          int
	seed          uint64
	workingSet    int
	zipf          float64
	json          bool
	blocksPerCall int
	layersPerCall int
	layout        string
	sweep         bool
	plot          string
	daemonPID     int
	into          string
	h2dChunk      string
	store         bool
	scatter       bool
	prefixes      int
}

func init() {
	var o benchLoadOptions
	c := &cobra.Command{
		Use:   "bench-load MOUNTPOINT [--groups-per-call N | --blocks-per-call N [--layout nhd|hnd|hf]] --calls N [--jobs J | --sweep [--plot FILE]] [--fill K] [--working-set N [--zipf S]] [--into host|cuda[:N,M]|pinned[:N]] [--store] [--daemon-pid PID] [--json]",
		Short: "Measure loads through the control ioctls into host shared memory",
		Long: `Measure end-to-end LOAD throughput of the kvfs mounted on MOUNTPOINT: each
call is one LOAD ioctl of --groups-per-call groups of whole random blocks
(all groups of a block, in slot order; the last block of a call may be
partial) into a registered /dev/shm buffer, packed in order, so the store
can land coalesced reads straight in it. --jobs callers issue --calls calls
each, concurrently, on one open control file.

The blocks are those listed in the mount's layer directories; --fill K first
STOREs random blocks until K are present (this writes to the store). Each
call draws its blocks uniformly from all of them (--seed seeds the draw),
or, with --working-set N, from the first N in id order (--fill N stores
them first); --zipf S draws them with Zipf(S) popularity instead (the
working set's block of rank k with probability proportional to
1/(k+1)^S: a few hot blocks, a long tail), the access pattern a DRAM tier
smaller than the working set is for. The report says how the blocks were
drawn (working_set and zipf in the JSON; zipf 0 is uniform).

With --blocks-per-call N (ABI minor 2) each call is one LOAD_BLOCKS of N
random whole blocks into cache blocks 0..N-1 of the caller's own KV-cache
target, laid out as --layout: nhd (vLLM/FlashAttention [blocks, tokens,
heads, head_dim], the default), hnd (FlashInfer [blocks, heads, tokens,
head_dim]) or hf (one Hugging Face sequence [heads, tokens, head_dim]);
the entries go inline up to 509, else through a registered entry array.
--layers-per-call K loads K layers of the blocks per call instead, the
next K each call, new blocks drawn at layer 0 without repeats (one
prefix's blocks): the calls of a layer-by-layer loader (kvfs.hf's); K =
the store's layers is one call of every layer, drawn the same way.
--stored-prefixes P with it has each caller first store P prefixes of its
own, each with one STORE_BLOCKS, and load those in turn: a prefix stored
in one piece lies in consecutive slots, where the fill's random blocks lie
anywhere, and a direct GPU load copies each head of a (layer, kind) across
such blocks at once.
--into cuda[:N[,M…]] puts each caller's target in GPU memory this process
allocates (callers round-robin over the devices) and registers it with
REGISTER_CUDA: the daemon reads into its pinned staging buffers and copies
to the GPU. The report adds each device's GB/s and the pinned host-to-device
copy rate measured on it in the same run (--h2d-chunk bytes per copy).
--into pinned[:N,…] is the simplest GPU path instead: host targets this
process pins for CUDA (cuMemHostRegister), loaded by the daemon as host
memory, then copied by this process to its GPU memory inside each call.
--store measures STORE_BLOCKS instead: each call stores the caller's whole
target (cache blocks 0..N-1) durably, as blocks of the caller's own that each
call replaces (this writes to the store; a GPU target with --into cuda is
copied device-to-host into staging and written from there).

Reports GB/s (wall clock), µs per ioctl (mean, p50, p99 of each call's
latency) and µs per group (mean call latency / groups per call). --sweep runs
the measurement with 1, 2, 4, 8 and 16 callers and prints a table; --plot
FILE.svg|.png also draws GB/s against callers.
The report includes the daemon's CPU time during each measurement, in
core-seconds per GB moved, read from the mount's .kvfs/stats
(daemon_cpu_seconds); --daemon-pid PID reads it from /proc/PID/stat
instead, for a daemon whose stats do not carry it. Compare with
'kvfs bench STORE --blocks B --qd J' on the same store, unmounted, for the
store's own cost with the same access pattern. On a mount with a DRAM tier
(kvfs mount --dram) the report adds the share of the groups read during the
measured calls that landed from the tier (dram_hit_ratio, from .kvfs/stats).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 || args[0] == "" {
				return usageErrorf("bench-load takes one MOUNTPOINT argument, got %d", len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := c.Flags()
	f.IntVar(&o.groupsPerCall, "groups-per-call", 256, "groups per LOAD ioctl (1..511)")
	f.IntVar(&o.calls, "calls", 1000, "measured calls per job")
	f.IntVar(&o.jobs, "jobs", 1, "concurrent callers")
	f.IntVar(&o.warmup, "warmup", 10, "unmeasured calls per job first")
	f.IntVar(&o.fill, "fill", 0, "first store random blocks until K blocks are present")
	f.Uint64Var(&o.seed, "seed", 1, "random seed of the block choice")
	f.IntVar(&o.workingSet, "working-set", 0, "draw the loaded blocks from the first N of the mount's blocks in id order (0: all)")
	f.Float64Var(&o.zipf, "zipf", 0, "draw the loaded blocks with Zipf(S) popularity over the working set (0: uniformly)")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.IntVar(&o.blocksPerCall, "blocks-per-call", 0, "whole blocks per LOAD_BLOCKS (1..65536; 0: LOAD of --groups-per-call groups)")
	f.StringVar(&o.layout, "layout", "nhd", "cache layout of --blocks-per-call: nhd, hnd or hf")
	f.IntVar(&o.layersPerCall, "layers-per-call", 0, "with --blocks-per-call: load that many layers of the blocks per call, stepping through the layers call by call and drawing new blocks at layer 0, as a layer-by-layer loader does (a divisor of the store's layers; 0: all)")
	f.BoolVar(&o.sweep, "sweep", false, "measure with 1, 2, 4, 8 and 16 callers and print a table")
	f.StringVar(&o.plot, "plot", "", "with --sweep: write a plot of GB/s against callers to FILE (.svg or .png)")
	f.IntVar(&o.daemonPID, "daemon-pid", 0, "read the daemon's CPU time from /proc/PID/stat instead of the mount's .kvfs/stats")
	f.StringVar(&o.into, "into", "host", "where the targets live: host (/dev/shm), cuda (device 0), cuda:N or cuda:N,M (jobs round-robin over the devices; per-device and aggregate GB/s, with the pinned H2D rate measured in the same run), or pinned[:N,…] (host targets pinned for CUDA, the client copies to the GPU after each call); needs --blocks-per-call")
	f.StringVar(&o.h2dChunk, "h2d-chunk", "4MiB", "bytes per copy of the pinned H2D measurement of --into cuda")
	f.IntVar(&o.prefixes, "stored-prefixes", 0, "with --layers-per-call: each caller first stores N prefixes of --blocks-per-call blocks of its own, each with one STORE_BLOCKS (consecutive slots, as an engine stores a prefix it computed), and loads them in turn instead of the fill's blocks (writes to the store)")
	f.BoolVar(&o.scatter, "scatter", false, "with --blocks-per-call: land each call's blocks in the target's cache blocks in a random order, drawn per call (as a paged cache's free list hands them out)")
	f.BoolVar(&o.store, "store", false, "with --blocks-per-call: measure STORE_BLOCKS of each caller's whole target (as blocks of its own, replaced call after call; writes to the store)")
	addCommand(c)
}

func (o *benchLoadOptions) run(cmd *cobra.Command, mountpoint string) error {
	switch {
	case o.groupsPerCall < 1 || o.groupsPerCall > 511:
		return usageErrorf("--groups-per-call %d: want 1..511 (one LOAD ioctl)", o.groupsPerCall)
	case o.calls < 1 || o.jobs < 1 || o.warmup < 0 || o.fill < 0:
		return usageErrorf("--calls and --jobs must be positive, --warmup and --fill not negative")
	case o.blocksPerCall < 0 || o.blocksPerCall > 65536:
		return usageErrorf("--blocks-per-call %d: want 1..65536 (one LOAD_BLOCKS)", o.blocksPerCall)
	case o.layout != "nhd" && o.layout != "hnd" && o.layout != "hf":
		return usageErrorf("--layout %q: want nhd, hnd or hf", o.layout)
	case o.daemonPID < 0:
		return usageErrorf("--daemon-pid %d", o.daemonPID)
	case o.workingSet < 0:
		return usageErrorf("--working-set %d: want a count of blocks (0: all)", o.workingSet)
	case !(o.zipf >= 0) || math.IsInf(o.zipf, 0):
		return usageErrorf("--zipf %v: want an exponent of 0 (uniform) or more", o.zipf)
	case o.store && (o.workingSet != 0 || o.zipf != 0):
		return usageErrorf("--working-set and --zipf choose the blocks loaded; --store writes blocks of its own")
	case o.plot != "" && !o.sweep:
		return usageErrorf("--plot draws a sweep: add --sweep")
	}
	if o.plot != "" {
		if _, err := benchplot.FormatOf(o.plot); err != nil {
			return usageErrorf("--plot: %v", err)
		}
	}
	devs, pinned, err := bench.ParseInto(o.into)
	if err != nil {
		return usageErrorf("%v", err)
	}
	if o.store && o.blocksPerCall == 0 {
		return usageErrorf("--store needs --blocks-per-call")
	}
	if o.scatter && o.blocksPerCall == 0 {
		return usageErrorf("--scatter needs --blocks-per-call")
	}
	if o.prefixes < 0 || o.prefixes > 0 && o.layersPerCall == 0 {
		return usageErrorf("--stored-prefixes %d: a count of prefixes for loads of --layers-per-call", o.prefixes)
	}
	if o.layersPerCall != 0 && (o.blocksPerCall == 0 || o.store || o.layersPerCall < 0) {
		return usageErrorf("--layers-per-call %d: a count of layers for loads of --blocks-per-call", o.layersPerCall)
	}
	if len(devs) > 0 && o.blocksPerCall == 0 {
		return usageErrorf("--into %s needs --blocks-per-call (targets in GPU memory)", o.into)
	}
	chunk, err := bytesize.Parse(o.h2dChunk)
	if err != nil || chunk < 1 || chunk > 1<<30 {
		return usageErrorf("--h2d-chunk %q: want a size up to 1GiB", o.h2dChunk)
	}
	c, err := client.Open(mountpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	cfg := bench.LoadConfig{Devices: devs, Pinned: pinned, H2DChunk: int(chunk), Client: c, Mountpoint: mountpoint, GroupsPerCall: o.groupsPerCall,
		Calls: o.calls, Jobs: o.jobs, Warmup: o.warmup, Fill: o.fill, Seed: o.seed, WorkingSet: o.workingSet, Zipf: o.zipf,
		BlocksPerCall: o.blocksPerCall, LayersPerCall: o.layersPerCall, Layout: o.layout, DaemonPID: o.daemonPID, Store: o.store,
		Scatter: o.scatter, StoredPrefixes: o.prefixes}
	// The fill's progress line ends when the fill does, before measuring.
	fill := progress.New(cmd.ErrOrStderr(), "fill", "blocks", progress.Count, int64(o.fill))
	defer fill.Done()
	cfg.FillProgress = func(done, total int64) {
		fill.Update(done, total)
		if done >= total {
			fill.Done()
		}
	}
	if o.sweep {
		reps, err := bench.RunLoadSweep(cfg, nil)
		if err != nil {
			return o.loadErr(err)
		}
		if o.plot != "" {
			if err := benchplot.Write(o.plot, benchplot.LoadSweep(reps)); err != nil {
				return err
			}
		}
		out := cmd.OutOrStdout()
		if o.json {
			return json.NewEncoder(out).Encode(reps)
		}
		_, err = fmt.Fprintln(out, bench.SweepTable(reps))
		return err
	}
	rep, err := bench.RunLoad(cfg)
	if err != nil {
		return o.loadErr(err)
	}
	out := cmd.OutOrStdout()
	if o.json {
		return json.NewEncoder(out).Encode(rep)
	}
	_, err = fmt.Fprintln(out, rep)
	return err
}

func (o *benchLoadOptions) loadErr(err error) error {
	switch {
	case errors.Is(err, bench.ErrFewBlocks):
		return fmt.Errorf("%w; put some, or pass --fill K", err)
	case errors.Is(err, bench.ErrConfig):
		return usageErrorf("%v", err)
	}
	return err
}
