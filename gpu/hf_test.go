package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// hfTarget is a Hugging Face cache on the fake device: per (layer, kind)
// a tensor [heads, seq, ...] of nb cache blocks, tensor lk at Base +
// lk*heads*seq, head h of cache block c at its tensor + h*seq + c*gb.
type hfTarget struct {
	geo     layout.Geometry
	gb, seq int // group bytes, the sequence stride (head stride)
}

func newHFTarget(geo layout.Geometry, nb int) hfTarget {
	return hfTarget{geo: geo, gb: geo.GroupBytes(), seq: nb * geo.GroupBytes()}
}

func (h hfTarget) size() int { return 2 * h.geo.Layers * h.geo.KVHeads * h.seq }

func (h hfTarget) dst(lk, head, cb int) uint64 {
	return gputest.Base + uint64((lk*h.geo.KVHeads+head)*h.seq+cb*h.gb)
}

// items are the pipeline items of loading block b into cache block cb[b]
// for each b of blocks: as tiles (a (layer, kind) of all heads one item,
// HeadStride the sequence stride) or one group per item.
func (h hfTarget) items(blocks []uint64, cb []int, tiles bool) []gpu.Item {
	H, L := h.geo.KVHeads, h.geo.Layers
	var its []gpu.Item
	crcs := make([]uint32, len(blocks)*2*L*H)
	ts := make([]gpu.Tile, len(blocks)*2*L)
	for i, b := range blocks {
		for lk := range 2 * L {
			k := layout.Key{Block: b, Layer: lk / 2, Kind: layout.Kind(lk % 2)}
			if tiles {
				n := len(its)
				ts[n] = gpu.Tile{Heads: H, HeadStride: h.seq, CRCs: crcs[n*H : (n+1)*H]}
				its = append(its, gpu.Item{Key: k, Dst: h.dst(lk, 0, cb[i]), Tile: &ts[n]})
				continue
			}
			for hd := range H {
				k.Head = hd
				its = append(its, gpu.Item{Key: k, Dst: h.dst(lk, hd, cb[i])})
			}
		}
	}
	return its
}

// hfPipeline is a pipeline for loads into h on a fake device of its size
// with 2D and batched copies, the default staging (16 buffers of 4 MiB,
// depth 8) and the checksums checked on the device (a group that fails is
// zeroed where it landed, as the CRC32C kernel does); direct: with the
// store's file in memory (m) as its host view. done releases them.
func hfPipeline(t *testing.T, h hfTarget, st *store.Store, m *storetest.Mem, direct bool) (*gpu.Pipeline, *gputest.Device, func()) {
	t.Helper()
	gbytes := h.geo.GroupBytes()
	// Above the cache, device scratch for direct loads with Land: its
	// budget and one chunk (8 MiB) per worker over it.
	const scratch, budget = 128 << 20, 64 << 20
	dev := gputest.NewDevice(h.size() + scratch)
	dev.Enable2D, dev.EnableBatch = true, true
	pool, err := gpu.NewPool(dev, gpu.PoolConfig{Count: 16, Size: 4 << 20})
	if err != nil {
		dev.Close()
		t.Fatal(err)
	}
	p := &gpu.Pipeline{Dev: dev, Pool: pool, Geo: gpu.Geometry{GroupBytes: gbytes, Rows: h.geo.BlockTokens, RowBytes: h.geo.RowBytes()}, Depth: 8, ScratchBudget: budget}
	p.Verify = func(items []*gpu.Item) error {
		for _, it := range items {
			for j := range it.Groups() {
				if dst, crc := it.Group(j); !it.Skip(j) && store.CRC32C(dev.Mem(dst, gbytes)) != crc {
					dev.Fill(dst, make([]byte, gbytes))
					it.FailHead(j, store.ErrCorrupt)
				}
			}
		}
		return nil
	}
	if direct {
		m.SetHostView(true)
		p.SetHost(st.HostView())
	}
	return p, dev, func() {
		if direct {
			m.SetHostView(false)
		}
		pool.Close()
		dev.Close()
	}
}

