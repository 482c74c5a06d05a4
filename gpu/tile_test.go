package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
	"testing"

	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/tier"
)

// tileGeo is the rig's group shape (rows × rowBytes) as a store geometry:
// 4 heads, 2 layers.
var tileGeo = layout.Geometry{Layers: 2, KVHeads: 4, HeadDim: rowBytes / 2, BlockTokens: rows, DType: layout.BF16, Align: 512}

// tileData is the payload of group k.
func tileData(k layout.Key) []byte {
	b := make([]byte, gb)
	for i := range b {
		b[i] = byte(int(k.Block)*131 + tileGeo.Index(k)*7 + i)
	}
	return b
}

// tileVerify is Pipeline.Verify on the rig's device, the CPU over its
// memory: each group not failed before (a tile's heads one by one) checked
// where it landed, zeroed and failed when it differs; tiles counts the
// tiles it was given.
func tileVerify(r *rig, tiles *int) func(items []*gpu.Item) error {
	return func(items []*gpu.Item) error {
		for _, it := range items {
			if it.Tile != nil {
				*tiles++
			}
			for j := range it.Groups() {
				if it.Skip(j) {
					continue
				}
				dst, crc := it.Group(j)
				if store.CRC32C(r.dev.Mem(dst, gb)) != crc {
					r.dev.Fill(dst, make([]byte, gb))
					it.FailHead(j, fmt.Errorf("verify: %w", store.ErrCorrupt))
				}
			}
		}
		return nil
	}
}

// deviceLand is Pipeline.Land on a fake device (the CPU over its memory),
// as the CRC32C kernel lands groups: each group not failed before (a
// tile's heads one by one), packed in scratch at srcs[i] + j*GroupBytes,
// checked there and its rows written where it lies (Pitch apart, packed
// for Pitch 0), zeros and failed when it differs; lands counts the calls.
func deviceLand(dev *gputest.Device, g gpu.Geometry, lands *int) func(items []*gpu.Item, srcs []uint64) error {
	var mu sync.Mutex // Land is called concurrently by a direct load's workers
	return func(items []*gpu.Item, srcs []uint64) error {
		mu.Lock()
		defer mu.Unlock()
		*lands++
		for i, it := range items {
			pitch := max(it.Pitch, g.RowBytes)
			for j := range it.Groups() {
				if it.Skip(j) {
					continue
				}
				src := slices.Clone(dev.Mem(srcs[i]+uint64(j*g.GroupBytes), g.GroupBytes))
				dst, crc := it.Group(j)
				ok := store.CRC32C(src) == crc
				if !ok {
					clear(src)
				}
				for row := range g.Rows {
					dev.Fill(dst+uint64(row*pitch), src[row*g.RowBytes:(row+1)*g.RowBytes])
				}
				if !ok {
					it.FailHead(j, fmt.Errorf("land: %w", store.ErrCorrupt))
				}
			}
		}
		return nil
	}
}

// tileStore is a store of geo holding blocks 0..nb-1 whole (tileData),
// except block 2 (heads 0 and 1 of each (layer, kind) only) and block 4
// (absent), with one head of block 3 corrupt.
func tileStore(t *testing.T, geo layout.Geometry, nb int) (*store.Store, *storetest.Mem, layout.Key) {
	t.Helper()
	m := storetest.Formatted(t, geo, int64(nb)+2, 512)
	st := storetest.Open(t, m, store.Options{})
	var w []store.WriteReq
	for b := range uint64(nb) {
		for i := range geo.GroupsPerBlock() {
			k := geo.KeyAt(b, i)
			if b == 2 && k.Head >= 2 || b == 4 {
				continue
			}
			w = append(w, store.WriteReq{Key: k, Data: tileData(k)})
		}
	}
	if err := st.Write(w); err != nil {
		t.Fatal(err)
	}
	bad := layout.Key{Block: 3, Layer: 1, Head: 2, Kind: layout.V}
	gi, err := st.Stat(bad)
	if err != nil {
		t.Fatal(err)
	}
	sb := st.Superblock()
	off := sb.DataOffset + gi.Slot*sb.SlotBytes + 2*sb.HeaderBytes + geo.Offset(geo.Index(bad))
	m.Poke(off+9, []byte{m.Image()[off+9] ^ 0x20})
	return st, m, bad
}

