package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/layout"
)

// kvfs load and kvfs bench-load: clients of the control ioctls of a mount
// (package client). kvfs mount serves them (mount.go wires package ctl).

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

// request is one parsed line of a requests file.
type request struct {
	Line   int    `json:"line"`
	Block  string `json:"block"`
	Layer  int    `json:"layer"`
	Head   int    `json:"head"`
	Kind   string `json:"kind"`
	Offset uint64 `json:"offset"`
	Pitch  uint32 `json:"pitch"`
	Status string `json:"status,omitempty"`
	Detail string `json:"detail,omitempty"`

	key     layout.Key
	autoOff bool
}

// parseRequests reads a requests file (see kvfs load --help).
func parseRequests(r io.Reader) ([]request, error) {
	var out []request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		q := request{Line: n}
		var err error
		if line[0] == '{' {
			err = q.parseJSON(line)
		} else {
			err = q.parseFields(strings.Fields(line))
		}
		if err != nil {
			return nil, fmt.Errorf("requests line %d: %w", n, err)
		}
		out = append(out, q)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("requests: %w", err)
	}
	return out, nil
}

func (q *request) parseFields(f []string) error {
	if len(f) < 4 || len(f) > 6 {
		return fmt.Errorf("want BLOCK LAYER HEAD KIND [OFFSET [PITCH]], got %d fields", len(f))
	}
	var err error
	if q.key.Block, err = layout.ParseBlockID(f[0]); err != nil {
		return err
	}
	if q.key.Layer, err = strconv.Atoi(f[1]); err != nil || q.key.Layer < 0 {
		return fmt.Errorf("layer %q is not a number", f[1])
	}
	if q.key.Head, err = strconv.Atoi(f[2]); err != nil || q.key.Head < 0 {
		return fmt.Errorf("head %q is not a number", f[2])
	}
	if q.key.Kind, err = layout.ParseKind(f[3]); err != nil {
		return err
	}
	q.autoOff = true
	if len(f) > 4 {
		off, err := layout.ParseSize(f[4])
		if err != nil {
			return fmt.Errorf("offset: %w", err)
		}
		q.Offset, q.autoOff = uint64(off), false
	}
	if len(f) > 5 {
		p, err := layout.ParseSize(f[5])
		if err != nil || p > 1<<32-1 {
			return fmt.Errorf("pitch %q: want bytes below 4 GiB", f[5])
		}
		q.Pitch = uint32(p)
	}
	q.fill()
	return nil
}

func (q *request) parseJSON(line string) error {
	var j struct {
		Block  json.RawMessage `json:"block"`
		Layer  *int            `json:"layer"`
		Head   *int            `json:"head"`
		Kind   string          `json:"kind"`
		Offset *uint64         `json:"offset"`
		Pitch  uint32          `json:"pitch"`
	}
	d := json.NewDecoder(strings.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&j); err != nil {
		return err
	}
	if j.Layer == nil || j.Head == nil || len(j.Block) == 0 {
		return errors.New(`want at least "block", "layer", "head" and "kind"`)
	}
	var s string
	if json.Unmarshal(j.Block, &s) != nil {
		var n uint64
		if err := json.Unmarshal(j.Block, &n); err != nil {
			return fmt.Errorf("block %s: want a hex string or a number", j.Block)
		}
		s = strconv.FormatUint(n, 16)
	}
	var err error
	if q.key.Block, err = layout.ParseBlockID(s); err != nil {
		return err
	}
	if *j.Layer < 0 || *j.Head < 0 {
		return errors.New("negative layer or head")
	}
	q.key.Layer, q.key.Head, q.Pitch = *j.Layer, *j.Head, j.Pitch
	if q.key.Kind, err = layout.ParseKind(j.Kind); err != nil {
		return err
	}
	q.autoOff = j.Offset == nil
	if j.Offset != nil {
		q.Offset = *j.Offset
	}
	q.fill()
	return nil
}

func (q *request) fill() {
	q.Block, q.Layer, q.Head, q.Kind = fmt.Sprintf("%016x", q.key.Block), q.key.Layer, q.key.Head, q.key.Kind.String()
}