// groupErrs is each group's outcome of items (a tile's heads one by one:
// nil, or the tile's error for a head in Bad).
func groupErrs(its []gpu.Item) []error {
	var out []error
	for _, it := range its {
		for j := range it.Groups() {
			var err error
			if it.Skip(j) {
				err = it.Err
			}
			out = append(out, err)
		}
	}
	return out
}

// TestTilesHF: a Hugging Face cache's (layer, kind) loaded as one tile of
// its heads (a sequence apart on the device) gives exactly what one group
// per item gives (the device's memory, and each group's outcome: a corrupt
// head zeroed and failed alone, a partial block's missing heads and an
// absent block's tiles left as they were), whatever the order of the cache
// blocks, through staging and direct from the store's file in memory; and
// with consecutive cache blocks staged head by head it moves a chunk with
// one 2D copy. Direct with Land, the tiles' heads go packed into device
// scratch and Land places them: the same bytes and outcomes, and at most
// one copy per tile where whole blocks load.
func TestTilesHF(t *testing.T) {
	H, L := tileGeo.KVHeads, tileGeo.Layers
	const nb = 8
	st, m, bad := tileStore(t, tileGeo, nb)
	all := []uint64{0, 1, 2, 3, 4, 5, 6, 7}
	cases := []struct {
		name   string
		blocks []uint64
		cb     []int
	}{
		{"consecutive", all, []int{0, 1, 2, 3, 4, 5, 6, 7}},
		{"runs", all, []int{3, 4, 5, 0, 1, 7, 6, 2}},
		{"scattered", []uint64{5, 0, 3, 1}, []int{6, 0, 3, 4}},
		{"whole", []uint64{0, 1, 5, 6, 7}, []int{0, 1, 2, 3, 4}},
	}
	for _, per := range []int{2 * tileGeo.GroupsPerBlock(), 3*H + 1} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/per=%d", tc.name, per), func(t *testing.T) {
				h := newHFTarget(tileGeo, nb)
				old := bytes.Repeat([]byte{0x5A}, h.size())
				load := func(tiles, direct, land bool) ([]gpu.Item, []byte, int, int) {
					// Whole blocks in whole buffers where the case counts
					// copies (a load smaller than its depth of buffers
					// spreads over them, cutting blocks).
					depth := 4
					if tc.name == "whole" {
						depth = 1
					}
					r := newRig(t, 4, per, depth)
					r.dev.Enable2D = true
					n := 0
					r.p.Verify = tileVerify(r, &n)
					lands := 0
					if land {
						r.p.Land = deviceLand(r.dev, r.p.Geo, &lands)
					}
					r.dev.Fill(gputest.Base, old)
					if direct {
						m.SetHostView(true)
						defer m.SetHostView(false)
						r.p.SetHost(st.HostView())
					}
					its := h.items(tc.blocks, tc.cb, tiles)
					if err := r.p.Load(st, its, tiles); err != nil {
						t.Fatal(err)
					}
					if direct != (r.p.Direct() > 0) {
						t.Fatalf("direct %v: %d groups loaded direct", direct, r.p.Direct())
					}
					r.checkClean(t)
					if land {
						// Every tile went through scratch: Land checked it.
						if lands == 0 || n != 0 {
							t.Fatalf("direct with Land: %d Land calls, %d tiles verified in place", lands, n)
						}
						n = lands
					}
					return its, r.dev.Mem(gputest.Base, h.size()), r.dev.Calls(), n
				}
				want, wmem, wcalls, _ := load(false, false, false)
				got, gmem, gcalls, tiles := load(true, false, false)
				dgot, dmem, _, dtiles := load(true, true, false)
				lgot, lmem, lcalls, _ := load(true, true, true)
				if tiles == 0 || dtiles == 0 {
					t.Fatal("Verify saw no tiles")
				}
				if !bytes.Equal(gmem, wmem) || !bytes.Equal(dmem, wmem) || !bytes.Equal(lmem, wmem) {
					t.Fatal("device memory differs between tiles (staged, direct, or direct with Land) and a group per item")
				}
				for i := range got {
					for _, d := range []gpu.Item{dgot[i], lgot[i]} {
						if got[i].Tile.Bad != d.Tile.Bad || got[i].Tile.Failed != d.Tile.Failed || (got[i].Err == nil) != (d.Err == nil) {
							t.Fatalf("%v: %b, %v staged, %b, %v direct", got[i].Key, got[i].Tile.Bad, got[i].Err, d.Tile.Bad, d.Err)
						}
					}
				}
				if tc.name == "whole" && lcalls > len(tc.blocks)*2*L {
					// This shape's groups lie a stride apart in their slot:
					// a tile's heads are one 2D copy into scratch.
					t.Fatalf("direct with Land: %d copy calls for %d tiles", lcalls, len(tc.blocks)*2*L)
				}
				we, ge := groupErrs(want), groupErrs(got)
				if len(we) != len(ge) {
					t.Fatalf("%d groups as tiles, %d one per item", len(ge), len(we))
				}
				for i := range we {
					if (we[i] == nil) != (ge[i] == nil) || we[i] != nil && !errors.Is(ge[i], store.ErrNotFound) && !errors.Is(ge[i], store.ErrCorrupt) {
						t.Fatalf("group %d: %v as a tile, %v one per item", i, ge[i], we[i])
					}
				}
				// The expected bytes and outcomes themselves.
				for i, b := range tc.blocks {
					for lk := range 2 * L {
						it := &got[i*2*L+lk]
						for hd := range H {
							k := layout.Key{Block: b, Layer: lk / 2, Kind: layout.Kind(lk % 2), Head: hd}
							dst := h.dst(lk, hd, tc.cb[i])
							w, failed := tileData(k), false
							switch {
							case b == 4 || b == 2 && hd >= 2:
								w, failed = old[:h.gb], true
							case k == bad:
								w, failed = make([]byte, h.gb), true
							}
							if !bytes.Equal(gmem[dst-gputest.Base:dst-gputest.Base+uint64(h.gb)], w) {
								t.Fatalf("%v: wrong bytes on the device", k)
							}
							if it.Skip(hd) != failed {
								t.Fatalf("%v: failed %v, want %v (%v)", k, it.Skip(hd), failed, it.Err)
							}
						}
						if k := it.Key; k.Block == bad.Block && k.Layer == bad.Layer && k.Kind == bad.Kind && !errors.Is(it.Err, store.ErrCorrupt) {
							t.Fatalf("%v: %v, want corrupt", k, it.Err)
						}
					}
				}
				if gcalls > wcalls {
					t.Fatalf("%d copy calls as tiles, %d one group per item", gcalls, wcalls)
				}
				if tc.name == "whole" && per > tileGeo.GroupsPerBlock() {
					// Whole blocks at consecutive cache blocks, two per
					// chunk: one 2D copy per chunk.
					if chunks := (len(tc.blocks) + 1) / 2; gcalls != chunks {
						t.Fatalf("%d copy calls for %d chunks of consecutive whole blocks", gcalls, chunks)
					}
				}
				t.Logf("%d copy calls as tiles, %d one group per item, %d direct with Land", gcalls, wcalls, lcalls)
			})
		}
	}
}

