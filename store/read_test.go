package store_test

import (
	"bytes"
	"errors"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// nhdGeo has 512-byte token rows (head_dim 256, bf16), so rows can be
// scattered with O_DIRECT-like 512-byte alignment: 2 layers × 4 heads × 2
// kinds = 16 groups of 16 rows (8 KiB).
var nhdGeo = layout.Geometry{Layers: 2, KVHeads: 4, HeadDim: 256, BlockTokens: 16, DType: layout.BF16, Align: 512}

// counting wraps a Mem engine and records, for every read, whether it
// landed in memory inside dst (the caller's destination) or elsewhere
// (store memory: a bounce buffer).
type counting struct {
	*storetest.Mem
	mu                sync.Mutex
	dst               []byte
	inDst, outside    int // read bytes by where they landed
	vecReads, bufRead int
}

func (c *counting) Do(ios []store.IO) error {
	c.mu.Lock()
	for i := range ios {
		if ios[i].Op != store.OpRead {
			continue
		}
		segs := ios[i].Vec
		if segs == nil {
			segs = [][]byte{ios[i].Buf}
			c.bufRead++
		} else {
			c.vecReads++
		}
		for _, v := range segs {
			if c.contains(v) {
				c.inDst += len(v)
			} else {
				c.outside += len(v)
			}
		}
	}
	c.mu.Unlock()
	return c.Mem.Do(ios)
}

func (c *counting) contains(v []byte) bool {
	if len(c.dst) == 0 || len(v) == 0 {
		return false
	}
	lo := uintptr(unsafe.Pointer(&c.dst[0]))
	p := uintptr(unsafe.Pointer(&v[0]))
	return p >= lo && p+uintptr(len(v)) <= lo+uintptr(len(c.dst))
}

// nhdFixture writes one block of nhdGeo and returns a store on a counting
// engine.
func nhdFixture(t *testing.T, vec bool, o store.Options) (*store.Store, *counting) {
	return nhdFixtureOn(t, vec, false, false, o)
}

// nhdFixtureOn is nhdFixture, with inline on an engine that offers inline
// reads (storetest.Inline around the counting engine), and view on one
// whose file lies in memory (a host view, from before the store opens).
func nhdFixtureOn(t *testing.T, vec, inline, view bool, o store.Options) (*store.Store, *counting) {
	t.Helper()
	m := storetest.Formatted(t, nhdGeo, 4, 512)
	m.SetVectorReads(vec)
	m.SetHostView(view)
	c := &counting{Mem: m}
	var e store.Engine = c
	if inline {
		e = storetest.NewInline(c)
	}
	s := openStore(t, e, o)
	n := nhdGeo.GroupsPerBlock()
	w := make([]store.WriteReq, n)
	for i := range w {
		k := nhdGeo.KeyAt(1, i)
		w[i] = store.WriteReq{Key: k, Data: groupData(nhdGeo, k, 1)}
	}
	if err := s.Write(w); err != nil {
		t.Fatal(err)
	}
	return s, c
}

// nhdLoad reads block 1 into an NHD cache ([layer×kind][token][head][row]),
// every byte the groups do not own set to a guard value, and checks every
// byte. It returns the cache.
func nhdLoad(t *testing.T, s *store.Store, c *counting) []byte {
	t.Helper()
	geo := nhdGeo
	rb, gb := geo.RowBytes(), geo.GroupBytes()
	pitch := geo.KVHeads * rb
	tile := gb * geo.KVHeads // one (layer, kind)
	// A guard tile before and after the cache proper.
	mem, err := store.AllocAligned((geo.Layers*2 + 2) * tile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.FreeAligned(mem) })
	const guard = 0xA5
	for i := range mem {
		mem[i] = guard
	}
	cache := mem[tile : len(mem)-tile]
	c.mu.Lock()
	c.dst, c.inDst, c.outside, c.vecReads, c.bufRead = cache, 0, 0, 0, 0
	c.mu.Unlock()
	n := geo.GroupsPerBlock()
	reqs := make([]store.ReadReq, n)
	// Leave head 3 out: its rows must keep the guard.
	var asked []int
	for i := range n {
		k := geo.KeyAt(1, i)
		if k.Head == 3 {
			continue
		}
		off := (k.Layer*2+int(k.Kind))*tile + k.Head*rb
		reqs[len(asked)] = store.ReadReq{Key: k, Buf: cache[off : off+(geo.BlockTokens-1)*pitch+rb], Pitch: pitch, RowBytes: rb}
		asked = append(asked, i)
	}
	reqs = reqs[:len(asked)]
	if err := s.Read(reqs); err != nil {
		t.Fatal(err)
	}
	want := bytes.Repeat([]byte{guard}, len(mem))
	for j, i := range asked {
		if reqs[j].Err != nil {
			t.Fatalf("%v: %v", reqs[j].Key, reqs[j].Err)
		}
		k := geo.KeyAt(1, i)
		d := groupData(geo, k, 1)
		off := tile + (k.Layer*2+int(k.Kind))*tile + k.Head*rb
		for r := range geo.BlockTokens {
			copy(want[off+r*pitch:], d[r*rb:(r+1)*rb])
		}
	}
	checkBytes(t, mem, want, "of the cache (guard tile first)")
	return cache
}

