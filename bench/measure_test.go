package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/posix"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchFile makes (or reuses) a file of size random bytes, synced and
// dropped from the page cache.
func benchFile(t *testing.T, path string, size int64) {
	if st, err := os.Stat(path); err == nil && st.Size() == size {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 8<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		fillRandom(buf, uint64(off))
		if _, err := f.Write(buf[:min(int64(len(buf)), size-off)]); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	_ = unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED)
}

func medianOf(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func geomean(v []float64) float64 {
	sum := 0.0
	for _, x := range v {
		sum += math.Log(x)
	}
	return math.Exp(sum / float64(len(v)))
}

// pairStats summarises paired runs of a and b (b is the reference).
type pairStats struct {
	A, B                 []Result
	MedA, MedB           float64 // median GB/s
	RatioOfMedians       float64
	MedianPairedRatio    float64
	GeomeanPairedRatio   float64
	PairsWonByA, NumPair int
}

func summarise(a, b []Result) pairStats {
	s := pairStats{A: a, B: b, NumPair: len(a)}
	ga, gb, r := make([]float64, len(a)), make([]float64, len(b)), make([]float64, len(a))
	for i := range a {
		ga[i], gb[i] = a[i].GBps, b[i].GBps
		r[i] = ga[i] / gb[i]
		if r[i] >= 1 {
			s.PairsWonByA++
		}
	}
	s.MedA, s.MedB = medianOf(ga), medianOf(gb)
	s.RatioOfMedians = s.MedA / s.MedB
	s.MedianPairedRatio = medianOf(r)
	s.GeomeanPairedRatio = geomean(r)
	return s
}

func gbpsList(rs []Result) string {
	var b strings.Builder
	for i, r := range rs {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%.2f", r.GBps)
	}
	return b.String()
}

func medianResult(rs []Result) Result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b Result) int { return int(math.Copysign(1, a.GBps-b.GBps)) })
	return s[len(s)/2]
}

// series is one kind of run in a rotation.
type series struct {
	name string
	run  func() Result
	res  []Result
}

// rotate runs every series once per round, starting each round with the
// next series, so that drift of the disk hits them all alike.
func rotate(rounds int, ss []*series) {
	for r := 0; r < rounds; r++ {
		for k := range ss {
			s := ss[(k+r)%len(ss)]
			s.res = append(s.res, s.run())
		}
	}
}