// hndTiles is a tile item per (layer, kind) of blocks 0..nb-1 of tileGeo
// into a head-major cache at gputest.Base: tensor (layer, kind) of nb cache
// blocks one after another, block b into cache block nb-1-b.
func hndTiles(nb int) []gpu.Item {
	H, L := tileGeo.KVHeads, tileGeo.Layers
	tensor := nb * H * gb
	crcs := make([]uint32, nb*tileGeo.GroupsPerBlock())
	tileOf := make([]gpu.Tile, nb*2*L)
	var its []gpu.Item
	for b := range nb {
		for lk := range 2 * L {
			k := layout.Key{Block: uint64(b), Layer: lk / 2, Kind: layout.Kind(lk % 2)}
			g := len(its) * H
			tileOf[len(its)] = gpu.Tile{Heads: H, HeadStride: gb, CRCs: crcs[g : g+H]}
			its = append(its, gpu.Item{Key: k, Dst: gputest.Base + uint64(lk*tensor+(nb-1-b)*H*gb), Tile: &tileOf[len(its)]})
		}
	}
	return its
}

// TestTilesLoad: tiles (a block's (layer, kind) heads as one item) load
// from a real store into a head-major cache through staging: every head
// that is stored lands byte for byte, a corrupt one is zeroed and counted,
// missing heads leave their tiles alone (Failed, Bad and Err say which and
// why), a block's tiles move as one 2D copy when the cache's tensors are
// evenly spaced, and a failed copy fails every head of the tiles it
// carried.
func TestTilesLoad(t *testing.T) {
	if tileGeo.GroupBytes() != gb {
		t.Fatalf("tile geometry: %d-byte groups, the rig's are %d", tileGeo.GroupBytes(), gb)
	}
	for _, mode := range []string{"ok", "copy-fails"} {
		t.Run(mode, func(t *testing.T) {
			H, L := tileGeo.KVHeads, tileGeo.Layers
			const nb = 6
			st, m, bad := tileStore(t, tileGeo, nb)

			r := newRig(t, 4, 2*tileGeo.GroupsPerBlock(), 4)
			r.dev.Enable2D = true
			tiles := 0
			r.p.Verify = tileVerify(r, &tiles)
			if mode == "copy-fails" {
				r.dev.FailCopy = func(i int) error {
					if i == 1 {
						return gputest.ErrInjected
					}
					return nil
				}
			}
			if !r.p.TakesTiles(st, false) {
				t.Fatal("a staged load checked on the device takes no tiles")
			}
			// HND: tensor (layer, kind) of nb cache blocks, block b into
			// cache block nb-1-b.
			tensor := nb * H * gb
			old := bytes.Repeat([]byte{0x5A}, 2*L*tensor)
			r.dev.Fill(gputest.Base, old)
			its := hndTiles(nb)
			if err := r.p.Load(st, its, true); err != nil {
				t.Fatal(err)
			}
			// checkHeads checks every head of tile it where the cache holds it
			// and returns the heads that must have failed: absent ones keep
			// the old bytes, the corrupt one is zeroed.
			checkHeads := func(what string, it gpu.Item) (wantBad uint64) {
				lk := 2*it.Key.Layer + int(it.Key.Kind)
				for h := range H {
					k := it.Key
					k.Head = h
					dst := gputest.Base + uint64(lk*tensor+(nb-1-int(k.Block))*H*gb+h*gb)
					want := tileData(k)
					switch {
					case k.Block == 4 || k.Block == 2 && h >= 2:
						want, wantBad = old[:gb], wantBad|1<<h
					case k == bad:
						want, wantBad = make([]byte, gb), wantBad|1<<h
					}
					if got := r.dev.Mem(dst, gb); !bytes.Equal(got, want) {
						t.Fatalf("%s: %v: wrong bytes on the device", what, k)
					}
				}
				return wantBad
			}
			copyFailed := 0
			for _, it := range its {
				if errors.Is(it.Err, gpu.ErrCopy) {
					// Its tiles are undefined, every head failed.
					if it.Tile.Failed != H || it.Tile.Bad != 1<<H-1 || !errors.Is(it.Err, gputest.ErrInjected) {
						t.Fatalf("%v: copy failed: %d failed (%b): %v", it.Key, it.Tile.Failed, it.Tile.Bad, it.Err)
					}
					copyFailed++
					continue
				}
				wantBad := checkHeads("staged", it)
				var wantErr error
				switch {
				case it.Key.Block == 4, it.Key.Block == 2:
					wantErr = store.ErrNotFound
				case it.Key.Block == bad.Block && it.Key.Layer == bad.Layer && it.Key.Kind == bad.Kind:
					wantErr = store.ErrCorrupt
				}
				if tl := it.Tile; tl.Bad != wantBad || tl.Failed != bits.OnesCount64(wantBad) || (wantErr == nil) != (it.Err == nil) || wantErr != nil && !errors.Is(it.Err, wantErr) {
					t.Fatalf("%v: %d failed (%b), %v; want %b, %v", it.Key, tl.Failed, tl.Bad, it.Err, wantBad, wantErr)
				}
			}
			if mode == "copy-fails" {
				if copyFailed == 0 {
					t.Fatal("an injected copy failure was not reported")
				}
			} else if copyFailed != 0 || r.dev.Calls() > nb {
				// A block's tiles one 2D copy (block 2's partial tiles
				// their first two heads each), none for the absent one.
				t.Fatalf("%d tiles failed a copy, %d copy calls (%d 2D) for %d blocks", copyFailed, r.dev.Calls(), r.dev.Copies2D(), nb)
			}
			if mode == "ok" && tiles == 0 {
				t.Fatal("Verify saw no tiles")
			}
			if mode == "ok" {
				// A host view registered after the caller chose tiles (it
				// is registered in the background): packed tiles then go
				// direct, each head located and copied from the view,
				// pitched ones are refused.
				m.SetHostView(true)
				r.p.SetHost(st.HostView())
				if !r.p.TakesTiles(st, false) || r.p.TakesTiles(st, true) {
					t.Fatalf("with a host view: packed tiles taken %v (want true), pitched %v (want false)", r.p.TakesTiles(st, false), r.p.TakesTiles(st, true))
				}
				r.dev.Fill(gputest.Base, old)
				direct := r.p.Direct()
				if err := r.p.Load(st, its, true); err != nil {
					t.Fatal(err)
				}
				if r.p.Direct() == direct {
					t.Fatal("tiles with a host view went through staging")
				}
				for _, it := range its {
					wantBad := checkHeads("direct", it)
					if it.Tile.Bad != wantBad || it.Tile.Failed != bits.OnesCount64(wantBad) {
						t.Fatalf("direct: %v: %d failed (%b), want %b: %v", it.Key, it.Tile.Failed, it.Tile.Bad, wantBad, it.Err)
					}
				}
				// Load, which goes direct there, fails tiles rather than
				// moving one group of each.
				if err := r.p.Load(st, its[:2*L], false); err != nil || !errors.Is(its[0].Err, gpu.ErrConfig) || its[0].Tile.Failed != H {
					t.Fatalf("tiles in a direct Load: %v, %v, %d failed", err, its[0].Err, its[0].Tile.Failed)
				}
				m.SetHostView(false)
				r.p.SetHost(nil)
			}
			r.checkClean(t)
		})
	}
}

