package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
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
	checkBytes(t, c.mem, want, "of the cache (guard tile first)")
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
					s, _ := nhdFixtureOn(t, vec, inline, false, store.Options{ScatterMin: 512})
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
		flipStored(t, s, m.Mem, bad, 7, 0x10)
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
		if reqs[0].Bad != 0b1100 || reqs[1].Bad != 0b1110 {
			t.Fatalf("nhd %v: heads failed %04b and %04b, want 1100 and 1110", nhd, reqs[0].Bad, reqs[1].Bad)
		}
		c.check(t, want)

		// Unverified: the same ranges land as stored, the corrupt head
		// too (the caller checks it against its CRC), the missing heads'
		// destinations untouched and their bits set.
		c2 := newRangeCache(t, nhd)
		want2 := bytes.Clone(c2.mem)
		reqs = []store.ReadReq{c2.req(2, 0, layout.K, 0, geo.KVHeads), c2.req(2, 1, layout.V, 0, geo.KVHeads)}
		for i := range reqs {
			reqs[i].Unverified, reqs[i].CRCs = true, make([]uint32, geo.KVHeads)
		}
		for _, k := range []layout.Key{{Block: 2, Layer: 0, Head: 0, Kind: layout.K}, {Block: 2, Layer: 0, Head: 1, Kind: layout.K}, {Block: 2, Layer: 1, Head: 0, Kind: layout.V}} {
			c2.place(want2, k, groupData(geo, k, 1))
		}
		raw := groupData(geo, bad, 1)
		raw[7] ^= 0x10
		c2.place(want2, bad, raw)
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for i, q := range reqs {
			if !errors.Is(q.Err, store.ErrNotFound) || q.Failed != 2 || q.Bad != 0b1100 {
				t.Fatalf("nhd %v: unverified range %d: %v, %d failed, heads %04b failed; want two missing (1100)", nhd, i, q.Err, q.Failed, q.Bad)
			}
			for h := range 2 {
				k := q.Key
				k.Head = h
				if got, want := q.CRCs[h], store.CRC32C(groupData(geo, k, 1)); got != want {
					t.Fatalf("nhd %v: %v: checksum %08x, header has %08x", nhd, k, got, want)
				}
			}
		}
		c2.check(t, want2)

		// Malformed: nothing read, nothing written.
		ok := c.req(1, 0, layout.K, 0, geo.KVHeads)
		for _, tc := range []struct {
			name string
			mod  func(q *store.ReadReq)
			err  error
		}{
			{"unverified without checksums", func(q *store.ReadReq) { q.Unverified = true }, store.ErrInvalid},
			{"unverified, checksums short", func(q *store.ReadReq) { q.Unverified, q.CRCs = true, make([]uint32, geo.KVHeads-1) }, store.ErrInvalid},
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
			if !errors.Is(rs[0].Err, tc.err) || rs[0].Failed != geo.KVHeads || rs[0].Bad != 1<<geo.KVHeads-1 {
				t.Fatalf("nhd %v, %s: %v, %d failed (%b); want %v, %d", nhd, tc.name, rs[0].Err, rs[0].Failed, rs[0].Bad, tc.err, geo.KVHeads)
			}
		}
		c.check(t, want)
	}
}

