package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

const (
	rows     = 4
	rowBytes = 64
	gb       = rows * rowBytes
)

var geo = gpu.Geometry{GroupBytes: gb, Rows: rows, RowBytes: rowBytes}

// fakeStore holds groups in memory; it checks that no queued copy still
// uses memory it writes (a Read) or reads (a Write).
type fakeStore struct {
	dev        *gputest.Device
	mu         sync.Mutex
	groups     map[layout.Key][]byte
	corrupt    map[layout.Key]bool
	viol       []string
	reads      int
	chunks     int // staging buffers filled, summed over reads
	unverified int
	onRead     func(n int) // called as read n (1-based) starts
	onReadEnd  func()      // called as a read returns
}

func newFakeStore(dev *gputest.Device) *fakeStore {
	return &fakeStore{dev: dev, groups: map[layout.Key][]byte{}, corrupt: map[layout.Key]bool{}}
}

func key(i int) layout.Key {
	return layout.Key{Block: uint64(i / 8), Layer: i % 8, Head: 0, Kind: layout.K}
}

func content(i int) []byte {
	b := make([]byte, gb)
	r := rand.New(rand.NewPCG(uint64(i), 7))
	for k := range b {
		b[k] = byte(r.UintN(256))
	}
	return b
}

func (s *fakeStore) Read(reqs []store.ReadReq) error {
	ends := map[*byte]bool{} // staging buffers this read lands in (by their last byte)
	for i := range reqs {
		if b := reqs[i].Buf; cap(b) > 0 {
			ends[&b[:cap(b)][cap(b)-1]] = true
		}
	}
	s.mu.Lock()
	s.reads++
	n, hook := s.reads, s.onRead
	s.chunks += len(ends)
	s.mu.Unlock()
	if s.onReadEnd != nil {
		defer s.onReadEnd()
	}
	if hook != nil {
		hook(n)
	}
	for i := range reqs {
		q := &reqs[i]
		s.dev.HostWrite(q.Buf)
		s.mu.Lock()
		g, ok := s.groups[q.Key]
		bad := s.corrupt[q.Key]
		s.mu.Unlock()
		switch {
		case !ok:
			q.Err = store.ErrNotFound
		case q.Unverified:
			// Land the bytes as stored (a corrupt group flipped) with the
			// recorded checksum; the caller checks.
			copy(q.Buf, g)
			if bad {
				q.Buf[3] ^= 0x40
			}
			q.CRC, q.Err = store.CRC32C(g), nil
			s.mu.Lock()
			s.unverified++
			s.mu.Unlock()
		case bad && q.Pitch != 0:
			// A pitched destination: the store zeroes its rows.
			for r := range rows {
				clear(q.Buf[r*q.Pitch : r*q.Pitch+q.RowBytes])
			}
			q.Err = fmt.Errorf("fake: %w", store.ErrCorrupt)
		case bad:
			// Leave garbage: the pipeline must zero it itself.
			for k := range q.Buf {
				q.Buf[k] = 0xEE
			}
			q.Err = fmt.Errorf("fake: %w", store.ErrCorrupt)
		case q.Pitch != 0:
			if len(q.Buf) != (rows-1)*q.Pitch+q.RowBytes {
				s.mu.Lock()
				s.viol = append(s.viol, fmt.Sprintf("pitched read of %v: %d bytes for pitch %d", q.Key, len(q.Buf), q.Pitch))
				s.mu.Unlock()
			}
			for r := range rows {
				copy(q.Buf[r*q.Pitch:r*q.Pitch+q.RowBytes], g[r*q.RowBytes:(r+1)*q.RowBytes])
			}
			q.Err = nil
		default:
			copy(q.Buf, g)
			q.Err = nil
		}
	}
	return nil
}

func (s *fakeStore) Write(reqs []store.WriteReq) error {
	for i := range reqs {
		q := &reqs[i]
		if s.dev.Pending(q.Data) {
			s.mu.Lock()
			s.viol = append(s.viol, fmt.Sprintf("write of %v while its D2H copy is queued", q.Key))
			s.mu.Unlock()
		}
		s.mu.Lock()
		s.groups[q.Key] = append([]byte(nil), q.Data...)
		s.mu.Unlock()
		q.Err = nil
	}
	return nil
}

type rig struct {
	dev  *gputest.Device
	pool *gpu.Pool
	p    *gpu.Pipeline
	st   *fakeStore
}

