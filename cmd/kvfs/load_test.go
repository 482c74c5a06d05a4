package main

import (
	"bytes"
	"encoding/json"
	"errors"
	imagepng "image/png"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// mountForLoad mounts an in-memory store with the ctl server in this
// process, as kvfs mount does.
func mountForLoad(t *testing.T) (string, *store.Store) {
	t.Helper()
	return mountForLoadTier(t, 0)
}

// mountForLoadTier is mountForLoad with a DRAM tier of dram bytes in front
// of the store (none for 0), as kvfs mount --dram does.
func mountForLoadTier(t *testing.T, dram int64) (string, *store.Store) {
	t.Helper()
	requireMount(t)
	st := storetest.Open(t, storetest.Formatted(t, testGeo, 16, 4096), store.Options{})
	// What the ioctls and bench-load did left the store consistent.
	return mountServed(t, st, dram, "", func() {
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		st.Close()
	}), st
}

// requireMount skips a test that mounts unless it runs as root with
// /dev/fuse.
func requireMount(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to mount; CI runs as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing")
	}
}

// mountServed mounts st in this process with the ctl server, as kvfs mount
// does, with a DRAM tier of dram bytes in front of it (none for 0) and
// fsName as the mount's source. When the test ends it unmounts (retrying
// while the kernel says busy), closes the tier and calls done, which owns
// closing the store. A failed mount calls done at once.
func mountServed(t *testing.T, st *store.Store, dram int64, fsName string, done func()) string {
	t.Helper()
	var tr *tier.Tier
	if dram > 0 {
		var err error
		if tr, err = tier.New(st, tier.Options{Bytes: dram}); err != nil {
			done()
			t.Fatal(err)
		}
	}
	dir := t.TempDir()
	srv, err := fs.Mount(dir, st, fs.Options{FsName: fsName, Tier: tr, Ctl: fs.Handler(ctl.NewServer(st, ctl.Options{Tier: tr}).Open)})
	if err != nil {
		if tr != nil {
			tr.Close()
		}
		done()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for range 100 {
			if err := srv.Unmount(); err == nil || !errors.Is(err, syscall.EBUSY) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		srv.Wait()
		if tr != nil {
			tr.Close()
		}
		done()
	})
	return dir
}

