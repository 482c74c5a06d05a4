package store_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/engine/posix"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/uring"
)

func TestEvictionLRU(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	for b := uint64(1); b <= 4; b++ {
		put(t, s, keysOf(b, 0, 1), 1)
	}
	// Use block 1 so block 2 is the least recently used.
	if _, err := get(s, keysOf(1, 0)[0]); err != nil {
		t.Fatal(err)
	}
	put(t, s, keysOf(5, 0), 1)
	put(t, s, keysOf(6, 0), 1)
	if n := s.Metrics().Evictions; n != 2 {
		t.Fatalf("%d evictions, want 2", n)
	}
	for _, c := range []struct {
		b    uint64
		here bool
	}{{1, true}, {2, false}, {3, false}, {4, true}, {5, true}, {6, true}} {
		got, err := get(s, keysOf(c.b, 0)[0])
		if !c.here {
			if !errors.Is(err, store.ErrNotFound) {
				t.Errorf("block %d should be evicted: %v", c.b, err)
			}
			continue
		}
		if err != nil || !bytes.Equal(got, groupData(testGeo, keysOf(c.b, 0)[0], 1)) {
			t.Errorf("block %d: %v", c.b, err)
		}
	}
	// A batch larger than the store fails cleanly for what does not fit.
	var reqs []store.WriteReq
	for b := uint64(10); b < 16; b++ {
		k := keysOf(b, 0)[0]
		reqs = append(reqs, store.WriteReq{Key: k, Data: groupData(testGeo, k, 1)})
	}
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	full := 0
	for _, r := range reqs {
		if errors.Is(r.Err, store.ErrFull) {
			full++
		} else if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if full != 2 {
		t.Fatalf("%d requests got ErrFull, want 2", full)
	}
}

func TestBadRequests(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	k := keysOf(1, 0)[0]
	reqs := []store.WriteReq{
		{Key: k, Data: make([]byte, 10)},
		{Key: layout.Key{Block: 1, Layer: 9}, Data: make([]byte, testGeo.GroupBytes())},
	}
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[0].Err, store.ErrSize) || !errors.Is(reqs[1].Err, store.ErrInvalid) {
		t.Fatalf("errors %v, %v", reqs[0].Err, reqs[1].Err)
	}
	if len(s.Blocks()) != 0 {
		t.Fatal("a bad write stored something")
	}
	rr := []store.ReadReq{{Key: k, Buf: make([]byte, 3)}}
	if err := s.Read(rr); err != nil || !errors.Is(rr[0].Err, store.ErrSize) {
		t.Fatalf("short read buffer: %v %v", err, rr[0].Err)
	}
	if err := s.DeleteBlock(42); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("delete of an unknown block: %v", err)
	}
}

func TestCorruptPayloadNeverServed(t *testing.T) {
	s, m := newMemStore(t, 4, testGeo)
	keys := keysOf(7, 0, 1, 2, 3)
	put(t, s, keys, 1)
	off := groupOnDevice(t, s, keys[1])
	m.Poke(off+17, []byte{0xff ^ m.Image()[off+17]})
	reqs := make([]store.ReadReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.ReadReq{Key: k, Buf: make([]byte, testGeo.GroupBytes())}
	}
	if err := s.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for i, r := range reqs {
		if i == 1 {
			if !errors.Is(r.Err, store.ErrCorrupt) || !bytes.Equal(r.Buf, make([]byte, len(r.Buf))) {
				t.Fatalf("corrupt group: %v (buffer zeroed: %v)", r.Err, bytes.Equal(r.Buf, make([]byte, len(r.Buf))))
			}
			continue
		}
		if r.Err != nil || !bytes.Equal(r.Buf, groupData(testGeo, r.Key, 1)) {
			t.Fatalf("group %d next to the corrupt one: %v", i, r.Err)
		}
	}
	rep, err := s.Fsck(false)
	if err != nil || len(rep.Problems) != 1 || rep.Problems[0].Key == nil || *rep.Problems[0].Key != keys[1] {
		t.Fatalf("fsck: %+v %v", rep, err)
	}
	if _, err := s.Fsck(true); err != nil {
		t.Fatal(err)
	}
	if rep, _ := s.Fsck(false); !rep.Clean() {
		t.Fatalf("after repair: %v", rep.Problems)
	}
	if _, err := get(s, keys[1]); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("repaired group: %v", err)
	}
	if got, err := get(s, keys[2]); err != nil || !bytes.Equal(got, groupData(testGeo, keys[2], 1)) {
		t.Fatalf("neighbour after repair: %v", err)
	}
}