func newRig(t *testing.T, count, groupsPerBuf, depth int) *rig {
	t.Helper()
	dev := gputest.NewDevice(64 << 20)
	t.Cleanup(dev.Close)
	dev.Delay, dev.Jitter = 20*time.Microsecond, 80*time.Microsecond
	pool, err := gpu.NewPool(dev, gpu.PoolConfig{Count: count, Size: groupsPerBuf * gb})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(); err != nil {
			t.Errorf("pool close: %v", err)
		}
	})
	p := &gpu.Pipeline{Dev: dev, Pool: pool, Geo: geo, Depth: depth}
	if rigOverlap {
		p.ReadAhead = max(1, depth/2)
	}
	dev.EnableBatch = rigBatch
	dev.LaneCount = rigLanes
	return &rig{dev: dev, pool: pool, p: p, st: newFakeStore(dev)}
}

// rigOverlap makes newRig's pipelines read ahead half their depth, so
// that the next group's store read overlaps the queueing of this group's
// copies (TestOverlapVariants).
var rigOverlap bool

// pipelineTests are run again under each variant of the rig (overlapped
// reads, batched copies, lanes).
var pipelineTests = []struct {
	name string
	fn   func(*testing.T)
}{
	{"LoadRoundTrip", TestLoadRoundTrip},
	{"StagingReusedOnlyAfterEvent", TestStagingReusedOnlyAfterEvent},
	{"CorruptMidBatchZeroedAndReported", TestCorruptMidBatchZeroedAndReported},
	{"AbsentLeavesDestination", TestAbsentLeavesDestination},
	{"CopyFailsMidBatch", TestCopyFailsMidBatch},
	{"RecordFailureFallsBackToSynchronize", TestRecordFailureFallsBackToSynchronize},
	{"PitchedLoadAndStore", TestPitchedLoadAndStore},
	{"StoreRoundTripAndCopyFailure", TestStoreRoundTripAndCopyFailure},
	{"ConcurrentBatchesSharePool", TestConcurrentBatchesSharePool},
	{"VerifyOnDevice", TestVerifyOnDevice},
	{"InterleavedSets", TestInterleavedSets},
	{"RunsNeverSpanMappings", TestRunsNeverSpanMappings},
	{"StagedOutOfOrderFailures", TestStagedOutOfOrderFailures},
	{"ReadsOverlapEachOther", TestReadsOverlapEachOther},
}

// runVariant runs pipelineTests with set(true) in force.
func runVariant(t *testing.T, set func(on bool)) {
	set(true)
	defer set(false)
	for _, tc := range pipelineTests {
		t.Run(tc.name, tc.fn)
	}
}

// TestOverlapVariants: the next group's read overlapping the queueing of
// the copies.
func TestOverlapVariants(t *testing.T) { runVariant(t, func(on bool) { rigOverlap = on }) }

// TestBatchVariants: the copies no 2D copy takes queued in batches
// (cuMemcpyBatchAsync).
func TestBatchVariants(t *testing.T) { runVariant(t, func(on bool) { rigBatch = on }) }

// TestLaneVariants: a device with three lanes (each batch's copies and
// events on one of them).
func TestLaneVariants(t *testing.T) {
	runVariant(t, func(on bool) {
		rigLanes = 0
		if on {
			rigLanes = 3
		}
	})
}

// rigBatch makes newRig's devices gpu.Batchers (TestBatchVariants).
var rigBatch bool

// rigLanes gives newRig's devices lanes (TestLaneVariants).
var rigLanes int