func TestLoadCommand(t *testing.T) {
	mnt, st := mountForLoad(t)
	keys := []layout.Key{{Block: 0xab, Layer: 0, Head: 1, Kind: layout.V}, {Block: 0xab, Layer: 1, Head: 0, Kind: layout.K}}
	var reqs []store.WriteReq
	for i, k := range keys {
		reqs = append(reqs, store.WriteReq{Key: k, Data: group(uint64(i + 1))})
	}
	if err := st.Write(reqs); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rf := filepath.Join(dir, "reqs")
	os.WriteFile(rf, []byte("ab 0 1 V\nab 1 0 K\n"), 0o644)
	shm := filepath.Join("/dev/shm", "kvfs-load-test-"+filepath.Base(dir))
	t.Cleanup(func() { os.Remove(shm) })

	r := kvfs(t, nil, "load", mnt, "--requests", rf, "--into", shm)
	r.want(t, 0, "loaded 2 of 2 groups", "into "+shm)
	got, err := os.ReadFile(shm)
	if err != nil || !bytes.Equal(got, append(group(1), group(2)...)) {
		t.Fatalf("--into holds other bytes (%v)", err)
	}

	// Without --into: a temporary buffer, saved with --out; pitched and
	// JSON requests; an absent group fails the command.
	os.WriteFile(rf, []byte(`{"block":"ab","layer":0,"head":1,"kind":"V","offset":0,"pitch":64}
ab 1 1 K 2048
`), 0o644)
	out := filepath.Join(dir, "out")
	r = kvfs(t, nil, "load", mnt, "--requests", rf, "--out", out, "--json")
	r.want(t, 1, "loaded 1 of 2 groups", ", 1 absent")
	var rep struct {
		OK, Total int
		Entries   []loadEntry
	}
	decodeJSON(t, r.stdout, &rep)
	if rep.OK != 1 || rep.Total != 2 || rep.Entries[0].Status != "ok" || rep.Entries[1].Status != "absent" {
		t.Fatalf("json %+v", rep)
	}
	b, err := os.ReadFile(out)
	if err != nil || len(b) != 2048+512 {
		t.Fatalf("--out: %d bytes, %v", len(b), err)
	}
	for row := range 16 {
		if !bytes.Equal(b[row*64:row*64+32], group(1)[row*32:(row+1)*32]) || !bytes.Equal(b[row*64+32:row*64+64], make([]byte, 32)) {
			t.Fatalf("pitched row %d misplaced", row)
		}
	}
	kvfs(t, nil, "load", mnt, "--requests", rf).want(t, 1, "line 2: 00000000000000ab 1 1 K: absent")
	// Requests from stdin, the buffer to stdout.
	r = kvfs(t, []byte("ab 1 0 K\n"), "load", mnt, "--requests", "-", "--out", "-")
	r.want(t, 0)
	if !bytes.Equal(r.stdout, group(2)) {
		t.Fatal("--out - wrote other bytes")
	}
	// Bad requests are usage errors; a bad key is a per-entry failure.
	os.WriteFile(rf, []byte("ab 9 0 K\n"), 0o644)
	kvfs(t, nil, "load", mnt, "--requests", rf).want(t, 1, "bad-request (layer, head or kind outside the geometry)")
	os.WriteFile(rf, []byte("ab 0 K\n"), 0o644)
	kvfs(t, nil, "load", mnt, "--requests", rf).want(t, 2, "requests line 1")
	kvfs(t, nil, "load", mnt).want(t, 2, "--requests")
	kvfs(t, nil, "load", mnt, "--requests", rf, "--into", filepath.Join(dir, "x")).want(t, 2, "must be in /dev/shm")
	kvfs(t, nil, "load", dir, "--requests", "-").want(t, 2, "lists no groups")
	os.WriteFile(rf, []byte("ab 0 0 K\n"), 0o644)
	kvfs(t, nil, "load", dir, "--requests", rf).want(t, 1, ".kvfs/ctl")
}

