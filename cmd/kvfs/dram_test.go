package main

import (
	"encoding/json"
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
			"kvfs_dram_evictions_total", "kvfs_dram_invalidations_total", "kvfs_dram_promoted_bytes_total", "kvfs_dram_corrupt_total"} {
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