// checkBytes fails t at the first byte where got differs from want (or
// if their lengths do); where says what the byte's index counts from.
func checkBytes(t *testing.T, got, want []byte, where string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d bytes %s, want %d", len(got), where, len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("byte %d %s: %#x, want %#x", i, where, got[i], want[i])
		}
	}
}

// TestReadPitchedNoBounce proves that a pitched (NHD) read whose rows are
// at least ScatterMin lands with no bounce copy: every byte the engine reads
// goes straight into the caller's cache, with vector reads.
func TestReadPitchedNoBounce(t *testing.T) {
	t.Run("do", func(t *testing.T) { readPitchedNoBounce(t, false) })
	// Inline reads of one group per chunk: every chunk a vector read of
	// its rows, verified after it.
	t.Run("inline", func(t *testing.T) { readPitchedNoBounce(t, true) })
}

func readPitchedNoBounce(t *testing.T, inline bool) {
	s, c := nhdFixtureOn(t, true, inline, false, store.Options{ScatterMin: 512, InlineChunk: 1})
	before := s.Metrics().Bounced
	nhdLoad(t, s, c)
	gb := nhdGeo.GroupBytes()
	groups := nhdGeo.GroupsPerBlock() * 3 / 4
	if c.outside != 0 || c.inDst != groups*gb || c.bufRead != 0 || c.vecReads == 0 {
		t.Fatalf("reads: %d bytes into the cache, %d elsewhere, %d vector and %d plain reads; want %d, 0, >0, 0",
			c.inDst, c.outside, c.vecReads, c.bufRead, groups*gb)
	}
	if got := s.Metrics().Bounced - before; got != 0 {
		t.Fatalf("%d bytes bounced", got)
	}
}

// TestReadPitchedBounceOnce: rows below ScatterMin, or an engine without
// vector reads, bounce once: the engine reads the data exactly once, into
// store memory, and it is copied once (Bounced = the data).
func TestReadPitchedBounceOnce(t *testing.T) {
	for _, tc := range []struct {
		name string
		vec  bool
		min  int
	}{{"small-rows", true, 0}, {"no-vector-engine", false, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := nhdFixture(t, tc.vec, store.Options{ScatterMin: tc.min})
			before := s.Metrics().Bounced
			nhdLoad(t, s, c)
			data := nhdGeo.GroupsPerBlock() * 3 / 4 * nhdGeo.GroupBytes()
			if c.inDst != 0 || c.vecReads != 0 {
				t.Fatalf("%d bytes read into the cache, %d vector reads", c.inDst, c.vecReads)
			}
			// Head 3 is not asked for, so runs are 3 groups: 3/4 of the data.
			if c.outside != data {
				t.Fatalf("%d bytes read into store memory, want %d (the data, once)", c.outside, data)
			}
			if got := s.Metrics().Bounced - before; got != uint64(data) {
				t.Fatalf("%d bytes bounced, want %d", got, data)
			}
		})
	}
}

// TestReadPitchedCorrupt: a corrupt group's rows are zeroed in place, the
// bytes between them (other heads) untouched, in both landing modes.
func TestReadPitchedCorrupt(t *testing.T) {
	for _, vec := range []bool{false, true} {
		s, c := nhdFixture(t, vec, store.Options{ScatterMin: 512})
		k := nhdGeo.KeyAt(1, 5)
		off := groupOnDevice(t, s, k)
		img := c.Mem.Image()
		c.Mem.Poke(off+100, []byte{img[off+100] ^ 1})
		rb := nhdGeo.RowBytes()
		pitch := nhdGeo.KVHeads * rb
		buf := bytes.Repeat([]byte{0xA5}, (nhdGeo.BlockTokens-1)*pitch+rb+pitch)
		buf, _ = alignedCopy(t, buf)
		dst := buf[:(nhdGeo.BlockTokens-1)*pitch+rb]
		reqs := []store.ReadReq{{Key: k, Buf: dst, Pitch: pitch, RowBytes: rb}}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(reqs[0].Err, store.ErrCorrupt) {
			t.Fatalf("vec %v: %v, want ErrCorrupt", vec, reqs[0].Err)
		}
		for i, b := range buf {
			inRow := i%pitch < rb && i < len(dst)
			if (inRow && b != 0) || (!inRow && b != 0xA5) {
				t.Fatalf("vec %v: byte %d is %#x (row byte: %v)", vec, i, b, inRow)
			}
		}
	}
}

