package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/kvfs/kvfs/store"
)

// Ops and patterns.
const (
	OpRead        = "read"
	OpWrite       = "write"
	PatternSeq    = "seq"
	PatternRandom = "random"
)

// Modes of issuing requests.
const (
	// ModeAuto is ModeAsync when the engine implements AsyncEngine, else
	// ModeSync.
	ModeAuto = "auto"
	// ModeSync runs QD goroutines, each calling Engine.Do with one request
	// at a time: the path the store uses.
	ModeSync = "sync"
	// ModeAsync keeps QD requests in flight through AsyncEngine.DoAsync,
	// starting the next request from each completion, as fio does.
	ModeAsync = "async"
)

// AsyncEngine is implemented by engines that can start requests without
// waiting for them (the uring and nvme engines). done(i) runs when ios[i] completes; it
// may start more requests.
type AsyncEngine interface {
	DoAsync(ios []store.IO, done func(i int)) error
}

// ErrConfig is wrapped by errors about an invalid Config or FioConfig.
var ErrConfig = errors.New("bench: invalid configuration")

// Config describes one engine benchmark.
type Config struct {
	// Path names the file or device (for reports; the engine is already
	// open on it).
	Path string
	// Engine is the opened engine. For QD > 1 its own queue depth should be
	// at least QD (uring: EngineOptions.QueueDepth).
	Engine store.Engine
	// Op is "read" (default) or "write". Writes overwrite the region.
	Op string
	// Pattern is "random" (default; offsets uniform over the region, in
	// IOSize steps) or "seq" (consecutive, wrapping around).
	Pattern string
	// IOSize is the bytes per request (default 1 MiB); a multiple of the
	// engine's Align.
	IOSize int
	// QD is the number of requests in flight (default 1).
	QD int
	// Duration is how long requests are issued (default 5 s).
	Duration time.Duration
	// Region is how many bytes from Offset are used (default: the rest of
	// the engine's size); it is rounded down to a multiple of IOSize.
	Region int64
	// Offset is where the region starts; a multiple of the engine's Align.
	Offset int64
	// Seed seeds the random offsets; 0 picks a new seed each run (as fio
	// does with --randrepeat=0), so that no cache below the engine sees the
	// same offsets run after run.
	Seed uint64
	// Mode is how requests are issued: auto (default), sync or async.
	Mode string
	// Logger receives progress lines; nil means none.
	Logger *zap.Logger
}

// jobDefaults fills the unset fields of a job's shape, the same for Run and
// RunFio: random 1 MiB reads at queue depth 1 for 5 s.
func jobDefaults(op, pattern *string, ioSize, qd *int, d *time.Duration) {
	if *op == "" {
		*op = OpRead
	}
	if *pattern == "" {
		*pattern = PatternRandom
	}
	if *ioSize == 0 {
		*ioSize = 1 << 20
	}
	if *qd == 0 {
		*qd = 1
	}
	if *d == 0 {
		*d = 5 * time.Second
	}
}

