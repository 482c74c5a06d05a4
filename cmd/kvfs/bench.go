package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/zap"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/benchplot"
	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/engine/posix"
	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/nvme"
	"github.com/kvfs/kvfs/progress"
	"github.com/kvfs/kvfs/store"
)

// benchOptions are the flags of kvfs bench.
type benchOptions struct {
	storeFlags
	ringFlags
	cpuProfile string
	fioJobs    int
	op         string
	pattern    string
	ioSize     string
	qd         int
	seconds    float64
	vsFio      bool
	json       bool
	forceWrite bool
	blocks     int
	fill       int
	sweep      bool
	plot       string
}

// benchReport is kvfs bench's output; the fio keys are null when fio was
// not run. In --blocks mode io_size is the bytes of one call (whole blocks)
// and iops counts store.Read calls.
type benchReport struct {
	Path          string   `json:"path"`
	Engine        string   `json:"engine"`
	Op            string   `json:"op"`
	Pattern       string   `json:"pattern"`
	IOSize        int      `json:"io_size"`
	QD            int      `json:"qd"`
	GBps          float64  `json:"gbps"`
	IOPS          float64  `json:"iops"`
	P50us         float64  `json:"p50_us"`
	P99us         float64  `json:"p99_us"`
	FioGBps       *float64 `json:"fio_gbps"`
	RatioVsFio    *float64 `json:"ratio_vs_fio"`
	Bytes         int64    `json:"bytes"`
	Ops           int64    `json:"ops"`
	Seconds       float64  `json:"seconds"`
	BlocksPerCall int      `json:"blocks_per_call,omitempty"`
	GroupsPerCall int      `json:"groups_per_call,omitempty"`
	// Rings is the engine's io_uring instances (0 for posix); QueueDepth
	// the engine's queue depth per ring.
	Rings    int `json:"rings"`
	EngineQD int `json:"engine_qd"`
	// CPUs is this process's CPU time over the run (getrusage, user +
	// system seconds), CPUsPerGB that per 10^9 bytes moved; the fio keys
	// are fio's (its process and its jobs), null when fio was not run.
	CPUs         float64  `json:"cpu_s"`
	CPUsPerGB    float64  `json:"cpu_s_per_gb"`
	FioCPUs      *float64 `json:"fio_cpu_s"`
	FioCPUsPerGB *float64 `json:"fio_cpu_s_per_gb"`
	FioJobs      int      `json:"fio_jobs,omitempty"`
	// FioFileWritten is the fraction of the file fio read that holds
	// written data (store.WrittenBytes); null when fio was not run or read
	// a device. Below 1, part of fio's reads were answered with zeros
	// without disk I/O and its figure is inflated: format with --zero.
	FioFileWritten *float64 `json:"fio_file_written,omitempty"`
}