// llama8B is the store shape of the performance figures (docs/
// performance.md, "Conventions"): 2 MiB blocks of 512 groups of 4 KiB.
var llama8B = layout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: 512}

// TestHFCopies counts the copy calls of a load of whole blocks of the
// Llama-3-8B shape into a Hugging Face cache (one allocation, every (layer,
// kind) tensor after the one before, as kvfs.hf allocates it) at
// consecutive cache blocks, with 2D and batched copies and the default
// staging (16 buffers of 4 MiB, depth 8): as tiles, one 2D copy per staging
// buffer of two blocks, fewer than one per block; one group per item
// through staging, for comparison. Straight from the store's file in
// memory (direct), where a head's blocks lie in different slots, one 2D
// copy per block, as tiles or not. Every route lands the same bytes.
// Storing the blocks back copies each to staging with one 2D copy.
func TestHFCopies(t *testing.T) {
	geo := llama8B
	nb := 64
	if testing.Short() {
		nb = 16
	}
	if v := os.Getenv("KVFS_TEST_HF_BLOCKS"); v != "" {
		// A larger load, for counting its copies (2,048 blocks need
		// about 9 GiB of memory).
		n, err := strconv.Atoi(v)
		if err != nil || n < 2 {
			t.Fatalf("KVFS_TEST_HF_BLOCKS=%q: want a count of blocks of 2 or more", v)
		}
		nb = n
	}
	gbytes := geo.GroupBytes()
	st, m := hfBlocksStore(t, geo, nb, false)
	h := newHFTarget(geo, nb)
	blocks, cb := make([]uint64, nb), make([]int, nb)
	for i := range blocks {
		blocks[i], cb[i] = uint64(i), i
	}
	load := func(route string) (int, uint32) {
		direct := strings.HasPrefix(route, "direct")
		p, dev, done := hfPipeline(t, h, st, m, direct)
		defer done()
		lands := 0
		if strings.HasSuffix(route, "land") {
			p.Land = deviceLand(dev, p.Geo, &lands)
		}
		tiled := strings.Contains(route, "tiles")
		its := h.items(blocks, cb, tiled)
		if err := p.Load(st, its, tiled); err != nil {
			t.Fatal(err)
		}
		for _, it := range its {
			if it.Err != nil {
				t.Fatalf("%s: %v: %v", route, it.Key, it.Err)
			}
		}
		if direct != (p.Direct() > 0) {
			t.Fatalf("%s: %d groups loaded direct", route, p.Direct())
		}
		if (lands > 0) != strings.HasSuffix(route, "land") {
			t.Fatalf("%s: %d Land calls", route, lands)
		}
		return dev.Calls(), store.CRC32C(dev.Mem(gputest.Base, h.size()))
	}
	tiles, tmem := load("tiles")
	groups, gmem := load("groups")
	direct, dmem := load("direct")
	dtiles, dtmem := load("direct-tiles")
	dland, dlmem := load("direct-tiles-land")
	if tmem != gmem || tmem != dmem || tmem != dtmem || tmem != dlmem {
		t.Fatal("the routes landed different bytes")
	}
	t.Logf("%d blocks, %d items as tiles, %d one group per item: staged %d copy calls as tiles, %d one group per item; direct %d as tiles, %d one group per item, %d as tiles through scratch (Land)",
		nb, nb*2*geo.Layers, nb*geo.GroupsPerBlock(), tiles, groups, dtiles, direct, dland)
	if dtiles > nb {
		// The store's blocks lie apart in its file: one 2D copy per block.
		t.Fatalf("%d copy calls as tiles direct for %d blocks", dtiles, nb)
	}
	// Through scratch, the blocks' tiles packed one after another as their
	// slots lie in the file (blocks in consecutive slots here): one copy
	// per direct chunk of 2,048 groups.
	if chunks := nb * geo.GroupsPerBlock() / 2048; dland > chunks {
		t.Fatalf("%d copy calls as tiles through scratch for %d chunks of consecutive blocks", dland, chunks)
	}
	if chunks := nb * int(geo.PayloadBytes()) / (4 << 20); tiles > chunks || tiles > groups {
		t.Fatalf("%d copy calls as tiles for %d staging buffers of blocks (%d one group per item)", tiles, chunks, groups)
	}

	// The way back: the cache's blocks stored (one group per item) copy
	// to staging with one 2D copy per block.
	dev := gputest.NewDevice(h.size())
	defer dev.Close()
	dev.Enable2D = true
	pool, err := gpu.NewPool(dev, gpu.PoolConfig{Count: 16, Size: 4 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	p := &gpu.Pipeline{Dev: dev, Pool: pool, Geo: gpu.Geometry{GroupBytes: gbytes, Rows: geo.BlockTokens, RowBytes: geo.RowBytes()}, Depth: 8}
	its := h.items(blocks, cb, false)
	marked := func(i int) bool { return i%geo.GroupsPerBlock() == 0 || i == len(its)-1 }
	for i := range its {
		if marked(i) {
			dev.Fill(its[i].Dst, bytes.Repeat([]byte{byte(i / geo.GroupsPerBlock())}, gbytes))
		}
	}
	out := storetest.Open(t, storetest.Formatted(t, geo, int64(nb), 512), store.Options{})
	if err := p.Store(out, its); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if it.Err != nil {
			t.Fatalf("store: %v: %v", it.Key, it.Err)
		}
		if marked(i) {
			q := []store.ReadReq{{Key: it.Key, Buf: make([]byte, gbytes)}}
			if err := out.Read(q); err != nil || q[0].Err != nil || !bytes.Equal(q[0].Buf, bytes.Repeat([]byte{byte(i / geo.GroupsPerBlock())}, gbytes)) {
				t.Fatalf("store: %v: %v, %v", it.Key, err, q[0].Err)
			}
		}
	}
	t.Logf("stored %d blocks, one group per item: %d copy calls", nb, dev.Calls())
	if dev.Calls() > nb {
		t.Fatalf("%d copy calls storing %d blocks", dev.Calls(), nb)
	}
}

// TestHFLayerCopies counts the copy calls of direct loads of a few layers
// of many blocks (a layer-by-layer load) into a Hugging Face cache, from a
// store whose blocks were written in order (consecutive slots) or in
// another order: with the blocks in consecutive slots, one layer of each
// head of a (layer, kind) moves with one 2D copy across the blocks (16 for
// one layer of the 8B shape), not one per block; from scattered slots,
// and for a load of whole blocks, one per block as before. With Land (the
// tiles packed into device scratch), one copy per block at most, and one
// per direct chunk from consecutive slots (a 2D copy of the blocks' layers
// where they are not whole). Every load
// lands the bytes a staged load does.
func TestHFLayerCopies(t *testing.T) {
	geo := llama8B
	const nb = 64
	h := newHFTarget(geo, nb)
	blocks, cb := make([]uint64, nb), make([]int, nb)
	for i := range blocks {
		blocks[i], cb[i] = uint64(i), i
	}
	for _, order := range []string{"in order", "scattered"} {
		st, m := hfBlocksStore(t, geo, nb, order == "scattered")
		for _, layers := range []int{1, 4, geo.Layers} {
			load := func(direct, land bool) (calls int, sum uint32) {
				p, dev, done := hfPipeline(t, h, st, m, direct)
				defer done()
				lands := 0
				if land {
					p.Land = deviceLand(dev, p.Geo, &lands)
				}
				var its []gpu.Item
				for _, it := range h.items(blocks, cb, true) {
					if it.Key.Layer < layers {
						its = append(its, it)
					}
				}
				if err := p.Load(st, its, true); err != nil {
					t.Fatal(err)
				}
				for _, it := range its {
					if it.Err != nil {
						t.Fatalf("%s, %d layers: %v: %v", order, layers, it.Key, it.Err)
					}
				}
				if direct != (p.Direct() > 0) || land != (lands > 0) {
					t.Fatalf("%s, %d layers: %d groups loaded direct, %d Land calls", order, layers, p.Direct(), lands)
				}
				return dev.Calls(), store.CRC32C(dev.Mem(gputest.Base, h.size()))
			}
			staged, want := load(false, false)
			calls, got := load(true, false)
			lcalls, lgot := load(true, true)
			if got != want || lgot != want {
				t.Fatalf("%s, %d layers: a direct load landed other bytes than the staged one", order, layers)
			}
			t.Logf("%s, %d layers of %d blocks: %d copy calls direct, %d through scratch (Land), %d staged", order, layers, nb, calls, lcalls, staged)
			// A direct chunk carries 2,048 groups (two 4 MiB staging buffers).
			chunks := (nb*layers*2*geo.KVHeads + 2047) / 2048
			if lcalls > nb || order == "in order" && lcalls > chunks {
				t.Fatalf("%s, %d layers: %d copy calls through scratch for %d blocks in %d chunks", order, layers, lcalls, nb, chunks)
			}
			switch {
			case order == "in order" && layers == 1:
				if want := 2 * geo.KVHeads * chunks; calls != want {
					t.Fatalf("in order, 1 layer: %d copy calls, want one per head of each (layer, kind): %d", calls, want)
				}
			case calls > nb:
				t.Fatalf("%s, %d layers: %d copy calls for %d blocks", order, layers, calls, nb)
			}
		}
	}
}

// TestHFScratchBudget: concurrent direct loads of Hugging Face tiles
// through device scratch (Land) keep the scratch they hold within
// ScratchBudget plus one chunk's per load (a load over the budget
// finishes its own oldest chunk and reuses its scratch), and land every
// group where it belongs.
func TestHFScratchBudget(t *testing.T) {
	geo := llama8B
	const nb, loads = 64, 4 // each load 8 layers of every block: 4 chunks of 2,048 groups
	st, m := hfBlocksStore(t, geo, nb, false)
	h := newHFTarget(geo, nb)
	p, dev, done := hfPipeline(t, h, st, m, true)
	defer done()
	dev.Delay, dev.Jitter = 20*time.Microsecond, 40*time.Microsecond
	lands := 0
	p.Land = deviceLand(dev, p.Geo, &lands)
	chunk := 2048 * geo.GroupBytes()
	p.ScratchBudget = 2 * chunk
	p.DirectWorkers = 1
	blocks, cb := make([]uint64, nb), make([]int, nb)
	for i := range blocks {
		blocks[i], cb[i] = uint64(i), i
	}
	its := h.items(blocks, cb, true)
	per := len(its) / loads
	var wg sync.WaitGroup
	for k := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Load k: layers [8k, 8k+8) of every block, as a layer-by-layer
			// loader asks for them.
			var mine []gpu.Item
			for i := range its {
				if its[i].Key.Layer/8 == k {
					mine = append(mine, its[i])
				}
			}
			if len(mine) != per {
				t.Errorf("load %d: %d tiles, want %d", k, len(mine), per)
				return
			}
			if err := p.Load(st, mine, true); err != nil {
				t.Error(err)
				return
			}
			for _, it := range mine {
				if it.Err != nil {
					t.Errorf("%v: %v", it.Key, it.Err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	gbytes := geo.GroupBytes()
	for b := range nb {
		for lk := range 2 * geo.Layers {
			for hd := range geo.KVHeads {
				if !bytes.Equal(dev.Mem(h.dst(lk, hd, b), gbytes), hfGroup(geo, uint64(b), lk*geo.KVHeads+hd)) {
					t.Fatalf("block %d, (layer, kind) %d, head %d: wrong bytes", b, lk, hd)
				}
			}
		}
	}
	if lands == 0 {
		t.Fatal("no tile went through scratch")
	}
	if peak := dev.PeakAllocated(); peak > p.ScratchBudget+loads*chunk {
		t.Fatalf("%d bytes of device scratch at once, budget %d plus %d loads × %d", peak, p.ScratchBudget, loads, chunk)
	}
}

// hfBlocksStore is a store of geo holding blocks 0..nb-1 whole (group g
// of block b filled with b, g), each block's slot taken in block order,
// or with scattered in another order (block 37i mod nb i-th; nb a power
// of two), so that consecutive blocks do not lie in consecutive slots.
func hfBlocksStore(t *testing.T, geo layout.Geometry, nb int, scattered bool) (*store.Store, *storetest.Mem) {
	t.Helper()
	m := storetest.Formatted(t, geo, int64(nb), 512)
	st := storetest.Open(t, m, store.Options{})
	for i := range uint64(nb) {
		b := i
		if scattered {
			b = (i * 37) % uint64(nb)
		}
		w := make([]store.WriteReq, geo.GroupsPerBlock())
		for g := range w {
			w[g] = store.WriteReq{Key: geo.KeyAt(b, g), Data: hfGroup(geo, b, g)}
		}
		if err := st.Write([]store.WriteReq{w[0]}); err != nil { // the block's slot, in this order
			t.Fatal(err)
		}
		if err := st.Write(w[1:]); err != nil {
			t.Fatal(err)
		}
	}
	return st, m
}

// hfGroup is what hfBlocksStore stores as group g of block b.
func hfGroup(geo layout.Geometry, b uint64, g int) []byte {
	return bytes.Repeat([]byte{byte(b), byte(g), byte(g >> 8), 0x5a}, geo.GroupBytes()/4)
}

// TestHFLayerCopiesFailures: direct loads of one layer of blocks in
// consecutive slots. With a group whose bytes were corrupted in the file
// the load still copies across blocks (16 copies), lands every other
// group, zeroes that one where it landed and reports it corrupt. With a
// head missing from the store its chunk copies block by block, fails that
// head alone and leaves its destination as it was. The staged load of the
// same items lands the same bytes and outcomes.
func TestHFLayerCopiesFailures(t *testing.T) {
	geo := llama8B
	const nb = 64
	gbytes := geo.GroupBytes()
	h := newHFTarget(geo, nb)
	blocks, cb := make([]uint64, nb), make([]int, nb)
	for i := range blocks {
		blocks[i], cb[i] = uint64(i), i
	}
	st, m := hfBlocksStore(t, geo, nb, false)
	corrupt := layout.Key{Block: 9, Layer: 0, Kind: layout.V, Head: 3}
	missing := layout.Key{Block: 40, Layer: 1, Kind: layout.K, Head: 5}
	m.SetHostView(true)
	reqs := []store.LocateReq{{Key: corrupt}}
	pins, err := st.Locate(reqs, nil)
	if err != nil || reqs[0].Err != nil {
		t.Fatal(err, reqs[0].Err)
	}
	st.HostView()[reqs[0].Off+100] ^= 0x40
	st.Unpin(pins)
	m.SetHostView(false)
	if err := st.Delete([]layout.Key{missing}); err != nil {
		t.Fatal(err)
	}
	old := bytes.Repeat([]byte{0xee}, gbytes)
	for _, bad := range []layout.Key{corrupt, missing} {
		for _, direct := range []bool{false, true} {
			what := fmt.Sprintf("layer %d, direct %v", bad.Layer, direct)
			p, dev, done := hfPipeline(t, h, st, m, direct)
			var its []gpu.Item
			for _, it := range h.items(blocks, cb, true) {
				if it.Key.Layer == bad.Layer {
					its = append(its, it)
				}
			}
			dev.Fill(h.dst(2*missing.Layer+int(missing.Kind), missing.Head, int(missing.Block)), old)
			if err := p.Load(st, its, true); err != nil {
				t.Fatal(err)
			}
			for _, it := range its {
				k := it.Key
				if k.Block == bad.Block && k.Kind == bad.Kind {
					want := store.ErrCorrupt
					if bad == missing {
						want = store.ErrNotFound
					}
					if !errors.Is(it.Err, want) || it.Tile.Bad != 1<<bad.Head {
						t.Fatalf("%s: the tile with a failed head: %v, bad %b", what, it.Err, it.Tile.Bad)
					}
					dst, _ := it.Group(bad.Head)
					if got := dev.Mem(dst, gbytes); bad == corrupt && !bytes.Equal(got, make([]byte, gbytes)) ||
						bad == missing && !bytes.Equal(got, old) {
						t.Fatalf("%s: the failed head's destination holds other bytes than zeros (corrupt) or what it held (missing)", what)
					}
				} else if it.Err != nil {
					t.Fatalf("%s: %v: %v", what, k, it.Err)
				}
				for j := range it.Groups() {
					if it.Skip(j) {
						continue
					}
					dst, _ := it.Group(j)
					g := geo.Index(layout.Key{Block: k.Block, Layer: k.Layer, Kind: k.Kind, Head: j})
					if !bytes.Equal(dev.Mem(dst, gbytes), hfGroup(geo, k.Block, g)) {
						t.Fatalf("%s: %v head %d: other bytes than stored", what, k, j)
					}
				}
			}
			if direct != (p.Direct() > 0) {
				t.Fatalf("%s: %d groups loaded direct", what, p.Direct())
			}
			if across := dev.Calls() == 2*geo.KVHeads; direct && across != (bad == corrupt) {
				t.Fatalf("%s: %d copy calls", what, dev.Calls())
			}
			done()
		}
	}
}

// TestHFStoreCopies: storing whole blocks of a Hugging Face cache (one
// group per item, heads a sequence apart on the device) copies each
// block's groups to staging with one 2D copy where the cache's tensors are
// evenly spaced, and one per (layer, kind) where they are not (each
// tensor's heads a constant stride apart), instead of one copy per group;
// every group is stored as it lies on the device.
func TestHFStoreCopies(t *testing.T) {
	geo := tileGeo
	H, L := geo.KVHeads, geo.Layers
	const nb = 6
	for _, even := range []bool{true, false} {
		t.Run(fmt.Sprintf("even=%v", even), func(t *testing.T) {
			h := newHFTarget(geo, nb)
			r := newRig(t, 4, 2*geo.GroupsPerBlock(), 2)
			r.dev.Enable2D = true
			dst := h.dst
			if !even {
				// Each tensor a group further than the one before.
				dst = func(lk, head, cb int) uint64 { return h.dst(lk, head, cb) + uint64(lk*h.gb) }
			}
			var its []gpu.Item
			blocks := []uint64{10, 11, 12, 13, 14, 15}
			for i, b := range blocks {
				for lk := range 2 * L {
					for hd := range H {
						k := layout.Key{Block: b, Layer: lk / 2, Kind: layout.Kind(lk % 2), Head: hd}
						its = append(its, gpu.Item{Key: k, Dst: dst(lk, hd, i)})
						r.dev.Fill(dst(lk, hd, i), tileData(k))
					}
				}
			}
			st := storetest.Open(t, storetest.Formatted(t, geo, 16, 512), store.Options{})
			c0 := r.dev.Calls()
			if err := r.p.Store(st, its); err != nil {
				t.Fatal(err)
			}
			calls := r.dev.Calls() - c0
			for _, it := range its {
				if it.Err != nil {
					t.Fatalf("%v: %v", it.Key, it.Err)
				}
				q := []store.ReadReq{{Key: it.Key, Buf: make([]byte, gb)}}
				if err := st.Read(q); err != nil || q[0].Err != nil || !bytes.Equal(q[0].Buf, tileData(it.Key)) {
					t.Fatalf("%v: stored %v, %v", it.Key, err, q[0].Err)
				}
			}
			want := nb
			if !even {
				want = nb * 2 * L
			}
			if calls != want {
				t.Fatalf("%d copy calls storing %d blocks (%d groups), want %d", calls, nb, len(its), want)
			}
			r.checkClean(t)
		})
	}
}