// TestBatchesSpreadOverLanes: concurrent loads and stores on a device with
// lanes record their buffers' events on more than one lane (round robin,
// one lane per batch), and every byte still lands and is stored.
func TestBatchesSpreadOverLanes(t *testing.T) {
	r := newRig(t, 6, 4, 2)
	r.dev.LaneCount = 3
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for b := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			its := make([]gpu.Item, n)
			for i := range its {
				k := b*n + i
				r.st.mu.Lock()
				r.st.groups[key(k)] = content(k)
				r.st.mu.Unlock()
				its[i] = gpu.Item{Key: key(k), Dst: gputest.Base + uint64(k*gb)}
			}
			if err := r.p.Load(r.st, its, false); err != nil {
				errs <- err
				return
			}
			for i, it := range its {
				if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(b*n+i)) {
					errs <- fmt.Errorf("batch %d item %d: %v", b, i, it.Err)
					return
				}
			}
			out := newFakeStore(r.dev)
			if err := r.p.Store(out, its); err != nil {
				errs <- err
				return
			}
			for i, it := range its {
				if it.Err != nil || !bytes.Equal(out.groups[it.Key], content(b*n+i)) {
					errs <- fmt.Errorf("batch %d item %d stored: %v", b, i, it.Err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if recs := r.dev.LaneRecords(); len(recs) < 2 {
		t.Fatalf("events recorded on lanes %v: want more than one lane used", recs)
	}
	r.checkClean(t)
}

// TestScatteredTilesBatched: tiles of cache blocks scattered over the
// device (no two adjacent, strides irregular, so no 2D copy takes them)
// are queued with one batch call per chunk, and every byte lands; a device
// that refuses batches gets every copy one by one, every byte still lands,
// and the pipeline stops asking it after the first refusal.
func TestScatteredTilesBatched(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refused=%v", refuse), func(t *testing.T) {
			const n, per = 48, 16
			r := newRig(t, 4, per, 2)
			r.dev.Enable2D, r.dev.EnableBatch = true, true
			asked := 0
			if refuse {
				r.dev.FailBatch = func() error { asked++; return gputest.ErrInjected }
			}
			// Group i at slot perm[i] of 3*n, the slots gb*(1+slot%3)
			// apart: no constant stride, no neighbours.
			perm := rand.New(rand.NewPCG(5, 5)).Perm(3 * n)
			var its []gpu.Item
			for i := range n {
				r.st.groups[key(i)] = content(i)
				its = append(its, gpu.Item{Key: key(i), Dst: gputest.Base + uint64(perm[i])*uint64(3*gb) + uint64(perm[i]%3)*gb/2})
			}
			for pass := range 2 {
				for i := range its {
					its[i].Err = nil
					clear(r.dev.Mem(its[i].Dst, gb))
				}
				if err := r.p.Load(r.st, its, false); err != nil {
					t.Fatal(err)
				}
				for i, it := range its {
					if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
						t.Fatalf("pass %d, item %d: %v", pass, i, it.Err)
					}
				}
			}
			chunks := 2 * ((n + per - 1) / per)
			if refuse {
				if asked != 1 || r.dev.Batches() != 0 || r.p.Batched() != 0 {
					t.Fatalf("refused: asked %d times, %d batches, %d batched copies; want 1, 0, 0", asked, r.dev.Batches(), r.p.Batched())
				}
			} else if r.dev.Batches() != chunks || r.p.Batched() != 2*n || r.dev.Copies2D() != 0 {
				t.Fatalf("%d batches of %d copies (%d 2D), want %d of %d (0 2D)", r.dev.Batches(), r.p.Batched(), r.dev.Copies2D(), chunks, 2*n)
			}
			r.checkClean(t)
		})
	}
}

// TestReadOverlapsCopies: with room for two groups in the depth, the next
// group's store read is under way while this group's copies are queued.
// The first copy waits for the second read to start: one group at a time,
// it never would (the test fails after a timeout); overlapped, it does.
// Every byte still lands, and no staging buffer is written under a copy.
func TestReadOverlapsCopies(t *testing.T) {
	r := newRig(t, 8, 4, 8)
	r.p.ReadAhead = 2
	second := make(chan struct{})
	var once sync.Once
	r.st.onRead = func(n int) {
		if n == 2 {
			once.Do(func() { close(second) })
		}
	}
	overlapped := true
	r.dev.FailEnqueue = func(i int) error {
		if i == 0 {
			select {
			case <-second:
			case <-time.After(2 * time.Second):
				overlapped = false
			}
		}
		return nil
	}
	its := r.items(64, 11)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	if !overlapped {
		t.Fatal("the second group's read did not start while the first group's copies were queued")
	}
	for i, it := range its {
		if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	r.checkClean(t)
	if r.st.reads < 2 {
		t.Fatalf("%d reads", r.st.reads)
	}
}

// TestReadsOverlapEachOther: with room for two groups in the depth, the
// next group's store read starts while this group's is still under way
// (two reads in flight), not once it ends. The first read waits for the
// second to start: one read at a time, it never would (the test fails
// after a timeout). Every byte still lands, no staging buffer is written
// under a copy, and no more than two reads are ever in flight.
func TestReadsOverlapEachOther(t *testing.T) {
	r := newRig(t, 8, 4, 8)
	r.p.ReadAhead = 2
	second := make(chan struct{})
	var once sync.Once
	var inFlight, most atomic.Int32
	overlapped := true
	r.st.onRead = func(n int) {
		for v := inFlight.Add(1); ; {
			if m := most.Load(); v <= m || most.CompareAndSwap(m, v) {
				break
			}
		}
		switch n {
		case 1:
			select {
			case <-second:
			case <-time.After(2 * time.Second):
				overlapped = false
			}
		case 2:
			once.Do(func() { close(second) })
		}
	}
	r.st.onReadEnd = func() { inFlight.Add(-1) }
	its := r.items(64, 13)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	if !overlapped {
		t.Fatal("the second group's read did not start while the first was under way")
	}
	if m := most.Load(); m > 2 {
		t.Fatalf("%d reads in flight at once, want at most 2", m)
	}
	for i, it := range its {
		if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	r.checkClean(t)
}

// items puts n groups in the store and returns load items for them at
// shuffled, non-overlapping destinations (runs of adjacent ones included).
func (r *rig) items(n int, seed uint64) []gpu.Item {
	perm := rand.New(rand.NewPCG(seed, 1)).Perm(n)
	its := make([]gpu.Item, n)
	for i := range its {
		r.st.groups[key(i)] = content(i)
		its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(destSlot(i, perm))*gb}
	}
	return its
}

// destSlot: blocks of 4 items adjacent, the blocks shuffled.
func destSlot(i int, perm []int) int {
	return perm[i/4%len(perm)]*4 + i%4
}

func (r *rig) checkClean(t *testing.T) {
	t.Helper()
	if v := r.dev.Violations(); len(v) > 0 {
		t.Fatalf("device misuse: %v", v)
	}
	if len(r.st.viol) > 0 {
		t.Fatalf("store saw: %v", r.st.viol)
	}
	if r.pool.Leaked() != 0 {
		t.Fatalf("%d staging buffers leaked", r.pool.Leaked())
	}
}

func TestLoadRoundTrip(t *testing.T) {
	r := newRig(t, 4, 8, 4)
	its := r.items(203, 1)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err != nil {
			t.Fatalf("item %d: %v", i, it.Err)
		}
		if got := r.dev.Mem(it.Dst, gb); !bytes.Equal(got, content(i)) {
			t.Fatalf("item %d: device bytes differ", i)
		}
	}
	r.checkClean(t)
	if c := r.dev.Copies(); c >= len(its) {
		t.Fatalf("%d copies for %d groups in runs of 4: adjacent groups were not coalesced", c, len(its))
	}
	if r.dev.Syncs() != 0 {
		t.Fatalf("%d device-wide synchronizes in a healthy load", r.dev.Syncs())
	}
}

