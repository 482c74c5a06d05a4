package main

import (
	"bytes"
	"encoding/xml"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// benchJSON runs kvfs bench with --json and decodes the report.
func benchJSON(t *testing.T, args ...string) (benchReport, map[string]any) {
	t.Helper()
	r := kvfs(t, nil, append(append([]string{"bench"}, args...), "--json", "--seconds", "0.2")...)
	r.want(t, 0)
	var rep benchReport
	var m map[string]any
	decodeJSON(t, r.stdout, &rep)
	decodeJSON(t, r.stdout, &m)
	return rep, m
}

var benchKeys = []string{"engine", "op", "pattern", "io_size", "qd", "gbps", "iops", "p50_us", "p99_us", "fio_gbps", "ratio_vs_fio",
	"cpu_s", "cpu_s_per_gb", "fio_cpu_s", "fio_cpu_s_per_gb", "rings", "engine_qd"}

func TestBenchEngine(t *testing.T) {
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	before := snapshot(t, path)
	for _, c := range []struct {
		engine, pattern string
		qd              string
	}{{"posix", "random", "1"}, {"auto", "seq", "4"}} {
		rep, m := benchJSON(t, path, "--engine", c.engine, "--pattern", c.pattern, "--io-size", "64KiB", "--qd", c.qd)
		for _, k := range benchKeys {
			if _, ok := m[k]; !ok {
				t.Errorf("bench --json lacks %q", k)
			}
		}
		if rep.Op != "read" || rep.Pattern != c.pattern || rep.IOSize != 64<<10 || rep.Ops == 0 || rep.GBps <= 0 || rep.IOPS <= 0 ||
			rep.P99us < rep.P50us || rep.FioGBps != nil || m["fio_gbps"] != nil {
			t.Errorf("%+v", rep)
		}
		if c.engine == "posix" && rep.Engine != "posix" {
			t.Errorf("engine %q", rep.Engine)
		}
		// The process did work to move the bytes: CPU is measured.
		if rep.CPUs <= 0 || rep.CPUsPerGB <= 0 || !near(rep.CPUsPerGB, rep.CPUs/(float64(rep.Bytes)/1e9)) {
			t.Errorf("cpu %v s, %v s/GB for %d bytes", rep.CPUs, rep.CPUsPerGB, rep.Bytes)
		}
	}
	unchanged(t, path, before) // reads leave the store alone

	// Writes: refused on a store without --force-write, allowed on a
	// scratch file.
	kvfs(t, nil, "bench", path, "--op", "write", "--seconds", "0.1").want(t, 1, "holds a kvfs store", "--force-write")
	unchanged(t, path, before)
	scratch := filepath.Join(t.TempDir(), "scratch")
	if err := os.WriteFile(scratch, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	rep, _ := benchJSON(t, scratch, "--op", "write", "--io-size", "64KiB", "--engine", "posix")
	if rep.Op != "write" || rep.Bytes == 0 {
		t.Errorf("write: %+v", rep)
	}
	if b := snapshot(t, scratch); bytes.Equal(b, make([]byte, 1<<20)) {
		t.Error("write bench wrote nothing")
	}
	benchJSON(t, path, "--op", "write", "--force-write", "--io-size", "64KiB")
}

func TestBenchBlocks(t *testing.T) {
	path := newStore(t)
	kvfs(t, nil, "bench", path, "--blocks", "2", "--seconds", "0.1").want(t, 1, "holds no blocks")
	kvfs(t, nil, "bench", path, "--blocks", "2", "--fill", "3", "--seconds", "0.1").want(t, 2, "pass --force-write")
	rep, m := benchJSON(t, path, "--blocks", "2", "--fill", "3", "--force-write", "--qd", "2")
	for _, k := range benchKeys {
		if _, ok := m[k]; !ok {
			t.Errorf("bench --blocks --json lacks %q", k)
		}
	}
	if rep.Pattern != "blocks" || rep.BlocksPerCall != 2 || rep.GroupsPerCall != 16 || rep.IOSize != 16*512 ||
		rep.Ops == 0 || rep.Bytes != rep.Ops*16*512 || rep.GBps <= 0 {
		t.Errorf("%+v", rep)
	}
	r := kvfs(t, nil, "ls", path)
	if n := bytes.Count(r.stdout, []byte("8/8")); n != 3 {
		t.Errorf("--fill 3 left:\n%s", r.stdout)
	}
	before := snapshot(t, path)
	benchJSON(t, path, "--blocks", "3")
	unchanged(t, path, before)
	// The engine's queue depth follows the benchmark's, the rings the flag.
	rep, _ = benchJSON(t, path, "--blocks", "3", "--qd", "40", "--engine", "uring", "--rings", "2")
	if rep.EngineQD != 2*40*3 || rep.Rings != 2 || rep.CPUs <= 0 || rep.CPUsPerGB <= 0 {
		t.Errorf("--qd 40 --blocks 3 --rings 2: engine qd %d, %d rings, cpu %v (%v s/GB)", rep.EngineQD, rep.Rings, rep.CPUs, rep.CPUsPerGB)
	}
	rep, _ = benchJSON(t, path, "--blocks", "1", "--qd", "2", "--engine", "uring")
	if rep.EngineQD != 64 || rep.Rings < 1 {
		t.Errorf("--qd 2 --blocks 1: engine qd %d, %d rings", rep.EngineQD, rep.Rings)
	}
	prof := filepath.Join(t.TempDir(), "cpu.prof")
	benchJSON(t, path, "--blocks", "1", "--cpuprofile", prof)
	if st, err := os.Stat(prof); err != nil || st.Size() == 0 {
		t.Errorf("--cpuprofile wrote nothing: %v", err)
	}
	kvfs(t, nil, "bench", path, "--blocks", "4", "--seconds", "0.1").want(t, 2, "holds only 3 blocks")
}

// --sweep measures each depth up to --qd and --plot draws them; the fill
// before shows no progress when stderr is not a terminal.
func TestBenchSweepPlot(t *testing.T) {
	path := newStore(t)
	svg := filepath.Join(t.TempDir(), "qd.svg")
	r := kvfs(t, nil, "bench", path, "--blocks", "1", "--fill", "3", "--force-write", "--sweep", "--qd", "4",
		"--plot", svg, "--json", "--seconds", "0.1")
	r.want(t, 0)
	if r.stderr != "" {
		t.Errorf("stderr (not a terminal) got %q", r.stderr)
	}
	var reps []benchReport
	decodeJSON(t, r.stdout, &reps)
	if len(reps) != 3 || reps[0].QD != 1 || reps[1].QD != 2 || reps[2].QD != 4 {
		t.Fatalf("--sweep --qd 4 measured %+v, want depths 1 2 4", reps)
	}
	for _, rep := range reps {
		if rep.Ops == 0 || rep.GBps <= 0 || rep.BlocksPerCall != 1 {
			t.Errorf("%+v", rep)
		}
	}
	b, err := os.ReadFile(svg)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(b, new(struct{})); err != nil {
		t.Fatalf("--plot wrote no SVG: %v", err)
	}
	for _, want := range []string{">queue depth<", ">GB/s<", ">4<"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the plot lacks %q", want)
		}
	}
}

func TestBenchUsage(t *testing.T) {
	path := newStore(t)
	before := snapshot(t, path)
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--op", "erase"}, `--op "erase"`},
		{[]string{"--pattern", "zigzag"}, `--pattern "zigzag"`},
		{[]string{"--qd", "0"}, "--qd 0"},
		{[]string{"--seconds", "0"}, "--seconds 0"},
		{[]string{"--io-size", "big"}, `--io-size "big"`},
		{[]string{"--engine", "spdk"}, "unknown engine kind"},
		{[]string{"--fill", "2"}, "--fill is for blocks mode"},
		{[]string{"--blocks", "1", "--op", "write"}, "--blocks measures reads"},
		{[]string{"--io-size", "2MiB"}, "smaller than one"}, // bench.ErrConfig: the store is 1 MiB
		{[]string{"--rings", "17"}, "--rings 17"},
		{[]string{"--rings", "-1"}, "--rings -1"},
		{[]string{"--pool-max", "lots"}, `--pool-max "lots"`},
		{[]string{"--async-reads", "maybe"}, `--async-reads "maybe"`},
		{[]string{"--inline-reads", "maybe"}, `--inline-reads "maybe"`},
		{[]string{"--fio-jobs", "0"}, "--fio-jobs 0"},
		{[]string{"--plot", "qd.svg"}, "--plot draws a sweep: add --sweep"},
		{[]string{"--sweep", "--plot", "qd.pdf"}, "want a .svg or .png file"},
	} {
		kvfs(t, nil, append([]string{"bench", path, "--seconds", "0.1"}, c.args...)...).want(t, 2, c.msg)
	}
	unchanged(t, path, before)
}

