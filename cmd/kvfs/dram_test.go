package main

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/bench"
	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// TestMountDRAMFlag: --dram that is not a size is a usage error; one the
// machine cannot give fails the mount, saying how much memory there is,
// before anything is mounted.
func TestMountDRAMFlag(t *testing.T) {
	dir := t.TempDir()
	kvfs(t, nil, "mount", dir+"/none.kvfs", dir, "--dram", "lots").want(t, 2, "--dram")
	kvfs(t, nil, "mount", newStore(t), t.TempDir(), "--dram", "1000TiB").want(t, 1, "--dram", "available")
}

// TestDRAMMetrics: /metrics exports the DRAM tier's counters, zeros
// without a tier.
func TestDRAMMetrics(t *testing.T) {
	st := storetest.Open(t, storetest.Formatted(t, testGeo, 8, 4096), store.Options{})
	tr, err := tier.New(st, tier.Options{Bytes: 4 * testGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for _, withTier := range []*tier.Tier{nil, tr} {
		pm := newPromMetrics()
		c := ctl.NewServer(st, ctl.Options{Tier: withTier})
		pm.register(st, fs.New(st, fs.Options{Tier: withTier}), c, withTier)
		c.Close()
		mfs, err := pm.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]float64{}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch {
				case m.Gauge != nil:
					got[mf.GetName()] = m.Gauge.GetValue()
				case m.Counter != nil:
					got[mf.GetName()] = m.Counter.GetValue()
				}
			}
		}
		for _, name := range []string{"kvfs_dram_bytes", "kvfs_dram_blocks", "kvfs_dram_hits_total", "kvfs_dram_misses_total",
			"kvfs_dram_evictions_total", "kvfs_dram_invalidations_total", "kvfs_dram_promoted_bytes_total", "kvfs_dram_corrupt_total",
			"kvfs_dram_written_bytes_total", "kvfs_dram_huge_pages", "kvfs_dram_registered"} {
			if _, ok := got[name]; !ok {
				t.Fatalf("tier %v: /metrics lacks %s", withTier != nil, name)
			}
		}
		want := 0.0
		if withTier != nil {
			want = float64(4 * testGeo.PayloadBytes())
		}
		if got["kvfs_dram_bytes"] != want {
			t.Fatalf("kvfs_dram_bytes %v, want %v", got["kvfs_dram_bytes"], want)
		}
	}
}

// TestBenchLoadDRAMHitRatio: bench-load reports the DRAM tier's hit ratio
// over its measured calls: a second run over blocks the first brought in
// lands every group from the tier. Without a tier it reports none.
func TestBenchLoadDRAMHitRatio(t *testing.T) {
	mnt, _ := mountForLoadTier(t, 16*testGeo.PayloadBytes())
	var rep bench.LoadResult
	for i := range 2 {
		r := kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--calls", "4", "--fill", "3", "--warmup", "0", "--json")
		r.want(t, 0)
		rep = bench.LoadResult{}
		if err := json.Unmarshal(r.stdout, &rep); err != nil {
			t.Fatalf("%v: %s", err, r.stdout)
		}
		if rep.DRAMHitRatio == nil || rep.DRAMHits+rep.DRAMMisses != uint64(4*3*testGeo.GroupsPerBlock()) {
			t.Fatalf("run %d: dram hit ratio %v, %d hits, %d misses: %s", i, rep.DRAMHitRatio, rep.DRAMHits, rep.DRAMMisses, r.stdout)
		}
	}
	if *rep.DRAMHitRatio != 1 {
		t.Fatalf("second run over 3 blocks in a 16-block tier: hit ratio %v", *rep.DRAMHitRatio)
	}
	r := kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "3", "--calls", "2")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "DRAM tier: hit ratio 1.000") {
		t.Fatalf("text output lacks the hit ratio: %s", r.stdout)
	}

	plain, _ := mountForLoad(t)
	r = kvfs(t, nil, "bench-load", plain, "--blocks-per-call", "3", "--calls", "2", "--fill", "3", "--json")
	r.want(t, 0)
	if strings.Contains(string(r.stdout), "dram_hit_ratio") {
		t.Fatalf("a mount without a tier reported a hit ratio: %s", r.stdout)
	}
}