// Staging buffers are reused many times per batch, with slow copies: the
// fake flags any write into a buffer whose copy has not run, and a copy
// that ran after its source was overwritten leaves wrong device bytes.
func TestStagingReusedOnlyAfterEvent(t *testing.T) {
	for _, tc := range []struct{ count, per, depth int }{{1, 1, 1}, {2, 1, 2}, {3, 2, 8}, {8, 4, 4}} {
		t.Run(fmt.Sprintf("count%d-per%d-depth%d", tc.count, tc.per, tc.depth), func(t *testing.T) {
			r := newRig(t, tc.count, tc.per, tc.depth)
			r.dev.Delay = 100 * time.Microsecond
			its := r.items(64, 2)
			if err := r.p.Load(r.st, its, false); err != nil {
				t.Fatal(err)
			}
			for i, it := range its {
				if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
					t.Fatalf("item %d: err %v or wrong bytes", i, it.Err)
				}
			}
			r.checkClean(t)
			if r.st.chunks < 64/(tc.per) {
				t.Fatalf("%d staging buffers filled: staging was not cycled", r.st.chunks)
			}
		})
	}
}

func TestCorruptMidBatchZeroedAndReported(t *testing.T) {
	r := newRig(t, 3, 4, 3)
	its := r.items(40, 3)
	bad := map[int]bool{5: true, 17: true, 18: true, 39: true}
	for i := range bad {
		r.st.corrupt[key(i)] = true
	}
	for i := range its { // the destination held something before
		r.dev.Fill(its[i].Dst, bytes.Repeat([]byte{0xAA}, gb))
	}
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	zero := make([]byte, gb)
	for i, it := range its {
		got := r.dev.Mem(it.Dst, gb)
		if bad[i] {
			if !errors.Is(it.Err, store.ErrCorrupt) {
				t.Fatalf("corrupt item %d: err %v", i, it.Err)
			}
			if !bytes.Equal(got, zero) {
				t.Fatalf("corrupt item %d: destination not zeroed", i)
			}
			continue
		}
		if it.Err != nil || !bytes.Equal(got, content(i)) {
			t.Fatalf("item %d: err %v or wrong bytes", i, it.Err)
		}
	}
	r.checkClean(t)
}