func TestDamagedSuperblockAndHeader(t *testing.T) {
	s, m := newMemStore(t, 4, testGeo)
	keys := keysOf(3, 0, 5)
	put(t, s, keys, 1)
	put(t, s, keysOf(3, 6), 1) // second header generation: both copies valid
	s.Close()
	m.Poke(100, []byte("garbage"))
	s2 := openStore(t, m, store.Options{})
	rep, _ := s2.Fsck(false)
	if len(rep.Problems) != 1 || rep.Problems[0].Slot != -1 {
		t.Fatalf("fsck should report the superblock: %v", rep.Problems)
	}
	if rep, _ = s2.Fsck(true); !rep.Problems[0].Fixed {
		t.Fatal("not repaired")
	}
	// Damage the current header copy: the older copy takes over (the
	// group written last reads as absent, the older ones stay).
	gi, _ := s2.Stat(keys[0])
	sb := s2.Superblock()
	s2.Close()
	img := m.Image()
	h0 := sb.DataOffset + gi.Slot*sb.SlotBytes
	var cur int64 = h0
	if g1 := binary.LittleEndian.Uint64(img[h0+sb.HeaderBytes+48:]); g1 > binary.LittleEndian.Uint64(img[h0+48:]) {
		cur = h0 + sb.HeaderBytes
	}
	m.Poke(cur+70, []byte{img[cur+70] ^ 1})
	s3 := openStore(t, m, store.Options{})
	if rep, _ := s3.Fsck(false); rep.Clean() {
		t.Fatal("fsck missed a damaged header")
	}
	for _, k := range keys {
		if got, err := get(s3, k); err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
			t.Fatalf("%v after header damage: %v", k, err)
		}
	}
	if _, err := get(s3, keysOf(3, 6)[0]); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("group of the damaged generation: %v", err)
	}
	if _, err := s3.Fsck(true); err != nil {
		t.Fatal(err)
	}
	if rep, _ := s3.Fsck(false); !rep.Clean() {
		t.Fatalf("after repair: %v", rep.Problems)
	}
	// Both superblock copies gone: a clear error.
	s3.Close()
	m.Poke(100, []byte("garbage"))
	m.Poke(64<<10+100, []byte("garbage"))
	if _, err := store.Open(m, store.Options{}); !errors.Is(err, store.ErrSuperblock) {
		t.Fatalf("both copies damaged: %v", err)
	}
}