// FuzzReadRequest: any read request — a range or one group, any key,
// heads, strides, pitch, row size and destination length — is either
// refused whole (ErrInvalid or ErrSize, every group counted failed,
// nothing written) or served, and the store never writes a byte outside
// the request's destination, even where the destination's capacity
// reaches further.
func FuzzReadRequest(f *testing.F) {
	geo := nhdGeo
	m := storetest.Formatted(f, geo, 4, 512)
	s := storetest.Open(f, m, store.Options{ScatterMin: 512})
	f.Cleanup(func() { s.Close() })
	w := make([]store.WriteReq, geo.GroupsPerBlock())
	for i := range w {
		k := geo.KeyAt(1, i)
		w[i] = store.WriteReq{Key: k, Data: groupData(geo, k, 1)}
	}
	if err := s.Write(w); err != nil {
		f.Fatal(err)
	}
	rb, gb := geo.RowBytes(), geo.GroupBytes()
	pitch := geo.KVHeads * rb
	f.Add(uint8(1), uint8(0), uint8(1), int8(0), int16(4), int64(gb), int64(0), int64(0), uint16(0), int64(4*gb), false)
	f.Add(uint8(1), uint8(1), uint8(0), int8(1), int16(3), int64(rb), int64(pitch), int64(rb), uint16(512), int64(2*rb+15*pitch+rb), false)
	f.Add(uint8(2), uint8(0), uint8(1), int8(0), int16(1), int64(0), int64(0), int64(0), uint16(7), int64(gb), true)
	const size = 1 << 18
	mem, err := store.AllocAligned(size)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { store.FreeAligned(mem) })
	f.Fuzz(func(t *testing.T, block, layer, kind uint8, head int8, heads int16, headStride, reqPitch, rowBytes int64, off uint16, n int64, unverified bool) {
		for i := range mem {
			mem[i] = rangeGuard
		}
		lo := int(off) % (size / 2)
		if n < 0 || n > int64(size-lo) {
			n = int64(size - lo)
		}
		q := store.ReadReq{
			Key:   layout.Key{Block: uint64(block % 3), Layer: int(layer % 4), Head: int(head), Kind: layout.Kind(kind % 3)},
			Buf:   mem[lo : lo+int(n)], // capacity to the end of mem
			Pitch: int(reqPitch), RowBytes: int(rowBytes), Heads: int(heads), HeadStride: int(headStride),
			Unverified: unverified,
		}
		if unverified && q.Heads > 1 && q.Heads <= store.MaxBadHeads {
			q.CRCs = make([]uint32, q.Heads)
		}
		reqs := []store.ReadReq{q}
		if err := s.Read(reqs); err != nil {
			t.Fatal(err)
		}
		got := reqs[0]
		groups := max(1, q.Heads)
		if got.Failed < 0 || got.Failed > groups || (got.Err == nil) != (got.Failed == 0) {
			t.Fatalf("%+v: err %v, %d failed of %d", q.Key, got.Err, got.Failed, groups)
		}
		if groups <= store.MaxBadHeads && bits.OnesCount64(got.Bad) != got.Failed || got.Bad>>groups != 0 && groups < store.MaxBadHeads {
			t.Fatalf("%+v: %d failed, heads %b failed", q.Key, got.Failed, got.Bad)
		}
		refused := errors.Is(got.Err, store.ErrInvalid) || errors.Is(got.Err, store.ErrSize)
		if refused && got.Failed != groups {
			t.Fatalf("refused with %d of %d groups failed: %v", got.Failed, groups, got.Err)
		}
		for i, b := range mem {
			inside := i >= lo && i < lo+int(n)
			if b != rangeGuard && (!inside || refused) {
				t.Fatalf("byte %d written (destination [%d, %d), refused %v, err %v)", i, lo, lo+int(n), refused, got.Err)
			}
		}
	})
}

// TestReadFromView: on an inline engine whose file lies in memory (a host
// view), bounced runs are verified and landed straight from the view, with
// no read at all: whole blocks land byte for byte into head-major and
// token-major caches, a corrupt group is zeroed in its destination and
// reported, never served; with NoViewReads every run is read (into the
// chunk buffers) as before, with the same results.
func TestReadFromView(t *testing.T) {
	geo := nhdGeo
	for _, noView := range []bool{false, true} {
		for _, nhd := range []bool{false, true} {
			t.Run(fmt.Sprintf("noview=%v/nhd=%v", noView, nhd), func(t *testing.T) {
				s, c := nhdFixtureOn(t, false, true, true, store.Options{NoViewReads: noView})
				// Two corrupt heads of one range: a bit at the start of one
				// and at the end of the other (the one-pass copy checksums
				// a group in four segments and joins them).
				bad := layout.Key{Block: 1, Layer: 1, Head: 2, Kind: layout.K}
				bad2 := layout.Key{Block: 1, Layer: 1, Head: 0, Kind: layout.K}
				flipStored(t, s, c.Mem, bad, 5, 0x01)
				flipStored(t, s, c.Mem, bad2, int64(geo.GroupBytes()-3), 0x80)
				rc := newRangeCache(t, nhd)
				want := bytes.Clone(rc.mem)
				var reqs []store.ReadReq
				for layer := range geo.Layers {
					for kind := range 2 {
						reqs = append(reqs, rc.req(1, layer, layout.Kind(kind), 0, geo.KVHeads))
						for h := range geo.KVHeads {
							k := layout.Key{Block: 1, Layer: layer, Head: h, Kind: layout.Kind(kind)}
							d := groupData(geo, k, 1)
							if k == bad || k == bad2 {
								d = make([]byte, geo.GroupBytes())
							}
							rc.place(want, k, d)
						}
					}
				}
				c.mu.Lock()
				before := c.bufRead + c.vecReads
				c.mu.Unlock()
				if err := s.Read(reqs); err != nil {
					t.Fatal(err)
				}
				c.mu.Lock()
				reads := c.bufRead + c.vecReads - before
				c.mu.Unlock()
				for _, q := range reqs {
					isBad := q.Key.Layer == bad.Layer && q.Key.Kind == bad.Kind
					if isBad != (q.Failed == 2) || isBad != errors.Is(q.Err, store.ErrCorrupt) || !isBad && q.Err != nil {
						t.Fatalf("%v: %v, %d failed", q.Key, q.Err, q.Failed)
					}
				}
				rc.check(t, want)
				if (reads == 0) == noView {
					t.Fatalf("noview %v: %d reads of the engine", noView, reads)
				}
			})
		}
	}
}