func alignedCopy(t *testing.T, b []byte) ([]byte, func()) {
	t.Helper()
	m, err := store.AllocAligned(len(b))
	if err != nil {
		t.Fatal(err)
	}
	copy(m, b)
	t.Cleanup(func() { store.FreeAligned(m) })
	return m, nil
}

// TestReadPitchedInvalid: bad pitch descriptions are refused per request.
func TestReadPitchedInvalid(t *testing.T) {
	s, _ := nhdFixture(t, true, store.Options{})
	rb, gb := nhdGeo.RowBytes(), nhdGeo.GroupBytes()
	k := nhdGeo.KeyAt(1, 0)
	big := make([]byte, 4*gb)
	for _, tc := range []struct {
		name     string
		buf      []byte
		pitch, r int
		want     error
	}{
		{"pitch below row", big[:gb], rb - 1, rb, store.ErrInvalid},
		{"row not dividing group", big[:gb], rb * 2, rb + 1, store.ErrInvalid},
		{"no row length", big[:gb], rb * 2, 0, store.ErrInvalid},
		{"short", big[:15*2*rb], rb * 2, rb, store.ErrSize},
		{"long", big[:15*2*rb+rb+1], rb * 2, rb, store.ErrSize},
		{"huge pitch", big[:gb], 1 << 62, rb, store.ErrInvalid},
		{"contiguous wrong size", big[:gb-1], 0, 0, store.ErrSize},
	} {
		reqs := []store.ReadReq{{Key: k, Buf: tc.buf, Pitch: tc.pitch, RowBytes: tc.r}}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		if !errors.Is(reqs[0].Err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, reqs[0].Err, tc.want)
		}
	}
}

// TestReadAllocs: Read allocates nothing per group, for hits and misses.
// Allocations per call are allowed; the number must not grow with the
// groups in the call.
func TestReadAllocs(t *testing.T) {
	geo := layout.Geometry{Layers: 16, KVHeads: 8, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}
	m := storetest.Formatted(t, geo, 4, 512)
	s := openStore(t, m, store.Options{})
	n := geo.GroupsPerBlock() // 256
	gb := geo.GroupBytes()
	w := make([]store.WriteReq, n)
	for i := range w {
		w[i] = store.WriteReq{Key: geo.KeyAt(1, i), Data: make([]byte, gb)}
	}
	if err := s.Write(w); err != nil {
		t.Fatal(err)
	}
	buf, err := store.AllocAligned(n * gb)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(buf)
	for _, tc := range []struct {
		name  string
		block uint64
		scat  bool // destinations apart from each other: bounce
		heads int  // groups per request (a range of heads above 1)
	}{{"hits", 1, false, 1}, {"hits-bounced", 1, true, 1}, {"misses", 2, false, 1},
		{"range-hits", 1, false, geo.KVHeads}, {"range-misses", 2, false, geo.KVHeads}} {
		allocs := func(groups int) float64 {
			h := tc.heads
			reqs := make([]store.ReadReq, groups/h)
			return testing.AllocsPerRun(50, func() {
				for i := range reqs {
					j := i
					if tc.scat {
						j = (i * 2) % groups
						if groups == n {
							j = (i*2)%n + (i*2)/n // a permutation
						}
					}
					reqs[i] = store.ReadReq{Key: geo.KeyAt(tc.block, i*h), Buf: buf[j*h*gb : (j+1)*h*gb]}
					if h > 1 {
						reqs[i].Heads, reqs[i].HeadStride = h, gb
					}
				}
				if err := s.Read(reqs); err != nil {
					t.Fatal(err)
				}
				if tc.block == 1 && reqs[0].Err != nil {
					t.Fatal(reqs[0].Err)
				}
			})
		}
		few, many := allocs(8), allocs(n)
		t.Logf("%s: %.1f allocations per call of 8 groups, %.1f of %d", tc.name, few, many, n)
		if many > few {
			t.Errorf("%s: %.1f allocations for %d groups, %.1f for 8: allocations per group", tc.name, many, n, few)
		}
	}
}

// allocCounter is a Mem engine that hands out the store's buffers
// (BufferAllocator) and tracks how many bytes are out at once.
type allocCounter struct {
	*storetest.Mem
	mu        sync.Mutex
	out, peak int
}

func (a *allocCounter) AllocBuffer(n int) ([]byte, error) {
	a.mu.Lock()
	a.out += n
	a.peak = max(a.peak, a.out)
	a.mu.Unlock()
	return store.AllocAligned(n)
}

