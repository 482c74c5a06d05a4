package ctl

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/tier"
)

// TestTierBlocks: with a DRAM tier, STORE_BLOCKS writes through it
// (keeping whole blocks it wrote, up to half the tier per call) and
// LOAD_BLOCKS lands from it, promoting what it lacks (a call of more
// blocks than the tier holds lands them all), serving repeats from memory,
// and never a version the store replaced, even by a write that did not pass
// through the tier (the GPU path's stores).
func TestTierBlocks(t *testing.T) {
	geo := blocksGeo
	for _, nhd := range []bool{false, true} {
		const nb = 8
		f := newBlocksFixtureTier(t, geo, nb, nb, nhd, 2)
		tr := f.srv.opts.Tier
		rnd := rand.New(rand.NewPCG(3, 4))
		for i := range f.cache {
			f.cache[i] = byte(rnd.UintN(256))
		}
		want := slices.Clone(f.cache)
		ids := make([]uint64, nb)
		for cb := range ids {
			ids[cb] = uint64(700 + cb)
			(&abi.BlockEntry{Block: ids[cb], CacheBlock: uint32(cb), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads),
				Kinds: abi.KindsBoth}).Marshal(f.arr[cb*abi.BlockEntrySize:])
		}
		var in, out [abi.BlocksSize]byte
		(&abi.Blocks{ABI: abi.Version, Target: f.target, Count: nb, Buffer: f.arrID}).Marshal(in[:])
		if n, errno := f.ss.Ioctl(abi.CmdStoreBlocks, in[:], out[:]); errno != 0 || n != nb {
			t.Fatalf("nhd=%v: store: %d, %v", nhd, n, errno)
		}
		clear(f.cache)
		if n := f.loadBlocks(t, geo, ids); n != nb {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		if !bytes.Equal(f.cache, want) {
			t.Fatalf("nhd=%v: blocks loaded through the tier differ from those stored", nhd)
		}
		m := tr.Metrics()
		if m.Blocks != 2 || m.Hits+m.Misses != uint64(nb*geo.GroupsPerBlock()) || m.WrittenBytes == 0 {
			t.Fatalf("nhd=%v: after the first load: %+v", nhd, m)
		}

		// The two blocks the tier holds, again: hits, the same bytes.
		var held []uint64
		for _, b := range ids {
			if tr.Holds(b) {
				held = append(held, b)
			}
		}
		if len(held) != 2 {
			t.Fatalf("nhd=%v: tier holds %v", nhd, held)
		}
		clear(f.cache)
		if n := f.loadBlocks(t, geo, held); n != 2 {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		if m2 := tr.Metrics(); m2.Hits != m.Hits+uint64(2*geo.GroupsPerBlock()) {
			t.Fatalf("nhd=%v: a repeat load missed: %+v", nhd, m2)
		}
		blockBytes := geo.BlockTokens * geo.KVHeads * geo.RowBytes()
		tensor := nb * blockBytes
		for r := range 2 * geo.Layers {
			for cb, b := range held {
				src := int(b-700) * blockBytes
				if !bytes.Equal(f.cache[r*tensor+cb*blockBytes:][:blockBytes], want[r*tensor+src:][:blockBytes]) {
					t.Fatalf("nhd=%v: block %d differs from the tier", nhd, b)
				}
			}
		}

		// Replaced in the store behind the tier's back: the new bytes.
		b := held[0]
		reqs := make([]store.WriteReq, geo.GroupsPerBlock())
		for i := range reqs {
			reqs[i] = store.WriteReq{Key: geo.KeyAt(b, i), Data: bytes.Repeat([]byte{byte(i + 1)}, geo.GroupBytes())}
		}
		if err := f.st.Write(reqs); err != nil {
			t.Fatal(err)
		}
		if n := f.loadBlocks(t, geo, []uint64{b}); n != 1 {
			t.Fatalf("nhd=%v: %d blocks loaded", nhd, n)
		}
		for i := range geo.GroupsPerBlock() {
			k := geo.KeyAt(b, i)
			o := (2*k.Layer+int(k.Kind))*tensor + k.Head*geo.BlockTokens*geo.RowBytes()
			if nhd {
				o = (2*k.Layer+int(k.Kind))*tensor + k.Head*geo.RowBytes()
			}
			if f.cache[o] != byte(i+1) {
				t.Fatalf("nhd=%v: group %v: %#x, want the store's new %#x", nhd, k, f.cache[o], i+1)
			}
		}
	}
}

// TestTierV1: v1 STORE writes through the tier, which keeps the whole
// block it wrote, so that v1 LOAD lands it from memory at once, and a
// version replaced in the store is never served.
func TestTierV1(t *testing.T) {
	f := newFixtureTier(t, 8, Options{}, 4)
	tr := f.srv.opts.Tier
	ss := f.open(0, 0)
	keys := blockKeys(0x10)
	s := newShm(t, len(keys)*f.gb, 4096)
	id := mustRegister(t, ss, s)
	defer unregister(ss, id)
	var es []abi.Entry
	for i, k := range keys {
		copy(s.mem[i*f.gb:], groupData(k, 1))
		es = append(es, entry(k, id, uint64(i*f.gb), 0))
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %+v", e)
		}
	}
	for round, version := range []int{1, 1, 2} {
		if round == 2 {
			f.put(keys, 2) // straight to the store
		}
		clear(s.mem[:s.n])
		hits := tr.Metrics().Hits
		for _, e := range mustBatch(t, ss, true, es) {
			if e.Status != abi.OK {
				t.Fatalf("load: %+v", e)
			}
		}
		for i, k := range keys {
			if !bytes.Equal(s.mem[i*f.gb:(i+1)*f.gb], groupData(k, version)) {
				t.Fatalf("round %d: %v: loaded bytes are not version %d", round, k, version)
			}
		}
		if hit := tr.Metrics().Hits > hits; hit != (round < 2) {
			t.Fatalf("round %d: served from the tier: %v", round, hit)
		}
	}
	s.checkGuard(t)
}

