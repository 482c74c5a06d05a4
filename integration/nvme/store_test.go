package nvmeint

import (
	"bytes"
	"os"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// TestStoreOnNVMe formats a store on the namespace through the nvme
// engine, round-trips many groups, checks fsck, and — with FDP — that the
// bytes the engine placed on each handle are exactly what each handle's
// reclaim unit status lost.
func TestStoreOnNVMe(t *testing.T) {
	e := openEngine(t, "auto")
	fdp, err := e.FDPInfo()
	if err != nil {
		t.Fatal(err)
	}
	g := testGeometry
	// A small store (about 470 slots) so that the slots of 300 blocks are
	// spread over every data stream.
	if _, err := store.Format(e, g, store.FormatOptions{Force: true, Size: 32 << 20}); err != nil {
		t.Fatalf("Format: %v", err)
	}
	s, err := store.Open(e, store.Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	info := s.Info()
	t.Logf("store: %d slots of %d bytes, engine %s", info.Slots, info.SlotBytes, info.Engine)

	const blocks = 300
	gb := g.GroupBytes()
	n := g.GroupsPerBlock()
	for b0 := uint64(0); b0 < blocks; b0 += 10 {
		var reqs []store.WriteReq
		for b := b0; b < b0+10; b++ {
			for idx := 0; idx < n; idx++ {
				d := make([]byte, gb)
				groupData(d, b, idx, 0)
				reqs = append(reqs, store.WriteReq{Key: g.KeyAt(b, idx), Data: d})
			}
		}
		if err := s.Write(reqs); err != nil {
			t.Fatalf("Write: %v", err)
		}
		for _, r := range reqs {
			if r.Err != nil {
				t.Fatalf("Write %v: %v", r.Key, r.Err)
			}
		}
	}
	verify := func(s *store.Store) {
		t.Helper()
		want := make([]byte, gb)
		for b := uint64(0); b < blocks; b++ {
			reqs := make([]store.ReadReq, n)
			for idx := range reqs {
				reqs[idx] = store.ReadReq{Key: g.KeyAt(b, idx), Buf: make([]byte, gb)}
			}
			if err := s.Read(reqs); err != nil {
				t.Fatalf("Read: %v", err)
			}
			for idx, r := range reqs {
				groupData(want, b, idx, 0)
				if r.Err != nil || !bytes.Equal(r.Buf, want) {
					t.Fatalf("block %d group %d: err %v, equal %v", b, idx, r.Err, bytes.Equal(r.Buf, want))
				}
			}
		}
	}
	verify(s)
	rep, err := s.Fsck(false)
	if err != nil || !rep.Clean() {
		t.Fatalf("fsck: %v %+v", err, rep)
	}
	t.Logf("fsck clean: %d blocks, %d groups", rep.Blocks, rep.Groups)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Reopen (recovery from the slot headers) and check again.
	s, err = store.Open(e, store.Options{Expect: &g})
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	verify(s)
	if rep, err := s.Fsck(false); err != nil || !rep.Clean() {
		t.Fatalf("fsck after reopen: %v %+v", err, rep)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	stats := e.Stats()
	t.Logf("engine: %s", stats)

	if !fdp.Enabled {
		if os.Getenv("KVFS_FDP") == "on" {
			t.Fatalf("booted with FDP, engine has none: %s", fdp.Reason)
		}
		return
	}
	after, err := e.FDPInfo()
	if err != nil {
		t.Fatal(err)
	}
	lba := uint64(e.Align())
	used := 0
	for i := range after.Handles {
		drop := fdp.Handles[i].RUAMW - after.Handles[i].RUAMW
		t.Logf("handle %d (pid %d): placed %d bytes, available %d → %d blocks", i, after.Handles[i].PID, stats.PlacedBytes[i], fdp.Handles[i].RUAMW, after.Handles[i].RUAMW)
		if drop != stats.PlacedBytes[i]/lba {
			t.Errorf("handle %d: available space dropped by %d blocks, the engine placed %d blocks there", i, drop, stats.PlacedBytes[i]/lba)
		}
		if stats.PlacedBytes[i] > 0 {
			used++
		}
	}
	if stats.PlacedBytes[0] == 0 {
		t.Error("no metadata written to the meta handle")
	}
	if used < len(after.Handles) {
		t.Errorf("%d of %d handles used; want superblock/headers on handle 0 and data on every other", used, len(after.Handles))
	}
}
