package bench

import (
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"

	"github.com/kvfs/kvfs/engine/posix"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(1, math.Abs(b)) }

func TestParseFio(t *testing.T) {
	for _, tc := range []struct {
		file, op string
		want     Result
	}{
		{"fio-3.33-randread.json", OpRead, Result{GBps: 0.524418941, IOPS: 4000.999001, Bytes: 524943360, Ops: 4005, Seconds: 1.001, P50us: 790.528, P99us: 31064.064}},
		{"fio-3.33-write.json", OpWrite, Result{GBps: 1.273270857, IOPS: 1214.285714, Bytes: 659554304, Ops: 629, Seconds: 0.518, P50us: 2244.608, P99us: 30277.632}},
	} {
		data, err := os.ReadFile(filepath.Join("testdata", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		// fio may print warnings before the report.
		data = append([]byte("fio: some warning\n"), data...)
		got, err := ParseFio(data, tc.op)
		if err != nil {
			t.Fatal(err)
		}
		w := tc.want
		if got.Engine != "fio" || got.Op != tc.op || !near(got.GBps, w.GBps) || !near(got.IOPS, w.IOPS) ||
			got.Bytes != w.Bytes || got.Ops != w.Ops || !near(got.Seconds, w.Seconds) ||
			!near(got.P50us, w.P50us) || !near(got.P99us, w.P99us) {
			t.Errorf("%s: got %+v, want %+v", tc.file, got, w)
		}
	}
}

func TestParseFioErrors(t *testing.T) {
	read, err := os.ReadFile("testdata/fio-3.33-randread.json")
	if err != nil {
		t.Fatal(err)
	}
	for name, in := range map[string]string{
		"empty":     "",
		"no json":   "fio: engine io_uring not loadable\n",
		"bad json":  "{\"jobs\": [",
		"no jobs":   `{"jobs": []}`,
		"job error": `{"jobs": [{"error": 5, "read": {"io_bytes": 1, "total_ios": 1}}]}`,
		"no write":  string(read), // a read report asked for writes
	} {
		if _, err := ParseFio([]byte(in), OpWrite); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestFioArgs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	c := FioConfig{Path: p, Op: OpRead, Pattern: PatternRandom, IOSize: 1 << 20, QD: 32, Duration: 1500 * time.Millisecond, Offset: 1 << 20}
	args, err := c.Args()
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(args, " ")
	want := "--name=kvfs-bench --filename=" + p + " --ioengine=io_uring --direct=1 --fixedbufs --registerfiles --rw=randread --bs=1048576 --iodepth=32 --size=2097152 --offset=1048576 --runtime=1500ms --time_based --numjobs=1 --group_reporting --output-format=json --randrepeat=0 --norandommap"
	if got != want {
		t.Fatalf("args\n got %s\nwant %s", got, want)
	}
	// The nvme engine's reference is fio's passthrough engine.
	c.Passthrough = true
	args, _ = c.Args()
	if got := strings.Join(args, " "); !strings.Contains(got, " --ioengine=io_uring_cmd --cmd_type=nvme --fixedbufs ") || strings.Contains(got, "--direct") {
		t.Fatalf("passthrough args: %s", got)
	}
	for _, tc := range []struct{ op, pattern, rw string }{{OpRead, PatternSeq, "read"}, {OpWrite, PatternRandom, "randwrite"}, {OpWrite, PatternSeq, "write"}} {
		c := FioConfig{Op: tc.op, Pattern: tc.pattern}
		if c.rw() != tc.rw {
			t.Errorf("%s/%s: %s", tc.op, tc.pattern, c.rw())
		}
	}
	// A region past the end would make fio write the file out: refused.
	bad := FioConfig{Path: p, IOSize: 1 << 20, Offset: 1 << 20, Region: 4 << 20}
	if _, err := bad.Args(); !errors.Is(err, ErrConfig) {
		t.Fatalf("region past the end: %v", err)
	}
}

func TestPercentile(t *testing.T) {
	var v []time.Duration
	for i := 1; i <= 10; i++ {
		v = append(v, time.Duration(i)*time.Microsecond)
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	for _, c := range []struct {
		in   []time.Duration
		p    float64
		want time.Duration
	}{
		{v, 50, 5 * time.Microsecond}, {v, 99, 10 * time.Microsecond}, {v, 100, 10 * time.Microsecond},
		{v, 0, time.Microsecond}, {v, 10, time.Microsecond}, {v, 11, 2 * time.Microsecond},
		{hundred, 99, 99}, {hundred, 50, 50}, {hundred, 99.5, 100}, {nil, 50, 0},
	} {
		if got := Percentile(c.in, c.p); got != c.want {
			t.Errorf("Percentile(%d values, %v) = %v, want %v", len(c.in), c.p, got, c.want)
		}
	}
	if Micros(1500*time.Nanosecond) != 1.5 {
		t.Error("Micros")
	}
}

func testFile(t *testing.T, size int) string {
	t.Helper()
	// /var/tmp first: /tmp may be tmpfs, where O_DIRECT is not real.
	dir, err := os.MkdirTemp("/var/tmp", "kvfs-bench-test-")
	if err != nil {
		dir = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(dir) })
	}
	p := filepath.Join(dir, "f")
	b := make([]byte, size)
	fillRandom(b, 1)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidate(t *testing.T) {
	p := testFile(t, 1<<20)
	e, err := posix.Open(p, posix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for name, c := range map[string]Config{
		"no engine":    {},
		"bad op":       {Engine: e, Op: "trim"},
		"bad pattern":  {Engine: e, Pattern: "zipf"},
		"past the end": {Engine: e, IOSize: 4096, Offset: 4096, Region: 1 << 20},
		"too small":    {Engine: e, IOSize: 2 << 20},
		"misaligned":   {Engine: e, IOSize: 4096, Offset: 100},
		"bad mode":     {Engine: e, IOSize: 4096, Mode: "turbo"},
		"posix async":  {Engine: e, IOSize: 4096, Mode: ModeAsync},
	} {
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	c := Config{Engine: e, IOSize: 4096}
	if err := c.Validate(); err != nil || c.Region != 1<<20 || c.QD != 1 || c.Op != OpRead || c.Pattern != PatternRandom {
		t.Fatalf("defaults: %v %+v", err, c)
	}
}

func TestRunShort(t *testing.T) {
	const size = 16 << 20
	p := testFile(t, size)
	engines := map[string]func() (store.Engine, error){
		"posix": func() (store.Engine, error) { return posix.Open(p, posix.Options{}) },
	}
	if uring.Available() == nil {
		engines["uring"] = func() (store.Engine, error) {
			return uringengine.OpenEngine(p, uringengine.EngineOptions{Direct: true, QueueDepth: 8, BufferPool: 1 << 20, Logger: zaptest.NewLogger(t)})
		}
	}
	for name, open := range engines {
		t.Run(name, func(t *testing.T) {
			e, err := open()
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			cfgs := []Config{
				{Op: OpRead, Pattern: PatternRandom, IOSize: 64 << 10, QD: 4},
				{Op: OpRead, Pattern: PatternSeq, IOSize: 128 << 10, QD: 1},
				{Op: OpWrite, Pattern: PatternSeq, IOSize: 64 << 10, QD: 2, Offset: 8 << 20, Region: 1 << 20},
			}
			if name == "uring" {
				cfgs = append(cfgs,
					Config{Op: OpRead, Pattern: PatternRandom, IOSize: 64 << 10, QD: 8, Mode: ModeSync},
					Config{Op: OpWrite, Pattern: PatternRandom, IOSize: 64 << 10, QD: 3, Offset: 8 << 20, Region: 1 << 20, Mode: ModeAsync})
			}
			for _, c := range cfgs {
				c.Path, c.Engine, c.Duration, c.Logger = p, e, 150*time.Millisecond, zaptest.NewLogger(t)
				res, err := Run(context.Background(), c)
				if err != nil {
					t.Fatal(err)
				}
				wantMode := ModeSync
				if name == "uring" && c.Mode != ModeSync {
					wantMode = ModeAsync
				}
				if res.Mode != wantMode {
					t.Fatalf("mode %q, want %q", res.Mode, wantMode)
				}
				if res.Engine != name || res.Ops == 0 || res.GBps <= 0 || res.IOPS <= 0 ||
					res.P50us <= 0 || res.P50us > res.P99us || res.Bytes != res.Ops*int64(c.IOSize) ||
					res.Seconds < 0.15 || res.Seconds > 5 {
					t.Fatalf("%+v", res)
				}
				t.Log(res)
			}
			// The writes stayed inside their region.
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			want := make([]byte, size)
			fillRandom(want, 1)
			if string(got[:8<<20]) != string(want[:8<<20]) || string(got[9<<20:]) != string(want[9<<20:]) {
				t.Fatal("bench write touched bytes outside its region")
			}
		})
	}
}

func TestRunCancel(t *testing.T) {
	p := testFile(t, 1<<20)
	e, err := posix.Open(p, posix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := Run(ctx, Config{Engine: e, IOSize: 4096, Duration: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("Run did not stop with its context")
	}
}

func TestRunFioShort(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("skipping: fio not installed (bench.EnsureFio installs it)")
	}
	if err := uring.Available(); err != nil {
		t.Skipf("skipping: fio's io_uring engine needs io_uring: %v", err)
	}
	p := testFile(t, 8<<20)
	res, err := RunFio(context.Background(), FioConfig{Path: p, IOSize: 128 << 10, QD: 4, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if res.Engine != "fio" || res.Ops == 0 || res.GBps <= 0 || res.QD != 4 || res.IOSize != 128<<10 || res.P50us <= 0 {
		t.Fatalf("%+v", res)
	}
	t.Log(res)
}
