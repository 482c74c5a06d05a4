package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// TestGroupCommitSharesSyncs: eight concurrent writers; the first commit is
// held until the other seven have queued, and those seven are then
// committed together: 2 commits and 4 syncs (payloads, headers; twice)
// instead of 8 commits and 16 syncs. Every group reads back.
func TestGroupCommitSharesSyncs(t *testing.T) {
	s, m := newMemStore(t, 16, testGeo)
	const writers = 8
	var commits []int
	store.OnCommit(s, func(calls int) {
		commits = append(commits, calls)
		if len(commits) != 1 {
			return
		}
		deadline := time.Now().Add(10 * time.Second)
		for store.PendingWrites(s) < writers-1 {
			if time.Now().After(deadline) {
				t.Errorf("only %d writers queued", store.PendingWrites(s))
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	syncs0, commits0 := m.Syncs(), s.Metrics().Commits
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
			for i := range reqs {
				k := testGeo.KeyAt(uint64(10+w), i)
				reqs[i] = store.WriteReq{Key: k, Data: groupData(testGeo, k, 1)}
			}
			errs[w] = s.Write(reqs)
			for _, r := range reqs {
				if errs[w] == nil {
					errs[w] = r.Err
				}
			}
		}()
	}
	wg.Wait()
	for w, err := range errs {
		if err != nil {
			t.Fatalf("writer %d: %v", w, err)
		}
	}
	if len(commits) != 2 || commits[0] != 1 || commits[1] != writers-1 {
		t.Fatalf("commits served %v calls, want [1 %d]", commits, writers-1)
	}
	if got := s.Metrics().Commits - commits0; got != 2 {
		t.Fatalf("Metrics.Commits rose by %d, want 2", got)
	}
	if got := m.Syncs() - syncs0; got != 4 {
		t.Fatalf("%d syncs for %d writes, want 4", got, writers)
	}
	for w := range writers {
		for i := range testGeo.GroupsPerBlock() {
			k := testGeo.KeyAt(uint64(10+w), i)
			got, err := get(s, k)
			if err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
				t.Fatalf("%v: %v", k, err)
			}
		}
	}
}

// concurrentWork is writer w's sequence of puts: its own block 1+w (fresh,
// in place, copy-on-write), and its own group w of the shared block 20
// (every writer adds to the same block).
func concurrentWork(w int) []op {
	own := uint64(1 + w)
	shared := []layout.Key{testGeo.KeyAt(20, w)}
	return []op{
		putOp(1, keysOf(own, 0, 1, 2, 3)),
		putOp(1, shared),
		putOp(2, keysOf(own, 2, 3, 4, 5)),
		putOp(3, keysOf(own, all(own)...), shared),
	}
}

// TestCrashConcurrentWriters crashes the engine at its k-th write while
// eight writers commit concurrently (group commit), for every k, and checks
// every device image: each group reads as its last acknowledged value or
// the value its writer's interrupted put was writing; absent only when
// never acknowledged; never as bytes whose checksum fails.
func TestCrashConcurrentWriters(t *testing.T) {
	const writers, slots = 8, 24
	run := func(s *store.Store) (acked model, inflight []*op) {
		var mu sync.Mutex
		acked = model{}
		inflight = make([]*op, writers)
		var wg sync.WaitGroup
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for _, o := range concurrentWork(w) {
					if err := o.apply(s); err != nil {
						inflight[w] = &o
						return
					}
					mu.Lock()
					acked.apply(o)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		return acked, inflight
	}
	s, m := newMemStore(t, slots, testGeo)
	before := m.Writes()
	if acked, inflight := run(s); len(acked) == 0 || inflight[0] != nil {
		t.Fatal("the workload failed without a crash")
	}
	total := m.Writes() - before
	images := 0
	for k := 1; k <= total+1; k++ {
		s, m := newMemStore(t, slots, testGeo)
		store.CheckMemoryOnly(s)
		m.CrashAt(k)
		acked, inflight := run(s)
		for w := range writers {
			if inflight[w] != nil && !m.Crashed() {
				t.Fatalf("k=%d: writer %d failed without a crash", k, w)
			}
		}
		for seed := range uint64(3) {
			images++
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512)
			rs := openStore(t, storetest.NewMemFrom(img, 512), store.Options{})
			if err := checkConcurrent(rs, acked, inflight); err != nil {
				t.Fatalf("k=%d seed=%d: %v", k, seed, err)
			}
			rs.Close()
		}
	}
	t.Logf("%d crash points, %d device images checked", total+1, images)
}

func checkConcurrent(s *store.Store, acked model, inflight []*op) error {
	check := func(k layout.Key, owner int) error {
		got, err := get(s, k)
		want, isAcked := acked[k]
		inV, inTouch := 0, false
		if o := inflight[owner]; o != nil {
			inV, inTouch = o.touches(k)
		}
		switch {
		case errors.Is(err, store.ErrNotFound):
			if isAcked {
				return fmt.Errorf("%v acknowledged (v%d) but absent", k, want)
			}
		case err != nil:
			return fmt.Errorf("%v: %w", k, err)
		default:
			okAcked := isAcked && bytes.Equal(got, groupData(testGeo, k, want))
			okNew := inTouch && bytes.Equal(got, groupData(testGeo, k, inV))
			if !okAcked && !okNew {
				return fmt.Errorf("%v reads neither its acknowledged value (v%d, %v) nor the one being written", k, want, isAcked)
			}
		}
		return nil
	}
	for w := range len(inflight) {
		for idx := range testGeo.GroupsPerBlock() {
			if err := check(testGeo.KeyAt(uint64(1+w), idx), w); err != nil {
				return err
			}
		}
		if err := check(testGeo.KeyAt(20, w), w); err != nil {
			return err
		}
	}
	return nil
}

// writeLanding wraps a Mem engine and counts the payload bytes written from
// inside src (the caller's data) and from elsewhere (bounce memory).
type writeLanding struct {
	*storetest.Mem
	src            []byte
	inside, beside int
}

func (w *writeLanding) Do(ios []store.IO) error {
	for i := range ios {
		if ios[i].Op != store.OpWrite || ios[i].Stream == store.StreamMeta || len(w.src) == 0 {
			continue
		}
		b := ios[i].Buf
		lo := uintptr(unsafe.Pointer(&w.src[0]))
		p := uintptr(unsafe.Pointer(&b[0]))
		if p >= lo && p+uintptr(len(b)) <= lo+uintptr(len(w.src)) {
			w.inside += len(b)
		} else {
			w.beside += len(b)
		}
	}
	return w.Mem.Do(ios)
}

// TestWriteDirectFromData: a block whose groups are adjacent slices of one
// aligned buffer is written straight from it (no bounce copy); groups
// scattered in memory are copied once into bounce memory. Both read back.
func TestWriteDirectFromData(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 4, 512)
	wl := &writeLanding{Mem: m}
	s := openStore(t, wl, store.Options{})
	n, gb := testGeo.GroupsPerBlock(), testGeo.GroupBytes()
	buf, err := store.AllocAligned(n * gb)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(buf)
	reqs := make([]store.WriteReq, n)
	for i := range reqs {
		k := testGeo.KeyAt(1, i)
		copy(buf[i*gb:], groupData(testGeo, k, 1))
		reqs[i] = store.WriteReq{Key: k, Data: buf[i*gb : (i+1)*gb]}
	}
	wl.src = buf
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if wl.inside != n*gb || wl.beside != 0 {
		t.Fatalf("contiguous block: %d payload bytes written from the data, %d from elsewhere", wl.inside, wl.beside)
	}
	// The same block's groups in reverse memory order: bounced.
	wl.inside, wl.beside = 0, 0
	for i := range reqs {
		k := testGeo.KeyAt(2, i)
		o := (n - 1 - i) * gb
		copy(buf[o:], groupData(testGeo, k, 1))
		reqs[i] = store.WriteReq{Key: k, Data: buf[o : o+gb]}
	}
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	if wl.inside != 0 || wl.beside != n*gb {
		t.Fatalf("scattered block: %d payload bytes written from the data, %d from elsewhere", wl.inside, wl.beside)
	}
	for blk := uint64(1); blk <= 2; blk++ {
		for i := range n {
			k := testGeo.KeyAt(blk, i)
			got, err := get(s, k)
			if err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
				t.Fatalf("%v: %v", k, err)
			}
		}
	}
}
