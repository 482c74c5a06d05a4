package fs

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// groupOffset is where group k lies on the store's device.
func (e *env) groupOffset(k layout.Key) int64 {
	e.t.Helper()
	gi, err := e.st.Stat(k)
	if err != nil {
		e.t.Fatal(err)
	}
	sb := e.st.Superblock()
	return sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + e.geo.Offset(e.geo.Index(k))
}

func TestNoStaleBytesAfterRewriteOrDelete(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0x51, Layer: 0, Head: 0, Kind: layout.K}
	v1 := e.put(k)[k]
	f, err := os.Open(e.path(k))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, e.geo.GroupBytes())
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, v1) {
		t.Fatalf("first read: %v", err)
	}
	// Rewritten behind the file system's back (the ioctl path): the open
	// handle and a new open both see the new bytes at once.
	v2 := e.put(k)[k]
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, v2) {
		t.Fatalf("open handle after rewrite: %v, fresh %v", err, bytes.Equal(buf, v2))
	}
	if got, err := os.ReadFile(e.path(k)); err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("new open after rewrite: %v", err)
	}
	// Rewritten through the file system.
	v3 := groupData(e.geo, 3)
	if err := os.WriteFile(e.path(k), v3, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ReadAt(buf, 0); err != nil || !bytes.Equal(buf, v3) {
		t.Fatalf("open handle after rewrite through fs: %v", err)
	}
	// Deleted: the open handle fails with ESTALE, a new open with ENOENT.
	if err := e.st.Delete([]layout.Key{k}); err != nil {
		t.Fatal(err)
	}
	_, err = f.ReadAt(buf, 0)
	wantErrno(t, "read of a deleted group", err, syscall.ESTALE)
	_, err = os.ReadFile(e.path(k))
	wantErrno(t, "open of a deleted group", err, syscall.ENOENT)
	// Written again: visible at once (no negative entry cached).
	v4 := e.put(k)[k]
	if got, err := os.ReadFile(e.path(k)); err != nil || !bytes.Equal(got, v4) {
		t.Fatalf("read after re-creation: %v", err)
	}
}

func TestEvictedGroupsVanish(t *testing.T) {
	e := mountEnv(t, 2, Options{})
	k1 := layout.Key{Block: 1, Layer: 2, Head: 1, Kind: layout.V}
	e.put(k1)
	f, err := os.Open(e.path(k1))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.ReadAt(make([]byte, 16), 0); err != nil {
		t.Fatal(err)
	}
	// Two more blocks in a store of two slots evict block 1.
	e.put(layout.Key{Block: 2, Layer: 2}, layout.Key{Block: 3, Layer: 2})
	if _, ok := e.st.Block(1); ok {
		t.Fatal("block 1 not evicted")
	}
	_, err = f.ReadAt(make([]byte, 16), 0)
	wantErrno(t, "read of an evicted group", err, syscall.ESTALE)
	_, err = os.Stat(e.path(k1))
	wantErrno(t, "stat of an evicted group", err, syscall.ENOENT)
	_, err = os.Stat(e.blockPath(2, 1))
	wantErrno(t, "stat of an evicted block", err, syscall.ENOENT)
	got := names(t, filepath.Join(e.dir, "layer-2"))
	if len(got) != 2 || got[0] != layout.BlockName(2) || got[1] != layout.BlockName(3) {
		t.Fatalf("layer-2 lists %v", got)
	}
}

