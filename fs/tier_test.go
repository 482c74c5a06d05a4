package fs

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/tier"
)

// mountTierEnv is mountEnv with a DRAM tier of tierBlocks blocks in front
// of the store, and without the read-ahead cache, so that every read of a
// group file reaches the tier.
func mountTierEnv(t *testing.T, slots, tierBlocks int64) (*env, *tier.Tier) {
	t.Helper()
	requireFUSE(t)
	mem, st := newStore(t, testGeo, slots)
	tr, err := tier.New(st, tier.Options{Bytes: tierBlocks * testGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{Tier: tr, CacheBytes: -1, Logger: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))}
	dir := t.TempDir()
	srv, err := Mount(dir, st, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := unmountRetry(srv); err != nil {
			t.Errorf("unmount: %v", err)
		}
		srv.Wait()
		tr.Close()
		if err := st.CheckInvariants(); err != nil {
			t.Error(err)
		}
		st.Close()
	})
	return &env{t: t, mem: mem, st: st, srv: srv, dir: dir, geo: testGeo, opts: opts}, tr
}

// TestTierFiles: cat of group files lands from the tier once the block is
// in it; a write, an unlink and a rename of the block through the mount
// are seen at once, and .kvfs/stats reports the tier.
func TestTierFiles(t *testing.T) {
	e, tr := mountTierEnv(t, 16, 2)
	k := layout.Key{Block: 0x51, Layer: 2, Head: 1, Kind: layout.V}
	k2 := layout.Key{Block: 0x51, Layer: 0, Head: 0, Kind: layout.K}
	d := e.put(k, k2)
	cat := func(k layout.Key) ([]byte, error) {
		return exec.Command("cat", e.path(k)).Output()
	}
	// The first cat reads the whole block into the tier; the second
	// group, and both again, are hits.
	for round := range 2 {
		m := tr.Metrics()
		for _, key := range []layout.Key{k, k2} {
			if got, err := cat(key); err != nil || !bytes.Equal(got, d[key]) {
				t.Fatalf("round %d: cat %v: %v", round, key, err)
			}
		}
		m2 := tr.Metrics()
		if misses := m2.Misses - m.Misses; misses != map[int]uint64{0: 1, 1: 0}[round] || m2.Hits-m.Hits != 2-misses {
			t.Fatalf("round %d: %+v", round, m2)
		}
	}

	// A write through the mount replaces the tier's copy.
	d2 := groupData(testGeo, 99)
	if err := os.WriteFile(e.path(k), d2, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := cat(k); err != nil || !bytes.Equal(got, d2) {
		t.Fatalf("cat after a write: %v", err)
	}
	if got, err := cat(k2); err != nil || !bytes.Equal(got, d[k2]) {
		t.Fatalf("cat of the other group after a write: %v", err)
	}

	// A rename of the block: the old name is gone, the new one reads.
	if err := os.Rename(e.blockPath(2, 0x51), e.blockPath(2, 0x52)); err != nil {
		t.Fatal(err)
	}
	moved := k2
	moved.Block = 0x52
	if got, err := os.ReadFile(e.path(moved)); err != nil || !bytes.Equal(got, d[k2]) {
		t.Fatalf("read the renamed block: %v", err)
	}
	if _, err := os.ReadFile(e.path(k2)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read under the old name: %v", err)
	}

	// An unlink: the group is gone, its sibling still reads.
	if err := os.Remove(e.path(moved)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.ReadFile(e.path(moved)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read an unlinked group: %v", err)
	}
	movedV := k
	movedV.Block = 0x52
	if got, err := cat(movedV); err != nil || !bytes.Equal(got, d2) {
		t.Fatalf("cat the unlinked group's sibling: %v", err)
	}

	raw, err := os.ReadFile(filepath.Join(e.dir, ".kvfs", "stats"))
	if err != nil {
		t.Fatal(err)
	}
	var stats map[string]any
	if err := json.Unmarshal(raw, &stats); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"dram_bytes", "dram_blocks", "dram_hits", "dram_misses", "dram_evictions", "dram_invalidations", "dram_promoted_bytes", "dram_corrupt", "dram_written_bytes", "dram_huge_pages", "dram_registered"} {
		if _, ok := stats[key]; !ok {
			t.Fatalf(".kvfs/stats lacks %s", key)
		}
	}
	if stats["dram_bytes"].(float64) != float64(2*testGeo.PayloadBytes()) || stats["dram_hits"].(float64) == 0 || stats["dram_promoted_bytes"].(float64) == 0 {
		t.Fatalf(".kvfs/stats: %s", raw)
	}
}
