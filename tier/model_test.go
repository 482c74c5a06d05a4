package tier

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
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
// and renames through the tier and straight to the store, and races of a
// write through the tier with one straight to the store on the same block,
// in a tier far smaller than the blocks (evictions, promotions, and blocks
// kept from writes all along), and checks every byte every read lands
// against the model: always some version the block had while the read ran,
// never one older than the last change that had returned before it began.
// With a store smaller than the blocks, the store's own evictions join in.
func TestConcurrentModel(t *testing.T) {
	for _, c := range []struct {
		name        string
		storeBlocks int64
	}{{"store-holds-all", 64}, {"store-evicts", 5}} {
		t.Run(c.name, func(t *testing.T) {
			writeOps, readOps := 300, 600
			if testing.Short() {
				writeOps, readOps = 60, 120
			}
			res := runModel(t, c.storeBlocks, writeOps, readOps)
			if len(res.wrong) > 0 {
				t.Fatalf("%d reads of a version the model forbids; the first: %s", len(res.wrong), res.wrong[0])
			}
			mt := res.metrics
			if res.storeEvictions == 0 && c.storeBlocks < modelBlocks {
				t.Fatalf("the store evicted nothing")
			}
			if mt.Hits == 0 || mt.Misses == 0 || mt.Evictions == 0 || mt.Invalidations == 0 || mt.WrittenBytes == 0 {
				t.Fatalf("the run did not exercise the tier: %+v", mt)
			}
			t.Logf("%+v", mt)
		})
	}
}