func TestAbsentLeavesDestination(t *testing.T) {
	r := newRig(t, 2, 4, 2)
	its := r.items(12, 4)
	delete(r.st.groups, key(6))
	old := bytes.Repeat([]byte{0x5A}, gb)
	r.dev.Fill(its[6].Dst, old)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(its[6].Err, store.ErrNotFound) || !bytes.Equal(r.dev.Mem(its[6].Dst, gb), old) {
		t.Fatalf("absent item: err %v; destination changed: %v", its[6].Err, !bytes.Equal(r.dev.Mem(its[6].Dst, gb), old))
	}
	for i, it := range its {
		if i != 6 && it.Err != nil {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
}

// A copy that fails mid-batch: no item whose bytes did not arrive is
// reported done, the failing one is ErrCopy, and the batch goes on.
func TestCopyFailsMidBatch(t *testing.T) {
	for _, mode := range []string{"run", "enqueue"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, 3, 4, 3)
			its := r.items(48, 5)
			for i := range its {
				r.dev.Fill(its[i].Dst, make([]byte, gb))
			}
			fail := func(i int) error {
				if i == 5 {
					return gputest.ErrInjected
				}
				return nil
			}
			if mode == "run" {
				r.dev.FailCopy = fail
			} else {
				r.dev.FailEnqueue = fail
			}
			if err := r.p.Load(r.st, its, false); err != nil {
				t.Fatal(err)
			}
			nfail, nok := 0, 0
			for i, it := range its {
				got := r.dev.Mem(it.Dst, gb)
				switch {
				case it.Err == nil:
					nok++
					if !bytes.Equal(got, content(i)) {
						t.Fatalf("item %d reported done but its bytes did not arrive", i)
					}
				case errors.Is(it.Err, gpu.ErrCopy):
					nfail++
				default:
					t.Fatalf("item %d: %v", i, it.Err)
				}
			}
			if nfail == 0 {
				t.Fatal("an injected copy failure was not reported")
			}
			if nok < len(its)/2 {
				t.Fatalf("only %d of %d items done: one failed copy sank the batch", nok, len(its))
			}
			if !errors.Is(firstErr(its), gputest.ErrInjected) {
				t.Fatalf("error does not carry the cause: %v", firstErr(its))
			}
			r.checkClean(t)
		})
	}
}

func firstErr(its []gpu.Item) error {
	for _, it := range its {
		if it.Err != nil {
			return it.Err
		}
	}
	return nil
}

// When an event cannot be recorded the pipeline synchronizes the device
// before reusing the buffer, and reports the chunk's copies unconfirmed.
func TestRecordFailureFallsBackToSynchronize(t *testing.T) {
	r := newRig(t, 2, 2, 2)
	var n int
	var mu sync.Mutex
	r.dev.FailRecord = func() error {
		mu.Lock()
		defer mu.Unlock()
		n++
		if n == 3 {
			return gputest.ErrInjected
		}
		return nil
	}
	its := r.items(16, 6)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	if r.dev.Syncs() == 0 {
		t.Fatal("no synchronize after a failed record")
	}
	nf := 0
	for i, it := range its {
		if it.Err == nil && !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
			t.Fatalf("item %d done with wrong bytes", i)
		}
		if errors.Is(it.Err, gpu.ErrCopy) {
			nf++
		}
	}
	if nf == 0 {
		t.Fatal("the chunk whose event failed was reported done")
	}
	r.checkClean(t)
}

func TestPitchedLoadAndStore(t *testing.T) {
	for _, twoD := range []bool{false, true} {
		t.Run(fmt.Sprintf("2d=%v", twoD), func(t *testing.T) { testPitched(t, twoD) })
	}
}

func testPitched(t *testing.T, twoD bool) {
	r := newRig(t, 2, 4, 2)
	r.dev.Enable2D = twoD
	const pitch = 3 * rowBytes
	its := make([]gpu.Item, 10)
	for i := range its {
		r.st.groups[key(i)] = content(i)
		its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(i)*rows*pitch, Pitch: pitch}
	}
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err != nil {
			t.Fatal(it.Err)
		}
		for row := 0; row < rows; row++ {
			got := r.dev.Mem(it.Dst+uint64(row*pitch), rowBytes)
			if !bytes.Equal(got, content(i)[row*rowBytes:(row+1)*rowBytes]) {
				t.Fatalf("item %d row %d differs", i, row)
			}
		}
	}
	// Store them back under other keys and compare.
	st2 := newFakeStore(r.dev)
	for i := range its {
		its[i].Key = key(100 + i)
		its[i].Err = nil
	}
	if err := r.p.Store(st2, its); err != nil {
		t.Fatal(err)
	}
	for i := range its {
		if its[i].Err != nil || !bytes.Equal(st2.groups[key(100+i)], content(i)) {
			t.Fatalf("stored item %d: %v", i, its[i].Err)
		}
	}
	if n := r.dev.Copies2D(); twoD != (n == 2*len(its)) || !twoD && n != 0 {
		t.Fatalf("%d 2D copies for %d pitched tiles loaded and stored (2D %v)", n, len(its), twoD)
	}
	r.checkClean(t)
}

func TestStoreRoundTripAndCopyFailure(t *testing.T) {
	r := newRig(t, 3, 4, 3)
	its := r.items(50, 7)
	for i := range its {
		r.dev.Fill(its[i].Dst, content(1000+i))
	}
	// Adjacent tiles move with one copy, so there are fewer copies than
	// tiles: fail an early one.
	r.dev.FailCopy = func(i int) error {
		if i == 5 {
			return gputest.ErrInjected
		}
		return nil
	}
	out := newFakeStore(r.dev)
	if err := r.p.Store(out, its); err != nil {
		t.Fatal(err)
	}
	nf := 0
	for i, it := range its {
		g, written := out.groups[it.Key]
		switch {
		case it.Err == nil:
			if !bytes.Equal(g, content(1000+i)) {
				t.Fatalf("item %d stored with wrong bytes", i)
			}
		case errors.Is(it.Err, gpu.ErrCopy):
			nf++
			if written {
				t.Fatalf("item %d written although its copy failed", i)
			}
		default:
			t.Fatal(it.Err)
		}
	}
	if nf == 0 {
		t.Fatal("failed D2H copy not reported")
	}
	if len(out.viol) > 0 {
		t.Fatal(out.viol)
	}
	r.checkClean(t)
}