// TestTierGPU: loads into GPU memory from a store whose file is not in
// memory read through the tier (the repeat is a hit), never a version the
// store replaced; stores from GPU memory write through it and drop its
// copy of the block.
func TestTierGPU(t *testing.T) {
	o, fakes := fakeGPUOptions(t, 1, fakeArena)
	f := newFixtureTier(t, 16, Options{GPU: o}, 4)
	tr := f.srv.opts.Tier
	dev := fakes[0]
	ss := f.open(0, 0)
	gb := uint64(f.gb)
	keys := blockKeys(3)
	f.put(keys, 1)
	base := gputest.Base
	n := uint64(len(keys)) * gb
	id := mustRegisterCUDA(t, ss, 0, base, 2*n, 0, 2*n)
	load := func(block uint64, at uint64, version int, src uint64) {
		t.Helper()
		var es []abi.Entry
		for i, k := range blockKeys(block) {
			es = append(es, entry(k, id, at+uint64(i)*gb, 0))
		}
		dev.Fill(base+at, bytes.Repeat([]byte{0xAB}, int(n)))
		for i, e := range mustBatch(t, ss, true, es) {
			k := blockKeys(src)[i]
			if e.Status != abi.OK || !bytes.Equal(dev.Mem(base+at+uint64(i)*gb, int(gb)), groupData(k, version)) {
				t.Fatalf("block %d entry %d: %v, or not version %d", block, i, e.Status, version)
			}
		}
	}
	for round, version := range []int{1, 1, 2} {
		if round == 2 {
			f.put(keys, 2) // straight to the store
		}
		hits := tr.Metrics().Hits
		load(3, 0, version, 3)
		if hit := tr.Metrics().Hits > hits; hit != (round == 1) {
			t.Fatalf("round %d: served from the tier: %v", round, hit)
		}
	}
	// Store the device's tiles of block 3 as block 9, load them back.
	var es []abi.Entry
	for i, k := range keys {
		k.Block = 9
		es = append(es, entry(k, id, uint64(i)*gb, 0))
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %v", e.Status)
		}
	}
	load(9, n, 2, 3)
	if !tr.Holds(9) {
		t.Fatal("a GPU load did not bring block 9 into the tier")
	}
	for _, e := range mustBatch(t, ss, false, es) {
		if e.Status != abi.OK {
			t.Fatalf("store: %v", e.Status)
		}
	}
	if tr.Holds(9) {
		t.Fatal("a GPU store of block 9 left the tier's copy")
	}
	if v := dev.Violations(); len(v) != 0 {
		t.Fatalf("fake device violations: %v", v)
	}
}