func (a *allocCounter) FreeBuffer(b []byte) {
	a.mu.Lock()
	a.out -= len(b)
	a.mu.Unlock()
	store.FreeAligned(b)
}

// TestBounceSizedToData: a read of 511 groups of 2 KiB, none adjacent to
// the next (so every one is its own run, and every run bounces), uses
// bounce memory of about the data's size (1 MiB), not a MaxIO buffer per
// run (that was 511 MiB); so does the write of 512 such groups.
func TestBounceSizedToData(t *testing.T) {
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 64, BlockTokens: 16, DType: layout.BF16, Align: 512}
	m := storetest.Formatted(t, geo, 4, 512)
	a := &allocCounter{Mem: m}
	s := openStore(t, a, store.Options{})
	gb, per := geo.GroupBytes(), geo.GroupsPerBlock()
	var w []store.WriteReq
	for blk := uint64(1); blk <= 2; blk++ {
		for i := 0; i < per; i += 2 {
			k := geo.KeyAt(blk, i)
			w = append(w, store.WriteReq{Key: k, Data: groupData(geo, k, 1)})
		}
	}
	a.mu.Lock()
	a.peak = a.out
	wbase := a.out
	a.mu.Unlock()
	if err := s.Write(w); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	wused := a.peak - wbase
	a.mu.Unlock()
	// The write's payloads too: 512 groups, each its own run.
	t.Logf("write: %d bytes of bounce and header memory for %d bytes of data", wused, len(w)*gb)
	if limit := len(w)*gb + 2<<20; wused > limit {
		t.Fatalf("write: %d bytes of bounce memory for %d bytes of data (limit %d)", wused, len(w)*gb, limit)
	}
	// Reopen: no idle bounce buffers left from the write.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, a, store.Options{})
	const n = 511
	reqs := make([]store.ReadReq, n)
	dst := make([]byte, n*gb+1)
	for i := range reqs {
		// Every other group (no run of two), destinations unaligned
		// (every run bounces).
		reqs[i] = store.ReadReq{Key: w[i].Key, Buf: dst[1+i*gb : 1+(i+1)*gb]}
	}
	a.mu.Lock()
	a.peak = a.out
	base := a.out
	a.mu.Unlock()
	if err := s.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if reqs[i].Err != nil || !bytes.Equal(reqs[i].Buf, w[i].Data) {
			t.Fatalf("%v: %v", reqs[i].Key, reqs[i].Err)
		}
	}
	a.mu.Lock()
	used := a.peak - base
	a.mu.Unlock()
	data := n * gb
	t.Logf("%d bytes of bounce memory for %d bytes of data", used, data)
	if limit := data + 2<<20; used > limit {
		t.Fatalf("%d bytes of bounce memory for %d bytes of data (limit %d)", used, data, limit)
	}
}

// callCounter counts the engine calls in progress at once (most), each
// held for a moment so that a second call could start meanwhile.
type callCounter struct{ inflight, most atomic.Int32 }

func (c *callCounter) enter() (leave func()) {
	n := c.inflight.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
	time.Sleep(20 * time.Millisecond)
	return func() { c.inflight.Add(-1) }
}

// checkServed checks the outcome of reads of version 1 of groupData: the
// group bad corrupt and zeroed, the groups failed reports (if not nil) with
// EIO, every other group served byte for byte.
func checkServed(t *testing.T, geo layout.Geometry, reqs []store.ReadReq, bad layout.Key, failed func(layout.Key) bool) {
	t.Helper()
	zero := make([]byte, geo.GroupBytes())
	for _, r := range reqs {
		if failed != nil && failed(r.Key) {
			if !errors.Is(r.Err, unix.EIO) {
				t.Fatalf("%v in the failed run: %v", r.Key, r.Err)
			}
			continue
		}
		if r.Key == bad {
			if !errors.Is(r.Err, store.ErrCorrupt) || !bytes.Equal(r.Buf, zero) {
				t.Fatalf("corrupt group: %v, zeroed %v", r.Err, bytes.Equal(r.Buf, zero))
			}
			continue
		}
		if r.Err != nil || !bytes.Equal(r.Buf, groupData(geo, r.Key, 1)) {
			t.Fatalf("%v: %v", r.Key, r.Err)
		}
	}
}

// overlapEngine counts its Do calls at once and hands out the store's
// buffers (allocCounter).
type overlapEngine struct {
	*allocCounter
	calls callCounter
}

func (o *overlapEngine) Do(ios []store.IO) error {
	defer o.calls.enter()()
	return o.allocCounter.Do(ios)
}

// overlapNotify is a NotifyEngine (as the ring engines) that counts its
// DoNotify calls at once and hands out the store's buffers.
type overlapNotify struct {
	*storetest.Notifying
	alloc *allocCounter
	calls callCounter
}