// TestMeasure compares the uring engine with fio (random reads, O_DIRECT,
// QD 32, 1 MiB and 128 KiB) and with the posix engine at QD 1. It is a
// measurement, not a test: it runs only with KVFS_BENCH=1. Knobs:
// KVFS_BENCH_FILE (default /var/tmp/kvfs-bench.dat, created with random
// data and kept), KVFS_BENCH_SIZE_MB (4096), KVFS_BENCH_SECONDS (2 per
// run), KVFS_BENCH_RUNS (9 rounds), KVFS_BENCH_QD (32), KVFS_BENCH_FIO_HUGE
// (1: also run fio with --mem=shmhuge, its buffers in huge pages like the
// engine's pool; sets vm.nr_hugepages to 64 for the run and restores it).
//
// Why the last one: on a virtio disk the number of DMA segments per request
// matters a lot, and fio's default buffers are whatever pages malloc got —
// rarely physically contiguous — so plain fio's 1 MiB reads swing by more
// than a factor of two from run to run on a virtual disk, where the
// engine's huge-page pool gives one segment per request (see
// docs/performance.md, 'Engine against fio').
//
// Virtual disks are noisy and drift over tens of seconds, so runs are short
// and rotated (each round starts with the next kind), and the report gives
// medians, the ratio of the medians, and the median and geometric mean of
// the per-round ratios.
//
//	KVFS_BENCH=1 go test -run TestMeasure -v -timeout 30m ./bench
func TestMeasure(t *testing.T) {
	if os.Getenv("KVFS_BENCH") != "1" {
		t.Skip("skipping: a measurement; run with KVFS_BENCH=1")
	}
	if err := uring.Available(); err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("KVFS_BENCH_FILE")
	if path == "" {
		path = "/var/tmp/kvfs-bench.dat"
	}
	size := int64(envInt("KVFS_BENCH_SIZE_MB", 4096)) << 20
	dur := time.Duration(envInt("KVFS_BENCH_SECONDS", 2)) * time.Second
	rounds := envInt("KVFS_BENCH_RUNS", 9)
	qd := envInt("KVFS_BENCH_QD", 32)
	ctx := context.Background()
	fio, err := EnsureFio(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	benchFile(t, path, size)
	fioHuge := os.Getenv("KVFS_BENCH_FIO_HUGE") == "1"
	if fioHuge {
		const sysctl = "/proc/sys/vm/nr_hugepages"
		old, err := os.ReadFile(sysctl)
		if err != nil {
			t.Fatal(err)
		}
		if n, _ := strconv.Atoi(strings.TrimSpace(string(old))); n < 64 {
			if err := os.WriteFile(sysctl, []byte("64"), 0); err != nil {
				t.Fatalf("KVFS_BENCH_FIO_HUGE needs vm.nr_hugepages ≥ 64: %v", err)
			}
			t.Cleanup(func() { os.WriteFile(sysctl, old, 0) })
		}
	}
	t.Logf("file %s, %d MiB; %d rounds of %v runs, rotated", path, size>>20, rounds, dur)

	ue, err := uringengine.OpenEngine(path, uringengine.EngineOptions{Direct: true, QueueDepth: max(64, qd), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ue.Close()
	pe, err := posix.Open(path, posix.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pe.Close()

	engineRun := func(e store.Engine, bs, qd int, mode string) func() Result {
		return func() Result {
			r, err := Run(ctx, Config{Path: path, Engine: e, Op: OpRead, Pattern: PatternRandom, IOSize: bs, QD: qd, Duration: dur, Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	fioRun := func(bs, qd int, extra ...string) func() Result {
		c := FioConfig{Path: path, Op: OpRead, Pattern: PatternRandom, IOSize: bs, QD: qd, Duration: dur, Fio: fio, ExtraArgs: extra}
		args, err := c.Args()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("fio command: %s %s", fio, strings.Join(args, " "))
		return func() Result {
			r, err := RunFio(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	compare := func(a, b *series) {
		s := summarise(a.res, b.res)
		t.Logf("  %s / %s: medians %.3f / %.3f GB/s = %.3f; per-round ratio median %.3f, geomean %.3f; %s ≥ %s in %d/%d rounds",
			a.name, b.name, s.MedA, s.MedB, s.RatioOfMedians, s.MedianPairedRatio, s.GeomeanPairedRatio, a.name, b.name, s.PairsWonByA, s.NumPair)
	}
	var out []Result
	for _, bs := range []int{1 << 20, 128 << 10} {
		async := &series{name: "uring-async", run: engineRun(ue, bs, qd, ModeAsync)}
		sync := &series{name: "uring-sync", run: engineRun(ue, bs, qd, ModeSync)}
		plain := &series{name: "fio", run: fioRun(bs, qd)}
		ss := []*series{async, sync, plain}
		var huge *series
		if fioHuge {
			huge = &series{name: "fio-hugemem", run: fioRun(bs, qd, "--mem=shmhuge")}
			ss = append(ss, huge)
		}
		rotate(rounds, ss)
		t.Logf("random read bs=%d qd=%d, GB/s per round:", bs, qd)
		for _, s := range ss {
			m := medianResult(s.res)
			t.Logf("  %-12s [%s]  median %.3f (p50 %.0f µs, p99 %.0f µs, cpu %.3f s/GB)", s.name, gbpsList(s.res), m.GBps, m.P50us, m.P99us, m.CPUsPerGB)
		}
		compare(async, plain)
		compare(sync, plain)
		ref := plain
		if huge != nil {
			compare(async, huge)
			compare(sync, huge)
			ref = huge
		}
		for _, s := range []*series{async, sync} {
			u := medianResult(s.res)
			u.CompareFio(medianResult(ref.res))
			out = append(out, u)
		}
		out = append(out, medianResult(plain.res))
		if huge != nil {
			h := medianResult(huge.res)
			h.Engine = "fio-hugemem"
			out = append(out, h)
		}
	}
	posix := &series{name: "posix-qd1", run: engineRun(pe, 1<<20, 1, ModeSync)}
	u32 := &series{name: fmt.Sprintf("uring-qd%d", qd), run: engineRun(ue, 1<<20, qd, ModeAuto)}
	u1 := &series{name: "uring-qd1", run: engineRun(ue, 1<<20, 1, ModeSync)}
	rotate(rounds, []*series{posix, u32, u1})
	t.Logf("random read bs=1MiB, GB/s per round:")
	for _, s := range []*series{posix, u1, u32} {
		m := medianResult(s.res)
		t.Logf("  %-12s [%s]  median %.3f (p50 %.0f µs, p99 %.0f µs, cpu %.3f s/GB)", s.name, gbpsList(s.res), m.GBps, m.P50us, m.P99us, m.CPUsPerGB)
	}
	compare(u32, posix)
	compare(u1, posix)
	out = append(out, medianResult(posix.res), medianResult(u1.res), medianResult(u32.res))
	t.Logf("uring engine stats: %v", ue.Stats())
	for _, r := range out {
		j, _ := json.Marshal(r)
		fmt.Println(string(j))
	}
}