// flipStored flips the bits mask of byte at of group k's payload on m, the
// store's device.
func flipStored(t *testing.T, s *store.Store, m *storetest.Mem, k layout.Key, at int64, mask byte) {
	t.Helper()
	off := groupOnDevice(t, s, k) + at
	m.Poke(off, []byte{m.Image()[off] ^ mask})
}

// TestReadFourInStep: groups read from the store file's mapping land four
// at a time where they can (consecutive groups whose destinations are
// alike and equally far apart: head-major and token-major tiles, groups in
// reverse order) and one by one where they cannot (shuffled tiles from
// mid-tile on: fours that span two tiles; every group placed at random),
// with source groups apart (an 8 KiB stride
// for 4 KiB groups) or packed: every group lands where asked and nowhere
// else, and only the corrupt groups (at each place in a four) are zeroed
// and reported.
func TestReadFourInStep(t *testing.T) {
	for _, align := range []int{4096, 8192} {
		geo := layout.Geometry{Layers: 2, KVHeads: 8, HeadDim: 128, BlockTokens: 16, DType: layout.BF16, Align: align}
		for _, order := range []string{"hnd", "nhd", "reverse", "tiles", "scatter"} {
			t.Run(fmt.Sprintf("align=%d/%s", align, order), func(t *testing.T) {
				m := storetest.Formatted(t, geo, 2, 4096)
				m.SetHostView(true)
				s := openStore(t, storetest.NewInline(m), store.Options{})
				writeBlocks(t, s, geo, 1, 1)
				per, gb, rb := geo.GroupsPerBlock(), geo.GroupBytes(), geo.RowBytes()
				bad := map[int]bool{1: true, 6: true, 11: true, 12: true} // places 1, 2, 3, 0 of a four
				for i := range bad {
					flipStored(t, s, m, geo.KeyAt(1, i), int64(i*97%gb), 0x10)
				}
				const guard = 0xA5
				mem, err := store.AllocAligned((per + 2) * gb)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { store.FreeAligned(mem) })
				for i := range mem {
					mem[i] = guard
				}
				want := bytes.Clone(mem)
				rng := rand.New(rand.NewPCG(7, 8))
				tiles, groups := rng.Perm(per/geo.KVHeads), rng.Perm(per)
				first := 0
				if order == "tiles" {
					first = 3 // heads 3..7 of the first tile, then whole tiles
				}
				var reqs []store.ReadReq
				for i := first; i < per; i++ {
					k := geo.KeyAt(1, i)
					tile := i / geo.KVHeads
					if order == "tiles" {
						tile = tiles[tile]
					}
					off := gb + tile*geo.KVHeads*gb // a guard group first
					q := store.ReadReq{Key: k}
					d := groupData(geo, k, 1)
					if bad[i] {
						d = make([]byte, gb)
					}
					if order == "nhd" {
						pitch := geo.KVHeads * rb
						off += k.Head * rb
						q.Buf, q.Pitch, q.RowBytes = mem[off:off+(geo.BlockTokens-1)*pitch+rb], pitch, rb
						for r := range geo.BlockTokens {
							copy(want[off+r*pitch:], d[r*rb:(r+1)*rb])
						}
					} else {
						off += k.Head * gb
						switch order {
						case "reverse":
							off = gb + (per-1-i)*gb
						case "scatter":
							off = gb + groups[i]*gb
						}
						q.Buf = mem[off : off+gb]
						copy(want[off:], d)
					}
					reqs = append(reqs, q)
				}
				if err := s.Read(reqs); err != nil {
					t.Fatal(err)
				}
				for j, q := range reqs {
					if i := first + j; bad[i] != errors.Is(q.Err, store.ErrCorrupt) || !bad[i] && q.Err != nil {
						t.Fatalf("%v: %v", q.Key, q.Err)
					}
				}
				checkBytes(t, mem, want, "(a guard group first)")
				asked := 0
				for i := range bad {
					if i >= first {
						asked++
					}
				}
				if c := s.Metrics().Corrupt; c != uint64(asked) {
					t.Fatalf("%d corrupt groups counted, want %d", c, asked)
				}
			})
		}
	}
}