// TestStoreMergesAdjacentTiles: a STORE moves packed tiles adjacent on the
// device, in item order, with one device-to-host copy (the heads of one
// (layer, kind) of an HND block), never across two mappings, and stores
// every group's own bytes.
func TestStoreMergesAdjacentTiles(t *testing.T) {
	r := newRig(t, 2, 32, 1)
	const runs, heads = 3, 8
	var its []gpu.Item
	for k := range runs {
		base := gputest.Base + uint64(k)*(1<<20)
		for h := range heads {
			i := k*heads + h
			it := gpu.Item{Key: key(i), Dst: base + uint64(h*gb)}
			if k == 2 {
				// Two allocations back to back: heads 0-3 and 4-7 are
				// mapped apart.
				it.Mapping = base + uint64(h/4*4*gb)
			}
			its = append(its, it)
			r.dev.Fill(it.Dst, content(2000+i))
		}
	}
	out := newFakeStore(r.dev)
	c0 := r.dev.Copies()
	if err := r.p.Store(out, its); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err != nil || !bytes.Equal(out.groups[it.Key], content(2000+i)) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	if n := r.dev.Copies() - c0; n != runs+1 {
		t.Fatalf("%d copies for %d runs of adjacent tiles (one split by a mapping), want %d", n, runs, runs+1)
	}
	r.checkClean(t)
}

// Several batches share one pool (fewer buffers than they would like).
func TestConcurrentBatchesSharePool(t *testing.T) {
	r := newRig(t, 3, 2, 4)
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for k := 0; k < 6000; k++ {
		if k%1000 < 30 {
			r.st.groups[key(k)] = content(k)
		}
	}
	for b := 0; b < 6; b++ {
		its := make([]gpu.Item, 30)
		for i := range its {
			k := b*1000 + i
			its[i] = gpu.Item{Key: key(k), Dst: gputest.Base + uint64(k)*gb}
		}
		wg.Add(1)
		go func(b int, its []gpu.Item) {
			defer wg.Done()
			if err := r.p.Load(r.st, its, false); err != nil {
				errs <- err
				return
			}
			for i, it := range its {
				if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(b*1000+i)) {
					errs <- fmt.Errorf("batch %d item %d: %v", b, i, it.Err)
					return
				}
			}
		}(b, its)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	r.checkClean(t)
}

