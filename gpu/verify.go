package gpu

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/kvfs/kvfs/gpu/crc32c"
	"github.com/kvfs/kvfs/gpu/cuda"
	"github.com/kvfs/kvfs/store"
)

// Checker checks loaded groups where they landed on a device and
// checksums staged groups for STORE (Pipeline.Verify and Pipeline.Sum):
// GPUVerifier, or a test's fake.
type Checker interface {
	Verify(items []*Item) error
	Sum(staged [][]byte, crcs []uint32) error
	Close() error
}

var (
	_ Checker = (*GPUVerifier)(nil)
	_ Lander  = (*GPUVerifier)(nil)
)

// Lander is implemented by checkers that can check groups copied packed
// into device scratch and land them in their tiles in one pass
// (Pipeline.Land): GPUVerifier.
type Lander interface {
	Land(items []*Item, srcs []uint64) error
}

// GPUVerifier checks loaded groups where they lie in GPU memory with the
// CRC32C kernel (package gpu/crc32c) on a stream of its own, so a check
// never waits on other batches' copies: Pipeline.Verify runs it on a
// chunk once that chunk's copies completed.
type GPUVerifier struct {
	geo Geometry
	mod *crc32c.Module
	s   cuda.Stream
	chk *crc32c.Checker

	// pool keeps the descriptors and checksums of calls (*vscratch) from
	// call to call: a load verifies every chunk's groups, and slices made
	// per call were megabytes of garbage per gigabyte loaded. Concurrent
	// calls (a direct load's workers) each take one, so their batches
	// run on the checker at once.
	pool sync.Pool
}

// vscratch is one call's descriptors and checksums, kept from call to call.
type vscratch struct {
	groups []crc32c.Group
	dsts   []crc32c.Group
	want   []uint32
	got    []uint32
	refs   []groupRef     // with tiles: the group each descriptor is (expand)
	srcs   []crc32c.Group // with tiles: Land's sources (expand)
}

// scratch returns the call's slices for n groups.
func (v *vscratch) scratch(n int) ([]crc32c.Group, []uint32, []uint32) {
	if cap(v.groups) < n {
		v.groups, v.dsts, v.want, v.got = make([]crc32c.Group, n), make([]crc32c.Group, n), make([]uint32, n), make([]uint32, n)
	}
	return v.groups[:n], v.want[:n], v.got[:n]
}

// take returns a call's scratch (pool); the caller puts it back.
func (v *GPUVerifier) take() *vscratch {
	if x, ok := v.pool.Get().(*vscratch); ok {
		return x
	}
	return &vscratch{}
}

// NewGPUVerifier loads the kernels on device ordinal.
func NewGPUVerifier(ordinal int, geo Geometry) (*GPUVerifier, error) {
	m, err := crc32c.Load(ordinal)
	if err != nil {
		return nil, err
	}
	v := &GPUVerifier{geo: geo, mod: m}
	if err := m.Context().Do(func() error {
		var err error
		v.s, err = cuda.StreamCreate(cuda.StreamNonBlocking)
		return err
	}); err != nil {
		_ = m.Close()
		return nil, err
	}
	v.chk = m.NewChecker(v.s)
	return v, nil
}

// Verify implements Pipeline.Verify: groups whose CRC32C differs from
// Item.CRC (a tile's head's from its CRCs) are zeroed on the device by the
// kernel and get ErrCorrupt. A tile's heads that failed before (Tile.Bad)
// are not checked.
func (v *GPUVerifier) Verify(items []*Item) error {
	x := v.take()
	defer v.pool.Put(x)
	n, tiles := groupsOf(items)
	groups, want, got := x.scratch(n)
	if !tiles {
		// One group per item (a direct load's half a million): no
		// expansion, group k is item k.
		for i, it := range items {
			groups[i], want[i] = v.tile(it, it.Dst), it.CRC
		}
	} else {
		n = v.expand(x, items, nil, groups, want)
	}
	bad, err := v.chk.Verify(groups[:n], want[:n], got[:n])
	return v.outcome(x, items, tiles, bad, want, got, err)
}

// Land implements Pipeline.Land: each item's group, packed at srcs[i] in
// device memory (a tile's heads one after another from there), is checked
// against its recorded checksum and copied to its tile (rows Item.Pitch
// apart) by one kernel pass; a group that differs lands as zeros and gets
// ErrCorrupt.
func (v *GPUVerifier) Land(items []*Item, srcs []uint64) error {
	x := v.take()
	defer v.pool.Put(x)
	n, tiles := groupsOf(items)
	src, want, got := x.scratch(n)
	dst := x.dsts[:n]
	if !tiles {
		for i, it := range items {
			src[i], dst[i], want[i] = v.packed(srcs[i]), v.tile(it, it.Dst), it.CRC
		}
	} else {
		n = v.expand(x, items, srcs, dst, want)
		src = x.srcs[:n]
	}
	bad, err := v.chk.Land(src[:n], dst[:n], want[:n], got[:n])
	return v.outcome(x, items, tiles, bad, want, got, err)
}

