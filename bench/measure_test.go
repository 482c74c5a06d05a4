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

// TestMeasure compares the uring engine with fio (random reads, O_DIRECT,
// QD 32, 1 MiB and 128 KiB) and with the posix engine at QD 1. It is a
// measurement, not a test: it runs only with KVFS_BENCH=1. Knobs:
// KVFS_BENCH_FILE (default /var/tmp/kvfs-bench.dat, created with random
// data and kept), KVFS_BENCH_SIZE_MB (4096), KVFS_BENCH_SECONDS (2 per
// run), KVFS_BENCH_RUNS (8 pairs), KVFS_BENCH_QD (32).
//
// Virtual disks are noisy and drift over tens of seconds, so the runs are
// short and paired, the order inside each pair alternates (A B, B A, …),
// and the report gives the medians, the ratio of the medians, and the
// median and geometric mean of the paired ratios.
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
	runs := envInt("KVFS_BENCH_RUNS", 8)
	qd := envInt("KVFS_BENCH_QD", 32)
	ctx := context.Background()
	fio, err := EnsureFio(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	benchFile(t, path, size)
	t.Logf("file %s, %d MiB; %d pairs of %v runs, order alternating", path, size>>20, runs, dur)

	ue, err := uring.OpenEngine(path, uring.EngineOptions{Direct: true, QueueDepth: max(64, qd), ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ue.Close()
	pe, err := store.OpenPosix(path, store.PosixOptions{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer pe.Close()

	engineRun := func(e store.Engine, bs, qd int) func() Result {
		return func() Result {
			r, err := Run(ctx, Config{Path: path, Engine: e, Op: OpRead, Pattern: PatternRandom, IOSize: bs, QD: qd, Duration: dur})
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
	}
	fioRun := func(bs, qd int) func() Result {
		c := FioConfig{Path: path, Op: OpRead, Pattern: PatternRandom, IOSize: bs, QD: qd, Duration: dur, Fio: fio}
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
	paired := func(a, b func() Result) ([]Result, []Result) {
		var as, bs []Result
		for i := 0; i < runs; i++ {
			if i%2 == 0 {
				as = append(as, a())
				bs = append(bs, b())
			} else {
				bs = append(bs, b())
				as = append(as, a())
			}
		}
		return as, bs
	}
	var out []Result
	for _, bs := range []int{1 << 20, 128 << 10} {
		us, fs := paired(engineRun(ue, bs, qd), fioRun(bs, qd))
		s := summarise(us, fs)
		u, f := medianResult(us), medianResult(fs)
		t.Logf("random read bs=%d qd=%d: uring GB/s [%s]", bs, qd, gbpsList(us))
		t.Logf("random read bs=%d qd=%d: fio   GB/s [%s]", bs, qd, gbpsList(fs))
		t.Logf("  => uring median %.3f GB/s (p50 %.0f µs p99 %.0f µs), fio median %.3f GB/s (p50 %.0f µs p99 %.0f µs); ratio of medians %.3f, median paired ratio %.3f, geomean paired ratio %.3f, uring ≥ fio in %d/%d pairs",
			s.MedA, u.P50us, u.P99us, s.MedB, f.P50us, f.P99us, s.RatioOfMedians, s.MedianPairedRatio, s.GeomeanPairedRatio, s.PairsWonByA, s.NumPair)
		u.CompareFio(f)
		out = append(out, u, f)
	}
	ps, u1 := paired(engineRun(pe, 1<<20, 1), engineRun(ue, 1<<20, qd))
	s := summarise(u1, ps)
	p, u := medianResult(ps), medianResult(u1)
	t.Logf("random read bs=1MiB: posix qd=1 GB/s [%s]", gbpsList(ps))
	t.Logf("random read bs=1MiB: uring qd=%d GB/s [%s]", qd, gbpsList(u1))
	t.Logf("  => posix qd=1 median %.3f GB/s (p50 %.0f µs), uring qd=%d median %.3f GB/s (p50 %.0f µs): uring/posix %.2f× (median paired %.2f×)",
		s.MedB, p.P50us, qd, s.MedA, u.P50us, s.RatioOfMedians, s.MedianPairedRatio)
	out = append(out, p, u)
	t.Logf("uring engine stats: %v", ue.Stats())
	for _, r := range out {
		j, _ := json.Marshal(r)
		fmt.Println(string(j))
	}
}