// tierGPU is a server on an in-memory store (its file not in host memory,
// as on a disk) with a DRAM tier, whose device 0 is a fake that checks
// loads "on the GPU" (fakeLander) and copies in 2D; a session holds a
// CUDA buffer of a target of nb cache blocks (HND or NHD).
type tierGPU struct {
	f    *fixture
	tr   *tier.Tier
	dev  *fakeGPU
	ss   *Session
	tid  uint32
	nb   int
	nhd  bool
	size uint64
	base uint64 // device address of the CUDA buffer
}

// newTierGPU makes the server and one session; the device has room for
// sessions of them (another). Direct loads go in chunks of chunk groups.
func newTierGPU(t *testing.T, slots, tierBlocks, nb int, nhd, refuse bool, sessions, chunk int) *tierGPU {
	t.Helper()
	geo := testGeo
	size := uint64(2 * geo.Layers * nb * geo.BlockTokens * geo.KVHeads * geo.RowBytes())
	verified := 0
	// Room above the targets for device scratch: the fake's AllocDevice
	// does not reuse the ranges freed.
	o, fakes := fakeGPUOptions(t, 1, sessions*int(size)+16<<20, func(o *GPUOptions, fakes []*fakeGPU) {
		o.VerifyOnGPU = true
		o.StagingSize = chunk / 2 * geo.GroupBytes() // a direct chunk is two buffers' worth
		o.NewVerifier = func(ordinal int, geo gpu.Geometry) (gpu.Checker, error) {
			return &fakeLander{fakeChecker: fakeChecker{dev: fakes[ordinal], geo: geo, verified: &verified}}, nil
		}
		fakes[0].Enable2D = true
		if refuse {
			fakes[0].FailRegister = func() error { return errors.New("fake: cannot pin") }
		}
	})
	f := newFixtureTier(t, slots, Options{GPU: o}, tierBlocks)
	g := (&tierGPU{f: f, tr: f.srv.opts.Tier, dev: fakes[0], nb: nb, nhd: nhd, size: size}).another(t, 0)
	// Staged loads of pitched tiles land them through batches of 64
	// groups' scratch, not 128 MiB: set before any load.
	f.srv.gpus.devs[0].pipe.LandBatch = 64 * geo.GroupBytes()
	deadline := time.Now().Add(10 * time.Second)
	for !refuse {
		if f.srv.Metrics().GPUTierRegistered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the tier's memory was never registered with the device")
		}
		time.Sleep(time.Millisecond)
	}
	if refuse {
		time.Sleep(20 * time.Millisecond) // a registration would be done by now
		if f.srv.Metrics().GPUTierRegistered || g.dev.Registered() != 0 {
			t.Fatal("registered although the device refused")
		}
	}
	return g
}

// another is g with a session of its own and a CUDA buffer (the i-th of
// the device) holding its target.
func (g *tierGPU) another(t *testing.T, i int) *tierGPU {
	t.Helper()
	c := *g
	c.ss, c.base = g.f.open(0, 0), gputest.Base+uint64(i)*g.size
	id := mustRegisterCUDA(t, c.ss, 0, c.base, g.size, 0, g.size)
	var errno syscall.Errno
	if c.tid, errno = registerTarget(c.ss, testTarget(id, g.nb, g.nhd)); errno != 0 {
		t.Fatalf("register target: %v", errno)
	}
	return &c
}

// load loads blocks into cache blocks 0, 1, … of the target (device memory
// filled with 0x5A first) and returns the entries' outcomes.
func (g *tierGPU) load(t *testing.T, blocks ...uint64) []abi.BlockEntry {
	t.Helper()
	got, err := g.tryLoad(blocks...)
	if err != nil {
		t.Fatal(err)
	}
	if v := g.dev.Violations(); len(v) != 0 {
		t.Fatal(v)
	}
	return got
}

