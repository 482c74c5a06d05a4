package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
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

var benchKeys = []string{"engine", "op", "pattern", "io_size", "qd", "gbps", "iops", "p50_us", "p99_us", "fio_gbps", "ratio_vs_fio"}

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
	kvfs(t, nil, "bench", path, "--blocks", "4", "--seconds", "0.1").want(t, 2, "holds only 3 blocks")
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
	if rep.FioGBps == nil || *rep.FioGBps <= 0 || rep.RatioVsFio == nil || *rep.RatioVsFio <= 0 {
		t.Errorf("%+v", rep)
	}
}
