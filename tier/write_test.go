package tier

import (
	"errors"
	"sync/atomic"
	"testing"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// A whole block written through the tier is kept, new or replacing a copy,
// and its next read is a hit of the written bytes; a write of part of a
// block drops the copy (the tier does not know the rest of the new
// version), and the store serves the block.
func TestWriteKeeps(t *testing.T) {
	tr, st, _ := newTier(t, 16, 4)
	groups := uint64(testGeo.GroupsPerBlock())
	block := groups * uint64(testGeo.GroupBytes())
	writeBlock(t, tr, 1, 10, nil) // never read: kept
	if !tr.Holds(1) || tr.Metrics().WrittenBytes != block {
		t.Fatalf("a block written through the tier was not kept: %+v", tr.Metrics())
	}
	mustRead(t, tr, 1, 10)
	if m := tr.Metrics(); m.Hits != groups || m.Misses != 0 {
		t.Fatalf("the read after a write: %+v", m)
	}
	writeBlock(t, tr, 1, 11, nil) // replaces the copy
	mustRead(t, tr, 1, 11)
	if m := tr.Metrics(); m.Hits != 2*groups || m.Misses != 0 || m.Blocks != 1 {
		t.Fatalf("the read after a rewrite: %+v", m)
	}
	// One group of a new version: the copy goes.
	part := []store.WriteReq{{Key: testGeo.KeyAt(1, 2), Data: content(12, 2)}}
	if err := tr.Write(part); err != nil || part[0].Err != nil {
		t.Fatal(err, part[0].Err)
	}
	if tr.Holds(1) {
		t.Fatal("a write of one group left the tier's copy")
	}
	reqs := blockReqs(1)
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for idx := range reqs {
		want := uint64(11)
		if idx == 2 {
			want = 12
		}
		if id, ok := contentOf(reqs[idx].Buf, idx); reqs[idx].Err != nil || !ok || id != want {
			t.Fatalf("group %d after a write of group 2: content %d (%v), %v", idx, id, ok, reqs[idx].Err)
		}
	}
	// A block whose groups the call names twice: the store keeps the
	// last; the tier keeps none.
	reqsTwice := []store.WriteReq{{Key: testGeo.KeyAt(2, 0), Data: content(20, 0)}}
	for idx := range int(groups) {
		reqsTwice = append(reqsTwice, store.WriteReq{Key: testGeo.KeyAt(2, idx), Data: content(21, idx)})
	}
	if err := tr.Write(reqsTwice); err != nil {
		t.Fatal(err)
	}
	if tr.Holds(2) {
		t.Fatal("a block with a group named twice was kept")
	}
	mustRead(t, tr, 2, 21)
	// The store's outcome reaches the caller, with the generation.
	var v [1]store.BlockVersion
	if err := st.Versions([]uint64{2}, v[:]); err != nil || reqsTwice[len(reqsTwice)-1].Gen != v[0].Gen {
		t.Fatalf("the caller's requests carry gen %d, the store's %+v (%v)", reqsTwice[len(reqsTwice)-1].Gen, v[0], err)
	}

	// A call writing more blocks than half the tier keeps half the tier.
	for b := uint64(10); b < 18; b++ {
		writeBlock(t, st, b, b, nil)
	}
	big := make([]store.WriteReq, 0, 8*groups)
	for b := uint64(10); b < 18; b++ {
		for idx := range int(groups) {
			big = append(big, store.WriteReq{Key: testGeo.KeyAt(b, idx), Data: content(b+100, idx)})
		}
	}
	if err := tr.Write(big); err != nil {
		t.Fatal(err)
	}
	kept := 0
	for b := uint64(10); b < 18; b++ {
		if tr.Holds(b) {
			kept++
		}
		mustRead(t, tr, b, b+100)
	}
	if kept != 2 {
		t.Fatalf("a call of 8 blocks kept %d in a tier of 4", kept)
	}
}

// A request that comes with its checksum (Summed: the GPU path's, or a
// STORE's staging) and a copy that does not match it: the tier keeps no
// copy and the store gets the caller's bytes and checksum, so the
// mismatch is the store's to report, as without the tier.
func TestWriteSummedMismatch(t *testing.T) {
	tr, _, _ := newTier(t, 8, 4)
	reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		d := content(30, idx)
		reqs[idx] = store.WriteReq{Key: testGeo.KeyAt(3, idx), Data: d, CRC: store.CRC32C(d), Summed: true}
	}
	if err := tr.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if !tr.Holds(3) {
		t.Fatal("a block with right checksums was not kept")
	}
	mustRead(t, tr, 3, 30)
	for idx := range reqs {
		reqs[idx].Data = content(31, idx)
	}
	reqs[1].CRC = store.CRC32C(reqs[1].Data)
	if err := tr.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if tr.Holds(3) {
		t.Fatal("a block with a wrong checksum was kept")
	}
	got := blockReqs(3)
	if err := tr.Read(got); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(got[0].Err, store.ErrCorrupt) || got[1].Err != nil {
		t.Fatalf("the store's answer for the groups written with a wrong and a right checksum: %v, %v", got[0].Err, got[1].Err)
	}
}

// A write the store fails keeps nothing, and the tier's slots all come
// back.
func TestWriteFails(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 8, 512)
	var failing atomic.Bool
	fe := storetest.NewFaulty(m, func(n int, r store.IO) storetest.Fault {
		if failing.Load() && r.Op == store.OpWrite {
			return storetest.EIO
		}
		return storetest.None
	}, nil)
	st := storetest.Open(t, fe, store.Options{})
	tr, err := New(st, Options{Bytes: 2 * testGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	writeBlock(t, tr, 1, 10, nil)
	failing.Store(true)
	reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		reqs[idx] = store.WriteReq{Key: testGeo.KeyAt(1, idx), Data: content(11, idx)}
	}
	tr.Write(reqs)
	if reqs[0].Err == nil || reqs[0].Gen != 0 || tr.Holds(1) {
		t.Fatalf("a failed write: err %v, gen %d, kept %v", reqs[0].Err, reqs[0].Gen, tr.Holds(1))
	}
	failing.Store(false)
	for b := uint64(2); b < 6; b++ {
		writeBlock(t, tr, b, b, nil)
		mustRead(t, tr, b, b)
	}
	if n := tr.Metrics().Blocks; n != 2 {
		t.Fatalf("the tier of 2 holds %d blocks", n)
	}
}