// TestBenchLoadZipf: bench-load --zipf draws from a working set with a few
// hot blocks, which a DRAM tier a quarter of the working set keeps: its hit
// ratio is strictly between 0 and 1 and above a uniform run's of the same
// size over the same blocks. The reports say the working set and the
// exponent.
func TestBenchLoadZipf(t *testing.T) {
	requireMount(t)
	const ws = 32
	st := storetest.Open(t, storetest.Formatted(t, testGeo, 2*ws, 4096), store.Options{})
	mnt := mountServed(t, st, ws/4*testGeo.PayloadBytes(), "", func() {
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	// Blocks beyond the working set, which no draw may touch.
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "1", "--calls", "1", "--fill", strconv.Itoa(ws+8)).want(t, 0)
	run := func(zipf string) bench.LoadResult {
		t.Helper()
		r := kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "4", "--calls", "60", "--warmup", "20",
			"--working-set", strconv.Itoa(ws), "--zipf", zipf, "--json")
		r.want(t, 0)
		var rep bench.LoadResult
		if err := json.Unmarshal(r.stdout, &rep); err != nil {
			t.Fatalf("%v: %s", err, r.stdout)
		}
		if rep.DRAMHitRatio == nil || rep.WorkingSet != ws || rep.Blocks != ws+8 || rep.NotOKBlocks != 0 {
			t.Fatalf("--zipf %s: %s", zipf, r.stdout)
		}
		return rep
	}
	zipf, uniform := run("1.0"), run("0")
	if zipf.Zipf != 1 || uniform.Zipf != 0 {
		t.Fatalf("exponents reported %v and %v", zipf.Zipf, uniform.Zipf)
	}
	z, u := *zipf.DRAMHitRatio, *uniform.DRAMHitRatio
	if z <= 0 || z >= 1 || z <= u {
		t.Fatalf("a tier of a quarter of the working set: hit ratio %.3f under Zipf(1), %.3f uniform", z, u)
	}
	t.Logf("hit ratio %.3f under Zipf(1), %.3f uniform", z, u)

	r := kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--calls", "3", "--working-set", "16", "--zipf", "1.2")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "with Zipf(1.2) popularity from a working set of 16 of the 40 blocks") {
		t.Fatalf("text report: %s", r.stdout)
	}
	r = kvfs(t, nil, "bench-load", mnt, "--groups-per-call", "8", "--calls", "3")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "drawn uniformly from a working set of 40 of the 40 blocks") {
		t.Fatalf("text report: %s", r.stdout)
	}
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--working-set", "41").want(t, 1, "--fill")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--zipf", "-1").want(t, 2, "--zipf")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--working-set", "-1").want(t, 2, "--working-set")
	kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--store", "--zipf", "1").want(t, 2, "--store")
}

// TestMountDRAMHugePages: where huge pages are reserved, a mount's DRAM
// tier is on them (the system's free huge pages drop by the tier's while
// it is mounted) and serves loads. Skipped where none can be reserved.
func TestMountDRAMHugePages(t *testing.T) {
	requireMount(t)
	const path = "/proc/sys/vm/nr_hugepages"
	hugeFree := func() int64 {
		t.Helper()
		data, err := os.ReadFile("/proc/meminfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "HugePages_Free:"); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
		}
		t.Skip("skipping: no HugePages_Free in /proc/meminfo")
		return 0
	}
	old, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("skipping: %v", err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(old)))
	if err != nil {
		t.Fatal(err)
	}
	free0 := hugeFree()
	if err := os.WriteFile(path, []byte(strconv.Itoa(n+16)), 0o644); err != nil {
		t.Skipf("skipping: reserving huge pages: %v", err)
	}
	t.Cleanup(func() { // after the unmount (cleanups run last first)
		if err := os.WriteFile(path, old, 0o644); err != nil {
			t.Errorf("giving the huge pages back: %v", err)
		}
	})
	if hugeFree()-free0 < 16 {
		t.Skip("skipping: the kernel reserved fewer huge pages than asked")
	}
	free1 := hugeFree()
	st := storetest.Open(t, storetest.Formatted(t, testGeo, 16, 4096), store.Options{})
	dram := 4 << 20 / testGeo.PayloadBytes() * testGeo.PayloadBytes()
	mnt := mountServed(t, st, dram, "", func() { st.Close() })
	if got := hugeFree(); free1-got < dram>>21 {
		t.Fatalf("huge pages free: %d before the mount, %d with a tier of %d bytes", free1, got, dram)
	}
	r := kvfs(t, nil, "bench-load", mnt, "--blocks-per-call", "2", "--calls", "3", "--fill", "3", "--json")
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "dram_hit_ratio") {
		t.Fatalf("no tier on the mount: %s", r.stdout)
	}
}
