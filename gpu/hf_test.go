package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

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

// hfStore is a store of geo holding blocks 0..nb-1 whole, except block
// 2 (heads 0 and 1 of each (layer, kind) only) and block 4 (absent), with
// one head of block 3 corrupt.
func hfStore(t *testing.T, geo layout.Geometry, nb int) (*store.Store, layout.Key) {
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
	return st, bad
}

// TestTilesHF: a Hugging Face cache's (layer, kind) loaded as one tile of
// its heads (a sequence apart on the device) gives exactly what one group
// per item gives (the device's memory, and each group's outcome: a corrupt
// head zeroed and failed alone, a partial block's missing heads and an
// absent block's tiles left as they were), whatever the order of the cache
// blocks, and with consecutive cache blocks staged head by head it moves a
// chunk with one 2D copy.
func TestTilesHF(t *testing.T) {
	H, L := tileGeo.KVHeads, tileGeo.Layers
	const nb = 8
	st, bad := hfStore(t, tileGeo, nb)
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
				load := func(tiles bool) ([]gpu.Item, []byte, int, int) {
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
					r.dev.Fill(gputest.Base, old)
					its := h.items(tc.blocks, tc.cb, tiles)
					if err := r.p.Load(st, its, tiles); err != nil {
						t.Fatal(err)
					}
					r.checkClean(t)
					return its, r.dev.Mem(gputest.Base, h.size()), r.dev.Calls(), n
				}
				want, wmem, wcalls, _ := load(false)
				got, gmem, gcalls, tiles := load(true)
				if tiles == 0 {
					t.Fatal("Verify saw no tiles")
				}
				if !bytes.Equal(gmem, wmem) {
					t.Fatal("device memory differs between tiles and a group per item")
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
				t.Logf("%d copy calls as tiles, %d one group per item", gcalls, wcalls)
			})
		}
	}
}