func (o *overlapNotify) DoNotify(ios []store.IO, done func(int)) error {
	defer o.calls.enter()()
	return o.Notifying.DoNotify(ios, done)
}
func (o *overlapNotify) AllocBuffer(n int) ([]byte, error) { return o.alloc.AllocBuffer(n) }
func (o *overlapNotify) FreeBuffer(b []byte)               { o.alloc.FreeBuffer(b) }

// TestReadWindowsOverlap: a read of 40 MiB of groups that all bounce (a
// disk store's runs under O_DIRECT, destinations apart) is issued in
// windows of bounded bounce memory, two of them in flight at once, so the
// device's queue does not run dry at each window's end (one at a time, no
// two engine calls of one Read ever overlapped). Every group lands, a
// corrupt one in the second window is zeroed and reported, and the bounce
// memory stays within the call's bound.
func TestReadWindowsOverlap(t *testing.T) {
	for _, notify := range []bool{false, true} {
		t.Run(map[bool]string{false: "do", true: "notify"}[notify], func(t *testing.T) {
			geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
			const blocks = 20
			m := storetest.Formatted(t, geo, blocks+1, 4096)
			ac := &allocCounter{Mem: m}
			oe := &overlapEngine{allocCounter: ac}
			var e store.Engine = oe
			calls := &oe.calls
			if notify {
				on := &overlapNotify{Notifying: storetest.NewNotifying(ac), alloc: ac}
				e, calls = on, &on.calls
			}
			s := openStore(t, e, store.Options{MaxIO: 2 << 20})
			gb, per := geo.GroupBytes(), geo.GroupsPerBlock()
			writeBlocks(t, s, geo, int(blocks), 1)
			bad := geo.KeyAt(blocks-2, 77)
			off := groupOnDevice(t, s, bad)
			m.Poke(off+9, []byte{^m.Image()[off+9]})
			dst := make([]byte, blocks*per*gb+1)
			var reqs []store.ReadReq
			for blk := uint64(1); blk <= blocks; blk++ {
				for i := range per {
					o := 1 + ((int(blk)-1)*per+i)*gb // unaligned: every run bounces
					reqs = append(reqs, store.ReadReq{Key: geo.KeyAt(blk, i), Buf: dst[o : o+gb]})
				}
			}
			calls.most.Store(0)
			ac.mu.Lock()
			ac.peak = ac.out
			base := ac.out
			ac.mu.Unlock()
			if err := s.Read(reqs); err != nil {
				t.Fatal(err)
			}
			checkServed(t, geo, reqs, bad, nil)
			ac.mu.Lock()
			used := ac.peak - base
			ac.mu.Unlock()
			most := calls.most.Load()
			t.Logf("%d engine calls at once at most, %d bytes of bounce memory for %d bytes of data", most, used, len(reqs)*gb)
			if most < 2 {
				t.Errorf("the windows of one Read never overlapped (%d engine call at once)", most)
			}
			if limit := 64<<20 + 4<<20; used > limit {
				t.Errorf("%d bytes of bounce memory for one Read (limit %d)", used, limit)
			}
		})
	}
}

// TestReadFaultPanicsInCaller: a read large enough to be verified on
// several goroutines, into a caller's mapping whose file was truncated (as
// a client may do to a daemon), with panic-on-fault set by the caller:
// the fault surfaces as a panic in the calling goroutine (so a caller like
// ctl turns it into EFAULT), and the store is left consistent (no pin
// left behind: the invariants check runs at Close).
func TestReadFaultPanicsInCaller(t *testing.T) {
	for _, notify := range []bool{false, true} {
		t.Run(map[bool]string{false: "do", true: "notify"}[notify], func(t *testing.T) { readFaultPanicsInCaller(t, notify, false, false, 3) })
	}
	t.Run("aligned", func(t *testing.T) { readFaultPanicsInCaller(t, false, true, false, 3) })
	// 40 MiB of bounced runs: two windows in flight, each on its own
	// goroutine.
	t.Run("windows", func(t *testing.T) { readFaultPanicsInCaller(t, true, false, false, 20) })
	// Inline reads: each fault gives back the inline slots of the runs it
	// cut short (else the store would stop reading inline once the faults
	// outnumber the slots).
	t.Run("inline", func(t *testing.T) { readFaultPanicsInCaller(t, false, false, true, 3) })
	// Aligned, inline: the fault is taken in the one-pass checksum copy
	// (crcCopyNT4).
	t.Run("inline-aligned", func(t *testing.T) { readFaultPanicsInCaller(t, false, true, true, 3) })
}