func init() {
	var o benchOptions
	c := &cobra.Command{
		Use:   "bench STORE [--engine posix|uring] [--op read|write] [--pattern seq|random] [--io-size SIZE] [--qd N | --sweep [--plot FILE]] [--seconds N]",
		Short: "Measure an engine (or the store's batched reads) on STORE",
		Long: `Measure throughput and latency on STORE.

Engine mode (the default) keeps --qd requests of --io-size bytes in flight
through the chosen engine for --seconds, and with --vs-fio runs fio on the
same region for comparison (fio is installed with apt-get when missing).
Reads are safe on a live store (no lock is taken). --op write overwrites
the file: it is refused on a formatted store unless --force-write.

Blocks mode (--blocks N) measures the store itself: each call is one
store.Read of every group of N random blocks, --qd calls at a time, so the
figure shows how close the store's coalesced reads come to the engine's.
It takes the store's lock (not while mounted); --fill K --force-write first
writes random blocks until the store holds K. iops then counts calls and
io_size is the bytes of one call; --vs-fio compares with fio random reads
of --io-size at --qd.

--sweep measures at queue depths 1, 2, 4, ... up to --qd (64 when --qd is
not given), one line (or JSON object) per depth; --plot FILE.svg|.png then
draws GB/s against depth (and fio's, with --vs-fio).`,
		Args: storeArg,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd, args[0]) },
	}
	f := c.Flags()
	f.StringVar(&o.op, "op", bench.OpRead, "read or write")
	f.StringVar(&o.pattern, "pattern", bench.PatternRandom, "seq or random")
	f.StringVar(&o.ioSize, "io-size", "1MiB", "bytes per request")
	f.IntVar(&o.qd, "qd", 1, "requests (or --blocks calls) in flight")
	f.Float64Var(&o.seconds, "seconds", 5, "how long to run")
	f.BoolVar(&o.vsFio, "vs-fio", false, "also run fio on the same job and report the ratio")
	f.BoolVar(&o.json, "json", false, "print JSON (snake_case keys)")
	f.BoolVar(&o.forceWrite, "force-write", false, "allow writes that destroy a store's data")
	f.IntVar(&o.blocks, "blocks", 0, "blocks mode: read N whole random blocks per store.Read call")
	f.IntVar(&o.fill, "fill", 0, "blocks mode: first write random blocks until the store holds K (needs --force-write)")
	f.StringVar(&o.cpuProfile, "cpuprofile", "", "write a Go CPU profile of the measurement to FILE (go tool pprof)")
	f.BoolVar(&o.sweep, "sweep", false, "measure at queue depths 1, 2, 4, ... up to --qd (default 64) and print one line each")
	f.StringVar(&o.plot, "plot", "", "with --sweep: write a plot of GB/s against queue depth to FILE (.svg or .png)")
	f.IntVar(&o.fioJobs, "fio-jobs", 1, "--vs-fio: fio jobs (processes), each with --qd in flight")
	addEngineFlag(c, &o.engine)
	addRingFlags(c, &o.ringFlags)
	addCommand(c)
}