func TestBenchLoad(t *testing.T) {
	mnt, _ := mountForLoad(t)
	r := kvfs(t, nil, "bench-load", mnt, "--groups-per-call", "5")
	r.want(t, 1, "holds 0 blocks", "--fill")
	r = kvfs(t, nil, "bench-load", mnt, "--groups-per-call", "12", "--calls", "20", "--jobs", "2", "--fill", "3", "--json")
	r.want(t, 0)
	if r.stderr != "" { // the fill's progress line is for terminals only
		t.Errorf("bench-load --fill wrote to stderr (not a terminal): %q", r.stderr)
	}
	var rep bench.LoadResult
	if err := json.Unmarshal(r.stdout, &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if rep.Blocks != 3 || rep.Calls != 20 || rep.Jobs != 2 || rep.GroupsPerCall != 12 || rep.Bytes != 2*20*12*512 ||
		rep.NotOK != 0 || rep.GBps <= 0 || rep.UsPerGroup <= 0 || rep.P99us < rep.P50us || rep.Engine != "mem" {
		t.Fatalf("report %+v", rep)
	}
	// The daemon reports its CPU time in .kvfs/stats; bench-load's cpu_s is
	// its difference over the run.
	if cpu, ok := bench.DaemonCPUSeconds(mnt); !ok || cpu <= 0 {
		t.Fatalf("daemon_cpu_seconds in .kvfs/stats: %v %v", cpu, ok)
	}
	if !bytes.Contains(r.stdout, []byte(`"cpu_s":`)) || !bytes.Contains(r.stdout, []byte(`"cpu_s_per_gb":`)) || rep.CPUs < 0 {
		t.Fatalf("bench-load --json lacks the daemon's cpu: %s", r.stdout)
	}
	if !bytes.Contains(r.stdout, []byte(`"machine_idle":`)) || rep.MachineIdle > 1 || (rep.MachineIdle < 0 && rep.MachineIdle != -1) {
		t.Fatalf("bench-load --json: machine_idle %v: %s", rep.MachineIdle, r.stdout)
	}
	r = kvfs(t, nil, "bench-load", mnt, "--groups-per-call", "8", "--calls", "5")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "µs/group") || !strings.Contains(string(r.stdout), "daemon cpu") {
		t.Fatalf("text output: %s", r.stdout)
	}
	// LOAD_BLOCKS: 5 whole blocks per call (the store holds 3: blocks
	// repeat in one call, into distinct cache blocks), each layout; the
	// daemon is this process.
	// With --scatter the cache blocks of each call are a permutation: the
	// daemon refuses overlapping destinations, so any repeat shows up as
	// entries not ok.
	for _, lay := range []string{"nhd", "hnd", "hf", "hnd --scatter", "hf --scatter"} {
		args := append([]string{"bench-load", mnt, "--blocks-per-call", "5", "--calls", "7", "--jobs", "2",
			"--daemon-pid", strconv.Itoa(os.Getpid()), "--json", "--layout"}, strings.Fields(lay)...)
		lay = strings.Fields(lay)[0]
		r = kvfs(t, nil, args...)
		r.want(t, 0)
		rep = bench.LoadResult{}
		if err := json.Unmarshal(r.stdout, &rep); err != nil {
			t.Fatalf("%v: %s", err, r.stdout)
		}
		gpb := testGeo.GroupsPerBlock()
		if rep.BlocksPerCall != 5 || rep.Layout != lay || rep.GroupsPerCall != 5*gpb || rep.Bytes != int64(2*7*5*gpb*512) ||
			rep.NotOKBlocks != 0 || rep.GBps <= 0 || rep.UsPerBlock <= 0 || rep.CPUs < 0 || rep.ClientCPUs < 0 {
			t.Fatalf("%s: report %+v", lay, rep)
		}
	}
	// STORE_BLOCKS: each caller's whole target, as blocks of its own that
	// every call replaces; they are then in the store.
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layout", "hnd", "--calls", "4", "--jobs", "2", "--store", "--json")
	r.want(t, 0)
	rep = bench.LoadResult{}
	if err := json.Unmarshal(r.stdout, &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if gpb := testGeo.GroupsPerBlock(); rep.Op != "store" || rep.Bytes != int64(2*4*3*gpb*512) || rep.NotOKBlocks != 0 || rep.GBps <= 0 || rep.Evicting {
		t.Fatalf("--store: report %+v", rep)
	}
	listed, err := bench.ListBlocks(mnt, testGeo)
	if err != nil {
		t.Fatal(err)
	}
	for j := range 2 {
		for i := range 3 {
			if !slices.Contains(listed, bench.StoreBlock(j, i)) {
				t.Fatalf("--store: block %#x (job %d, cache block %d) not in the store: %#x", bench.StoreBlock(j, i), j, i, listed)
			}
		}
	}
	kvfs(t, nil, "bench-load", mnt, "--store").want(t, 2, "--blocks-per-call")
	kvfs(t, nil, "bench-load", mnt, "--scatter").want(t, 2, "--blocks-per-call")
	// One layer per call: the calls step through the 2 layers of 3
	// different blocks, each moving a layer's share of them.
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layers-per-call", "1", "--layout", "hf", "--calls", "4",
		"--json")
	r.want(t, 0)
	rep = bench.LoadResult{}
	if err := json.Unmarshal(r.stdout, &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if gpl := testGeo.GroupsPerBlock() / testGeo.Layers; rep.LayersPerCall != 1 || rep.GroupsPerCall != 3*gpl ||
		rep.Bytes != int64(4*3*gpl*512) || rep.NotOKBlocks != 0 || rep.GBps <= 0 {
		t.Fatalf("--layers-per-call: report %+v", rep)
	}
	// Stored prefixes: the caller stores 2 prefixes of 3 blocks of its own
	// first, and its layer-by-layer loads take them in turn (every block
	// found: none not OK). Two callers' would not fit the 16 slots.
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layers-per-call", "1", "--layout", "hf", "--calls", "8",
		"--warmup", "0", "--jobs", "2", "--stored-prefixes", "2").want(t, 1, "too small")
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layers-per-call", "1", "--layout", "hf", "--calls", "8",
		"--warmup", "0", "--stored-prefixes", "2", "--json")
	r.want(t, 0)
	rep = bench.LoadResult{}
	if err := json.Unmarshal(r.stdout, &rep); err != nil {
		t.Fatalf("%v: %s", err, r.stdout)
	}
	if gpl := testGeo.GroupsPerBlock() / testGeo.Layers; rep.StoredPrefixes != 2 || rep.Bytes != int64(8*3*gpl*512) || rep.NotOKBlocks != 0 {
		t.Fatalf("--stored-prefixes: report %+v", rep)
	}
	if listed, err = bench.ListBlocks(mnt, testGeo); err != nil {
		t.Fatal(err)
	}
	for k := range 2 {
		if b := bench.PrefixBlock(0, k, 2); !slices.Contains(listed, b) {
			t.Fatalf("--stored-prefixes: block %#x (prefix %d) not in the store", b, k)
		}
	}
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--stored-prefixes", "2").want(t, 2, "--stored-prefixes")
	kvfs(t, nil, "bench-load", mnt, "--layers-per-call", "1").want(t, 2, "--layers-per-call")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layers-per-call", "1", "--store").want(t, 2, "--layers-per-call")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--layers-per-call", "3").want(t, 2, "divisor")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "50", "--layers-per-call", "1").want(t, 1, "different blocks")
	// More than 509 blocks per call: the entry array.
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "600", "--layout", "hnd", "--calls", "2", "--json")
	r.want(t, 0)
	// A sweep prints one row per caller count; --plot draws them.
	png := filepath.Join(t.TempDir(), "callers.png")
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--calls", "3", "--sweep", "--daemon-pid", strconv.Itoa(os.Getpid()),
		"--plot", png)
	r.want(t, 0)
	if f, err := os.Open(png); err != nil {
		t.Fatalf("--plot: %v", err)
	} else if _, err := imagepng.Decode(f); err != nil {
		t.Fatalf("--plot wrote no PNG: %v", err)
	} else {
		f.Close()
	}
	if lines := strings.Split(strings.TrimSpace(string(r.stdout)), "\n"); len(lines) != 2+len(bench.SweepJobs) ||
		!strings.Contains(lines[1], "core-s/GB") || !strings.HasPrefix(strings.TrimSpace(lines[6]), "16 ") {
		t.Fatalf("sweep table:\n%s", r.stdout)
	}
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--layout", "xyz").want(t, 2, "--layout")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "70000").want(t, 2, "1..65536")
	kvfs(t, nil, "bench-load", mnt, "--groups-per-call", "512").want(t, 2, "1..511")
	kvfs(t, nil, "bench-load", mnt, "--calls", "0").want(t, 2, "--calls")
	kvfs(t, nil, "bench-load").want(t, 2)
	kvfs(t, nil, "bench-load", mnt, "--plot", "x.svg").want(t, 2, "add --sweep")
	kvfs(t, nil, "bench-load", mnt, "--sweep", "--plot", "x.jpg").want(t, 2, "want a .svg or .png file")
	// Two callers storing 5 blocks each need 20 slots while they replace
	// them; the store has 16: the report says the rate includes evictions.
	r = kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "5", "--layout", "hnd", "--calls", "1", "--jobs", "2", "--store")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "other blocks were evicted") {
		t.Fatalf("--store beyond the store's slots: no note in\n%s", r.stdout)
	}
}
