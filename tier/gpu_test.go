package tier

import (
	"bytes"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
)

// locateBlock locates every group of block b (tag: the expected one).
func locateBlock(b uint64, tag store.Tag) []store.LocateReq {
	reqs := make([]store.LocateReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		reqs[idx] = store.LocateReq{Key: testGeo.KeyAt(b, idx), Tag: &tag}
	}
	return reqs
}

// read reads block b through the tier, failing t unless every group reads.
func read(t *testing.T, tr *Tier, b uint64) {
	t.Helper()
	reqs := blockReqs(b)
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if reqs[i].Err != nil {
			t.Fatalf("block %d group %d: %v", b, i, reqs[i].Err)
		}
	}
}

// TestLocate: Locate says where the groups of a block the tier holds as
// the store's version lie in the arena, with the checksums they were
// verified against, and pins its slot: eviction pressure while it is
// pinned leaves the bytes in place. Blocks it does not hold, another tag,
// and invalid keys are ErrNotHeld. Changed reports a block written since,
// and counts the others' groups as hits.
func TestLocate(t *testing.T) {
	tr, st, _ := newTier(t, 16, 2)
	tag := store.Tag{1, 2, 3}
	for b := range uint64(6) {
		writeBlock(t, st, b, 100+b, &store.BlockMeta{Tag: tag})
	}
	read(t, tr, 1)
	reqs := append(locateBlock(1, tag), locateBlock(2, store.Tag{})...)
	reqs = append(reqs, store.LocateReq{Key: testGeo.KeyAt(1, 0), Tag: &store.Tag{9}}, store.LocateReq{Key: testGeo.KeyAt(1, 0)})
	reqs[len(reqs)-1].Key.Layer = testGeo.Layers // invalid
	pins, err := tr.Locate(reqs, nil)
	if err != nil {
		t.Fatal(err)
	}
	unpinned := false
	defer func() {
		if !unpinned { // a failure: Close waits for the pins
			tr.Unpin(pins)
		}
	}()
	gpb := testGeo.GroupsPerBlock()
	arena := tr.Arena()
	for idx := range gpb {
		r := reqs[idx]
		if r.Err != nil {
			t.Fatalf("group %d of a held block: %v", idx, r.Err)
		}
		g := arena[r.Off : r.Off+int64(testGeo.GroupBytes())]
		if !bytes.Equal(g, content(101, idx)) || store.CRC32C(g) != r.CRC {
			t.Fatalf("group %d: not the block's bytes, or not its checksum", idx)
		}
	}
	for i, r := range reqs[gpb:] {
		if !errors.Is(r.Err, ErrNotHeld) {
			t.Fatalf("request %d: %v, want ErrNotHeld", gpb+i, r.Err)
		}
	}
	// Eviction pressure: block 1's slot is pinned.
	for b := uint64(2); b < 6; b++ {
		read(t, tr, b)
	}
	if !tr.Holds(1) {
		t.Fatal("a pinned block was evicted")
	}
	for idx := range gpb {
		if !bytes.Equal(arena[reqs[idx].Off:reqs[idx].Off+int64(testGeo.GroupBytes())], content(101, idx)) {
			t.Fatalf("group %d of a pinned block overwritten", idx)
		}
	}
	hits := tr.Metrics().Hits
	if stale, err := tr.Changed(pins, nil); err != nil || len(stale) != 0 {
		t.Fatalf("nothing written: %v, %v", stale, err)
	}
	if h := tr.Metrics().Hits - hits; h != uint64(gpb) {
		t.Fatalf("%d hits counted, want %d", h, gpb)
	}
	writeBlock(t, st, 1, 200, nil) // behind the tier's back
	// Two pins of block 1: its groups, then (after block 2's) the
	// request with another tag.
	if stale, err := tr.Changed(pins, nil); err != nil || !slices.Equal(stale, []uint64{1, 1}) {
		t.Fatalf("block 1 written: %v, %v", stale, err)
	}
	tr.Unpin(pins)
	unpinned = true
	// Its copy is now stale: not located (and dropped).
	reqs = locateBlock(1, store.Tag{})
	if pins, err = tr.Locate(reqs, nil); err != nil || len(pins) != 0 || !errors.Is(reqs[0].Err, ErrNotHeld) {
		t.Fatalf("a stale copy located: %v, %v, %v", pins, err, reqs[0].Err)
	}
	if tr.Holds(1) {
		t.Fatal("a stale copy kept")
	}
}

// TestLocateCorruptClose: Corrupt drops the block (counted); Close waits
// until the slots located are unpinned (a GPU may still be reading them),
// and a Locate meanwhile is refused rather than waiting behind it.
func TestLocateCorruptClose(t *testing.T) {
	tr, st, _ := newTier(t, 8, 2)
	writeBlock(t, st, 1, 101, nil)
	writeBlock(t, st, 2, 102, nil)
	read(t, tr, 1)
	read(t, tr, 2)
	tr.Corrupt(1)
	if m := tr.Metrics(); tr.Holds(1) || m.Corrupt != 1 {
		t.Fatalf("corrupt copy kept: %+v", m)
	}
	tr.Corrupt(1) // not held: nothing to count
	if m := tr.Metrics(); m.Corrupt != 1 {
		t.Fatalf("a block not held counted corrupt: %+v", m)
	}
	pins, err := tr.Locate(locateBlock(2, store.Tag{}), nil)
	if err != nil || len(pins) == 0 {
		t.Fatal(pins, err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned with a slot pinned: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	if _, err := tr.Locate(locateBlock(2, store.Tag{}), nil); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Locate while closing: %v", err)
	}
	tr.Unpin(pins)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if tr.Arena() != nil {
		t.Fatal("arena of a closed tier")
	}
}
