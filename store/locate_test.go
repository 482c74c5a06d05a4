package store_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// TestLocate: Locate gives, for each group present, the offset of its
// payload in the file (the host view holds the group's bytes there) and
// its recorded CRC; misses and bad keys fail alone; the pins keep a
// located slot's bytes through a delete and writes that would reuse it,
// until Unpin; a closed store pins nothing.
func TestLocate(t *testing.T) {
	geo := testGeo
	s, m := newMemStore(t, 3, geo)
	if s.HostView() != nil {
		t.Fatal("host view offered by an engine without one")
	}
	m.SetHostView(true)
	view := s.HostView()
	if len(view) != int(m.Size()) {
		t.Fatalf("host view of %d bytes, file %d", len(view), m.Size())
	}
	writeBlocks(t, s, geo, 1, 1)
	put(t, s, []layout.Key{geo.KeyAt(2, 0), geo.KeyAt(2, 5)}, 1)
	gb := int64(geo.GroupBytes())
	var reqs []store.LocateReq
	for _, b := range []uint64{1, 2} {
		for i := range geo.GroupsPerBlock() {
			reqs = append(reqs, store.LocateReq{Key: geo.KeyAt(b, i)})
		}
	}
	reqs = append(reqs, store.LocateReq{Key: layout.Key{Block: 7}}, store.LocateReq{Key: layout.Key{Block: 1, Layer: geo.Layers}})
	before := s.Metrics()
	pins, err := s.Locate(reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	// located groups count as read and found, absent ones as misses
	found := uint64(geo.GroupsPerBlock() + 2)
	if m := s.Metrics(); m.Hits-before.Hits != found || m.Reads-before.Reads != found || m.Misses-before.Misses != uint64(geo.GroupsPerBlock()-2+1) {
		t.Errorf("metrics after Locate: %d hits, %d reads, %d misses; want %d, %d, %d",
			m.Hits-before.Hits, m.Reads-before.Reads, m.Misses-before.Misses, found, found, geo.GroupsPerBlock()-2+1)
	}
	if len(pins) != 2 {
		t.Fatalf("%d pins for two blocks present", len(pins))
	}
	check := func(when string) {
		t.Helper()
		for _, r := range reqs {
			present := r.Key.Block == 1 || (r.Key.Block == 2 && (geo.Index(r.Key) == 0 || geo.Index(r.Key) == 5))
			switch {
			case r.Key.Layer == geo.Layers:
				if !errors.Is(r.Err, store.ErrInvalid) {
					t.Errorf("%s: %v: %v, want ErrInvalid", when, r.Key, r.Err)
				}
			case !present:
				if r.Err != store.ErrNotFound {
					t.Errorf("%s: %v: %v, want the ErrNotFound sentinel", when, r.Key, r.Err)
				}
			case r.Err != nil:
				t.Errorf("%s: %v: %v", when, r.Key, r.Err)
			default:
				want := groupData(geo, r.Key, 1)
				if got := view[r.Off : r.Off+gb]; !bytes.Equal(got, want) {
					t.Errorf("%s: %v: the view at %d is not the group", when, r.Key, r.Off)
				}
				if r.CRC != store.CRC32C(want) {
					t.Errorf("%s: %v: CRC %08x, want %08x", when, r.Key, r.CRC, store.CRC32C(want))
				}
			}
		}
	}
	check("located")
	// Block 1 deleted and every slot written while pinned: the pinned
	// slots are not reused.
	if err := s.DeleteBlock(1); err != nil {
		t.Fatal(err)
	}
	for b := uint64(10); b < 16; b++ {
		put(t, s, blockKeys(geo, b), 2)
	}
	check("pinned through a delete and writes")
	s.Unpin(pins)
	// Unpinned, the deleted block's slot serves writes again.
	for b := uint64(20); b < 26; b++ {
		put(t, s, blockKeys(geo, b), 3)
	}
	reused := false
	for _, r := range reqs {
		if r.Key.Block == 1 && !bytes.Equal(view[r.Off:r.Off+gb], groupData(geo, r.Key, 1)) {
			reused = true
		}
	}
	if !reused {
		t.Error("the deleted block's slot was never reused after Unpin")
	}
	s.Close()
	if pins, err := s.Locate(reqs[:1], nil); !errors.Is(err, store.ErrClosed) || len(pins) != 0 {
		t.Errorf("closed store: %d pins, %v", len(pins), err)
	}
}

// TestLocateAllocs: Locate allocates nothing per group, hits or misses.
func TestLocateAllocs(t *testing.T) {
	geo := testGeo
	s, _ := newMemStore(t, 4, geo)
	writeBlocks(t, s, geo, 2, 1)
	reqs := make([]store.LocateReq, 0, 4*geo.GroupsPerBlock())
	for b := uint64(1); b <= 4; b++ { // blocks 3 and 4 miss
		for i := range geo.GroupsPerBlock() {
			reqs = append(reqs, store.LocateReq{Key: geo.KeyAt(b, i)})
		}
	}
	pins := make([]int64, 0, 4)
	if a := testing.AllocsPerRun(100, func() {
		p, err := s.Locate(reqs, pins[:0])
		if err != nil {
			t.Fatal(err)
		}
		s.Unpin(p)
	}); a != 0 {
		t.Errorf("%v allocations per Locate of %d groups", a, len(reqs))
	}
}

// TestBatchSlotsAscend: the new blocks of one write take their slots in
// ascending order, in the order the write names them, whatever order the
// free list holds the slots in (here freed in an order of its own): a
// prefix stored in one call lies in the file in its order.
func TestBatchSlotsAscend(t *testing.T) {
	geo := testGeo
	s, m := newMemStore(t, 8, geo)
	m.SetHostView(true)
	writeBlocks(t, s, geo, 8, 1)
	for _, b := range []uint64{3, 7, 1, 6, 2} {
		if err := s.DeleteBlock(b); err != nil {
			t.Fatal(err)
		}
	}
	order := []uint64{40, 10, 30, 50, 20} // block ids in the write's order, not ascending
	var w []store.WriteReq
	for _, b := range order {
		for i := range geo.GroupsPerBlock() {
			w = append(w, store.WriteReq{Key: geo.KeyAt(b, i), Data: bytes.Repeat([]byte{byte(b)}, geo.GroupBytes())})
		}
	}
	if err := s.Write(w); err != nil {
		t.Fatal(err)
	}
	reqs := make([]store.LocateReq, len(order))
	for i, b := range order {
		reqs[i] = store.LocateReq{Key: geo.KeyAt(b, 0)}
	}
	pins, err := s.Locate(reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Unpin(pins)
	for i, r := range reqs {
		if r.Err != nil {
			t.Fatalf("block %d: %v", order[i], r.Err)
		}
		if i > 0 && r.Off <= reqs[i-1].Off {
			t.Fatalf("block %d at %d, after block %d at %d: the write's blocks do not ascend in the file", order[i], r.Off, order[i-1], reqs[i-1].Off)
		}
	}
}