func readFaultPanicsInCaller(t *testing.T, notify, aligned, inline bool, blocks int) {
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	m := storetest.Formatted(t, geo, int64(blocks)+1, 4096)
	var e store.Engine = m
	if notify {
		e = storetest.NewNotifying(m)
	}
	if inline {
		e = storetest.NewInline(storetest.NewNotifying(m))
	}
	s := openStore(t, e, store.Options{})
	gb, per := geo.GroupBytes(), geo.GroupsPerBlock()
	// 3 blocks, 6 MiB: more than one verification piece.
	var reqs []store.ReadReq
	writeBlocks(t, s, geo, blocks, 1)
	f, err := os.CreateTemp(t.TempDir(), "dst")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	size := blocks*per*gb + 4096
	if err := f.Truncate(int64(size)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	for blk := uint64(1); blk <= uint64(blocks); blk++ {
		for i := range per {
			o := 1 + ((int(blk)-1)*per+i)*gb // unaligned: every run bounces
			if aligned {
				// Aligned but in reverse order: every run bounces, and
				// lands with non-temporal stores (copyRowsNT).
				o = (blocks*per - 1 - ((int(blk)-1)*per + i)) * gb
			}
			reqs = append(reqs, store.ReadReq{Key: geo.KeyAt(blk, i), Buf: mem[o : o+gb]})
		}
	}
	if err := f.Truncate(0); err != nil {
		t.Fatal(err)
	}
	faults := 1
	if inline {
		faults = runtime.GOMAXPROCS(0) + 1
	}
	for range faults {
		var caught any
		func() {
			old := debug.SetPanicOnFault(true)
			defer func() {
				debug.SetPanicOnFault(old)
				caught = recover()
			}()
			_ = s.Read(reqs)
		}()
		a, ok := caught.(interface{ Addr() uintptr })
		if !ok {
			t.Fatalf("Read into a truncated mapping: recovered %v, want a fault", caught)
		}
		lo := uintptr(unsafe.Pointer(&mem[0]))
		if p := a.Addr(); p < lo || p >= lo+uintptr(size) {
			t.Fatalf("fault at %#x, outside the mapping", p)
		}
	}
	// The store still serves reads (whole blocks: runs read inline).
	buf := make([]byte, blocks*per*gb)
	r := make([]store.ReadReq, 0, blocks*per)
	for blk := uint64(1); blk <= uint64(blocks); blk++ {
		for i := range per {
			o := ((int(blk)-1)*per + i) * gb
			r = append(r, store.ReadReq{Key: geo.KeyAt(blk, i), Buf: buf[o : o+gb]})
		}
	}
	done := make(chan error, 1)
	go func() { done <- s.Read(r) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("read after the faults: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("read after the faults never returned (inline slots lost?)")
	}
	for i := range r {
		if r[i].Err != nil {
			t.Fatalf("read after the faults: %v: %v", r[i].Key, r[i].Err)
		}
	}
}

// TestReadLargeCorrupt: in a read verified on several goroutines (three
// whole blocks, 6 MiB, landing directly), a group corrupt on the device in
// the last piece is reported and zeroed, and every other group is served.
func TestReadLargeCorrupt(t *testing.T) {
	for _, mode := range []string{"do", "notify", "inline"} {
		t.Run(mode, func(t *testing.T) { readLargeCorrupt(t, mode) })
	}
}

// readLargeCorrupt is TestReadLargeCorrupt on a Mem engine (mode do), on
// one that reports completions as they happen in any order (notify: the
// ring engines, runs verified as they land, concurrently), or on one with
// inline reads (inline: runs read in 64 KiB chunks, each verified after
// its read, on several goroutines). With notify and inline one read also
// fails, and only its groups report the error.
func readLargeCorrupt(t *testing.T, mode string) {
	notify := mode != "do"
	geo := layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 4096}
	m := storetest.Formatted(t, geo, 4, 4096)
	var e store.Engine = m
	var faulty *storetest.Faulty
	var nt *storetest.Notifying
	const chunk = 64 << 10
	if notify {
		faulty = storetest.NewFaulty(m, nil, nil)
		nt = storetest.NewNotifying(faulty)
		e = nt
		if mode == "inline" {
			e = storetest.NewInline(faulty)
		}
	}
	s := openStore(t, e, store.Options{InlineChunk: chunk})
	gb, per := geo.GroupBytes(), geo.GroupsPerBlock()
	const blocks = 3
	writeBlocks(t, s, geo, int(blocks), 1)
	bad := geo.KeyAt(3, 300)
	off := groupOnDevice(t, s, bad)
	m.Poke(off+9, []byte{^m.Image()[off+9]})
	buf, err := store.AllocAligned(blocks * per * gb)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(buf)
	reqs := make([]store.ReadReq, 0, blocks*per)
	for blk := uint64(1); blk <= blocks; blk++ {
		for i := range per {
			o := ((int(blk)-1)*per + i) * gb
			reqs = append(reqs, store.ReadReq{Key: geo.KeyAt(blk, i), Buf: buf[o : o+gb]})
		}
	}
	// With notify, the read of block 2's slot at group offset 0 fails.
	failed := func(k layout.Key) bool { return false }
	if notify {
		at := groupOnDevice(t, s, geo.KeyAt(2, 0))
		faulty.SetInjector(func(_ int, r store.IO) storetest.Fault {
			if r.Op == store.OpRead && r.Off == at {
				return storetest.EIO
			}
			return storetest.None
		})
		// MaxIO 1 MiB: the failing run is block 2's first 256 groups;
		// inline, the failing chunk its first 16.
		n := (1 << 20) / gb
		if mode == "inline" {
			n = chunk / gb
		}
		failed = func(k layout.Key) bool { return k.Block == 2 && geo.Index(k) < n }
	}
	if err := s.Read(reqs); err != nil {
		t.Fatal(err)
	}
	if mode == "notify" && nt.Calls() == 0 {
		t.Fatal("the store never used DoNotify")
	}
	checkServed(t, geo, reqs, bad, failed)
	if m := s.Metrics(); m.Corrupt != 1 {
		t.Fatalf("%d corrupt groups counted", m.Corrupt)
	}
}

// TestReadVecContiguousApart: contiguous destinations that do not follow
// each other in memory (tiles of a paged cache, here in reverse order)
// land with one vector read per run and no bounce copy; with segments
// below ScatterMin they bounce once.
func TestReadVecContiguousApart(t *testing.T) {
	for _, smin := range []int{0, 512} { // default (4 KiB) and lower: 8 KiB groups pass both
		s, c := nhdFixture(t, true, store.Options{ScatterMin: smin})
		n, gb := nhdGeo.GroupsPerBlock(), nhdGeo.GroupBytes() // 8 KiB groups
		buf, err := store.AllocAligned(n * gb)
		if err != nil {
			t.Fatal(err)
		}
		defer store.FreeAligned(buf)
		c.mu.Lock()
		c.dst, c.inDst, c.outside, c.vecReads, c.bufRead = buf, 0, 0, 0, 0
		c.mu.Unlock()
		reqs := make([]store.ReadReq, n)
		for i := range reqs {
			o := (n - 1 - i) * gb
			reqs[i] = store.ReadReq{Key: nhdGeo.KeyAt(1, i), Buf: buf[o : o+gb]}
		}
		before := s.Metrics().Bounced
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if r.Err != nil || !bytes.Equal(r.Buf, groupData(nhdGeo, r.Key, 1)) {
				t.Fatalf("%v: %v", r.Key, r.Err)
			}
		}
		if c.inDst != n*gb || c.outside != 0 || c.vecReads != 1 {
			t.Fatalf("ScatterMin %d: %d bytes read into place, %d elsewhere, %d vector reads", smin, c.inDst, c.outside, c.vecReads)
		}
		if b := s.Metrics().Bounced - before; b != 0 {
			t.Fatalf("%d bytes bounced", b)
		}
	}
	// Segments below ScatterMin: one bounce.
	s, c := nhdFixture(t, true, store.Options{ScatterMin: 16 << 10})
	gb := nhdGeo.GroupBytes()
	buf, err := store.AllocAligned(2 * gb)
	if err != nil {
		t.Fatal(err)
	}
	defer store.FreeAligned(buf)
	c.mu.Lock()
	c.dst, c.inDst, c.outside, c.vecReads, c.bufRead = buf, 0, 0, 0, 0
	c.mu.Unlock()
	reqs := []store.ReadReq{{Key: nhdGeo.KeyAt(1, 0), Buf: buf[gb:]}, {Key: nhdGeo.KeyAt(1, 1), Buf: buf[:gb]}}
	if err := s.Read(reqs); err != nil || reqs[0].Err != nil || reqs[1].Err != nil {
		t.Fatal(err, reqs[0].Err, reqs[1].Err)
	}
	if c.vecReads != 0 || c.inDst != 0 || s.Metrics().Bounced != uint64(2*gb) {
		t.Fatalf("small segments: %d vector reads, %d bytes into place, %d bounced", c.vecReads, c.inDst, s.Metrics().Bounced)
	}
}

