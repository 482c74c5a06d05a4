package main

import (
	"bytes"
	"testing"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
)

// fsck reports the store's format version, in text and in --json.
func TestFsckFormatVersion(t *testing.T) {
	path := newStore(t)
	r := kvfs(t, nil, "fsck", path)
	r.want(t, 0)
	if !bytes.Contains(r.stdout, []byte("format version 2,")) {
		t.Fatalf("fsck: %s", r.stdout)
	}
	r = kvfs(t, nil, "fsck", path, "--json")
	r.want(t, 0)
	var rep fsckReport
	decodeJSON(t, r.stdout, &rep)
	if rep.FormatVersion != store.FormatVersion {
		t.Fatalf("fsck --json format_version %d", rep.FormatVersion)
	}
}

// mount refuses an eviction order it does not know, before mounting.
func TestMountEvictFlag(t *testing.T) {
	path := newStore(t)
	kvfs(t, nil, "mount", path, t.TempDir(), "--evict", "fifo").want(t, 2, "--evict", "prefix or lru")
}

// --evict reaches the store's options; prefix is the default.
func TestMountEvictOption(t *testing.T) {
	for flag, want := range map[string]index.Policy{"prefix": index.Prefix, "lru": index.LRU} {
		o := mountOptions{evict: flag}
		if got := o.storeOptions(nil, nil, 1<<20).Evict; got != want {
			t.Errorf("--evict %s: store evicts by %v", flag, got)
		}
	}
	if f := root.Commands(); f != nil {
		for _, c := range f {
			if c.Name() == "mount" {
				if d := c.Flags().Lookup("evict").DefValue; d != "prefix" {
					t.Errorf("--evict defaults to %q", d)
				}
			}
		}
	}
}