func (c *Config) ensureDefaults() {
	jobDefaults(&c.Op, &c.Pattern, &c.IOSize, &c.QD, &c.Duration)
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	if c.Mode == "" {
		c.Mode = ModeAuto
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
}

func checkShape(op, pattern string, ioSize, qd int, duration time.Duration, off, region int64) error {
	switch {
	case op != OpRead && op != OpWrite:
		return fmt.Errorf("%w: op %q (want read or write)", ErrConfig, op)
	case pattern != PatternSeq && pattern != PatternRandom:
		return fmt.Errorf("%w: pattern %q (want seq or random)", ErrConfig, pattern)
	case ioSize <= 0:
		return fmt.Errorf("%w: io size %d", ErrConfig, ioSize)
	case qd <= 0:
		return fmt.Errorf("%w: queue depth %d", ErrConfig, qd)
	case duration <= 0:
		return fmt.Errorf("%w: duration %v", ErrConfig, duration)
	case off < 0:
		return fmt.Errorf("%w: offset %d", ErrConfig, off)
	case region < int64(ioSize):
		return fmt.Errorf("%w: region of %d bytes is smaller than one %d-byte request", ErrConfig, region, ioSize)
	}
	return nil
}

// Validate applies the defaults and checks c against its engine.
func (c *Config) Validate() error {
	c.ensureDefaults()
	if c.Engine == nil {
		return fmt.Errorf("%w: no engine", ErrConfig)
	}
	size := c.Engine.Size()
	if c.Region == 0 {
		c.Region = size - c.Offset
	}
	if err := checkShape(c.Op, c.Pattern, c.IOSize, c.QD, c.Duration, c.Offset, c.Region); err != nil {
		return err
	}
	_, async := c.Engine.(AsyncEngine)
	switch c.Mode {
	case ModeAuto:
		c.Mode = ModeSync
		if async {
			c.Mode = ModeAsync
		}
	case ModeSync:
	case ModeAsync:
		if !async {
			return fmt.Errorf("%w: engine %s cannot run async", ErrConfig, c.Engine.Name())
		}
	default:
		return fmt.Errorf("%w: mode %q (want auto, sync or async)", ErrConfig, c.Mode)
	}
	if c.Offset+c.Region > size {
		return fmt.Errorf("%w: region [%d, %d) ends past the device's %d bytes", ErrConfig, c.Offset, c.Offset+c.Region, size)
	}
	if a := int64(max(1, c.Engine.Align())); int64(c.IOSize)%a != 0 || c.Offset%a != 0 {
		return fmt.Errorf("%w: io size %d and offset %d must be multiples of the engine's alignment %d", ErrConfig, c.IOSize, c.Offset, a)
	}
	return nil
}

// Result is a benchmark's outcome. GBps is 10^9 bytes per second.
type Result struct {
	Engine     string  `json:"engine"`
	Op         string  `json:"op"`
	Pattern    string  `json:"pattern"`
	IOSize     int     `json:"io_size"`
	QD         int     `json:"qd"`
	Mode       string  `json:"mode,omitempty"`
	GBps       float64 `json:"gbps"`
	IOPS       float64 `json:"iops"`
	P50us      float64 `json:"p50_us"`
	P99us      float64 `json:"p99_us"`
	Bytes      int64   `json:"bytes"`
	Ops        int64   `json:"ops"`
	Seconds    float64 `json:"seconds"`
	FioGBps    float64 `json:"fio_gbps,omitempty"`
	RatioVsFio float64 `json:"ratio_vs_fio,omitempty"`
	// CPUs is the CPU time (user + system, seconds) the measuring process
	// used over the run (getrusage; for fio, fio's and its jobs'), and
	// CPUsPerGB that per 10^9 bytes moved.
	CPUs      float64 `json:"cpu_s"`
	CPUsPerGB float64 `json:"cpu_s_per_gb"`
	// FioCPUs and FioCPUsPerGB are fio's figures (CompareFio).
	FioCPUs      float64 `json:"fio_cpu_s,omitempty"`
	FioCPUsPerGB float64 `json:"fio_cpu_s_per_gb,omitempty"`
}

// CompareFio records fio's figure for the same job and the ratio of r's
// throughput to it.
func (r *Result) CompareFio(fio Result) {
	r.FioGBps = fio.GBps
	r.FioCPUs, r.FioCPUsPerGB = fio.CPUs, fio.CPUsPerGB
	if fio.GBps > 0 {
		r.RatioVsFio = r.GBps / fio.GBps
	}
}

func (r Result) String() string {
	eng := r.Engine
	if r.Mode != "" {
		eng += "/" + r.Mode
	}
	s := fmt.Sprintf("%s %s %s bs=%d qd=%d: %.3f GB/s, %.0f IOPS, p50 %.0f µs, p99 %.0f µs, cpu %.2f s (%.3f s/GB) (%d ops in %.2f s)",
		eng, r.Pattern, r.Op, r.IOSize, r.QD, r.GBps, r.IOPS, r.P50us, r.P99us, r.CPUs, r.CPUsPerGB, r.Ops, r.Seconds)
	if r.FioGBps > 0 {
		s += fmt.Sprintf("; fio %.3f GB/s (cpu %.3f s/GB), ratio %.3f", r.FioGBps, r.FioCPUsPerGB, r.RatioVsFio)
	}
	return s
}

// Run issues requests through c.Engine.Do with c.QD in flight for
// c.Duration (or until ctx ends) and measures them. A failed request ends
// the run with its error.
func Run(ctx context.Context, c Config) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	e := c.Engine
	bufs := make([][]byte, c.QD)
	for i := range bufs {
		b, free, err := allocIO(e, c.IOSize)
		if err != nil {
			return Result{}, err
		}
		defer free()
		bufs[i] = b
		if c.Op == OpWrite {
			fillRandom(bufs[i], c.Seed+uint64(i))
		}
	}
	op := store.OpRead
	if c.Op == OpWrite {
		op = store.OpWrite
	}
	blocks := c.Region / int64(c.IOSize)
	c.Logger.Info("bench: start", zap.String("engine", e.Name()), zap.String("path", c.Path),
		zap.String("op", c.Op), zap.String("pattern", c.Pattern), zap.Int("io_size", c.IOSize),
		zap.Int("qd", c.QD), zap.String("mode", c.Mode), zap.Duration("duration", c.Duration), zap.Int64("offset", c.Offset),
		zap.Int64("region", blocks*int64(c.IOSize)))

	next := offsets(c)
	cpu0 := CPUSeconds()
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.Duration)
	defer cancel()
	var stop atomic.Bool
	go func() {
		<-ctx.Done()
		stop.Store(true)
	}()
	var (
		lats   [][]time.Duration
		runErr error
	)
	if c.Mode == ModeAsync {
		lats, runErr = runAsync(c, op, bufs, next, &stop)
	} else {
		lats, runErr = runSync(c, op, bufs, next, &stop)
	}
	elapsed := time.Since(start).Seconds()
	cpu := CPUSeconds() - cpu0
	if runErr != nil {
		return Result{}, runErr
	}
	all := slices.Concat(lats...)
	slices.Sort(all)
	res := Result{
		Engine: e.Name(), Op: c.Op, Pattern: c.Pattern, IOSize: c.IOSize, QD: c.QD, Mode: c.Mode,
		Ops: int64(len(all)), Bytes: int64(len(all)) * int64(c.IOSize), Seconds: elapsed,
		P50us: Micros(Percentile(all, 50)), P99us: Micros(Percentile(all, 99)),
		CPUs: cpu,
	}
	res.CPUsPerGB = PerGB(cpu, res.Bytes)
	if elapsed > 0 {
		res.GBps = float64(res.Bytes) / elapsed / 1e9
		res.IOPS = float64(res.Ops) / elapsed
	}
	c.Logger.Info("bench: done", zap.Stringer("result", res))
	return res, nil
}