// layoutRequests gives packed offsets to requests without one and returns
// the buffer size the requests need.
func layoutRequests(reqs []request, info client.Info) (int64, error) {
	var next, size uint64
	for i := range reqs {
		q := &reqs[i]
		if q.autoOff {
			q.Offset = next
		}
		ext := uint64(info.GroupBytes)
		if q.Pitch != 0 {
			if int(q.Pitch) < info.RowBytes {
				return 0, usageErrorf("requests line %d: pitch %d is smaller than a row (%d bytes)", q.Line, q.Pitch, info.RowBytes)
			}
			ext = uint64(info.Geometry.BlockTokens-1)*uint64(q.Pitch) + uint64(info.RowBytes)
		}
		end := q.Offset + ext
		if end < q.Offset || end > 1<<46 {
			return 0, usageErrorf("requests line %d: offset %d is too large", q.Line, q.Offset)
		}
		next = max(next, end)
		size = max(size, end)
	}
	return int64(size), nil
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
	reqs, err := parseRequests(in)
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
	size, err := layoutRequests(reqs, info)
	if err != nil {
		return err
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
	for i, q := range reqs {
		es[i] = client.Entry{Key: q.key, Buffer: buf.ID, Offset: q.Offset, Pitch: q.Pitch}
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
	for i := range reqs {
		reqs[i].Status, reqs[i].Detail = st[i].String(), det[i].String()
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
			OK      int       `json:"ok"`
			Total   int       `json:"total"`
			Buffer  string    `json:"buffer"`
			Seconds float64   `json:"seconds"`
			Entries []request `json:"entries"`
		}{nok, len(reqs), buf.Path, took.Seconds(), reqs}); err != nil {
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
	json          bool
}

// benchLoadReport is kvfs bench-load's result.
type benchLoadReport struct {
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
}

func init() {
	var o benchLoadOptions
	c := &cobra.Command{
		Use:   "bench-load MOUNTPOINT --groups-per-call N --calls N [--jobs J] [--fill K] [--json]",
		Short: "Measure loads through the control ioctls into host shared memory",
		Long: `Measure end-to-end LOAD throughput of the kvfs mounted on MOUNTPOINT: each
call is one LOAD ioctl of --groups-per-call groups of whole random blocks
(all groups of a block, in slot order; the last block of a call may be
partial) into a registered /dev/shm buffer, packed in order, so the store
can land coalesced reads straight in it. --jobs callers issue --calls calls
each, concurrently, on one open control file.

The blocks are those listed in the mount's layer directories; --fill K first
STOREs random blocks until K are present (this writes to the store).

Reports GB/s (wall clock), µs per ioctl (mean, p50, p99 of each call's
latency) and µs per group (mean call latency / groups per call). Compare with
'kvfs bench STORE --blocks B --qd J' on the same store, unmounted, for the
store's own cost with the same access pattern.`,
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
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	addCommand(c)
}

// listBlocks returns the blocks present under mountpoint (union over the
// layer directories).
func listBlocks(mountpoint string, g layout.Geometry) ([]uint64, error) {
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

func (o *benchLoadOptions) run(cmd *cobra.Command, mountpoint string) error {
	switch {
	case o.groupsPerCall < 1 || o.groupsPerCall > 511:
		return usageErrorf("--groups-per-call %d: want 1..511 (one LOAD ioctl)", o.groupsPerCall)
	case o.calls < 1 || o.jobs < 1 || o.warmup < 0 || o.fill < 0:
		return usageErrorf("--calls and --jobs must be positive, --warmup and --fill not negative")
	}
	c, err := client.Open(mountpoint)
	if err != nil {
		return err
	}
	defer c.Close()
	info := c.Info()
	g, gb := info.Geometry, info.GroupBytes
	blocks, err := listBlocks(mountpoint, g)
	if err != nil {
		return err
	}
	if len(blocks) < o.fill {
		if blocks, err = fillBlocksCtl(c, blocks, o.fill, o.seed); err != nil {
			return err
		}
	}
	perBlock := g.GroupsPerBlock()
	need := (o.groupsPerCall + perBlock - 1) / perBlock
	if len(blocks) < need {
		return fmt.Errorf("%s holds %d blocks, a call of %d groups needs %d; put some, or pass --fill K", mountpoint, len(blocks), o.groupsPerCall, need)
	}
	callBytes := int64(o.groupsPerCall * gb)
	buf, err := c.NewHostBuffer("", callBytes*int64(o.jobs))
	if err != nil {
		return err
	}
	defer buf.Close()

	lat := make([][]time.Duration, o.jobs)
	notOK := make([]int, o.jobs)
	errs := make([]error, o.jobs)
	var start time.Time
	var ready, wg sync.WaitGroup
	gate := make(chan struct{})
	for j := range o.jobs {
		wg.Add(1)
		ready.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(o.seed, uint64(j)))
			es := make([]client.Entry, o.groupsPerCall)
			st := make([]client.Status, o.groupsPerCall)
			base := uint64(int64(j) * callBytes)
			pick := func() {
				n := 0
				for n < len(es) {
					b := blocks[rng.IntN(len(blocks))]
					for i := 0; i < perBlock && n < len(es); i++ {
						es[n] = client.Entry{Key: g.KeyAt(b, i), Buffer: buf.ID, Offset: base + uint64(n*gb)}
						n++
					}
				}
			}
			for range o.warmup {
				pick()
				if _, err := c.Batch(true, es, st, nil); err != nil {
					errs[j] = err
				}
			}
			ready.Done()
			<-gate
			lat[j] = make([]time.Duration, 0, o.calls)
			for range o.calls {
				pick()
				t0 := time.Now()
				nok, err := c.Batch(true, es, st, nil)
				lat[j] = append(lat[j], time.Since(t0))
				if err != nil {
					errs[j] = err
					return
				}
				notOK[j] += len(es) - nok
			}
		}()
	}
	ready.Wait()
	start = time.Now()
	close(gate)
	wg.Wait()
	wall := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var all []time.Duration
	var sum time.Duration
	rep := benchLoadReport{Mountpoint: mountpoint, Engine: info.Engine, GroupBytes: gb, GroupsPerCall: o.groupsPerCall,
		Calls: o.calls, Jobs: o.jobs, Blocks: len(blocks), Seconds: wall.Seconds()}
	for j := range lat {
		all = append(all, lat[j]...)
		rep.NotOK += notOK[j]
	}
	for _, d := range all {
		sum += d
	}
	slices.Sort(all)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	rep.Bytes = int64(len(all)) * callBytes
	rep.GBps = float64(rep.Bytes) / wall.Seconds() / 1e9
	rep.UsPerCall = us(sum) / float64(len(all))
	rep.P50us = us(all[len(all)/2])
	rep.P99us = us(all[min(len(all)-1, len(all)*99/100)])
	rep.UsPerGroup = rep.UsPerCall / float64(o.groupsPerCall)
	out := cmd.OutOrStdout()
	if o.json {
		return json.NewEncoder(out).Encode(rep)
	}
	fmt.Fprintf(out, "bench-load %s (engine %s): %d jobs × %d calls × %d groups of %d bytes from %d blocks\n",
		mountpoint, rep.Engine, rep.Jobs, rep.Calls, rep.GroupsPerCall, rep.GroupBytes, rep.Blocks)
	fmt.Fprintf(out, "  %.2f GB/s   %.1f µs/ioctl (p50 %.1f, p99 %.1f)   %.3f µs/group   %d bytes in %.3f s\n",
		rep.GBps, rep.UsPerCall, rep.P50us, rep.P99us, rep.UsPerGroup, rep.Bytes, rep.Seconds)
	if rep.NotOK > 0 {
		fmt.Fprintf(out, "  %d groups not ok (absent, corrupt or evicted while measuring)\n", rep.NotOK)
	}
	return nil
}

// fillBlocksCtl stores random whole blocks through STORE until want blocks
// are present.
func fillBlocksCtl(c *client.Client, have []uint64, want int, seed uint64) ([]uint64, error) {
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
				return nil, fmt.Errorf("fill: storing block %016x: %v", b, s)
			}
		}
		present[b] = true
		have = append(have, b)
	}
	return have, nil
}