// TestTilesFromCache: packed tiles load from a Cache's registered memory
// (the DRAM tier) as they do from the store's file. The second load of the
// same blocks, after the first filled the tier through staging, copies the
// tiles the tier holds whole straight from its memory (Cached counts their
// groups) and gives exactly what the first gave: every stored head byte
// for byte, missing heads left alone and reported, the corrupt head
// zeroed. A tile with a head the tier does not hold goes through staging
// whole. So for head-major tiles (HND) checked in place, and for Hugging
// Face tiles (heads a sequence apart) through device scratch and Land.
func TestTilesFromCache(t *testing.T) {
	for _, hf := range []bool{false, true} {
		t.Run(map[bool]string{false: "hnd", true: "hf-land"}[hf], func(t *testing.T) { testTilesFromCache(t, hf) })
	}
}

func testTilesFromCache(t *testing.T, hf bool) {
	H, L := tileGeo.KVHeads, tileGeo.Layers
	const nb = 6
	st, _, _ := tileStore(t, tileGeo, nb)
	tr, err := tier.New(st, tier.Options{Bytes: int64(nb+2) * tileGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	r := newRig(t, 4, 2*tileGeo.GroupsPerBlock(), 4)
	r.dev.Enable2D = true
	tiles, lands := 0, 0
	r.p.Verify = tileVerify(r, &tiles)
	items := func() []gpu.Item { return hndTiles(nb) }
	if hf {
		r.p.Land = deviceLand(r.dev, r.p.Geo, &lands)
		h := newHFTarget(tileGeo, nb)
		blocks, cb := make([]uint64, nb), make([]int, nb)
		for i := range blocks {
			blocks[i], cb[i] = uint64(i), i
		}
		items = func() []gpu.Item { return h.items(blocks, cb, true) }
	}
	r.p.SetCache(tr.Arena())
	if !r.p.TakesTiles(tr, false) || r.p.TakesTiles(tr, true) {
		t.Fatal("a cache's registered memory: packed tiles refused, or pitched ones taken")
	}
	tensor := nb * H * gb
	old := bytes.Repeat([]byte{0x5A}, 2*L*tensor)
	load := func() ([]gpu.Item, []byte) {
		r.dev.Fill(gputest.Base, old)
		its := items()
		if err := r.p.Load(tr, its, true); err != nil {
			t.Fatal(err)
		}
		return its, r.dev.Mem(gputest.Base, 2*L*tensor)
	}
	first, mem1 := load()
	if r.p.Cached() != 0 || lands != 0 {
		t.Fatalf("%d groups served from an empty tier, %d Land calls", r.p.Cached(), lands)
	}
	second, mem2 := load()
	if !bytes.Equal(mem1, mem2) {
		t.Fatal("the load from the tier's memory left other bytes than the load through staging")
	}
	for i := range first {
		a, b := &first[i], &second[i]
		if a.Tile.Bad != b.Tile.Bad || a.Tile.Failed != b.Tile.Failed || (a.Err == nil) != (b.Err == nil) ||
			a.Err != nil && !errors.Is(b.Err, store.ErrNotFound) && !errors.Is(b.Err, store.ErrCorrupt) {
			t.Fatalf("%v: %d failed (%b), %v from the tier; %d (%b), %v through staging",
				b.Key, b.Tile.Failed, b.Tile.Bad, b.Err, a.Tile.Failed, a.Tile.Bad, a.Err)
		}
	}
	// Blocks 0, 1 and 5 are whole; block 2 lacks heads (its tiles go
	// through staging), 3 has a corrupt head and 4 is absent (the tier
	// holds neither).
	if want := uint64(3 * 2 * L * H); r.p.Cached() != want {
		t.Fatalf("%d groups served from the tier's memory, want %d", r.p.Cached(), want)
	}
	if tiles == 0 {
		t.Fatal("Verify saw no tiles")
	}
	if hf != (lands > 0) {
		t.Fatalf("%d Land calls", lands)
	}
}