// tryLoad is load for any goroutine: it returns the ioctl's failure.
func (g *tierGPU) tryLoad(blocks ...uint64) ([]abi.BlockEntry, error) {
	geo := testGeo
	g.dev.Fill(g.base, bytes.Repeat([]byte{0x5A}, int(g.size)))
	in := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Target: g.tid, Count: uint32(len(blocks))}).Marshal(in)
	for i, b := range blocks {
		e := abi.BlockEntry{Block: b, CacheBlock: uint32(i), LayerCount: uint16(geo.Layers), HeadCount: uint16(geo.KVHeads), Kinds: abi.KindsBoth}
		e.Marshal(in[abi.BlocksSize+i*abi.BlockEntrySize:])
	}
	out := make([]byte, len(in))
	if _, errno := g.ss.Ioctl(abi.CmdLoadBlocksInline, in, out); errno != 0 {
		return nil, fmt.Errorf("load blocks: %w", errno)
	}
	got := make([]abi.BlockEntry, len(blocks))
	for i := range got {
		got[i].Unmarshal(out[abi.BlocksSize+i*abi.BlockEntrySize:])
	}
	return got, nil
}

// group is group k as it lies in cache block cb of the target.
func (g *tierGPU) group(cb int, k layout.Key) []byte {
	geo := testGeo
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := g.nb * T * H * rb
	base := g.base + uint64((2*k.Layer+int(k.Kind))*tensor)
	if !g.nhd {
		return g.dev.Mem(base+uint64((cb*H+k.Head)*T*rb), geo.GroupBytes())
	}
	var b []byte
	for r := range T {
		b = append(b, g.dev.Mem(base+uint64(cb*T*H*rb+r*H*rb+k.Head*rb), rb)...)
	}
	return b
}

// check fails t unless every block of blocks loaded whole as version[b]
// into its cache block.
func (g *tierGPU) check(t *testing.T, got []abi.BlockEntry, blocks []uint64, version map[uint64]int) {
	t.Helper()
	for i, b := range blocks {
		if got[i].Status != abi.OK || int(got[i].GroupsOK) != testGeo.GroupsPerBlock() {
			t.Fatalf("block %d: %v, %d groups", b, got[i].Status, got[i].GroupsOK)
		}
		for _, k := range blockKeys(b) {
			if !bytes.Equal(g.group(i, k), groupData(k, version[b])) {
				t.Fatalf("%v in cache block %d is not version %d", k, i, version[b])
			}
		}
	}
}

