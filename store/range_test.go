package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// rangeCache is a paged cache of one block of nhdGeo in store memory,
// head-major (HND: a (layer, kind) tile is its heads' groups one after
// another) or token-major (NHD: row r of every head side by side), with a
// guard tile before and after and every byte set to the guard.
type rangeCache struct {
	mem, cache []byte
	nhd        bool
	tile       int // bytes of one (layer, kind)
}

const rangeGuard = 0xA5

func newRangeCache(t *testing.T, nhd bool) *rangeCache {
	t.Helper()
	geo := nhdGeo
	tile := geo.GroupBytes() * geo.KVHeads
	mem, err := store.AllocAligned((geo.Layers*2 + 2) * tile)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.FreeAligned(mem) })
	for i := range mem {
		mem[i] = rangeGuard
	}
	return &rangeCache{mem: mem, cache: mem[tile : len(mem)-tile], nhd: nhd, tile: tile}
}

// req is the request for heads [h0, h0+n) of (layer, kind) of block b.
func (c *rangeCache) req(b uint64, layer int, kind layout.Kind, h0, n int) store.ReadReq {
	geo := nhdGeo
	rb, gb := geo.RowBytes(), geo.GroupBytes()
	base := (layer*2 + int(kind)) * c.tile
	q := store.ReadReq{Key: layout.Key{Block: b, Layer: layer, Head: h0, Kind: kind}, Heads: n}
	if c.nhd {
		pitch := geo.KVHeads * rb
		off := base + h0*rb
		q.Buf = c.cache[off : off+(n-1)*rb+(geo.BlockTokens-1)*pitch+rb]
		q.Pitch, q.RowBytes, q.HeadStride = pitch, rb, rb
	} else {
		off := base + h0*gb
		q.Buf = c.cache[off : off+n*gb]
		q.HeadStride = gb
	}
	return q
}

// place writes group data d of key k where the cache keeps it, into want
// (an image of mem).
func (c *rangeCache) place(want []byte, k layout.Key, d []byte) {
	geo := nhdGeo
	rb, gb := geo.RowBytes(), geo.GroupBytes()
	base := c.tile + (k.Layer*2+int(k.Kind))*c.tile
	if !c.nhd {
		copy(want[base+k.Head*gb:], d)
		return
	}
	pitch := geo.KVHeads * rb
	for r := range geo.BlockTokens {
		copy(want[base+r*pitch+k.Head*rb:], d[r*rb:(r+1)*rb])
	}
}

func (c *rangeCache) check(t *testing.T, want []byte) {
	t.Helper()
	for i := range c.mem {
		if c.mem[i] != want[i] {
			t.Fatalf("byte %d of the cache (guard tile first): %#x, want %#x", i, c.mem[i], want[i])
		}
	}
}

// TestReadRange: a request for a range of heads lands each head's group
// where the head stride puts it, for head-major (contiguous, adjacent) and
// token-major (pitched, interleaved) caches, on every way a run lands
// (bounced, direct, vector; by the engine's Do or inline), with every byte
// outside the asked heads left as it was.
func TestReadRange(t *testing.T) {
	geo := nhdGeo
	for _, vec := range []bool{false, true} {
		for _, inline := range []bool{false, true} {
			for _, nhd := range []bool{false, true} {
				t.Run(fmt.Sprintf("vec=%v/inline=%v/nhd=%v", vec, inline, nhd), func(t *testing.T) {
					s, _ := nhdFixtureOn(t, vec, inline, store.Options{ScatterMin: 512})
					c := newRangeCache(t, nhd)
					want := bytes.Clone(c.mem)
					var reqs []store.ReadReq
					// Heads 1..3 of every (layer, kind): head 0 keeps the guard.
					for layer := range geo.Layers {
						for kind := range 2 {
							reqs = append(reqs, c.req(1, layer, layout.Kind(kind), 1, geo.KVHeads-1))
							for h := 1; h < geo.KVHeads; h++ {
								k := layout.Key{Block: 1, Layer: layer, Head: h, Kind: layout.Kind(kind)}
								c.place(want, k, groupData(geo, k, 1))
							}
						}
					}
					if err := s.Read(reqs); err != nil {
						t.Fatal(err)
					}
					for _, q := range reqs {
						if q.Err != nil || q.Failed != 0 {
							t.Fatalf("%v: %v, %d failed", q.Key, q.Err, q.Failed)
						}
					}
					c.check(t, want)
				})
			}
		}
	}
}