func TestOpenRefusals(t *testing.T) {
	m := storetest.NewMem(1<<20, 512)
	if _, err := store.Open(m, store.Options{}); !errors.Is(err, store.ErrNoStore) {
		t.Fatalf("unformatted: %v", err)
	}
	if _, err := store.Format(storetest.NewMem(store.MinSize(testGeo)-512, 512), testGeo, store.FormatOptions{}); !errors.Is(err, store.ErrTooSmall) {
		t.Fatalf("too small: %v", err)
	}
	if _, err := store.Format(m, testGeo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Format(m, testGeo, store.FormatOptions{}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("reformat without force: %v", err)
	}
	other := testGeo
	other.Layers = 3
	if _, err := store.Open(m, store.Options{Expect: &other}); !errors.Is(err, store.ErrGeometry) {
		t.Fatalf("other geometry: %v", err)
	}
	// Another format version, in both copies, with valid checksums.
	for _, off := range []int64{0, 64 << 10} {
		b := m.Image()[off : off+store.SuperblockSize]
		binary.LittleEndian.PutUint32(b[8:], 99)
		binary.LittleEndian.PutUint32(b[store.SuperblockSize-4:], store.CRC32C(b[:store.SuperblockSize-4]))
		m.Poke(off, b)
	}
	if _, err := store.Open(m, store.Options{}); !errors.Is(err, store.ErrVersion) {
		t.Fatalf("version 99: %v", err)
	}
}

// TestFaults injects EIO, short and torn transfers: each failing request is
// reported, nothing acknowledged is lost, nothing corrupt is served.
func TestFaults(t *testing.T) {
	faultsOn(t, func() store.Engine { return storetest.NewMem(store.SizeFor(testGeo, 6), 512) })
}

// TestFaultsUring runs the same faults over the uring engine on a real file.
func TestFaultsUring(t *testing.T) {
	if err := uring.Available(); err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	path := t.TempDir() + "/faults.kvfs"
	var open []store.Engine
	t.Cleanup(func() {
		for _, e := range open {
			e.Close()
		}
	})
	faultsOn(t, func() store.Engine {
		if err := store.PrepareFile(path, store.SizeFor(testGeo, 6)); err != nil {
			t.Fatal(err)
		}
		e, err := uringengine.OpenEngine(path, uringengine.EngineOptions{Direct: true, BufferPool: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		open = append(open, e)
		return e
	})
}

func faultsOn(t *testing.T, newEngine func() store.Engine) {
	for _, f := range []storetest.Fault{storetest.EIO, storetest.ShortWrite, storetest.TornWrite} {
		for nth := 0; nth < 8; nth++ {
			m := newEngine()
			if _, err := store.Format(m, testGeo, store.FormatOptions{Force: true}); err != nil {
				t.Fatal(err)
			}
			fe := storetest.NewFaulty(m, nil, nil)
			s := openStore(t, fe, store.Options{})
			put(t, s, keysOf(1, 0, 1, 2, 3), 1)
			writes := 0
			fe.SetInjector(func(n int, r store.IO) storetest.Fault {
				if r.Op != store.OpWrite {
					return storetest.None
				}
				writes++
				if writes-1 == nth {
					return f
				}
				return storetest.None
			})
			acked := model{}
			for _, k := range keysOf(1, 0, 1, 2, 3) {
				acked[k] = 1
			}
			// A failed operation may or may not have taken effect: its
			// groups may read as before or after it, never corrupt.
			maybe := map[layout.Key][]int{}
			for _, o := range []op{putOp(2, keysOf(1, 1)), putOp(1, keysOf(1, 5)), putOp(1, keysOf(2, 0, 1)), {del: keysOf(1, 3)}} {
				if err := o.apply(s); err == nil {
					acked.apply(o)
					continue
				}
				for _, k := range append(keysOf(1, all(1)...), keysOf(2, all(2)...)...) {
					if v, ok := o.touches(k); ok {
						maybe[k] = append(maybe[k], acked[k], v)
						delete(acked, k)
					}
				}
			}
			checkMaybe := func(s *store.Store) {
				for k, vs := range maybe {
					got, err := get(s, k)
					if errors.Is(err, store.ErrNotFound) {
						continue
					}
					ok := false
					for _, v := range vs {
						ok = ok || err == nil && v > 0 && bytes.Equal(got, groupData(testGeo, k, v))
					}
					if !ok {
						t.Fatalf("fault %d at write %d: %v after a failed op: %v", f, nth, k, err)
					}
				}
			}
			fe.SetInjector(nil)
			checkMaybe(s)
			for k, v := range acked {
				got, err := get(s, k)
				if err != nil || !bytes.Equal(got, groupData(testGeo, k, v)) {
					t.Fatalf("fault %d at write %d: acknowledged %v: %v", f, nth, k, err)
				}
			}
			// And after a reopen.
			s.Close()
			s2 := openStore(t, m, store.Options{})
			checkMaybe(s2)
			for k, v := range acked {
				got, err := get(s2, k)
				if err != nil || !bytes.Equal(got, groupData(testGeo, k, v)) {
					t.Fatalf("fault %d at write %d, reopened: %v: %v", f, nth, k, err)
				}
			}
			s2.Close() // before the next round formats the device again
		}
	}
	// A read error is reported per group; the rest of the batch is served.
	m := newEngine()
	store.Format(m, testGeo, store.FormatOptions{Force: true})
	fe := storetest.NewFaulty(m, nil, nil)
	s := openStore(t, fe, store.Options{})
	put(t, s, keysOf(1, 0), 1)
	put(t, s, keysOf(2, 0), 1)
	for _, f := range []storetest.Fault{storetest.EIO, storetest.ShortRead} {
		// Fail the first read of the batch only.
		first := true
		fe.SetInjector(func(n int, r store.IO) storetest.Fault {
			if r.Op == store.OpRead && first {
				first = false
				return f
			}
			return storetest.None
		})
		reqs := []store.ReadReq{{Key: keysOf(1, 0)[0], Buf: make([]byte, testGeo.GroupBytes())}, {Key: keysOf(2, 0)[0], Buf: make([]byte, testGeo.GroupBytes())}}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		failed := 0
		for _, r := range reqs {
			switch {
			case errors.Is(r.Err, unix.EIO):
				failed++
			case r.Err != nil:
				t.Fatalf("fault %d: unexpected %v", f, r.Err)
			case !bytes.Equal(r.Buf, groupData(testGeo, r.Key, 1)):
				t.Fatalf("fault %d: %v served wrong bytes", f, r.Key)
			}
		}
		if failed != 1 {
			t.Fatalf("fault %d: %d requests failed, want exactly the faulted one", f, failed)
		}
	}
	fe.SetInjector(nil)
	// A failing sync fails the write, which is then not acknowledged.
	failSync := true
	fe2 := storetest.NewFaulty(m, nil, func() bool { return failSync })
	s.Close()
	s3 := openStore(t, storetest.NewFaulty(m, nil, nil), store.Options{})
	s3.Close()
	s4 := openStore(t, fe2, store.Options{})
	w := []store.WriteReq{{Key: keysOf(3, 0)[0], Data: groupData(testGeo, keysOf(3, 0)[0], 1)}}
	s4.Write(w)
	if w[0].Err == nil {
		t.Fatal("write acknowledged though sync failed")
	}
}

// TestConcurrent runs readers and writers on overlapping blocks (run with
// -race): every read returns a version that was written, or absent.
func TestConcurrent(t *testing.T) {
	s, _ := newMemStore(t, 6, testGeo)
	var wg sync.WaitGroup
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				b := uint64(1 + (i+w)%8)
				keys := keysOf(b, (i*3+w)%8, (i*5+w)%8)
				reqs := make([]store.WriteReq, len(keys))
				for j, k := range keys {
					reqs[j] = store.WriteReq{Key: k, Data: groupData(testGeo, k, 1+i%3)}
				}
				if err := s.Write(reqs); err != nil {
					t.Error(err)
					return
				}
				if i%17 == 0 {
					s.Delete(keys[:1])
				}
			}
		}()
	}
	for r := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				b := uint64(1 + (i+r)%8)
				reqs := make([]store.ReadReq, 8)
				buf := make([]byte, 8*testGeo.GroupBytes())
				for j := range reqs {
					reqs[j] = store.ReadReq{Key: testGeo.KeyAt(b, j), Buf: buf[j*testGeo.GroupBytes() : (j+1)*testGeo.GroupBytes()]}
				}
				if err := s.Read(reqs); err != nil {
					t.Error(err)
					return
				}
				for _, q := range reqs {
					if errors.Is(q.Err, store.ErrNotFound) {
						continue
					}
					if q.Err != nil {
						t.Errorf("%v: %v", q.Key, q.Err)
						return
					}
					ok := false
					for v := 1; v <= 3; v++ {
						ok = ok || bytes.Equal(q.Buf, groupData(testGeo, q.Key, v))
					}
					if !ok {
						t.Errorf("%v: bytes of no version", q.Key)
						return
					}
				}
			}
		}()
	}
	// The invariants hold between write operations while readers run.
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 20 {
			if err := s.CheckInvariants(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	wg.Wait()
	if rep, err := s.Fsck(false); err != nil || !rep.Clean() {
		t.Fatalf("fsck after concurrent use: %v %v", err, rep)
	}
}

// TestPosixEngine runs the round trip on a real file with the posix engine.
func TestPosixEngine(t *testing.T) {
	dir, err := dirForDirect(t)
	if err != nil {
		t.Skip(err)
	}
	path := dir + "/s.kvfs"
	geo := layout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	if err := store.PrepareFile(path, store.SizeFor(geo, 8)); err != nil {
		t.Fatal(err)
	}
	e, err := posix.Open(path, posix.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := store.Format(e, geo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, e, store.Options{})
	defer s.Close() // before the engine's
	keys := make([]layout.Key, geo.GroupsPerBlock())
	for i := range keys {
		keys[i] = geo.KeyAt(0x77, i)
	}
	put(t, s, keys, 1)
	// A whole block into one contiguous, aligned buffer: direct landing.
	buf, _ := store.AllocAligned(len(keys) * geo.GroupBytes())
	defer store.FreeAligned(buf)
	reqs := make([]store.ReadReq, len(keys))
	for i, k := range keys {
		reqs[i] = store.ReadReq{Key: k, Buf: buf[i*geo.GroupBytes() : (i+1)*geo.GroupBytes()]}
	}
	if err := s.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for _, r := range reqs {
		if r.Err != nil || !bytes.Equal(r.Buf, groupData(geo, r.Key, 1)) {
			t.Fatalf("%v: %v", r.Key, r.Err)
		}
	}
	if _, err := store.Lock(path); err != nil {
		t.Fatal(err)
	}
}

func dirForDirect(t *testing.T) (string, error) {
	return t.TempDir(), nil
}

// FsckProgress reports growing amounts that end at the total: both header
// copies of every slot plus every present group.
func TestFsckProgress(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	put(t, s, blockKeys(testGeo, 5), 1)
	put(t, s, keysOf(9, 0, 1), 1)
	sb := s.Superblock()
	want := sb.Slots*2*sb.HeaderBytes + int64((testGeo.GroupsPerBlock()+2)*testGeo.GroupBytes())
	var calls int
	var last int64
	rep, err := s.FsckProgress(false, func(done, total int64) {
		calls++
		if total != want || done <= last || done > total {
			t.Errorf("progress(%d, %d) after %d, want a growing amount of %d", done, total, last, want)
		}
		last = done
	})
	if err != nil || !rep.Clean() {
		t.Fatalf("fsck: %+v %v", rep, err)
	}
	if calls == 0 || last != want {
		t.Fatalf("%d progress calls ending at %d, want the last at %d", calls, last, want)
	}
}

// Open reports its scan of the slot headers, ending at all of them.
func TestOpenProgress(t *testing.T) {
	size := store.SizeFor(testGeo, 600) // more than one scan chunk
	m := storetest.NewMem(size, 512)
	sb, err := store.Format(m, testGeo, store.FormatOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := sb.Slots * 2 * sb.HeaderBytes
	var calls int
	var last int64
	openStore(t, m, store.Options{OpenProgress: func(done, total int64) {
		calls++
		if total != want || done <= last || done > total {
			t.Errorf("progress(%d, %d) after %d, want a growing amount of %d", done, total, last, want)
		}
		last = done
	}})
	if calls < 2 || last != want {
		t.Fatalf("%d progress calls ending at %d, want several ending at %d", calls, last, want)
	}
}