// TestTierGPUDirect: with the GPU checking loads and the tier's memory
// registered with it, a LOAD_BLOCKS of blocks the tier holds is copied by
// the device straight from the tier's memory (a 2D copy per block, or per
// chunk of half a block, into an HND target; one copy into scratch per
// chunk for an NHD one), checked
// there, the same bytes as the store's; misses go through staging and fill
// the tier. A byte of the tier's copy changed on purpose is never served
// (the block is read again from the store); a write or delete that ends
// while the copy is in flight is never undone by it; a refused
// registration leaves every load on staging, still through the tier; and
// Close unregisters the tier's memory.
func TestTierGPUDirect(t *testing.T) {
	for _, mode := range []string{"hnd", "nhd", "refused", "chunks"} {
		t.Run(mode, func(t *testing.T) {
			const nb = 4
			// Chunks of whole blocks, or ("chunks") of half a block, loaded
			// by several workers.
			chunk := 8 * testGeo.GroupsPerBlock()
			if mode == "chunks" {
				chunk = testGeo.GroupsPerBlock() / 2
			}
			g := newTierGPU(t, 16, 4, nb, mode == "nhd", mode == "refused", 1, chunk)
			f, tr := g.f, g.tr
			gpb := uint64(testGeo.GroupsPerBlock())
			version := map[uint64]int{}
			blocks := []uint64{1, 2, 3, 4}
			for _, b := range blocks {
				f.put(blockKeys(b), 1)
				version[b] = 1
			}
			cached := func() uint64 { return f.srv.Metrics().GPUTierDirect }

			// Misses: staged, and the tier keeps the blocks. In chunks of
			// half a block (staging buffers of a quarter), a block's later
			// quarters may hit the copy its first quarter's miss filled,
			// when they are read one after the other; the first read of
			// each block misses.
			g.check(t, g.load(t, blocks...), blocks, version)
			m0 := tr.Metrics()
			if m0.Blocks != nb || m0.Hits+m0.Misses != nb*gpb || cached() != 0 ||
				mode != "chunks" && m0.Hits != 0 || m0.Misses < nb*min(uint64(chunk/2), gpb) {
				t.Fatalf("after the first load: %+v, %d groups direct", m0, cached())
			}
			// Hits: straight from the tier's memory.
			calls := g.dev.Calls()
			g.check(t, g.load(t, blocks...), blocks, version)
			direct := uint64(0)
			if mode != "refused" {
				direct = nb * gpb
				if c := g.dev.Calls() - calls; mode == "hnd" && c > nb || mode == "nhd" && c > 1 || mode == "chunks" && c > 2*nb {
					t.Fatalf("%d copy calls for %d blocks from the tier", c, nb)
				}
			}
			if m := tr.Metrics(); m.Hits != m0.Hits+nb*gpb || cached() != direct {
				t.Fatalf("after the repeat: %+v, %d groups direct, want %d", m, cached(), direct)
			}

			// A byte of block 2's copy in the tier changed: never served.
			bad := blockKeys(2)[5]
			reqs := []store.LocateReq{{Key: bad}}
			pins, err := tr.Locate(reqs, nil)
			if err != nil || reqs[0].Err != nil {
				t.Fatal(err, reqs[0].Err)
			}
			tr.Arena()[reqs[0].Off+7] ^= 0xff
			tr.Unpin(pins)
			before := cached()
			g.check(t, g.load(t, 2), []uint64{2}, version)
			if mode == "refused" {
				if m := tr.Metrics(); m.Corrupt != 1 {
					t.Fatalf("corrupt copy, staged: %+v", m)
				}
			} else {
				// The corrupt group's tile (HND: all its heads) is read
				// again whole, a group of NHD alone. In chunks of half a
				// block, the other half may be located after the block
				// was dropped: read through staging too.
				lost := uint64(testGeo.KVHeads)
				if mode == "nhd" {
					lost = 1
				}
				if d := cached() - before; tr.Metrics().Corrupt != 1 || d != gpb-lost && (mode != "chunks" || d != gpb/2-lost) {
					t.Fatalf("corrupt copy: %+v, %d groups direct", tr.Metrics(), d)
				}
				before = cached()
				g.check(t, g.load(t, 2), []uint64{2}, version)
				if cached()-before != gpb {
					t.Fatalf("block 2 read again into the tier: %d groups direct", cached()-before)
				}
			}
			if mode == "refused" {
				return
			}

			// A write (straight to the store) and a delete (through the
			// tier) that end while the copy from the tier is in flight: the
			// copy is not served, the load reads the store's version.
			var hook atomic.Pointer[func()]
			ran := 0
			g.dev.FailCopy = func(int) error {
				if h := hook.Swap(nil); h != nil {
					(*h)()
					ran++
				}
				return nil
			}
			var hookErr error
			write := func() {
				reqs := make([]store.WriteReq, gpb)
				for i, k := range blockKeys(3) {
					reqs[i] = store.WriteReq{Key: k, Data: groupData(k, 2)}
				}
				hookErr = f.st.Write(reqs)
			}
			hook.Store(&write)
			before = cached()
			got := g.load(t, 3)
			version[3] = 2
			if ran != 1 || hookErr != nil {
				t.Fatalf("the write during the copy: ran %d, %v", ran, hookErr)
			}
			g.check(t, got, []uint64{3}, version)
			if cached() != before {
				t.Fatalf("%d groups of a block written during the copy served from the tier", cached()-before)
			}
			del := func() { hookErr = tr.DeleteBlock(4) }
			hook.Store(&del)
			if got := g.load(t, 4); ran != 2 || hookErr != nil || got[0].Status != abi.Absent || got[0].GroupsOK != 0 {
				t.Fatalf("a block deleted during the copy: hook ran %d (%v), %v, %d groups", ran, hookErr, got[0].Status, got[0].GroupsOK)
			}
			if cached() != before {
				t.Fatalf("%d groups of a block deleted during the copy served from the tier", cached()-before)
			}

			g.ss.Release()
			if err := f.srv.Close(); err != nil {
				t.Fatal(err)
			}
			if r := g.dev.Registered(); r != 0 {
				t.Fatalf("%d host ranges still registered after Close", r)
			}
		})
	}
}