// TestReadRangeFailures: in a range, a missing head and a corrupt one fail
// alone: the others land, the missing head's destination is untouched, the
// corrupt one's zeroed, Failed counts both and Err is the corruption (the
// failure a caller must not overlook). A malformed range fails whole
// before any I/O.
func TestReadRangeFailures(t *testing.T) {
	geo := nhdGeo
	for _, nhd := range []bool{false, true} {
		s, m := nhdFixture(t, false, store.Options{})
		// Block 2: only heads 0 and 1 of every (layer, kind).
		var keys []layout.Key
		for i := range geo.GroupsPerBlock() {
			if k := geo.KeyAt(2, i); k.Head < 2 {
				keys = append(keys, k)
			}
		}
		put(t, s, keys, 1)
		bad := layout.Key{Block: 2, Layer: 1, Head: 1, Kind: layout.V}
		off := groupOnDevice(t, s, bad)
		img := m.Mem.Image()
		m.Mem.Poke(off+7, []byte{img[off+7] ^ 0x10})
		c := newRangeCache(t, nhd)
		want := bytes.Clone(c.mem)
		reqs := []store.ReadReq{c.req(2, 0, layout.K, 0, geo.KVHeads), c.req(2, 1, layout.V, 0, geo.KVHeads)}
		for _, k := range []layout.Key{{Block: 2, Layer: 0, Head: 0, Kind: layout.K}, {Block: 2, Layer: 0, Head: 1, Kind: layout.K}, {Block: 2, Layer: 1, Head: 0, Kind: layout.V}} {
			c.place(want, k, groupData(geo, k, 1))
		}
		c.place(want, bad, make([]byte, geo.GroupBytes()))
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		if q := reqs[0]; !errors.Is(q.Err, store.ErrNotFound) || q.Failed != 2 {
			t.Fatalf("nhd %v: two heads missing: %v, %d failed", nhd, q.Err, q.Failed)
		}
		if q := reqs[1]; !errors.Is(q.Err, store.ErrCorrupt) || q.Failed != 3 {
			t.Fatalf("nhd %v: two heads missing, one corrupt: %v, %d failed", nhd, q.Err, q.Failed)
		}
		c.check(t, want)

		// Malformed: nothing read, nothing written.
		ok := c.req(1, 0, layout.K, 0, geo.KVHeads)
		for _, tc := range []struct {
			name string
			mod  func(q *store.ReadReq)
			err  error
		}{
			{"unverified", func(q *store.ReadReq) { q.Unverified = true }, store.ErrInvalid},
			{"past the heads", func(q *store.ReadReq) { q.Key.Head = 1 }, store.ErrInvalid},
			{"no stride", func(q *store.ReadReq) { q.HeadStride = 0 }, store.ErrInvalid},
			{"short", func(q *store.ReadReq) { q.Buf = q.Buf[:len(q.Buf)-1] }, store.ErrSize},
			{"long", func(q *store.ReadReq) { q.Buf = q.Buf[:len(q.Buf)+1] }, store.ErrSize},
			{"huge stride", func(q *store.ReadReq) { q.HeadStride = 1 << 62 }, store.ErrInvalid},
		} {
			q := ok
			tc.mod(&q)
			rs := []store.ReadReq{q}
			if err := s.Read(rs); err != nil {
				t.Fatal(err)
			}
			if !errors.Is(rs[0].Err, tc.err) || rs[0].Failed != geo.KVHeads {
				t.Fatalf("nhd %v, %s: %v, %d failed; want %v, %d", nhd, tc.name, rs[0].Err, rs[0].Failed, tc.err, geo.KVHeads)
			}
		}
		c.check(t, want)
	}
}
