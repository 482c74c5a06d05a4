package gpu_test

import (
	"bytes"
	"errors"
	"slices"
	"testing"

	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/store"
)

var errNotHeld = errors.New("test: not held")

// cacheStore is a locStore as a gpu.Cache (the DRAM tier's part): the
// groups its host memory holds are located there, the others answer
// errNotHeld and are read through the fake store. Changed reports the
// blocks in changed; Corrupt records the blocks it is told of; Locate
// fails (store.ErrClosed) from call failFrom on (0: never).
type cacheStore struct {
	*locStore
	changed  []uint64
	dropped  []uint64
	failFrom int
}

func (c *cacheStore) Locate(reqs []store.LocateReq, pins []int64) ([]int64, error) {
	c.mu.Lock()
	fail := c.failFrom > 0 && c.locates+1 >= c.failFrom
	c.mu.Unlock()
	if fail {
		return pins, store.ErrClosed
	}
	pins, err := c.locStore.Locate(reqs, pins)
	for i := range reqs {
		if reqs[i].Err != nil {
			reqs[i].Err = errNotHeld
		}
	}
	return pins, err
}

func (c *cacheStore) Changed(pins []int64, stale []uint64) ([]uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append(stale, c.changed...), nil
}

func (c *cacheStore) Corrupt(b uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dropped = append(c.dropped, b)
}

// cacheRig is directRig loading from a cacheStore of n groups, every third
// one not held; the store holds every group.
func cacheRig(t *testing.T, n int) (*rig, *cacheStore, []gpu.Item) {
	r, s, _ := directRig(t, n, 4) // chunks of 8 groups
	r.p.SetHost(nil)
	r.p.SetCache(s.host)
	c := &cacheStore{locStore: s}
	its := r.items(n, 5)
	for i := 0; i < n; i += 3 {
		delete(s.at, key(i))
	}
	return r, c, its
}

// TestCacheLoad: a load from a Cache copies the groups it holds straight
// from its memory (counted by Cached) and reads the others through
// staging; a held group whose copy fails the device's check is reported
// to the cache (Corrupt) and read again from the store, as is every
// group of a block the store changed while it was copied (Changed); all
// land the store's bytes, and every pin is dropped after its copies.
func TestCacheLoad(t *testing.T) {
	const n = 64
	r, c, its := cacheRig(t, n)
	c.corrupt(10)
	c.changed = []uint64{key(20).Block}
	for i := range n {
		if key(i).Block == key(20).Block {
			r.st.groups[key(i)] = content(1000 + i) // the store's new version
		}
	}
	if err := r.p.Load(c, its, false); err != nil {
		t.Fatal(err)
	}
	served := 0
	for i, it := range its {
		want := content(i)
		if key(i).Block == key(20).Block {
			want = content(1000 + i)
		} else if i%3 != 0 && i != 10 {
			served++
		}
		if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), want) {
			t.Fatalf("item %d: %v, or not the store's bytes", i, it.Err)
		}
	}
	if got := r.p.Cached(); got != uint64(served) {
		t.Fatalf("Cached() = %d, want %d", got, served)
	}
	if !slices.Equal(c.dropped, []uint64{key(10).Block}) {
		t.Fatalf("blocks reported corrupt: %v", c.dropped)
	}
	if r.p.Direct() != 0 {
		t.Fatal("a load from a cache counted as from the store's file")
	}
	c.check(t, r)
}

// TestCacheLoadFails: when locating fails part way (the tier closing),
// the groups an earlier chunk left to staging fail with the error too,
// never reported loaded without a copy.
func TestCacheLoadFails(t *testing.T) {
	const n = 64
	r, c, its := cacheRig(t, n)
	r.p.DirectWorkers = 1
	c.failFrom = 2
	old := bytes.Repeat([]byte{0x5A}, gb)
	for i := range its {
		r.dev.Fill(its[i].Dst, old)
	}
	if err := r.p.Load(c, its, false); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("load: %v", err)
	}
	for i, it := range its {
		switch {
		case i < 8 && i%3 != 0: // located and copied by the first chunk
			if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
				t.Fatalf("item %d: %v", i, it.Err)
			}
		case !errors.Is(it.Err, store.ErrClosed):
			t.Fatalf("item %d: %v, want the batch's error", i, it.Err)
		}
	}
	c.check(t, r)
}