// TestTierGPUConcurrent: loads into GPU memory from several sessions at
// once, through a tier that holds fewer blocks than they use (evictions
// all along, while copies from the tier's memory are in flight), while a
// writer replaces blocks (through the tier and behind its back): every
// group loaded is a version no older than the last write that completed
// before its load started, and no newer than the last one started before
// it ended; some loads were hits copied from the tier's memory.
func TestTierGPUConcurrent(t *testing.T) {
	for _, nhd := range []bool{false, true} {
		t.Run(fmt.Sprint("nhd=", nhd), func(t *testing.T) {
			const blocks, loaders, rounds = 8, 4, 40
			g := newTierGPU(t, 16, 3, 2, nhd, false, loaders, 8*testGeo.GroupsPerBlock())
			g.dev.Delay, g.dev.Jitter = 20*time.Microsecond, 50*time.Microsecond
			f, tr := g.f, g.tr
			var started, done [blocks]atomic.Int64
			for b := range uint64(blocks) {
				f.put(blockKeys(b), 1)
				started[b].Store(1)
				done[b].Store(1)
			}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // the writer
				defer wg.Done()
				rnd := rand.New(rand.NewPCG(1, 2))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					b := rnd.Uint64N(blocks)
					v := started[b].Add(1)
					reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
					for j, k := range blockKeys(b) {
						reqs[j] = store.WriteReq{Key: k, Data: groupData(k, int(v))}
					}
					var err error
					if i%2 == 0 {
						err = tr.Write(reqs)
					} else {
						err = f.st.Write(reqs)
					}
					if err != nil {
						t.Error(err)
						return
					}
					done[b].Store(v)
					time.Sleep(200 * time.Microsecond)
				}
			}()
			var lwg sync.WaitGroup
			for l := range loaders {
				lg := g
				if l > 0 {
					lg = g.another(t, l)
				}
				lwg.Add(1)
				go func() {
					defer lwg.Done()
					rnd := rand.New(rand.NewPCG(uint64(l), 9))
					pair := []uint64{0, 1}
					for range rounds {
						if rnd.IntN(2) == 0 { // else the same blocks again: likely hits
							pair[0] = rnd.Uint64N(blocks)
							pair[1] = (pair[0] + 1 + rnd.Uint64N(blocks-1)) % blocks
						}
						var lo [2]int64
						for i, b := range pair {
							lo[i] = done[b].Load()
						}
						got, err := lg.tryLoad(pair...)
						if err != nil {
							t.Error(err)
							return
						}
						for i, b := range pair {
							hi := started[b].Load()
							if got[i].Status != abi.OK || int(got[i].GroupsOK) != testGeo.GroupsPerBlock() {
								t.Errorf("block %d: %v, %d groups", b, got[i].Status, got[i].GroupsOK)
								return
							}
							for _, k := range blockKeys(b) {
								have := lg.group(i, k)
								ok := false
								for v := lo[i]; v <= hi && !ok; v++ {
									ok = bytes.Equal(have, groupData(k, int(v)))
								}
								if !ok {
									t.Errorf("%v: not a version from %d to %d", k, lo[i], hi)
									return
								}
							}
						}
					}
				}()
			}
			lwg.Wait()
			close(stop)
			wg.Wait()
			if v := g.dev.Violations(); len(v) != 0 {
				t.Fatal(v)
			}
			m := tr.Metrics()
			n := f.srv.Metrics().GPUTierDirect
			// Each group loaded counts once, a hit or a miss, whatever
			// route it took (a copy found stale is read again, a miss).
			if m.Hits+m.Misses != loaders*rounds*2*uint64(testGeo.GroupsPerBlock()) {
				t.Fatalf("%d hits and %d misses of %d groups loaded", m.Hits, m.Misses, loaders*rounds*2*testGeo.GroupsPerBlock())
			}
			if m.Evictions == 0 || n == 0 || m.Blocks > 3 {
				t.Fatalf("%+v, %d groups copied from the tier's memory", m, n)
			}
			t.Logf("%+v, %d groups copied from the tier's memory", m, n)
		})
	}
}