// TestReadUnverified: an Unverified request lands the group's bytes as
// stored, corrupt or not, and reports the header's CRC for the caller to
// check; verified requests of the same call are still checked.
func TestReadUnverified(t *testing.T) {
	for _, vec := range []bool{false, true} {
		s, c := nhdFixture(t, vec, store.Options{ScatterMin: 512})
		good, bad := nhdGeo.KeyAt(1, 4), nhdGeo.KeyAt(1, 5)
		off := groupOnDevice(t, s, bad)
		img := c.Mem.Image()
		c.Mem.Poke(off+100, []byte{img[off+100] ^ 1})
		gb := nhdGeo.GroupBytes()
		rb := nhdGeo.RowBytes()
		pitch := nhdGeo.KVHeads * rb
		for _, pitched := range []bool{false, true} {
			n := gb
			if pitched {
				n = (nhdGeo.BlockTokens-1)*pitch + rb
			}
			bufs := make([][]byte, 3)
			reqs := make([]store.ReadReq, 3)
			for i, k := range []layout.Key{good, bad, bad} {
				bufs[i], _ = alignedCopy(t, make([]byte, n))
				reqs[i] = store.ReadReq{Key: k, Buf: bufs[i], Unverified: i < 2}
				if pitched {
					reqs[i].Pitch, reqs[i].RowBytes = pitch, rb
				}
			}
			if err := s.Read(reqs); err != nil {
				t.Fatal(err)
			}
			for i := range 2 {
				if reqs[i].Err != nil {
					t.Fatalf("vec %v pitched %v: unverified %d: %v", vec, pitched, i, reqs[i].Err)
				}
				got := bufs[i]
				if pitched {
					var packed []byte
					for r := range nhdGeo.BlockTokens {
						packed = append(packed, got[r*pitch:r*pitch+rb]...)
					}
					got = packed
				}
				sum := store.CRC32C(got)
				if (i == 0) != (sum == reqs[i].CRC) {
					t.Fatalf("vec %v pitched %v: request %d: CRC %08x, bytes %08x", vec, pitched, i, reqs[i].CRC, sum)
				}
			}
			if !errors.Is(reqs[2].Err, store.ErrCorrupt) {
				t.Fatalf("verified request of the corrupt group: %v", reqs[2].Err)
			}
		}
	}
}