func TestPoolRefusesBusyBuffer(t *testing.T) {
	dev := gputest.NewDevice(1 << 20)
	defer dev.Close()
	pool, err := gpu.NewPool(dev, gpu.PoolConfig{Count: 1, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	st, err := pool.Get()
	if err != nil {
		t.Fatal(err)
	}
	if pool.TryGet() != nil {
		t.Fatal("TryGet handed out a buffer that is in use")
	}
	if err := pool.Put(st); err != nil {
		t.Fatal(err)
	}
	if err := pool.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Get(); !errors.Is(err, gpu.ErrClosed) {
		t.Fatalf("Get after Close: %v", err)
	}
}

// regionItems stores blocks×regions groups and returns their items block
// by block, the tiles of each region side by side on the device in block
// order (a Hugging Face cache's (layer, kind, head) of consecutive cache
// blocks), region k at Base + k*region; apart gives each region a Mapping
// of its own.
func (r *rig) regionItems(blocks, regions, region int, apart bool) []gpu.Item {
	its := make([]gpu.Item, blocks*regions)
	for b := range blocks {
		for k := range regions {
			i := b*regions + k
			r.st.groups[key(i)] = content(i)
			base := gputest.Base + uint64(k*region)
			its[i] = gpu.Item{Key: key(i), Dst: base + uint64(b*gb)}
			if apart {
				its[i].Mapping = base
			}
		}
	}
	return its
}

// loadAll loads its and checks that every tile holds its group.
func (r *rig) loadAll(t *testing.T, its []gpu.Item) {
	t.Helper()
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
}

// TestRunsMergeInto2D: groups laid out as a Hugging Face target's (per
// region, a (layer, kind, head) of the cache, consecutive cache blocks
// adjacent on the device), given block by block as a LOAD_BLOCKS entry
// lists them, are staged in destination order: each region's tiles move
// with one copy (there were blocks×regions copies in item order), and with
// 2D copies the chunk's regions, a constant pitch apart, with one. They
// land the same either way.
func TestRunsMergeInto2D(t *testing.T) {
	const blocks, regions = 4, 2
	const region = 1 << 20
	for _, twoD := range []bool{false, true} {
		t.Run(fmt.Sprintf("2d=%v", twoD), func(t *testing.T) {
			r := newRig(t, 2, blocks*regions, 1)
			r.dev.Enable2D = twoD
			r.loadAll(t, r.regionItems(blocks, regions, region, false))
			// One copy per region (all blocks in one chunk), or one 2D
			// copy of a row per region.
			want2D := 0
			if twoD {
				want2D = 1
			}
			if n, n2 := r.dev.Copies(), r.dev.Copies2D(); n != regions || n2 != want2D {
				t.Fatalf("%d copies (%d 2D), want %d (%d 2D)", n, n2, regions, want2D)
			}
			r.checkClean(t)
		})
	}
}

// TestRunsNeverSpanMappings: tiles that fill two device allocations lying
// back to back in the address space (a K and a V tensor of a Hugging Face
// cache, every position loaded) are staged next to each other, yet move
// with one copy per allocation: a copy may not span two mappings. With one
// mapping the same tiles move with one copy.
func TestRunsNeverSpanMappings(t *testing.T) {
	const blocks, regions = 4, 2
	const region = blocks * gb
	for _, twoD := range []bool{false, true} {
		for _, apart := range []bool{false, true} {
			t.Run(fmt.Sprintf("2d=%v/mappings-apart=%v", twoD, apart), func(t *testing.T) {
				r := newRig(t, 2, blocks*regions, 1)
				r.dev.Enable2D = twoD
				r.loadAll(t, r.regionItems(blocks, regions, region, apart))
				want := 1
				if apart {
					want = regions
				}
				if n, n2 := r.dev.Copies(), r.dev.Copies2D(); n != want || n2 != 0 {
					t.Fatalf("%d copies (%d 2D), want %d", n, n2, want)
				}
				r.checkClean(t)
			})
		}
	}
}

// TestStagedOutOfOrderFailures: in a chunk staged in destination order
// (not item order), a corrupt group is zeroed where it was staged and on
// the device, an absent group's tile is left as it was, and the others
// land, in several chunks.
func TestStagedOutOfOrderFailures(t *testing.T) {
	const blocks, regions = 6, 3
	const region = 1 << 20
	r := newRig(t, 4, 6, 2) // 18 groups in chunks of up to 6
	its := make([]gpu.Item, blocks*regions)
	const bad, absent = 7, 10
	for b := range blocks {
		for k := range regions {
			i := b*regions + k
			if i != absent {
				r.st.groups[key(i)] = content(i)
			}
			its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(k*region+b*gb)}
		}
	}
	r.st.corrupt[key(bad)] = true
	old := bytes.Repeat([]byte{0xAB}, gb)
	r.dev.Fill(its[absent].Dst, old)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		got := r.dev.Mem(it.Dst, gb)
		switch i {
		case bad:
			if !errors.Is(it.Err, store.ErrCorrupt) || !bytes.Equal(got, make([]byte, gb)) {
				t.Fatalf("corrupt item: %v, zeroed %v", it.Err, bytes.Equal(got, make([]byte, gb)))
			}
		case absent:
			if !errors.Is(it.Err, store.ErrNotFound) || !bytes.Equal(got, old) {
				t.Fatalf("absent item: %v, untouched %v", it.Err, bytes.Equal(got, old))
			}
		default:
			if it.Err != nil || !bytes.Equal(got, content(i)) {
				t.Fatalf("item %d: %v", i, it.Err)
			}
		}
	}
	r.checkClean(t)
}

// TestVerifyOnDevice: with Pipeline.Verify the store's reads are
// Unverified, Verify sees each group's recorded CRC once its copy is done,
// and a group it finds corrupt (zeroed on the device by Verify) is reported
// ErrCorrupt while the others load.
func TestVerifyOnDevice(t *testing.T) {
	r := newRig(t, 3, 4, 2)
	its := r.items(20, 5)
	bad := map[layout.Key]bool{key(3): true, key(11): true}
	for k := range bad {
		r.st.corrupt[k] = true
	}
	calls := 0
	r.p.Verify = func(items []*gpu.Item) error {
		calls++
		for _, it := range items {
			if store.CRC32C(r.dev.Mem(it.Dst, gb)) != it.CRC {
				r.dev.Fill(it.Dst, make([]byte, gb))
				it.Err = fmt.Errorf("verify: %w", store.ErrCorrupt)
			}
		}
		return nil
	}
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		want := content(i)
		if bad[it.Key] {
			if !errors.Is(it.Err, store.ErrCorrupt) || !bytes.Equal(r.dev.Mem(it.Dst, gb), make([]byte, gb)) {
				t.Fatalf("corrupt item %d: %v", i, it.Err)
			}
			continue
		}
		if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), want) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	if r.st.unverified != len(its) || calls == 0 {
		t.Fatalf("%d unverified reads of %d, %d Verify calls", r.st.unverified, len(its), calls)
	}
	// A Verify that fails as a whole fails its items: none reported OK.
	for i := range its {
		its[i].Err = nil
	}
	r.p.Verify = func([]*gpu.Item) error { return errors.New("checker broke") }
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err == nil {
			t.Fatalf("item %d reported OK after Verify failed", i)
		}
	}
	r.checkClean(t)
}