// groupRef is a group an expand call laid out: head j of items[item].
type groupRef struct{ item, head int32 }

// groupsOf is how many groups items move, and whether any is a tile.
func groupsOf(items []*Item) (n int, tiles bool) {
	for _, it := range items {
		if it.Tile != nil {
			n, tiles = n+it.Tile.Heads, true
			continue
		}
		n++
	}
	return n, tiles
}

// expand lays out the groups of items still to check (a tile's heads that
// did not fail before) in dst and want, and with srcs (Land) their packed
// sources in x.srcs, noting each in x.refs (the call's scratch); it
// returns how many. dst and want hold every group of items.
func (v *GPUVerifier) expand(x *vscratch, items []*Item, srcs []uint64, dst []crc32c.Group, want []uint32) int {
	if n := len(dst); cap(x.refs) < n || srcs != nil && cap(x.srcs) < n {
		x.refs, x.srcs = make([]groupRef, n), make([]crc32c.Group, n)
	}
	refs, src := x.refs[:cap(x.refs)], x.srcs[:cap(x.srcs)]
	gb := uint64(v.geo.GroupBytes)
	k := 0
	for i, it := range items {
		for j := range it.Groups() {
			if it.Skip(j) {
				continue
			}
			d, crc := it.Group(j)
			dst[k], want[k], refs[k] = v.tile(it, d), crc, groupRef{int32(i), int32(j)}
			if srcs != nil {
				src[k] = v.packed(srcs[i] + uint64(j)*gb)
			}
			k++
		}
	}
	return k
}

// packed is a group packed at addr in device memory (Land's sources).
func (v *GPUVerifier) packed(addr uint64) crc32c.Group {
	g := v.geo
	return crc32c.Group{Addr: addr, Pitch: uint64(g.RowBytes), Rows: uint32(g.Rows), RowBytes: uint32(g.RowBytes)}
}

// tile is a group where it lies on the device, at dst: its rows
// Item.Pitch apart (packed for pitch 0).
func (v *GPUVerifier) tile(it *Item, dst uint64) crc32c.Group {
	g := v.geo
	pitch := it.Pitch
	if pitch == 0 {
		pitch = g.RowBytes
	}
	return crc32c.Group{Addr: dst, Pitch: uint64(pitch), Rows: uint32(g.Rows), RowBytes: uint32(g.RowBytes)}
}

// outcome sets ErrCorrupt on the groups the kernel found bad (Verify and
// Land; bad indexes the groups as laid out: item k's, or with tiles the
// call's expand), or returns the kernel's failure as a whole.
func (v *GPUVerifier) outcome(x *vscratch, items []*Item, tiles bool, bad []int, want, got []uint32, err error) error {
	if err != nil {
		return fmt.Errorf("%w: GPU checksum: %w", ErrCopy, err)
	}
	for _, k := range bad {
		r := groupRef{int32(k), 0}
		if tiles {
			r = x.refs[k]
		}
		it := items[r.item]
		key := it.Key
		key.Head += int(r.head)
		it.FailHead(int(r.head), fmt.Errorf("%w: %v: crc32c %08x on the GPU, header says %08x", store.ErrCorrupt, key, got[k], want[k]))
	}
	return nil
}

// Sum implements Pipeline.Sum: the kernel checksums staged groups in the
// pinned staging buffers, which it reads through their host addresses
// (pinned memory from cuMemHostAlloc is mapped at the same address on every
// device with unified addressing).
func (v *GPUVerifier) Sum(staged [][]byte, crcs []uint32) error {
	x := v.take()
	defer v.pool.Put(x)
	groups, _, _ := x.scratch(len(staged))
	for i, b := range staged {
		groups[i] = crc32c.Group{Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))), Rows: 1, RowBytes: uint32(len(b))}
	}
	if err := v.chk.Sum(groups, crcs); err != nil {
		return fmt.Errorf("%w: GPU checksum of staged groups: %w", ErrCopy, err)
	}
	return nil
}

// Close frees the checker, its stream and the module.
func (v *GPUVerifier) Close() error {
	err := v.chk.Close()
	err = errors.Join(err, v.mod.Context().Do(v.s.Destroy))
	return errors.Join(err, v.mod.Close())
}
