package store_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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

// TestWriteGen: a durable write's requests carry the generation Versions
// then answers for their block; a request whose Data a later call of the
// same commit replaced (the same group, or the block under another tag)
// carries none, since the header holds the other call's bytes.
func TestWriteGen(t *testing.T) {
	s, _ := newMemStore(t, 8, testGeo)
	version := func(b uint64) store.BlockVersion {
		t.Helper()
		out := make([]store.BlockVersion, 1)
		if err := s.Versions([]uint64{b}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	blockReqs := func(b uint64, v int, m *store.BlockMeta) []store.WriteReq {
		reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
		for i := range reqs {
			k := testGeo.KeyAt(b, i)
			reqs[i] = store.WriteReq{Key: k, Data: groupData(testGeo, k, v), Meta: m, Gen: 99}
		}
		return reqs
	}
	reqs := blockReqs(1, 1, nil)
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		if r.Err != nil || r.Gen == 0 || r.Gen != version(1).Gen {
			t.Fatalf("request %d: err %v, gen %d; the block's %+v", i, r.Err, r.Gen, version(1))
		}
	}
	bad := []store.WriteReq{{Key: testGeo.KeyAt(2, 0), Data: make([]byte, 3), Gen: 99}}
	if s.Write(bad); bad[0].Err == nil || bad[0].Gen != 0 {
		t.Fatalf("a refused request: err %v, gen %d", bad[0].Err, bad[0].Gen)
	}

	// Three calls, the second and third queued while the first commits:
	// they commit together, the third last.
	commit := func(first []store.WriteReq, later ...[]store.WriteReq) {
		t.Helper()
		var calls atomic.Int32
		store.OnCommit(s, func(int) {
			if calls.Add(1) != 1 {
				return
			}
			deadline := time.Now().Add(10 * time.Second)
			for store.PendingWrites(s) < len(later) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		})
		defer store.OnCommit(s, func(int) {})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); s.Write(first) }()
		for n, reqs := range later {
			for deadline := time.Now().Add(10 * time.Second); calls.Load() == 0 || store.PendingWrites(s) < n; {
				if time.Now().After(deadline) {
					t.Fatal("calls did not queue")
				}
				time.Sleep(time.Millisecond)
			}
			wg.Add(1)
			go func() { defer wg.Done(); s.Write(reqs) }()
		}
		wg.Wait()
	}
	first, early, late := blockReqs(3, 1, nil), blockReqs(1, 2, nil), blockReqs(1, 3, nil)[:1]
	commit(first, early, late)
	gen := version(1).Gen
	if late[0].Err != nil || late[0].Gen != gen {
		t.Fatalf("the last call of the commit: err %v, gen %d, the block's %d", late[0].Err, late[0].Gen, gen)
	}
	if early[0].Err != nil || early[0].Gen != 0 {
		t.Fatalf("a group a later call of the commit replaced: err %v, gen %d", early[0].Err, early[0].Gen)
	}
	for i, r := range early[1:] {
		if r.Err != nil || r.Gen != gen {
			t.Fatalf("group %d, which no later call named: err %v, gen %d, the block's %d", i+1, r.Err, r.Gen, gen)
		}
	}
	// A later call under another tag replaces the whole block.
	early, late = blockReqs(1, 4, nil), blockReqs(1, 5, &store.BlockMeta{Tag: store.Tag{7}})[:1]
	commit(blockReqs(3, 2, nil), early, late)
	if late[0].Gen != version(1).Gen {
		t.Fatalf("the block's new tag: gen %d, the block's %d", late[0].Gen, version(1).Gen)
	}
	for i, r := range early {
		if r.Err != nil || r.Gen != 0 {
			t.Fatalf("group %d under the replaced tag: err %v, gen %d", i, r.Err, r.Gen)
		}
	}
}