// TestModelCatchesBrokenChecks: the model fails a tier whose generation
// checks are broken on purpose: hits that take any copy of the block, and
// written copies labelled with the block's generation once the write
// returned rather than the write's own (wrong when a write straight to
// the store committed just after, or in the same commit after it).
func TestModelCatchesBrokenChecks(t *testing.T) {
	saved := genCheck
	t.Cleanup(func() { genCheck = saved })
	for _, c := range []struct {
		name   string
		break_ func()
	}{
		{"hit-any-copy", func() {
			genCheck.hit = func(uint64, store.BlockVersion) bool { return true }
		}},
		{"label-with-store-gen", func() {
			genCheck.written = func(_ uint64, v store.BlockVersion) uint64 {
				if v.Stored {
					return v.Gen
				}
				return 0
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			genCheck = saved
			c.break_()
			defer func() { genCheck = saved }()
			for try := range 20 {
				if res := runModel(t, 64, 300, 600); len(res.wrong) > 0 {
					t.Logf("caught in run %d: %s", try+1, res.wrong[0])
					return
				}
			}
			t.Fatal("the model passed a tier whose generation check is broken")
		})
	}
}

// modelBlocks is how many blocks the model's operations touch.
const modelBlocks = 8

// modelResult is what a model run found: the reads of a version the model
// forbids (one line each), the tier's counters and the store's evictions.
type modelResult struct {
	wrong          []string
	metrics        Metrics
	storeEvictions uint64
}

func runModel(t *testing.T, storeBlocks int64, writeOps, readOps int) modelResult {
	const blocks, writers, readers = modelBlocks, 2, 3
	g := &gated{Engine: storetest.Formatted(t, testGeo, storeBlocks, 512)}
	st := storetest.Open(t, g, store.Options{})
	tr, err := New(st, Options{Bytes: 3 * testGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	m := newModel(blocks)
	m.evicts = storeBlocks < blocks
	// Races put three writes in a commit (a held one and the two racing):
	// in a store of a few slots, with readers pinning some, they may find
	// none free (ErrFull), which this model does not follow.
	races := storeBlocks >= 2*blocks
	var next atomic.Int64
	var wg sync.WaitGroup
	var wrongMu sync.Mutex
	var res modelResult
	var stop atomic.Bool // a read went wrong, or an operation failed: the run ends
	var errs []error
	wrong := func(format string, args ...any) {
		wrongMu.Lock()
		res.wrong = append(res.wrong, fmt.Sprintf(format, args...))
		wrongMu.Unlock()
		stop.Store(true)
	}
	fail := func(err error) {
		wrongMu.Lock()
		errs = append(errs, err)
		wrongMu.Unlock()
		stop.Store(true)
	}
	// Readers read while any writer writes, and at least readOps times.
	var writing sync.WaitGroup
	writersDone := make(chan struct{})
	for w := range writers {
		wg.Add(1)
		writing.Add(1)
		go func() {
			defer wg.Done()
			defer writing.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			for range writeOps {
				if stop.Load() {
					return
				}
				var via interface {
					Write([]store.WriteReq) error
					DeleteBlock(uint64) error
					RenameBlock(from, to uint64) error
				} = tr
				if rng.IntN(2) == 0 {
					via = st // as the GPU path does
				}
				b := rng.IntN(blocks)
				switch op := rng.IntN(12); {
				case op < 6:
					m.locks[b].Lock()
					id, prev := next.Add(1), m.current(b)
					at := m.start(b, id)
					err := tryWriteBlock(via, uint64(b), uint64(id))
					switch {
					case err == nil:
						m.commit(b, at)
					case m.evicts && errors.Is(err, store.ErrFull):
						// A store of a few slots, the others pinned by
						// reads and writes: the write did nothing.
						m.commit(b, m.start(b, prev))
					default:
						fail(err)
					}
					m.locks[b].Unlock()
				case op < 8 && races:
					m.locks[b].Lock()
					raceWrites(tr, st, g, m, b, &next, fail)
					m.locks[b].Unlock()
				case op < 10:
					m.locks[b].Lock()
					if m.current(b) >= 0 {
						at := m.start(b, -1)
						if err := via.DeleteBlock(uint64(b)); err != nil && !(m.evicts && errors.Is(err, store.ErrNotFound)) {
							fail(err)
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
							fail(err)
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
			for n := 0; !stop.Load(); n++ {
				if n >= readOps {
					select {
					case <-writersDone:
						return
					default:
					}
					// Past its share, a reader leaves the cores to the
					// writers it waits for.
					time.Sleep(20 * time.Microsecond)
				}
				b := rng.IntN(blocks)
				lo := m.window(b)
				bufs, errs, err := readGroups(tr, uint64(b), rng.IntN(2) == 0)
				if err != nil {
					fail(err)
					return
				}
				got := int64(-2)
				for idx := range bufs {
					c := int64(-1)
					switch err := errs[idx]; {
					case err == nil:
						id, ok := contentOf(bufs[idx], idx)
						if !ok {
							wrong("block %d group %d: bytes of no version", b, idx)
							return
						}
						c = int64(id)
					case !errors.Is(err, store.ErrNotFound):
						fail(fmt.Errorf("block %d group %d: %w", b, idx, err))
						return
					}
					if got != -2 && c != got {
						wrong("block %d: group %d of content %d, earlier groups of %d", b, idx, c, got)
						return
					}
					got = c
				}
				if !m.allowed(b, lo, got) {
					m.mu.Lock()
					wrong("block %d: read content %d; history %v, %d changes returned before the read", b, got, m.hist[b], lo)
					m.mu.Unlock()
				}
			}
		}()
	}
	writing.Wait()
	close(writersDone)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatal(errors.Join(errs...))
	}
	res.metrics, res.storeEvictions = tr.Metrics(), st.Metrics().Evictions
	return res
}

// raceWrites writes block b through the tier and straight to the store at
// once, then asks the store which won and records that as the block's
// content. The caller holds b's lock. When it can hold a commit in
// progress (g), it queues the tier's write first and the store's after, so
// that the two commit together with the store's last: the store's bytes
// win under the generation the tier's write was committed with.
func raceWrites(tr *Tier, st *store.Store, g *gated, m *model, b int, next *atomic.Int64, fail func(error)) {
	viaTier, viaStore := next.Add(1), next.Add(1)
	m.start(b, viaTier)
	m.start(b, viaStore)
	var wg sync.WaitGroup
	writeAll := func(w interface{ Write([]store.WriteReq) error }, b, id uint64) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := tryWriteBlock(w, b, id); err != nil {
				fail(err)
			}
		}()
	}
	if held, release, ok := g.hold(); ok {
		writeAll(st, modelBlocks+uint64(b), 1) // a commit to hold
		<-held
		writeAll(tr, uint64(b), uint64(viaTier))
		time.Sleep(300 * time.Microsecond)
		writeAll(st, uint64(b), uint64(viaStore))
		time.Sleep(300 * time.Microsecond)
		release()
	} else {
		writeAll(tr, uint64(b), uint64(viaTier))
		writeAll(st, uint64(b), uint64(viaStore))
	}
	wg.Wait()
	reqs := blockReqs(uint64(b))
	if err := st.Read(reqs); err != nil {
		fail(err)
		return
	}
	won, ok := contentOf(reqs[0].Buf, 0)
	for idx := range reqs {
		if id, okIdx := contentOf(reqs[idx].Buf, idx); reqs[idx].Err != nil || !okIdx || id != won {
			ok = false
		}
	}
	if !ok || won != uint64(viaTier) && won != uint64(viaStore) {
		fail(fmt.Errorf("block %d after a race of writes of %d and %d: content %d (%v), %v", b, viaTier, viaStore, won, ok, reqs[0].Err))
		return
	}
	// The winner again, as the last change: reads from now on must not
	// see the loser, whichever of the two started first.
	m.commit(b, m.start(b, int64(won)))
}

// tryWriteBlock writes every group of block b with content id through w
// and returns the first error.
func tryWriteBlock(w interface{ Write([]store.WriteReq) error }, b, id uint64) error {
	reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		reqs[idx] = store.WriteReq{Key: testGeo.KeyAt(b, idx), Data: content(id, idx)}
	}
	if err := w.Write(reqs); err != nil {
		return err
	}
	for i := range reqs {
		if reqs[i].Err != nil {
			return fmt.Errorf("write block %d group %d: %w", b, i, reqs[i].Err)
		}
	}
	return nil
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

// gated is an engine whose next write, once armed (hold), waits until
// released: a commit in progress, which holds the store's write lock, so
// that the writes queued meanwhile commit together, in the order they
// queued.
type gated struct {
	store.Engine
	mu      sync.Mutex
	busy    bool // a hold is armed or held
	armed   bool
	held    chan struct{}
	release chan struct{}
}

// hold arms the gate: held is closed when a write is waiting at it, and
// release lets it through. ok is false while another hold is under way.
func (g *gated) hold() (held <-chan struct{}, release func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy {
		return nil, nil, false
	}
	g.busy, g.armed = true, true
	g.held, g.release = make(chan struct{}), make(chan struct{})
	rel := g.release
	return g.held, func() {
		close(rel)
		g.mu.Lock()
		g.busy = false
		g.mu.Unlock()
	}, true
}

func (g *gated) Do(ios []store.IO) error {
	g.mu.Lock()
	wait := g.armed && len(ios) > 0 && ios[0].Op == store.OpWrite
	var held, release chan struct{}
	if wait {
		g.armed = false
		held, release = g.held, g.release
	}
	g.mu.Unlock()
	if wait {
		close(held)
		<-release
	}
	return g.Engine.Do(ios)
}