// TestReadOrderings: requests in any order land right, whichever way the
// store orders them: blocks shuffled with each block's groups in slot order
// (the stretches are sorted and gathered), a block's groups reversed, one
// block asked as two interleaved stretches (even groups, then odd: the full
// sort), and a group asked twice.
func TestReadOrderings(t *testing.T) {
	geo := layout.Geometry{Layers: 4, KVHeads: 4, HeadDim: 64, BlockTokens: 16, DType: layout.BF16, Align: 512}
	const blocks = 24
	m := storetest.Formatted(t, geo, blocks+2, 512)
	s := openStore(t, m, store.Options{})
	per, gb := geo.GroupsPerBlock(), geo.GroupBytes()
	writeBlocks(t, s, geo, int(blocks), 1)
	order := []uint64{17, 3, 24, 9, 1, 12, 20, 5, 14, 2, 22, 7, 11, 19, 4, 16, 8, 23, 6, 13, 21, 10, 15, 18}
	var keys []layout.Key
	for n, b := range order {
		switch n {
		case 3: // reversed
			for i := per - 1; i >= 0; i-- {
				keys = append(keys, geo.KeyAt(b, i))
			}
		case 5: // even groups, then odd: interleaved stretches
			for i := 0; i < per; i += 2 {
				keys = append(keys, geo.KeyAt(b, i))
			}
			for i := 1; i < per; i += 2 {
				keys = append(keys, geo.KeyAt(b, i))
			}
		default:
			for i := range per {
				keys = append(keys, geo.KeyAt(b, i))
			}
		}
	}
	keys = append(keys, geo.KeyAt(17, 5)) // asked twice
	for _, interleave := range []bool{false, true} {
		ks := keys
		if !interleave {
			// Only whole blocks in slot order: the gather path alone.
			ks = nil
			for _, b := range order {
				for i := range per {
					ks = append(ks, geo.KeyAt(b, i))
				}
			}
		}
		reqs := make([]store.ReadReq, len(ks))
		for i, k := range ks {
			reqs[i] = store.ReadReq{Key: k, Buf: make([]byte, gb)}
		}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if r.Err != nil || !bytes.Equal(r.Buf, groupData(geo, r.Key, 1)) {
				t.Fatalf("interleave=%v: %v: %v", interleave, r.Key, r.Err)
			}
		}
	}
}

// groupOnDevice is the device offset of group k's payload in the store
// behind s (its slot's data area, past the two header copies).
func groupOnDevice(t *testing.T, s *store.Store, k layout.Key) int64 {
	t.Helper()
	gi, err := s.Stat(k)
	if err != nil {
		t.Fatal(err)
	}
	sb := s.Superblock()
	g := s.Geometry()
	return sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + g.Offset(g.Index(k))
}
