package store_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// testGeo is small: 2 layers × 2 heads × 2 kinds = 8 groups of 512 bytes.
var testGeo = layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}

func newMemStore(t testing.TB, slots int, geo layout.Geometry) (*store.Store, *storetest.Mem) {
	t.Helper()
	size := store.SizeFor(geo, int64(slots))
	m := storetest.NewMem(size, 512)
	if _, err := store.Format(m, geo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	return openStore(t, m, store.Options{}), m
}

// openStore opens the store on e and checks its invariants when it is
// closed (export_test.go hooks the check into Close): by the test, or at
// the end of the test, where openStore closes it. Close a store before its
// engine; the check reads the slot headers through it.
func openStore(t testing.TB, e store.Engine, o store.Options) *store.Store {
	t.Helper()
	s, err := store.Open(e, o)
	if err != nil {
		t.Fatal(err)
	}
	checkAtClose(t, s)
	return s
}

// checkAtClose closes s at the end of the test if it is still open, and
// reports what the invariants check found when it was closed.
func checkAtClose(t testing.TB, s *store.Store) {
	sb := s.Superblock()
	id := sb.UUIDString()
	t.Cleanup(func() {
		s.Close() // a no-op when the test closed it; its error is the test's business
		ran, err := store.CheckedAtClose(s)
		switch {
		case !ran:
			t.Errorf("store %s: the invariants check did not run at Close", id)
		case err != nil:
			t.Errorf("store %s: %v", id, err)
		}
	})
}

// groupData is deterministic content for a key and a version.
// writeBlocks writes every group of blocks 1..n, version v of groupData.
func writeBlocks(t testing.TB, s *store.Store, geo layout.Geometry, n, v int) {
	t.Helper()
	for b := uint64(1); b <= uint64(n); b++ {
		w := make([]store.WriteReq, geo.GroupsPerBlock())
		for i := range w {
			k := geo.KeyAt(b, i)
			w[i] = store.WriteReq{Key: k, Data: groupData(geo, k, v)}
		}
		if err := s.Write(w); err != nil {
			t.Fatal(err)
		}
	}
}

func groupData(geo layout.Geometry, k layout.Key, version int) []byte {
	b := make([]byte, geo.GroupBytes())
	r := rand.New(rand.NewPCG(k.Block, uint64(geo.Index(k))<<32|uint64(version)))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func put(t testing.TB, s *store.Store, keys []layout.Key, version int) {
	t.Helper()
	reqs := make([]store.WriteReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.WriteReq{Key: k, Data: groupData(s.Geometry(), k, version)}
	}
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil {
			t.Fatalf("write %v: %v", r.Key, r.Err)
		}
	}
}

func get(s *store.Store, k layout.Key) ([]byte, error) {
	reqs := []store.ReadReq{{Key: k, Buf: make([]byte, s.Geometry().GroupBytes())}}
	if err := s.Read(reqs); err != nil {
		return nil, err
	}
	return reqs[0].Buf, reqs[0].Err
}

func blockKeys(geo layout.Geometry, block uint64) []layout.Key {
	keys := make([]layout.Key, geo.GroupsPerBlock())
	for i := range keys {
		keys[i] = geo.KeyAt(block, i)
	}
	return keys
}

func TestRoundTrip(t *testing.T) {
	s, m := newMemStore(t, 8, testGeo)
	k := layout.Key{Block: 0xabc, Layer: 1, Head: 1, Kind: layout.V}
	if _, err := get(s, k); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("absent group: %v", err)
	}
	put(t, s, []layout.Key{k}, 1)
	got, err := get(s, k)
	if err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
		t.Fatalf("read back: %v", err)
	}
	// Overwrite (copy-on-write), then add a group in place.
	put(t, s, []layout.Key{k}, 2)
	k2 := k
	k2.Kind = layout.K
	put(t, s, []layout.Key{k2}, 1)
	for _, c := range []struct {
		k layout.Key
		v int
	}{{k, 2}, {k2, 1}} {
		got, err := get(s, c.k)
		if err != nil || !bytes.Equal(got, groupData(testGeo, c.k, c.v)) {
			t.Fatalf("%v: %v", c.k, err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Reopen: the index comes back from the headers.
	s2 := openStore(t, m, store.Options{})
	got, err = get(s2, k)
	if err != nil || !bytes.Equal(got, groupData(testGeo, k, 2)) {
		t.Fatalf("after reopen: %v", err)
	}
	if n := len(s2.Blocks()); n != 1 {
		t.Fatalf("%d blocks, want 1", n)
	}
}