func (o *benchOptions) run(cmd *cobra.Command, path string) error {
	log, err := newLogger(cmd)
	if err != nil {
		return err
	}
	kind, err := engine.ParseKind(o.engine)
	if err != nil {
		return usageErrorf("--engine: %v", err)
	}
	ioSize, err := bytesize.Parse(o.ioSize)
	if err != nil || ioSize <= 0 || ioSize > 1<<30 {
		return usageErrorf("--io-size %q: want a size like 4KiB or 1MiB, at most 1GiB", o.ioSize)
	}
	switch {
	case o.op != bench.OpRead && o.op != bench.OpWrite:
		return usageErrorf("--op %q: want read or write", o.op)
	case o.pattern != bench.PatternSeq && o.pattern != bench.PatternRandom:
		return usageErrorf("--pattern %q: want seq or random", o.pattern)
	case o.qd < 1 || o.qd > 4096:
		return usageErrorf("--qd %d: want 1 to 4096", o.qd)
	case !(o.seconds > 0) || o.seconds > 24*3600:
		return usageErrorf("--seconds %v: want a positive duration in seconds", o.seconds)
	case o.blocks < 0 || o.fill < 0:
		return usageErrorf("--blocks and --fill count blocks")
	case o.fill > 0 && o.blocks == 0:
		return usageErrorf("--fill is for blocks mode (--blocks N)")
	case o.blocks > 0 && o.op != bench.OpRead:
		return usageErrorf("--blocks measures reads; --op write is for engine mode")
	case o.fioJobs < 1 || o.fioJobs > 256:
		return usageErrorf("--fio-jobs %d: want 1 to 256", o.fioJobs)
	}
	var plotFormat string
	switch {
	case o.plot != "" && !o.sweep:
		return usageErrorf("--plot draws a sweep: add --sweep")
	case o.plot != "":
		if plotFormat, err = benchplot.FormatOf(o.plot); err != nil {
			return usageErrorf("--plot: %v", err)
		}
	}
	depths := []int{o.qd}
	if o.sweep {
		if !cmd.Flags().Changed("qd") {
			o.qd = bench.SweepDepthMax
		}
		depths = bench.SweepDepths(o.qd)
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.cpuProfile != "" {
		stopProfile, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stopProfile()
	}
	var reps []benchReport
	for _, qd := range depths {
		rep, err := o.measure(ctx, cmd, path, log, kind, int(ioSize), qd)
		if err != nil {
			if errors.Is(err, bench.ErrConfig) {
				return usageErrorf("%v", err)
			}
			return err
		}
		reps = append(reps, rep)
		o.fill = 0 // filled once
	}
	if plotFormat != "" {
		if err := benchplot.Write(o.plot, benchplot.DepthSweep(path, benchPoints(reps))); err != nil {
			return err
		}
	}
	w := cmd.OutOrStdout()
	switch {
	case o.json && o.sweep:
		return writeJSON(w, reps)
	case o.json:
		return writeJSON(w, reps[0])
	}
	for _, rep := range reps {
		fmt.Fprintln(w, rep)
	}
	return nil
}

// measure runs one measurement at depth qd (and fio's, with --vs-fio).
func (o *benchOptions) measure(ctx context.Context, cmd *cobra.Command, path string, log *zap.Logger, kind string, ioSize, qd int) (benchReport, error) {
	o.qd = qd
	dur := time.Duration(o.seconds * float64(time.Second))
	eo := engine.Options{Kind: kind, Logger: log, QueueDepth: max(qd, 1)}
	if o.blocks > 0 {
		// One call of B blocks is up to B·(groups per block) IOs (fewer
		// when coalesced); the engine must not be the throttle.
		eo.QueueDepth = blocksQueueDepth(qd, o.blocks)
	}
	if err := o.ringFlags.apply(&eo); err != nil {
		return benchReport{}, err
	}
	var rep benchReport
	var err error
	if o.blocks > 0 {
		rep, err = o.runBlocks(ctx, cmd.ErrOrStderr(), path, eo, dur)
	} else {
		rep, err = o.runEngine(ctx, path, eo, ioSize, dur, log)
	}
	if err != nil {
		return benchReport{}, err
	}
	if o.vsFio {
		if err := o.compareFio(ctx, path, &rep, ioSize, dur, log); err != nil {
			return benchReport{}, err
		}
	}
	return rep, nil
}

// benchPoints are the plotted figures of a depth sweep.
func benchPoints(reps []benchReport) []benchplot.DepthPoint {
	pts := make([]benchplot.DepthPoint, len(reps))
	for i, r := range reps {
		pts[i] = benchplot.DepthPoint{QD: r.QD, GBps: r.GBps, FioGBps: r.FioGBps, Engine: r.Engine,
			Op: r.Op, Pattern: r.Pattern, IOSize: r.IOSize, BlocksPerCall: r.BlocksPerCall}
	}
	return pts
}

// guardWrite refuses to overwrite a store unless --force-write.
func (o *benchOptions) guardWrite(path string, eo engine.Options) error {
	eo.ReadOnly = true
	e, err := engine.Open(path, eo)
	if err != nil {
		return err
	}
	defer e.Close()
	found, err := store.HoldsStore(e)
	if err != nil {
		return fmt.Errorf("%s: looking for a store: %w", path, err)
	}
	if found && !o.forceWrite {
		return fmt.Errorf("%s holds a kvfs store and --op write would overwrite its data; pass --force-write to destroy it, or bench a scratch file", path)
	}
	return nil
}

func (o *benchOptions) runEngine(ctx context.Context, path string, eo engine.Options, ioSize int, dur time.Duration, log *zap.Logger) (benchReport, error) {
	write := o.op == bench.OpWrite
	if write {
		// Writers take the lock, so a mounted store is never written under.
		lock, err := engine.Lock(path)
		if err != nil {
			return benchReport{}, err
		}
		defer lock.Close()
		if err := o.guardWrite(path, eo); err != nil {
			return benchReport{}, err
		}
	}
	eo.ReadOnly = !write
	e, err := engine.Open(path, eo)
	if err != nil {
		return benchReport{}, err
	}
	defer e.Close()
	r, err := bench.Run(ctx, bench.Config{
		Path: path, Engine: e, Op: o.op, Pattern: o.pattern, IOSize: ioSize, QD: o.qd, Duration: dur, Logger: log,
	})
	if err != nil {
		return benchReport{}, err
	}
	rep := fromResult(path, r)
	rep.Rings, rep.EngineQD = engineRings(e), eo.QueueDepth
	return rep, e.Close()
}

// blocksQueueDepth is the engine queue depth of blocks mode: at least 64
// and twice the IOs qd calls of blocks whole blocks can have in flight
// when each block is one coalesced read, so that deep benchmarks are not
// throttled by the engine.
func blocksQueueDepth(qd, blocks int) int { return max(64, 2*qd*blocks) }

// engineRings is the ring count of a ring engine, 0 for others.
func engineRings(e store.Engine) int {
	if r, ok := e.(interface{ Rings() int }); ok {
		return r.Rings()
	}
	return 0
}

// startCPUProfile writes a CPU profile to path until the returned
// function runs.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// writeProfiles writes the named runtime profiles (pprof.Lookup) to path,
// the first, and path.NAME for the others.
func writeProfiles(path string, names ...string) error {
	for i, name := range names {
		p := path
		if i > 0 {
			p += "." + name
		}
		f, err := os.Create(p)
		if err != nil {
			return err
		}
		err = pprof.Lookup(name).WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s profile: %w", name, err)
		}
	}
	return nil
}