func TestBenchVsFio(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skip("fio is not installed (kvfs bench --vs-fio would install it)")
	}
	path := newStore(t)
	rep, _ := benchJSON(t, path, "--vs-fio", "--io-size", "64KiB", "--engine", "posix")
	if rep.FioGBps == nil || *rep.FioGBps <= 0 || rep.RatioVsFio == nil || *rep.RatioVsFio <= 0 ||
		rep.FioCPUs == nil || *rep.FioCPUs <= 0 || rep.FioCPUsPerGB == nil || *rep.FioCPUsPerGB <= 0 {
		t.Errorf("%+v", rep)
	}
	// The report says how much of the file fio read was ever written:
	// the rest reads as zeros without disk I/O. After format --zero, all.
	written, size, err := store.WrittenBytes(path)
	if err != nil {
		t.Fatal(err)
	}
	if w := rep.FioFileWritten; w == nil || !near(*w, float64(written)/float64(size)) {
		t.Errorf("fio_file_written %v, want %d/%d", w, written, size)
	}
	if written < size {
		r := kvfs(t, nil, "bench", path, "--vs-fio", "--io-size", "64KiB", "--engine", "posix", "--seconds", "0.2")
		// Engine mode reads the whole file too: both figures are inflated
		// (the log on stderr, and the summary).
		r.want(t, 0, "both figures are inflated")
		if !bytes.Contains(r.stdout, []byte("both figures are inflated (the engine's reads and fio's): only")) {
			t.Errorf("the summary does not say the figures are inflated: %s", r.stdout)
		}
	}
	kvfs(t, nil, append([]string{"format", path, "--force", "--zero"}, geoFlags...)...).want(t, 0)
	rep, _ = benchJSON(t, path, "--vs-fio", "--io-size", "64KiB", "--engine", "posix")
	if w := rep.FioFileWritten; w == nil || *w != 1 {
		t.Errorf("after format --zero: fio_file_written %v, want 1", w)
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// TestWriteProfiles: mount --mutexprofile FILE writes the mutex profile
// to FILE and the blocking profile to FILE.block, both in pprof's format
// (gzip), and a path it cannot create is an error.
func TestWriteProfiles(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mu.pprof")
	if err := writeProfiles(p, "mutex", "block"); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p, p + ".block"} {
		b, err := os.ReadFile(f)
		if err != nil || len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("%s: %d bytes, %v; want a gzipped profile", f, len(b), err)
		}
	}
	if err := writeProfiles(filepath.Join(p, "no", "such"), "mutex"); err == nil {
		t.Fatal("a path that cannot be created wrote a profile")
	}
}
