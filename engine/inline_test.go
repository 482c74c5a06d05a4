package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvfs/kvfs/engine/posix"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/uring"
)

// TestInlineReads: a store on a tmpfs file read through the uring engine
// reads inline (pread on the verifying goroutines, counted in InlineIOs,
// no ring reads) with InlineReads auto, and through the rings with it off;
// the bytes are the same, and a bad value is refused. The posix engine
// offers inline reads on tmpfs too.
func TestInlineReads(t *testing.T) {
	dir := shmDir(t, "kvfs-inline-test-")
	path := filepath.Join(dir, "store")
	if err := store.PrepareFile(path, store.SizeFor(testGeo, 4)); err != nil {
		t.Fatal(err)
	}
	pe, err := posix.Open(path, posix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !pe.InlineReads() {
		t.Error("posix on tmpfs: no inline reads")
	}
	if _, err := store.Format(pe, testGeo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	pe.Close()
	gb, per := testGeo.GroupBytes(), testGeo.GroupsPerBlock()
	want := make([][]byte, per)
	// auto: inline reads, the bounced ones verified and landed from the
	// engine's host view (no read at all); noview: every one an inline
	// read; off: ring reads.
	for _, run := range []string{"auto", "noview", "off"} {
		mode := run
		if run == "noview" {
			mode = "auto"
		}
		s, closeAll, err := OpenStore(path, Options{Kind: KindUring, InlineReads: mode}, store.Options{NoViewReads: run == "noview"})
		if err != nil {
			t.Fatal(err)
		}
		e := s.Engine().(*uringengine.Engine)
		if e.InlineReads() != (mode == "auto") {
			t.Fatalf("%s: InlineReads %v", mode, e.InlineReads())
		}
		if mode == "auto" {
			w := make([]store.WriteReq, per)
			for i := range w {
				want[i] = bytes.Repeat([]byte{byte(i + 1)}, gb)
				w[i] = store.WriteReq{Key: testGeo.KeyAt(1, i), Data: want[i]}
			}
			if err := s.Write(w); err != nil {
				t.Fatal(err)
			}
		}
		before := e.Stats()
		// Destinations in reverse order: vector reads (page cache).
		mem := make([]byte, per*gb)
		reqs := make([]store.ReadReq, per)
		for i := range reqs {
			o := (per - 1 - i) * gb
			reqs[i] = store.ReadReq{Key: testGeo.KeyAt(1, i), Buf: mem[o : o+gb]}
		}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for i, r := range reqs {
			if r.Err != nil || !bytes.Equal(r.Buf, want[i]) {
				t.Fatalf("%s: group %d: %v", mode, i, r.Err)
			}
		}
		after := e.Stats()
		inline, ring := after.InlineIOs-before.InlineIOs, after.IOs-before.IOs
		if ring != 0 && run != "off" || run == "noview" && inline == 0 || run == "off" && (inline != 0 || ring == 0) {
			t.Fatalf("%s: %d inline reads, %d ring reads", run, inline, ring)
		}
		if err := closeAll(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Open(path, Options{Kind: KindUring, InlineReads: "sometimes"}); err == nil {
		t.Fatal("InlineReads \"sometimes\" accepted")
	}
}

// shmDir is a directory in /dev/shm (tmpfs) for a store file read through
// the uring engine, removed after the test; the test is skipped where
// io_uring or /dev/shm is not usable.
func shmDir(t *testing.T, prefix string) string {
	t.Helper()
	if err := uring.Available(); err != nil {
		t.Skipf("skipping: io_uring is not usable here: %v", err)
	}
	dir, err := os.MkdirTemp("/dev/shm", prefix)
	if err != nil {
		t.Skipf("skipping: no /dev/shm: %v", err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
