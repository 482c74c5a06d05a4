package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

var errNoMem = errors.New("test: out of memory")

// allocFailing is an in-memory engine that offers its own I/O buffers
// (store.BufferAllocator) and fails its k-th allocation.
type allocFailing struct {
	*storetest.Mem
	mu     sync.Mutex
	calls  int
	failAt int // 0: never
}

func (a *allocFailing) AllocBuffer(n int) ([]byte, error) {
	a.mu.Lock()
	a.calls++
	fail := a.calls == a.failAt
	a.mu.Unlock()
	if fail {
		return nil, errNoMem
	}
	return store.AllocAligned(n)
}

func (a *allocFailing) FreeBuffer(b []byte) { store.FreeAligned(b) }

// TestAllocFailureAtEveryPoint fails the store's k-th buffer allocation for
// every k of a workload of fresh blocks, in-place additions, copy-on-write
// overwrites and deletes: a request is acknowledged only when durable, a
// failed one leaves its groups as before or after it, never corrupt, no
// slot leaks (the invariants check at Close), and the store and its reopen
// agree.
func TestAllocFailureAtEveryPoint(t *testing.T) {
	work := crashWorkload()
	total := 0
	for k := 1; ; k++ {
		e := &allocFailing{Mem: storetest.NewMem(store.SizeFor(testGeo, 12), 512), failAt: k}
		if _, err := store.Format(e, testGeo, store.FormatOptions{}); err != nil {
			t.Fatal(err)
		}
		s := openStore(t, e, store.Options{MaxIO: 1024}) // small bounce buffers: several per write
		acked := model{}
		maybe := map[layout.Key][]int{}
		failed := 0
		for i, o := range work {
			var err error
			if o.puts != nil {
				err = writeChecked(t, s, o, fmt.Sprintf("k=%d op %d", k, i))
			} else {
				err = o.apply(s)
			}
			if err == nil || errors.Is(err, store.ErrNotFound) {
				acked.apply(o)
				for key := range maybe {
					if _, ok := o.touches(key); ok {
						delete(maybe, key) // settled by this op
					}
				}
				continue
			}
			if !errors.Is(err, errNoMem) {
				t.Fatalf("k=%d op %d: %v", k, i, err)
			}
			failed++
			for b := uint64(1); b <= 7; b++ {
				for idx := range testGeo.GroupsPerBlock() {
					key := testGeo.KeyAt(b, idx)
					if v, ok := o.touches(key); ok {
						maybe[key] = append(maybe[key], acked[key], v)
						delete(acked, key)
					}
				}
			}
		}
		e.mu.Lock()
		calls := e.calls
		e.failAt = 0
		e.mu.Unlock()
		check := func(s *store.Store, what string) {
			for b := uint64(1); b <= 7; b++ {
				for idx := range testGeo.GroupsPerBlock() {
					key := testGeo.KeyAt(b, idx)
					got, err := get(s, key)
					if vs, ok := maybe[key]; ok {
						good := errors.Is(err, store.ErrNotFound)
						for _, v := range vs {
							good = good || err == nil && v > 0 && bytes.Equal(got, groupData(testGeo, key, v))
						}
						if !good {
							t.Fatalf("k=%d %s: %v after a failed op: %v", k, what, key, err)
						}
						continue
					}
					v, isAcked := acked[key]
					switch {
					case !isAcked && !errors.Is(err, store.ErrNotFound):
						t.Fatalf("k=%d %s: %v present (%v) but never acknowledged", k, what, key, err)
					case isAcked && (err != nil || !bytes.Equal(got, groupData(testGeo, key, v))):
						t.Fatalf("k=%d %s: acknowledged %v (v%d): %v", k, what, key, v, err)
					}
				}
			}
		}
		check(s, "")
		put(t, s, keysOf(9, 0, 1), 1) // the store still takes writes
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		s2 := openStore(t, e, store.Options{})
		check(s2, "reopened")
		s2.Close()
		if k > calls {
			t.Logf("%d allocation points, %d failed ops in all", calls, total)
			break
		}
		total += failed // some allocations fail no op (a replaced slot's tombstone: logged)
	}
	if total == 0 {
		t.Fatal("no allocation failure reached an op")
	}
}

// writeChecked applies a put op through Write and checks that every request Write reports durable reads back,
// whatever the batch's error.
func writeChecked(t *testing.T, s *store.Store, o op, what string) error {
	t.Helper()
	var reqs []store.WriteReq
	for k, v := range o.puts {
		reqs = append(reqs, store.WriteReq{Key: k, Data: groupData(testGeo, k, v)})
	}
	err := s.Write(reqs)
	for _, r := range reqs {
		if r.Err != nil {
			if err == nil {
				err = r.Err
			}
			continue
		}
		if got, gerr := get(s, r.Key); gerr != nil || !bytes.Equal(got, r.Data) {
			t.Fatalf("%s: %v acknowledged but reads %v", what, r.Key, gerr)
		}
	}
	return err
}
