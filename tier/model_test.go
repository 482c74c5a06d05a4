package tier

import (
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// model is the history of every block: the contents it had, in order (-1:
// absent), how many of them were started (a change under way) and how
// many committed (the change returned).
type model struct {
	mu        sync.Mutex
	hist      [][]int64
	committed []int // index in hist of the last change that returned
	locks     []sync.Mutex
	// evicts: the store is small enough to evict blocks, so any block
	// may be absent at any time (its content, when present, is still
	// checked).
	evicts bool
}

func newModel(blocks int) *model {
	m := &model{hist: make([][]int64, blocks), committed: make([]int, blocks), locks: make([]sync.Mutex, blocks)}
	for b := range m.hist {
		m.hist[b] = []int64{-1}
	}
	return m
}

// current is block b's content; the caller holds b's lock.
func (m *model) current(b int) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hist[b][len(m.hist[b])-1]
}

// change records that block b is about to become c, runs do and records
// that it returned. The caller holds b's lock.
func (m *model) start(b int, c int64) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.hist[b] = append(m.hist[b], c)
	return len(m.hist[b]) - 1
}

func (m *model) commit(b, at int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.committed[b] = at
}

// allowed reports whether a read of b that began when lo changes had
// returned and ended when hist had hi entries may have seen c.
func (m *model) window(b int) (lo int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.committed[b]
}

func (m *model) allowed(b, lo int, c int64) bool {
	if c < 0 && m.evicts {
		return true
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, h := range m.hist[b][lo:] {
		if h == c {
			return true
		}
	}
	return false
}

// TestConcurrentModel runs reads through the tier against writes, deletes
// and renames through the tier and straight to the store, in a tier far
// smaller than the blocks (evictions and promotions all along), and checks
// every byte every read lands against the model: always some version the
// block had while the read ran, never one older than the last change that
// had returned before it began. With a store smaller than the blocks, the
// store's own evictions join in.
func TestConcurrentModel(t *testing.T) {
	for _, c := range []struct {
		name        string
		storeBlocks int64
	}{{"store-holds-all", 64}, {"store-evicts", 5}} {
		t.Run(c.name, func(t *testing.T) { runModel(t, c.storeBlocks) })
	}
}

func runModel(t *testing.T, storeBlocks int64) {
	const blocks, writers, readers = 8, 2, 3
	writeOps, readOps := 300, 600
	if testing.Short() {
		writeOps, readOps = 60, 120
	}
	tr, st, _ := newTier(t, storeBlocks, 3)
	m := newModel(blocks)
	m.evicts = storeBlocks < blocks
	var next atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, writers+readers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range writeOps {
				var via interface {
					Write([]store.WriteReq) error
					DeleteBlock(uint64) error
					RenameBlock(from, to uint64) error
				} = tr
				if rng.IntN(2) == 0 {
					via = st // as the GPU path does
				}
				b := rng.IntN(blocks)
				switch op := rng.IntN(10); {
				case op < 6:
					m.locks[b].Lock()
					id := next.Add(1)
					at := m.start(b, id)
					writeBlock(t, via, uint64(b), uint64(id), nil)
					m.commit(b, at)
					m.locks[b].Unlock()
				case op < 8:
					m.locks[b].Lock()
					if m.current(b) >= 0 {
						at := m.start(b, -1)
						if err := via.DeleteBlock(uint64(b)); err != nil && !(m.evicts && errors.Is(err, store.ErrNotFound)) {
							errc <- err
						}
						m.commit(b, at)
					}
					m.locks[b].Unlock()
				default:
					to := rng.IntN(blocks)
					if to == b {
						continue
					}
					lo, hi := min(b, to), max(b, to)
					m.locks[lo].Lock()
					m.locks[hi].Lock()
					if c := m.current(b); c >= 0 && m.current(to) < 0 {
						atTo := m.start(to, c)
						atFrom := m.start(b, -1)
						if err := via.RenameBlock(uint64(b), uint64(to)); err != nil && !(m.evicts && errors.Is(err, store.ErrNotFound)) {
							errc <- err
						}
						m.commit(to, atTo)
						m.commit(b, atFrom)
					}
					m.locks[hi].Unlock()
					m.locks[lo].Unlock()
				}
			}
		}()
	}
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(r), 2))
			for range readOps {
				b := rng.IntN(blocks)
				lo := m.window(b)
				bufs, errs, err := readGroups(tr, uint64(b), rng.IntN(2) == 0)
				if err != nil {
					errc <- err
					return
				}
				got := int64(-2)
				for idx := range bufs {
					c := int64(-1)
					switch err := errs[idx]; {
					case err == nil:
						id, ok := contentOf(bufs[idx], idx)
						if !ok {
							t.Errorf("block %d group %d: bytes of no version", b, idx)
							return
						}
						c = int64(id)
					case !errors.Is(err, store.ErrNotFound):
						t.Errorf("block %d group %d: %v", b, idx, err)
						return
					}
					if got != -2 && c != got {
						t.Errorf("block %d: group %d of content %d, earlier groups of %d", b, idx, c, got)
						return
					}
					got = c
				}
				if !m.allowed(b, lo, got) {
					m.mu.Lock()
					t.Errorf("block %d: read content %d; history %v, %d changes returned before the read", b, got, m.hist[b], lo)
					m.mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	mt := tr.Metrics()
	if sm := st.Metrics(); m.evicts && sm.Evictions == 0 {
		t.Fatalf("the store evicted nothing: %+v", sm)
	}
	if mt.Hits == 0 || mt.Misses == 0 || mt.Evictions == 0 || mt.Invalidations == 0 {
		t.Fatalf("the run did not exercise the tier: %+v", mt)
	}
	t.Logf("%+v", mt)
}

// readGroups reads every group of block b through tr, one request per
// group or (ranged) one per (layer, kind) for all its heads, and returns
// each group's bytes and outcome.
func readGroups(tr *Tier, b uint64, ranged bool) ([][]byte, []error, error) {
	n, gb, heads := testGeo.GroupsPerBlock(), testGeo.GroupBytes(), testGeo.KVHeads
	bufs, errs := make([][]byte, n), make([]error, n)
	if !ranged {
		reqs := blockReqs(b)
		if err := tr.Read(reqs); err != nil {
			return nil, nil, err
		}
		for i := range reqs {
			bufs[i], errs[i] = reqs[i].Buf, reqs[i].Err
		}
		return bufs, errs, nil
	}
	reqs := make([]store.ReadReq, n/heads)
	for lk := range reqs {
		reqs[lk] = store.ReadReq{Key: testGeo.KeyAt(b, lk*heads), Heads: heads, HeadStride: gb, Buf: make([]byte, heads*gb)}
	}
	if err := tr.Read(reqs); err != nil {
		return nil, nil, err
	}
	for lk, r := range reqs {
		for h := range heads {
			i := lk*heads + h
			bufs[i] = r.Buf[h*gb : (h+1)*gb]
			if r.Bad&(1<<h) != 0 {
				errs[i] = r.Err
			} else if r.Err != nil && r.Failed == 0 {
				errs[i] = r.Err
			}
		}
	}
	return bufs, errs, nil
}
