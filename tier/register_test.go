package tier

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/engine"
	"github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
)

// uringStore formats a store of slots slots in a file on a disk file
// system (O_DIRECT, so reads go through the ring) and opens it on the
// io_uring engine; it skips where io_uring or O_DIRECT is not available.
func uringStore(t *testing.T, slots int64) (*store.Store, *uring.Engine) {
	t.Helper()
	dir, err := os.MkdirTemp("/var/tmp", "kvfs-tier-")
	if err != nil {
		t.Skipf("skipping: no /var/tmp: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "s.kvfs")
	if err := store.PrepareFile(path, store.SizeFor(testGeo, slots)); err != nil {
		t.Fatal(err)
	}
	o := engine.Options{Kind: "uring"}
	eng, err := engine.Open(path, o)
	if err != nil {
		t.Skipf("skipping: no io_uring engine here: %v", err)
	}
	if _, err := store.Format(eng, testGeo, store.FormatOptions{Force: true}); err != nil {
		t.Fatal(err)
	}
	eng.Close()
	st, closeAll, err := engine.OpenStore(path, o, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAll() })
	ue, ok := st.Engine().(*uring.Engine)
	if !ok {
		t.Skipf("skipping: the store opened on %T", st.Engine())
	}
	return st, ue
}

// The tier's memory is registered with an io_uring store's engine, so a
// miss reads from the store into it with READ_FIXED; unregistered
// (Options.NoRegisterMemory) the same reads use plain buffers. Either way
// the bytes are the block's.
func TestArenaRegisteredWithEngine(t *testing.T) {
	for _, reg := range []bool{true, false} {
		st, ue := uringStore(t, 8)
		tr, err := New(st, Options{Bytes: 4 * testGeo.PayloadBytes(), NoRegisterMemory: !reg})
		if err != nil {
			t.Fatal(err)
		}
		if got := tr.Metrics().Registered; got != reg {
			t.Fatalf("registered %v, want %v", got, reg)
		}
		writeBlock(t, st, 3, 33, nil)
		before := ue.Stats()
		mustRead(t, tr, 3, 33) // a miss: read into the arena
		after := ue.Stats()
		if m := tr.Metrics(); m.Misses == 0 || m.Blocks != 1 {
			t.Fatalf("the read was no miss kept in the tier: %+v", m)
		}
		ios, fixed := after.SQEs-before.SQEs, after.FixedSQEs-before.FixedSQEs
		if ios == 0 {
			t.Skip("skipping: the engine served the read without its ring (no O_DIRECT here)")
		}
		if reg && fixed == 0 {
			t.Fatalf("registered: %d reads into the tier, none with a fixed buffer", ios)
		}
		if !reg && fixed != 0 {
			t.Fatalf("unregistered: %d of %d reads into the tier used a fixed buffer", fixed, ios)
		}
		mustRead(t, tr, 3, 33) // a hit
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