func TestCorruptGroupReadsEIO(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	k := layout.Key{Block: 0xbad, Layer: 1, Head: 1, Kind: layout.V}
	good := layout.Key{Block: 0xbad, Layer: 1, Head: 1, Kind: layout.K}
	data := e.put(k, good)
	off := e.groupOffset(k) + 1000
	e.mem.Poke(off, []byte{data[k][1000] ^ 0x40})
	_, err := os.ReadFile(e.path(k))
	wantErrno(t, "read of a corrupt group", err, syscall.EIO)
	if got, err := os.ReadFile(e.path(good)); err != nil || !bytes.Equal(got, data[good]) {
		t.Fatalf("neighbour of a corrupt group: %v", err)
	}
	if m := e.srv.FS.Metrics(); m.Corrupt == 0 || m.Errors != 0 {
		t.Fatalf("metrics: %+v", m)
	}
	// Rewriting the group heals it.
	fresh := groupData(e.geo, 99)
	if err := os.WriteFile(e.path(k), fresh, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(e.path(k)); err != nil || !bytes.Equal(got, fresh) {
		t.Fatalf("after rewrite: %v", err)
	}
}

// TestConcurrentReadersSeeWholeVersions races readers of the mount against
// writers through the mount and through the store: every read returns one
// complete version of the group, never a mix, never stale beyond the
// versions written before it started.
func TestConcurrentReadersSeeWholeVersions(t *testing.T) {
	e := mountEnv(t, 8, Options{})
	keys := []layout.Key{{Block: 1, Layer: 0, Head: 0, Kind: layout.K}, {Block: 1, Layer: 0, Head: 1, Kind: layout.V}, {Block: 2, Layer: 3, Head: 0, Kind: layout.K}}
	var mu sync.Mutex
	versions := map[layout.Key]map[string]bool{}
	remember := func(k layout.Key, d []byte) {
		mu.Lock()
		defer mu.Unlock()
		if versions[k] == nil {
			versions[k] = map[string]bool{}
		}
		versions[k][string(d)] = true
	}
	for k, d := range e.put(keys...) {
		remember(k, d)
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	var seed atomic.Uint64
	var reads atomic.Int64
	for w := range 2 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				// Keep pace with the readers rather than starve them.
				for int64(seed.Load()) > reads.Load()+4 && !stop.Load() {
					time.Sleep(50 * time.Microsecond)
				}
				k := keys[i%len(keys)]
				d := groupData(e.geo, 1000+seed.Add(1))
				remember(k, d)
				if w == 0 {
					reqs := []store.WriteReq{{Key: k, Data: d}}
					if err := e.st.Write(reqs); err != nil || reqs[0].Err != nil {
						t.Errorf("store write: %v %v", err, reqs[0].Err)
						return
					}
				} else if err := os.WriteFile(e.path(k), d, 0o644); err != nil {
					t.Errorf("write through fs: %v", err)
					return
				}
			}
		})
	}
	var rg sync.WaitGroup
	for range 3 {
		rg.Go(func() {
			for i := 0; reads.Load() < 300 && !t.Failed(); i++ {
				k := keys[i%len(keys)]
				got, err := os.ReadFile(e.path(k))
				if err != nil {
					t.Errorf("read %v: %v", k, err)
					return
				}
				mu.Lock()
				ok := versions[k][string(got)]
				mu.Unlock()
				if !ok {
					t.Errorf("read %v: bytes of no version written", k)
					return
				}
				reads.Add(1)
			}
		})
	}
	rg.Wait()
	stop.Store(true)
	wg.Wait()
}

func TestReadAheadServesNeighboursFresh(t *testing.T) {
	e := mountEnv(t, 4, Options{})
	var keys []layout.Key
	for h := range 2 {
		for _, kind := range []layout.Kind{layout.K, layout.V} {
			keys = append(keys, layout.Key{Block: 1, Layer: 2, Head: h, Kind: kind})
		}
	}
	data := e.put(keys...)
	e.put(layout.Key{Block: 1, Layer: 3}) // another layer: not read ahead
	read := func(k layout.Key) []byte {
		t.Helper()
		b, err := os.ReadFile(e.path(k))
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		return b
	}
	for _, k := range keys {
		if !bytes.Equal(read(k), data[k]) {
			t.Fatalf("%v: wrong bytes", k)
		}
	}
	if m := e.srv.FS.Metrics(); m.CacheMisses != 1 || m.CacheHits != 3 {
		t.Fatalf("one layer read: %d misses, %d hits", m.CacheMisses, m.CacheHits)
	}
	if sm := e.st.Metrics(); sm.Reads != 4 || sm.Bounced != 0 {
		t.Fatalf("store read %d groups (want the layer's 4), %d bytes through a bounce buffer (want none: the layer lands in place)", sm.Reads, sm.Bounced)
	}
	// Rewritten behind the cache's back: read again, not served stale.
	v2 := e.put(keys[3])[keys[3]]
	if !bytes.Equal(read(keys[3]), v2) {
		t.Fatal("stale bytes from the read-ahead cache")
	}
	// Deleted: gone, although cached.
	if err := e.st.Delete([]layout.Key{keys[1]}); err != nil {
		t.Fatal(err)
	}
	_, err := os.ReadFile(e.path(keys[1]))
	wantErrno(t, "read of a deleted, cached group", err, syscall.ENOENT)
	// Re-reading an unchanged group is served from memory.
	before := e.st.Metrics().Reads
	for range 5 {
		if !bytes.Equal(read(keys[0]), data[keys[0]]) {
			t.Fatal("wrong bytes")
		}
	}
	if after := e.st.Metrics().Reads; after != before {
		t.Fatalf("re-reads went to the store: %d → %d", before, after)
	}
}

func TestReadAheadOff(t *testing.T) {
	e := mountEnv(t, 4, Options{CacheBytes: -1})
	k := layout.Key{Block: 1, Layer: 2}
	data := e.put(k, other(k))
	for range 3 {
		b, err := os.ReadFile(e.path(k))
		if err != nil || !bytes.Equal(b, data[k]) {
			t.Fatal(err)
		}
	}
	if sm := e.st.Metrics(); sm.Reads != 3 {
		t.Fatalf("store read %d groups, want 3 (no read-ahead, no cache)", sm.Reads)
	}
}
