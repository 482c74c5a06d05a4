package nvmeint

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
)

// The crash test spans two boots of the emulator on one disk image (see
// run.sh). TestCrashWrite formats a store and writes batches forever; after
// each batch's Write returns (the groups are durable) it prints
// "KVFS-ACK <batch>" on the console. The harness kills QEMU after some
// acknowledgements — a power cut in the middle of a write — and boots
// TestCrashCheck with KVFS_ACKED set to the highest batch it saw acknowledged.
//
// Batch i writes every group of block i at version 0 and, for i >= lag,
// rewrites the even groups of block i-lag at version 1 (copy-on-write of a
// live block). After the cut, every group of an acknowledged batch must read
// back with its acknowledged content; groups the next (unacknowledged) batch
// was writing may read old or new, or be absent; nothing may read corrupt.

const (
	crashLag        = 5
	crashStoreBytes = 64 << 20
)

func crashBatch(i uint64) []store.WriteReq {
	g := testGeometry
	var reqs []store.WriteReq
	for idx := 0; idx < g.GroupsPerBlock(); idx++ {
		d := make([]byte, g.GroupBytes())
		groupData(d, i, idx, 0)
		reqs = append(reqs, store.WriteReq{Key: g.KeyAt(i, idx), Data: d})
	}
	if i >= crashLag {
		for idx := 0; idx < g.GroupsPerBlock(); idx += 2 {
			d := make([]byte, g.GroupBytes())
			groupData(d, i-crashLag, idx, 1)
			reqs = append(reqs, store.WriteReq{Key: g.KeyAt(i-crashLag, idx), Data: d})
		}
	}
	return reqs
}

// versionAfter is the version of group idx of block b once batch k is
// durable, or -1 when the group does not exist yet.
func versionAfter(b uint64, idx int, k int64) int {
	switch {
	case int64(b) > k:
		return -1
	case idx%2 == 0 && int64(b+crashLag) <= k:
		return 1
	}
	return 0
}

func TestCrashWrite(t *testing.T) {
	testDevicePath(t)
	if os.Getenv("KVFS_MODE") != "crash-write" {
		t.Skip("runs only as the first boot of the rig's crash test (KVFS_MODE=crash-write)")
	}
	e := openEngine(t, "auto")
	if _, err := store.Format(e, testGeometry, store.FormatOptions{Force: true, Size: crashStoreBytes}); err != nil {
		t.Fatalf("Format: %v", err)
	}
	s, err := store.Open(e, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("KVFS-CRASH store of %d slots formatted; writing until the power cut\n", s.Info().Slots)
	deadline := time.Now().Add(150 * time.Second)
	for i := uint64(0); time.Now().Before(deadline); i++ {
		reqs := crashBatch(i)
		if err := s.Write(reqs); err != nil {
			t.Fatalf("batch %d: %v", i, err)
		}
		for _, r := range reqs {
			if r.Err != nil {
				t.Fatalf("batch %d %v: %v", i, r.Key, r.Err)
			}
		}
		fmt.Printf("KVFS-ACK %d\n", i)
	}
	t.Fatal("no power cut came")
}

func TestCrashCheck(t *testing.T) {
	testDevicePath(t)
	if os.Getenv("KVFS_MODE") != "crash-check" {
		t.Skip("runs only as the second boot of the rig's crash test (KVFS_MODE=crash-check)")
	}
	acked, err := strconv.ParseInt(os.Getenv("KVFS_ACKED"), 10, 64)
	if err != nil || acked < 0 {
		t.Fatalf("KVFS_ACKED=%q: the first boot acknowledged nothing", os.Getenv("KVFS_ACKED"))
	}
	e := openEngine(t, "auto")
	s, err := store.Open(e, store.Options{})
	if err != nil {
		t.Fatalf("Open after the power cut: %v", err)
	}
	defer s.Close()
	g := testGeometry
	gb := g.GroupBytes()
	want := make([]byte, gb)
	var verified, newer, absent int
	// The harness saw acknowledgements up to batch acked. The batch after
	// it may have completed (its acknowledgement still on its way to the
	// console) and the one after that may have been in flight: groups they
	// touch may read as any of those versions; nothing later exists.
	const inFlight = 2
	for b := uint64(0); int64(b) <= acked+inFlight; b++ {
		reqs := make([]store.ReadReq, g.GroupsPerBlock())
		for idx := range reqs {
			reqs[idx] = store.ReadReq{Key: g.KeyAt(b, idx), Buf: make([]byte, gb)}
		}
		if err := s.Read(reqs); err != nil {
			t.Fatalf("Read block %d: %v", b, err)
		}
		for idx, r := range reqs {
			old := versionAfter(b, idx, acked) // durable before the cut
			switch {
			case errors.Is(r.Err, store.ErrCorrupt):
				t.Errorf("block %d group %d reads corrupt (acknowledged version %d)", b, idx, old)
			case errors.Is(r.Err, store.ErrNotFound):
				if old >= 0 {
					t.Errorf("block %d group %d: acknowledged (version %d) but absent", b, idx, old)
				}
				absent++
			case r.Err != nil:
				t.Errorf("block %d group %d: %v", b, idx, r.Err)
			default:
				matches := func(v int) bool {
					if v < 0 {
						return false
					}
					groupData(want, b, idx, uint32(v))
					return bytes.Equal(r.Buf, want)
				}
				ok := matches(old)
				if ok {
					verified++
				}
				for k := acked + 1; !ok && k <= acked+inFlight; k++ {
					if v := versionAfter(b, idx, k); v != old && matches(v) {
						ok = true
						newer++
					}
				}
				if !ok {
					t.Errorf("block %d group %d: content is no version written by batches up to %d (acknowledged: version %d)", b, idx, acked+inFlight, old)
				}
			}
		}
	}
	rep, err := s.Fsck(false)
	if err != nil {
		t.Fatalf("fsck: %v", err)
	}
	for _, p := range rep.Problems {
		t.Logf("fsck after the power cut: %s", p)
	}
	for _, p := range rep.Problems {
		if int64(p.Block) <= acked && p.Key != nil {
			t.Errorf("fsck: acknowledged group damaged: %s", p)
		}
	}
	fmt.Printf("KVFS-CRASH acknowledged batches 0..%d: %d groups verified, %d from batches in flight, %d absent; fsck: %d blocks, %d groups, %d problems\n",
		acked, verified, newer, absent, rep.Blocks, rep.Groups, len(rep.Problems))
}
