package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/store"
)

// TestInfoOfMountedStore: kvfs info of a store a daemon holds answers from
// the mount's .kvfs/ files, with the figures info gives of the store
// unmounted, and says where it is mounted.
func TestInfoOfMountedStore(t *testing.T) {
	requireMount(t)
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	r := kvfs(t, nil, "info", path, "--json", "--engine", "posix")
	r.want(t, 0)
	var offline infoReport
	decodeJSON(t, r.stdout, &offline)

	mnt := mountStoreFile(t, path, 0)

	r = kvfs(t, nil, "info", path, "--json")
	r.want(t, 0)
	var mounted infoReport
	decodeJSON(t, r.stdout, &mounted)
	if mounted.MountedAt != mnt {
		t.Errorf("mounted_at %q, want %q", mounted.MountedAt, mnt)
	}
	mounted.MountedAt = ""
	offline.Owner = nil // the lease is not in .kvfs/
	if mj, oj := string(jsonOf(t, mounted)), string(jsonOf(t, offline)); mj != oj {
		t.Errorf("info from the mount:\n%s\nunmounted:\n%s", mj, oj)
	}
	r = kvfs(t, nil, "info", path)
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "mounted at:") || !strings.Contains(string(r.stdout), filepath.Join(mnt, ".kvfs")) {
		t.Errorf("info does not say where the store is mounted:\n%s", r.stdout)
	}
}

// mountStoreFile mounts the store file path in this process, as kvfs mount
// does, with a DRAM tier of dram bytes in front of it (none for 0), and
// unmounts it when the test ends.
func mountStoreFile(t *testing.T, path string, dram int64) string {
	t.Helper()
	st, closeStore, err := engine.OpenStore(path, engine.Options{Kind: "posix"}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return mountServed(t, st, dram, path, func() {
		if err := closeStore(); err != nil {
			t.Error(err)
		}
	})
}

// TestInfoOfMountedStoreDRAM: kvfs info of a store mounted with a DRAM tier
// reports the tier's size and counters from the mount: a group file read
// through the mount is a miss that brings its block in, and a LOAD of the
// same group (kvfs load) is then a hit.
func TestInfoOfMountedStoreDRAM(t *testing.T) {
	requireMount(t)
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	dram := 4 * testGeo.PayloadBytes()
	mnt := mountStoreFile(t, path, dram)
	file := filepath.Join(mnt, "layer-0", "block-0000000000000001", "head-0", "K")
	if b, err := os.ReadFile(file); err != nil || !bytes.Equal(b, group(1)) {
		t.Fatalf("read %s through the tier: %v", file, err)
	}
	dir := t.TempDir()
	reqs, out := filepath.Join(dir, "reqs"), filepath.Join(dir, "out")
	if err := os.WriteFile(reqs, []byte("1 0 0 K\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kvfs(t, nil, "load", mnt, "--requests", reqs, "--out", out).want(t, 0)
	if b, err := os.ReadFile(out); err != nil || !bytes.Equal(b, group(1)) {
		t.Fatalf("kvfs load through the tier: %v", err)
	}
	r := kvfs(t, nil, "info", path, "--json")
	r.want(t, 0)
	var rep infoReport
	decodeJSON(t, r.stdout, &rep)
	if d := rep.DRAM; d == nil || d.Bytes != uint64(dram) || d.Blocks != 1 || d.Hits != 1 || d.Misses != 1 || d.PromotedBytes == 0 {
		t.Fatalf("info of a store mounted with a DRAM tier: dram %+v\n%s", rep.DRAM, r.stdout)
	}
	r = kvfs(t, nil, "info", path)
	r.want(t, 0)
	if !strings.Contains(string(r.stdout), "dram tier:") || !strings.Contains(string(r.stdout), "1 groups hit, 1 missed, hit ratio 0.500") {
		t.Fatalf("info text lacks the DRAM tier:\n%s", r.stdout)
	}
}

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}