func fromResult(path string, r bench.Result) benchReport {
	return benchReport{Path: path, Engine: r.Engine, Op: r.Op, Pattern: r.Pattern, IOSize: r.IOSize, QD: r.QD,
		GBps: r.GBps, IOPS: r.IOPS, P50us: r.P50us, P99us: r.P99us, Bytes: r.Bytes, Ops: r.Ops, Seconds: r.Seconds,
		CPUs: r.CPUs, CPUsPerGB: r.CPUsPerGB}
}

// fioWrittenMin is the written fraction of a file below which fio's
// figure on it is reported as inflated.
const fioWrittenMin = 0.99

// inflated says which figures a file only frac of which was ever written
// inflates: fio's, which reads the whole file at random; and in engine
// mode the engine's too, which reads it the same way (blocks mode reads
// stored blocks only).
func inflated(frac float64, blocks bool) string {
	who := "fio's figure is inflated"
	if !blocks {
		who = "both figures are inflated (the engine's reads and fio's)"
	}
	return fmt.Sprintf("%s: only %.0f%% of the file was ever written, and the file system answers reads of the rest without disk I/O; format the store with --zero", who, frac*100)
}

// compareFio runs fio on the job rep describes (in blocks mode: random
// reads of --io-size) and records its figure.
func (o *benchOptions) compareFio(ctx context.Context, path string, rep *benchReport, ioSize int, dur time.Duration, log *zap.Logger) error {
	fio, err := bench.EnsureFio(ctx, log)
	if err != nil {
		return err
	}
	fc := bench.FioConfig{Path: path, Op: o.op, Pattern: o.pattern, IOSize: ioSize, QD: o.qd, Duration: dur, Fio: fio, NumJobs: o.fioJobs}
	if o.blocks > 0 {
		fc.Op, fc.Pattern = bench.OpRead, bench.PatternRandom
	}
	if rep.Engine == "nvme" {
		// The nvme engine's reference: fio's own NVMe passthrough engine
		// on the namespace's char device.
		ng, err := nvme.CharDevice(path)
		if err != nil {
			return err
		}
		fc.Path, fc.Passthrough = ng, true
	} else if e, err := posix.Open(path, posix.Options{ReadOnly: true}); err == nil {
		// fio runs buffered where the file system refuses O_DIRECT.
		fc.Buffered = !e.Direct()
		e.Close()
	}
	if written, size, err := store.WrittenBytes(fc.Path); err == nil && size > 0 {
		// fio reads the whole file at random offsets.
		frac := float64(written) / float64(size)
		rep.FioFileWritten = &frac
		if frac < fioWrittenMin {
			log.Warn("bench: "+inflated(frac, o.blocks > 0), zap.String("path", fc.Path), zap.Float64("written_fraction", frac))
		}
	}
	fr, err := bench.RunFio(ctx, fc)
	if err != nil {
		if errors.Is(err, bench.ErrConfig) {
			return usageErrorf("%v", err)
		}
		return err
	}
	gbps, ratio := fr.GBps, 0.0
	if gbps > 0 {
		ratio = rep.GBps / gbps
	}
	rep.FioGBps, rep.RatioVsFio = &gbps, &ratio
	rep.FioCPUs, rep.FioCPUsPerGB, rep.FioJobs = &fr.CPUs, &fr.CPUsPerGB, fc.NumJobs
	return nil
}