// offsets returns the offset generator of worker w (random) or of the
// whole run (seq); it is called by one goroutine at a time per worker.
func offsets(c Config) func(w int) int64 {
	blocks := c.Region / int64(c.IOSize)
	if c.Pattern == PatternSeq {
		var n atomic.Int64
		return func(int) int64 { return c.Offset + (n.Add(1)-1)%blocks*int64(c.IOSize) }
	}
	rngs := make([]*rand.Rand, c.QD)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(c.Seed, uint64(w)))
	}
	return func(w int) int64 { return c.Offset + rngs[w].Int64N(blocks)*int64(c.IOSize) }
}

// runSync runs QD goroutines, each with one request per Engine.Do.
func runSync(c Config, op store.Op, bufs [][]byte, next func(int) int64, stop *atomic.Bool) ([][]time.Duration, error) {
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		runErr  error
		lats    = make([][]time.Duration, c.QD)
	)
	for w := 0; w < c.QD; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ios := []store.IO{{Op: op, Buf: bufs[w]}}
			lat := make([]time.Duration, 0, 1024)
			for !stop.Load() {
				ios[0].Off = next(w)
				t0 := time.Now()
				err := c.Engine.Do(ios)
				d := time.Since(t0)
				if err == nil {
					err = ios[0].Err
				}
				if err != nil {
					errOnce.Do(func() {
						runErr = fmt.Errorf("bench: %s %s at offset %d: %w", c.Engine.Name(), c.Op, ios[0].Off, err)
						stop.Store(true)
					})
					break
				}
				lat = append(lat, d)
			}
			lats[w] = lat
		}()
	}
	wg.Wait()
	return lats, runErr
}

