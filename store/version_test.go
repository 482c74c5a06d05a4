package store_test

import (
	"errors"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestVersions: every change of a block gives it a generation never seen
// before; an unchanged block keeps its own; an absent block is not Stored.
func TestVersions(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	version := func(b uint64) store.BlockVersion {
		t.Helper()
		out := make([]store.BlockVersion, 1)
		if err := s.Versions([]uint64{b}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	seen := map[uint64]bool{}
	fresh := func(what string, v store.BlockVersion) {
		t.Helper()
		if !v.Stored || seen[v.Gen] {
			t.Fatalf("%s: %+v, a generation seen before or no block", what, v)
		}
		seen[v.Gen] = true
	}
	if v := version(1); v.Stored {
		t.Fatalf("absent block: %+v", v)
	}
	tag := store.Tag{9}
	write := func(b uint64, m *store.BlockMeta) {
		t.Helper()
		reqs := []store.WriteReq{
			{Key: layout.Key{Block: b}, Data: make([]byte, testGeo.GroupBytes()), Meta: m},
			{Key: layout.Key{Block: b, Kind: layout.V}, Data: make([]byte, testGeo.GroupBytes()), Meta: m},
		}
		if err := s.Write(reqs); err != nil || reqs[0].Err != nil || reqs[1].Err != nil {
			t.Fatal(err, reqs[0].Err, reqs[1].Err)
		}
	}
	write(1, &store.BlockMeta{Tag: tag})
	v := version(1)
	fresh("written", v)
	if v.Meta.Tag != tag {
		t.Fatalf("tag %v, want %v", v.Meta.Tag, tag)
	}
	write(2, nil)
	if version(1) != v {
		t.Fatal("a write of another block changed the version")
	}
	write(1, nil)
	fresh("rewritten", version(1))
	if err := s.Delete([]layout.Key{{Block: 1, Kind: layout.V}}); err != nil {
		t.Fatal(err)
	}
	fresh("one group deleted", version(1))
	if err := s.RenameBlock(1, 3); err != nil {
		t.Fatal(err)
	}
	if version(1).Stored {
		t.Fatal("renamed block still stored under its old id")
	}
	fresh("renamed", version(3))
	if err := s.DeleteBlock(3); err != nil {
		t.Fatal(err)
	}
	if version(3).Stored {
		t.Fatal("deleted block still stored")
	}
	s.Close()
	if err := s.Versions([]uint64{2}, make([]store.BlockVersion, 1)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("closed store: %v", err)
	}
}