// runBlocks measures store.Read of whole random blocks (bench.RunBlocks).
func (o *benchOptions) runBlocks(ctx context.Context, stderr io.Writer, path string, eo engine.Options, dur time.Duration) (rep benchReport, err error) {
	if o.fill > 0 && !o.forceWrite {
		return benchReport{}, usageErrorf("--fill writes blocks into the store (evicting others when it is full); pass --force-write")
	}
	eo.ReadOnly = o.fill == 0
	s, closeAll, err := engine.OpenStore(path, eo, store.Options{Logger: eo.Logger, Lease: writerLease(eo.ReadOnly)})
	if err != nil {
		return benchReport{}, err
	}
	defer closeInto(&err, closeAll)
	if o.fill > 0 {
		m := progress.New(stderr, "fill", "blocks", progress.Count, int64(o.fill))
		err := bench.FillBlocks(s, o.fill, m.Update)
		m.Done()
		if err != nil {
			return benchReport{}, err
		}
	}
	r, err := bench.RunBlocks(ctx, bench.BlocksConfig{Store: s, Blocks: o.blocks, QD: o.qd, Duration: dur})
	if errors.Is(err, bench.ErrFewBlocks) {
		return benchReport{}, fmt.Errorf("%s: %w; put some, or pass --fill K --force-write", path, err)
	}
	if err != nil {
		return benchReport{}, err
	}
	return benchReport{Path: path, Engine: r.Engine, Op: bench.OpRead, Pattern: "blocks", IOSize: r.CallBytes, QD: r.QD,
		GBps: r.GBps, IOPS: r.CallsPerSec, P50us: r.P50us, P99us: r.P99us, Bytes: r.Bytes, Ops: r.Calls, Seconds: r.Seconds,
		BlocksPerCall: r.BlocksPerCall, GroupsPerCall: r.GroupsPerCall,
		Rings: engineRings(s.Engine()), EngineQD: eo.QueueDepth, CPUs: r.CPUs, CPUsPerGB: r.CPUsPerGB}, nil
}

func (r benchReport) String() string {
	eng := r.Engine
	if r.Rings > 0 {
		eng = fmt.Sprintf("%s(%d rings)", r.Engine, r.Rings)
	}
	s := fmt.Sprintf("%s %s %s bs=%d qd=%d: %.3f GB/s, %.0f IOPS, p50 %.0f µs, p99 %.0f µs, cpu %.2f s = %.3f s/GB (%d ops in %.2f s)",
		eng, r.Pattern, r.Op, r.IOSize, r.QD, r.GBps, r.IOPS, r.P50us, r.P99us, r.CPUs, r.CPUsPerGB, r.Ops, r.Seconds)
	if r.BlocksPerCall > 0 {
		s = fmt.Sprintf("%s store.Read of %d blocks (%d groups) per call, qd=%d: %.3f GB/s, %.0f calls/s, p50 %.0f µs, p99 %.0f µs, cpu %.2f s = %.3f s/GB (%d calls in %.2f s)",
			eng, r.BlocksPerCall, r.GroupsPerCall, r.QD, r.GBps, r.IOPS, r.P50us, r.P99us, r.CPUs, r.CPUsPerGB, r.Ops, r.Seconds)
	}
	if r.FioGBps != nil {
		s += fmt.Sprintf("; fio %.3f GB/s, cpu %.3f s/GB, ratio %.3f", *r.FioGBps, *r.FioCPUsPerGB, *r.RatioVsFio)
		if w := r.FioFileWritten; w != nil && *w < fioWrittenMin {
			s += " (" + inflated(*w, r.BlocksPerCall > 0) + ")"
		}
	}
	return s
}