// runAsync keeps QD requests in flight with DoAsync: each completion
// records its latency and starts the slot's next request.
func runAsync(c Config, op store.Op, bufs [][]byte, next func(int) int64, stop *atomic.Bool) ([][]time.Duration, error) {
	ae := c.Engine.(AsyncEngine)
	var (
		mu       sync.Mutex // guards the fields below; callbacks run on the engine's goroutine
		active   = c.QD
		runErr   error
		lats     = make([][]time.Duration, c.QD)
		finished = make(chan struct{})
	)
	ios := make([]store.IO, c.QD)
	starts := make([]time.Time, c.QD)
	cbs := make([]func(int), c.QD)
	// retire ends slot w; mu is held.
	retire := func(err error) {
		if err != nil && runErr == nil {
			runErr = err
			stop.Store(true)
		}
		if active--; active == 0 {
			close(finished)
		}
	}
	for w := range cbs {
		ios[w] = store.IO{Op: op, Buf: bufs[w]}
		lats[w] = make([]time.Duration, 0, 1024)
		cbs[w] = func(int) {
			d := time.Since(starts[w])
			mu.Lock()
			if err := ios[w].Err; err != nil {
				retire(fmt.Errorf("bench: %s %s at offset %d: %w", c.Engine.Name(), c.Op, ios[w].Off, err))
				mu.Unlock()
				return
			}
			lats[w] = append(lats[w], d)
			if stop.Load() {
				retire(nil)
				mu.Unlock()
				return
			}
			ios[w].Off = next(w)
			starts[w] = time.Now()
			mu.Unlock()
			if err := ae.DoAsync(ios[w:w+1], cbs[w]); err != nil {
				mu.Lock()
				retire(fmt.Errorf("bench: %s: %w", c.Engine.Name(), err))
				mu.Unlock()
			}
		}
	}
	for w := range cbs {
		mu.Lock()
		ios[w].Off = next(w)
		starts[w] = time.Now()
		mu.Unlock()
		if err := ae.DoAsync(ios[w:w+1], cbs[w]); err != nil {
			mu.Lock()
			retire(fmt.Errorf("bench: %s: %w", c.Engine.Name(), err))
			mu.Unlock()
		}
	}
	<-finished
	return lats, runErr
}

// Percentile is the nearest-rank p-th percentile (0 < p ≤ 100) of sorted
// latencies: the smallest one that at least p % of them do not exceed. It
// is 0 for none. Every latency figure kvfs reports comes from it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p*float64(len(sorted))/100)) - 1
	rank = min(max(rank, 0), len(sorted)-1)
	return sorted[rank]
}

// Micros is d in microseconds, the unit of the reports.
func Micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// fillRandom fills b with incompressible bytes, so that a thin-provisioned
// or compressing device cannot shortcut the writes.
func fillRandom(b []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(b); i += 8 {
		v := rng.Uint64()
		b[i], b[i+1], b[i+2], b[i+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(v>>32), byte(v>>40), byte(v>>48), byte(v>>56)
	}
}