// TestReadAheadGroupsChunks: one store call fills several staging buffers
// (ReadAhead, default 4) so the storage has more in flight; ReadAhead 1
// reads chunk by chunk. The bytes are the same either way.
func TestReadAheadGroupsChunks(t *testing.T) {
	for _, ra := range []int{0, 1} {
		r := newRig(t, 8, 4, 4)
		r.p.ReadAhead = ra
		its := r.items(64, 9)
		if err := r.p.Load(r.st, its, false); err != nil {
			t.Fatal(err)
		}
		for i, it := range its {
			if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
				t.Fatalf("read-ahead %d: item %d: %v", ra, i, it.Err)
			}
		}
		if grouped := r.st.reads < r.st.chunks; grouped != (ra == 0) {
			t.Fatalf("read-ahead %d: %d reads filled %d staging buffers", ra, r.st.reads, r.st.chunks)
		}
		r.checkClean(t)
	}
}

// TestInterleavedSets: pitched tiles whose rows sit side by side on the
// device (the heads of an NHD cache block) land interleaved in staging and
// move as one span (full rows) or one 2D copy (a head shard); a corrupt
// member lands as zeros, an absent member's tile is left as it was, and
// nothing outside the tiles is written.
func TestInterleavedSets(t *testing.T) {
	for _, twoD := range []bool{false, true} {
		for _, heads := range []int{3, 4} { // 3 of 4 heads per row: a shard
			t.Run(fmt.Sprintf("2d=%v/heads=%d", twoD, heads), func(t *testing.T) { testInterleaved(t, twoD, heads) })
		}
	}
}

func testInterleaved(t *testing.T, twoD bool, heads int) {
	r := newRig(t, 2, 8, 2)
	r.dev.Enable2D = twoD
	const pitch = 4 * rowBytes
	const sets = 5
	span := uint64(rows * pitch)
	sentinel := bytes.Repeat([]byte{0x77}, int(sets*span))
	r.dev.Fill(gputest.Base, sentinel)
	var its []gpu.Item
	for s := range sets {
		for h := range heads {
			i := s*heads + h
			r.st.groups[key(i)] = content(i)
			its = append(its, gpu.Item{Key: key(i), Dst: gputest.Base + uint64(s)*span + uint64(h*rowBytes), Pitch: pitch})
		}
	}
	absent, corrupt := heads+1, 3*heads
	delete(r.st.groups, key(absent))
	r.st.corrupt[key(corrupt)] = true
	c0, c2 := r.dev.Copies(), r.dev.Copies2D()
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	want := append([]byte(nil), sentinel...)
	for i, it := range its {
		o := int(it.Dst - gputest.Base)
		switch {
		case i == absent:
			if !errors.Is(it.Err, store.ErrNotFound) {
				t.Fatalf("absent item: %v", it.Err)
			}
			continue
		case i == corrupt:
			if !errors.Is(it.Err, store.ErrCorrupt) {
				t.Fatalf("corrupt item: %v", it.Err)
			}
			for row := range rows {
				clear(want[o+row*pitch : o+row*pitch+rowBytes])
			}
			continue
		case it.Err != nil:
			t.Fatalf("item %d: %v", i, it.Err)
		}
		for row := range rows {
			copy(want[o+row*pitch:o+row*pitch+rowBytes], content(i)[row*rowBytes:(row+1)*rowBytes])
		}
	}
	if got := r.dev.Mem(gputest.Base, len(want)); !bytes.Equal(got, want) {
		for k := range got {
			if got[k] != want[k] {
				t.Fatalf("device byte %d: %#x, want %#x", k, got[k], want[k])
			}
		}
	}
	if twoD {
		// One copy per set at most (full rows merge across sets), plus one
		// per member of the set with the absent group.
		// (the fake counts each row of a 2D copy as a copy)
		n2 := r.dev.Copies2D() - c2
		if n := r.dev.Copies() - c0 - rows*n2 + n2; n > sets+heads {
			t.Fatalf("%d copies for %d sets of %d tiles", n, sets, heads)
		}
	}
	r.checkClean(t)
}
