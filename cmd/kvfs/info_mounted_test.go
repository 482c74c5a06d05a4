package main

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/fs"
	"github.com/kvfs/kvfs/store"
)

// TestInfoOfMountedStore: kvfs info of a store a daemon holds answers from
// the mount's .kvfs/ files, with the figures info gives of the store
// unmounted, and says where it is mounted.
func TestInfoOfMountedStore(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root to mount; CI runs as root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("skipping: /dev/fuse is missing")
	}
	path := newStore(t)
	put(t, path, "1", 0, 0, "K", group(1))
	r := kvfs(t, nil, "info", path, "--json", "--engine", "posix")
	r.want(t, 0)
	var offline infoReport
	decodeJSON(t, r.stdout, &offline)

	st, closeStore, err := engine.OpenStore(path, engine.Options{Kind: "posix"}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	srv, err := fs.Mount(mnt, st, fs.Options{FsName: path})
	if err != nil {
		closeStore()
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
		if err := closeStore(); err != nil {
			t.Error(err)
		}
	})

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

func jsonOf(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return b
}
