package ctl

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

// cacheLayout is how a test places a paged cache: tensor indexing written
// out independently of the client's stride helpers, which the test checks.
type cacheLayout struct {
	name   string
	target func(i client.Info, nb, headFirst, heads int) client.Target
	size   func(nb, heads int) int // bytes of one tensor
}

func layouts(geo layout.Geometry) []cacheLayout {
	T, rb := geo.BlockTokens, geo.RowBytes()
	return []cacheLayout{
		{name: "nhd", target: client.Info.NHD,
			size: func(nb, heads int) int { return nb * T * heads * rb }},
		{name: "hnd", target: client.Info.HND,
			size: func(nb, heads int) int { return nb * heads * T * rb }},
		{name: "hf", target: func(i client.Info, nb, hf, heads int) client.Target { return i.HF(nb*T, hf, heads) },
			size: func(nb, heads int) int { return heads * nb * T * rb }},
	}
}

// offsetFn is a layout's tensor indexing for a cache of nb blocks and
// heads heads.
func offsetFn(name string, geo layout.Geometry, nb, heads int) func(c, t, h int) int {
	T, rb := geo.BlockTokens, geo.RowBytes()
	switch name {
	case "nhd": // [nb, T, H, D]
		return func(c, t, h int) int { return ((c*T+t)*heads + h) * rb }
	case "hnd": // [nb, H, T, D]
		return func(c, t, h int) int { return ((c*heads+h)*T + t) * rb }
	case "hf": // [H, nb·T, D]
		return func(c, t, h int) int { return (h*nb*T + c*T + t) * rb }
	}
	panic(name)
}

// cache is a target in one host buffer: a (layer, kind) tensor after
// another, each followed by guard bytes, all of it guard bytes at first.
type cache struct {
	lay        cacheLayout
	nb, hf, nh int
	lf, nl     int
	tensor     int // bytes of one tensor
	gap        int
	buf        *client.HostBuffer
	want       []byte // what buf must hold
	t          client.Target
	id         client.TargetID
	off        func(c, t, h int) int
}

func (cc *cache) base(layer, kind int) int {
	return cc.gap + (2*(layer-cc.lf)+kind)*(cc.tensor+cc.gap)
}

func newCache(t *testing.T, c *client.Client, lay cacheLayout, nb, lf, nl, hf, nh int) *cache {
	t.Helper()
	info := c.Info()
	cc := &cache{lay: lay, nb: nb, lf: lf, nl: nl, hf: hf, nh: nh, tensor: lay.size(nb, nh), gap: 4096 + 64}
	cc.off = offsetFn(lay.name, info.Geometry, nb, nh)
	n := cc.gap + 2*nl*(cc.tensor+cc.gap)
	buf, err := c.NewHostBuffer("", int64(n))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Close() })
	cc.buf = buf
	for i := range buf.Mem {
		buf.Mem[i] = guardByte
	}
	cc.want = bytes.Clone(buf.Mem)
	cc.t = lay.target(info, nb, hf, nh)
	cc.t.LayerFirst, cc.t.LayerCount = lf, nl
	for l := lf; l < lf+nl; l++ {
		for k := range 2 {
			cc.t.Regions = append(cc.t.Regions, client.Region{Buffer: buf.ID, Offset: uint64(cc.base(l, k))})
		}
	}
	if got := cc.t.RegionBytes(info); got != int64(cc.tensor) {
		t.Fatalf("%s: region bytes %d, tensor %d", lay.name, got, cc.tensor)
	}
	cc.id, err = c.RegisterTarget(cc.t)
	if err != nil {
		t.Fatalf("%s: register target: %v", lay.name, err)
	}
	return cc
}

// place writes group data of key k into img at cache block cb.
func (cc *cache) place(img []byte, geo layout.Geometry, k layout.Key, cb int, data []byte) {
	rb := geo.RowBytes()
	for row := range geo.BlockTokens {
		o := cc.base(k.Layer, int(k.Kind)) + cc.off(cb, row, k.Head-cc.hf)
		copy(img[o:o+rb], data[row*rb:(row+1)*rb])
	}
}

// gather reads key k's tile at cache block cb out of the buffer.
func (cc *cache) gather(geo layout.Geometry, k layout.Key, cb int) []byte {
	rb := geo.RowBytes()
	out := make([]byte, geo.GroupBytes())
	for row := range geo.BlockTokens {
		o := cc.base(k.Layer, int(k.Kind)) + cc.off(cb, row, k.Head-cc.hf)
		copy(out[row*rb:], cc.buf.Mem[o:o+rb])
	}
	return out
}

func (cc *cache) check(t *testing.T, what string) {
	t.Helper()
	if !bytes.Equal(cc.buf.Mem, cc.want) {
		for i := range cc.want {
			if cc.buf.Mem[i] != cc.want[i] {
				t.Fatalf("%s %s: byte %d is %#x, want %#x", cc.lay.name, what, i, cc.buf.Mem[i], cc.want[i])
			}
		}
	}
}

// cpGroup writes a group through the mount with cp(1).
func cpGroup(t *testing.T, e *env, k layout.Key, data []byte) {
	t.Helper()
	src := filepath.Join(t.TempDir(), "g")
	if err := os.WriteFile(src, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dst := e.path(k)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %v: %v %s", k, err, out)
	}
}

// TestBlocksLayouts: blocks written with cp load through LOAD_BLOCKS into
// NHD, HND and Hugging Face caches, every byte where the layout says and
// none elsewhere (guard bytes around every tensor and between tiles);
// STORE_BLOCKS of those caches reads back through the files byte for byte;
// inline entries and entries in a registered buffer alike.
func TestBlocksLayouts(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 32})
	c := openClient(t, e)
	if !c.Info().Has(abi.CapBlocks) || c.Info().ABIMinor != abi.Minor || c.Info().MaxBlockEntries != abi.BlocksMax {
		t.Fatalf("info %+v", c.Info())
	}
	geo := e.geo
	blocks := []uint64{0xc0de0, 0xc0de1, 0xc0de2}
	for i, b := range blocks {
		for _, k := range blockKeys(geo, b) {
			cpGroup(t, e, k, groupData(e.gb, k, uint64(i)+1))
		}
	}
	for _, lay := range layouts(geo) {
		const nb = 5
		cc := newCache(t, c, lay, nb, 0, geo.Layers, 0, geo.KVHeads)
		// Blocks into cache blocks 4, 0 and 2 (1 and 3 stay guard bytes);
		// an absent block into 3 leaves it untouched.
		cbs := []int{4, 0, 2}
		var es []client.BlockEntry
		for i, b := range blocks {
			es = append(es, cc.t.WholeBlock(b, cbs[i]))
			for _, k := range blockKeys(geo, b) {
				cc.place(cc.want, geo, k, cbs[i], groupData(e.gb, k, uint64(i)+1))
			}
		}
		es = append(es, cc.t.WholeBlock(0xab5e47, 3))
		n, err := c.LoadBlocks(cc.id, es)
		if err != nil || n != 3 {
			t.Fatalf("%s: load %d %v %+v", lay.name, n, err, es)
		}
		for i := range 3 {
			if es[i].Status != client.OK || es[i].GroupsOK != uint32(geo.GroupsPerBlock()) {
				t.Fatalf("%s: entry %d %+v", lay.name, i, es[i])
			}
		}
		if es[3].Status != client.Absent || es[3].GroupsOK != 0 {
			t.Fatalf("%s: absent entry %+v", lay.name, es[3])
		}
		cc.check(t, "inline load")

		// The same through an entry array in a registered buffer, into
		// cleared memory.
		arr, err := c.NewHostBuffer("", 4096)
		if err != nil {
			t.Fatal(err)
		}
		for i := range cc.buf.Mem {
			cc.buf.Mem[i] = guardByte
		}
		if n, err := c.BlocksIn(true, cc.id, arr, 64, es); err != nil || n != 3 {
			t.Fatalf("%s: load from an entry array: %d %v", lay.name, n, err)
		}
		cc.check(t, "entry-array load")
		// The statuses went back into the array.
		var a abi.BlockEntry
		a.Unmarshal(arr.Mem[64+3*abi.BlockEntrySize:])
		if a.Status != abi.Absent || a.Block != 0xab5e47 {
			t.Fatalf("%s: entry in the array %+v", lay.name, a)
		}
		arr.Close()

		// STORE_BLOCKS: cache blocks 4, 0, 2 under new ids, read back with
		// cat.
		st := []client.BlockEntry{cc.t.WholeBlock(0xd00d0, 4), cc.t.WholeBlock(0xd00d1, 0), cc.t.WholeBlock(0xd00d2, 2)}
		if n, err := c.StoreBlocks(cc.id, st); err != nil || n != 3 {
			t.Fatalf("%s: store %d %v %+v", lay.name, n, err, st)
		}
		for i, s := range st {
			for _, k := range blockKeys(geo, s.Block) {
				src := layout.Key{Block: blocks[i], Layer: k.Layer, Head: k.Head, Kind: k.Kind}
				if got := e.cat(k); !bytes.Equal(got, groupData(e.gb, src, uint64(i)+1)) {
					t.Fatalf("%s: stored %v differs", lay.name, k)
				}
			}
			if err := e.st.DeleteBlock(s.Block); err != nil {
				t.Fatal(err)
			}
		}
		cc.check(t, "after store") // STORE reads only
		if err := c.UnregisterTarget(cc.id); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBlocksShards: a tensor-parallel shard holds heads [1, 2) of layers
// [1, 3); its loads land only those groups, and entries reaching outside
// its heads or layers are refused without touching anything.
func TestBlocksShards(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	geo := e.geo
	const block = 0x5aa5
	e.put(blockKeys(geo, block), 3)
	for _, lay := range layouts(geo) {
		cc := newCache(t, c, lay, 3, 1, 2, 1, 1)
		es := []client.BlockEntry{
			cc.t.WholeBlock(block, 1),
			{Block: block, CacheBlock: 2, LayerFirst: 2, LayerCount: 1, HeadFirst: 1, HeadCount: 1, Kinds: client.KindsV},
			{Block: block, CacheBlock: 0, LayerFirst: 1, LayerCount: 1, HeadFirst: 0, HeadCount: 2, Kinds: client.KindsK}, // head 0: not in the shard
			{Block: block, CacheBlock: 0, LayerFirst: 0, LayerCount: 2, HeadFirst: 1, HeadCount: 1, Kinds: client.KindsK}, // layer 0: not in the shard
			{Block: block, CacheBlock: 3, LayerFirst: 1, LayerCount: 1, HeadFirst: 1, HeadCount: 1, Kinds: client.KindsK}, // cache block 3 of 3
		}
		for _, k := range blockKeys(geo, block) {
			if k.Layer >= 1 && k.Layer < 3 && k.Head == 1 {
				cc.place(cc.want, geo, k, 1, groupData(e.gb, k, 3))
				if k.Layer == 2 && k.Kind == layout.V {
					cc.place(cc.want, geo, k, 2, groupData(e.gb, k, 3))
				}
			}
		}
		n, err := c.LoadBlocks(cc.id, es)
		if err != nil || n != 2 {
			t.Fatalf("%s: %d %v", lay.name, n, err)
		}
		want := []struct {
			st  client.Status
			det client.Detail
			ok  uint32
		}{{client.OK, 0, 4}, {client.OK, 0, 1}, {client.BadRequest, abi.BadKey, 0}, {client.BadRequest, abi.BadKey, 0}, {client.BadRequest, abi.BadRange, 0}}
		for i, w := range want {
			if es[i].Status != w.st || es[i].Detail != w.det || es[i].GroupsOK != w.ok {
				t.Fatalf("%s: entry %d %+v, want %+v", lay.name, i, es[i], w)
			}
		}
		cc.check(t, "shard load")
	}
}

// TestBlocksHostile: what a LOAD_BLOCKS or REGISTER_TARGET may not do is
// refused, per entry or as a whole, before any byte moves.
func TestBlocksHostile(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	geo := e.geo
	e.put(blockKeys(geo, 0x77), 1)
	lay := layouts(geo)[0]
	cc := newCache(t, c, lay, 4, 0, geo.Layers, 0, geo.KVHeads)
	errno := func(err error) syscall.Errno {
		var ce *client.Error
		if errors.As(err, &ce) {
			return ce.Errno
		}
		return 0
	}

	// Overlap: two entries naming cache block 1 with a shared group are
	// both refused; one naming other heads of cache block 2 is fine.
	es := []client.BlockEntry{
		cc.t.WholeBlock(0x77, 1),
		{Block: 0x77, CacheBlock: 1, LayerFirst: 3, LayerCount: 1, HeadFirst: 1, HeadCount: 1, Kinds: client.KindsV},
		{Block: 0x77, CacheBlock: 2, LayerFirst: 0, LayerCount: 4, HeadFirst: 0, HeadCount: 1, Kinds: client.KindsBoth},
		{Block: 0x77, CacheBlock: 2, LayerFirst: 0, LayerCount: 4, HeadFirst: 1, HeadCount: 1, Kinds: client.KindsBoth},
	}
	if n, err := c.LoadBlocks(cc.id, es); err != nil || n != 2 {
		t.Fatalf("overlap: %d %v %+v", n, err, es)
	}
	if es[0].Detail != abi.BadOverlap || es[1].Detail != abi.BadOverlap || es[2].Status != client.OK || es[3].Status != client.OK {
		t.Fatalf("overlap statuses %+v", es)
	}
	for _, k := range blockKeys(geo, 0x77) {
		cc.place(cc.want, geo, k, 2, groupData(e.gb, k, 1))
	}
	cc.check(t, "overlap")

	// Reserved bytes and kinds, through the raw ABI.
	raw := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Target: uint32(cc.id), Count: 2}).Marshal(raw)
	(&abi.BlockEntry{Block: 0x77, CacheBlock: 3, LayerCount: 1, HeadCount: 1, Kinds: 1, Reserved: 9}).Marshal(raw[abi.BlocksSize:])
	(&abi.BlockEntry{Block: 0x77, CacheBlock: 3, LayerCount: 1, HeadCount: 1, Kinds: 8}).Marshal(raw[abi.BlocksSize+abi.BlockEntrySize:])
	if n, err := c.Ioctl(abi.CmdLoadBlocksInline, raw); err != nil || n != 0 ||
		raw[abi.BlocksSize+abi.BlockDetailOff] != uint8(abi.BadReserved) || raw[abi.BlocksSize+abi.BlockEntrySize+abi.BlockDetailOff] != uint8(abi.BadKey) {
		t.Fatalf("reserved/kinds: %d %v", n, err)
	}
	cc.check(t, "refused entries")

	// Whole-call failures.
	if _, err := c.LoadBlocks(cc.id+100, es[2:3]); errno(err) != syscall.ENOENT {
		t.Fatalf("unknown target: %v", err)
	}
	// An entry array inside the cache memory.
	if _, err := c.BlocksIn(true, cc.id, cc.buf, cc.base(0, 0)+64, es[2:3]); errno(err) != syscall.EINVAL {
		t.Fatalf("entries in the cache: %v", err)
	}
	cc.clientWrote(t, cc.base(0, 0)+64, len(es[2:3]))
	// Past the end of the array's buffer.
	arr, err := c.NewHostBuffer("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Target: uint32(cc.id), Count: 129, Buffer: uint32(arr.ID)}).Marshal(hdr[:])
	if _, err := c.Ioctl(abi.CmdLoadBlocks, hdr[:]); !errors.Is(err, syscall.ERANGE) {
		t.Fatalf("array past its buffer: %v", err)
	}
	(&abi.Blocks{ABI: abi.Version, Target: uint32(cc.id), Count: 1, Buffer: uint32(arr.ID), Offset: 4}).Marshal(hdr[:])
	if _, err := c.Ioctl(abi.CmdLoadBlocks, hdr[:]); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("misaligned array: %v", err)
	}
	(&abi.Blocks{ABI: abi.Version, Target: uint32(cc.id), Count: abi.BlocksMax + 1, Buffer: uint32(arr.ID)}).Marshal(hdr[:])
	if _, err := c.Ioctl(abi.CmdLoadBlocks, hdr[:]); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("count above the maximum: %v", err)
	}
	// A buffer of a target cannot be unregistered.
	if err := c.Unregister(cc.buf.ID); errno(err) != syscall.EBUSY {
		t.Fatalf("unregister a target's buffer: %v", err)
	}

	// Targets that are refused at registration.
	bad := []struct {
		name string
		mod  func(*client.Target)
		want syscall.Errno
	}{
		{"layers overlap", func(t *client.Target) { t.Regions[2] = t.Regions[0] }, syscall.EINVAL},
		{"rows overlap", func(t *client.Target) { t.RowPitch = 100 }, syscall.EINVAL},
		{"past the buffer", func(t *client.Target) { t.NumBlocks = 1000 }, syscall.ERANGE},
		{"huge offset", func(t *client.Target) { t.Regions[1].Offset = 1<<64 - 8 }, syscall.ERANGE},
		{"unknown buffer", func(t *client.Target) { t.Regions[3].Buffer = 9999 }, syscall.ENOENT},
		{"heads past the store", func(t *client.Target) { t.HeadFirst = 1 }, syscall.EINVAL},
	}
	for _, b := range bad {
		tg := cc.t
		tg.Regions = append([]client.Region(nil), cc.t.Regions...)
		b.mod(&tg)
		if _, err := c.RegisterTarget(tg); errno(err) != b.want {
			t.Errorf("%s: %v, want %v", b.name, err, b.want)
		}
	}
	cc.check(t, "refused targets")
	if e.srv.Metrics().Faults != 0 {
		t.Fatal("faults")
	}
}

// clientWrote takes n entries the client itself wrote at off into the
// expected image, and checks that the refused call changed nothing else
// (nor wrote statuses there).
func (cc *cache) clientWrote(t *testing.T, off, n int) {
	t.Helper()
	copy(cc.want[off:off+n*abi.BlockEntrySize], cc.buf.Mem[off:])
	for i := range n {
		if st := cc.buf.Mem[off+i*abi.BlockEntrySize+abi.BlockStatusOff]; st != 0 {
			t.Fatalf("refused call wrote status %d", st)
		}
	}
	cc.check(t, "refused entry array")
}

// blocksHelper runs the minor-2 helper modes of the test binary; ok is
// false for another mode.
func blocksHelper(mode string, c *client.Client) (rc int, ok bool) {
	switch mode {
	case "blocks-rw":
		return blocksRW(c), true
	case "blocks-loop":
		return blocksLoop(c), true
	}
	return 0, false
}

// blocksRW: one of several processes storing and loading through an HND
// target for KVFS_CTL_SECONDS: its own blocks (id KVFS_CTL_ID<<32 | round)
// stored from the cache and loaded back into other cache blocks, and the
// shared block 0x5a5a (seed 7), every byte verified. Prints "rounds=N".
func blocksRW(c *client.Client) int {
	id, _ := strconv.ParseUint(os.Getenv("KVFS_CTL_ID"), 10, 64)
	secs, _ := strconv.ParseFloat(os.Getenv("KVFS_CTL_SECONDS"), 64)
	info := c.Info()
	geo := info.Geometry
	const nb = 8
	t := info.HND(nb, 0, geo.KVHeads)
	tensor := int(t.RegionBytes(info))
	buf, err := c.NewHostBuffer("", int64(2*geo.Layers*tensor))
	if err != nil {
		fmt.Println("buffer:", err)
		return 1
	}
	for l := range geo.Layers {
		for k := range 2 {
			t.Regions = append(t.Regions, client.Region{Buffer: buf.ID, Offset: uint64((2*l + k) * tensor)})
		}
	}
	tid, err := c.RegisterTarget(t)
	if err != nil {
		fmt.Println("target:", err)
		return 1
	}
	off := offsetFn("hnd", geo, nb, geo.KVHeads)
	rb := geo.RowBytes()
	tile := func(k layout.Key, cb int) []byte {
		out := make([]byte, 0, info.GroupBytes)
		for row := range geo.BlockTokens {
			o := (2*k.Layer+int(k.Kind))*tensor + off(cb, row, k.Head)
			out = append(out, buf.Mem[o:o+rb]...)
		}
		return out
	}
	fill := func(k layout.Key, cb int, data []byte) {
		for row := range geo.BlockTokens {
			o := (2*k.Layer+int(k.Kind))*tensor + off(cb, row, k.Head)
			copy(buf.Mem[o:o+rb], data[row*rb:])
		}
	}
	stop := time.Now().Add(time.Duration(secs * float64(time.Second)))
	rounds := 0
	for r := 0; time.Now().Before(stop); r++ {
		rounds++
		// Store 3 blocks from cache blocks 0..2, load them into 3..5 and
		// the shared block into 6.
		var st, ld []client.BlockEntry
		for j := range 3 {
			b := id<<32 | uint64(r*3+j)%12
			for _, k := range blockKeys(geo, b) {
				fill(k, j, groupData(info.GroupBytes, k, uint64(r)))
			}
			st = append(st, t.WholeBlock(b, j))
			ld = append(ld, t.WholeBlock(b, 3+j))
		}
		ld = append(ld, t.WholeBlock(0x5a5a, 6))
		clear(buf.Mem)
		for j := range 3 {
			for _, k := range blockKeys(geo, st[j].Block) {
				fill(k, j, groupData(info.GroupBytes, k, uint64(r)))
			}
		}
		if n, err := c.StoreBlocks(tid, st); err != nil || n != 3 {
			fmt.Printf("store round %d: %d %v %+v\n", r, n, err, st)
			return 1
		}
		if n, err := c.LoadBlocks(tid, ld); err != nil || n != 4 {
			fmt.Printf("load round %d: %d %v %+v\n", r, n, err, ld)
			return 1
		}
		for j, en := range ld {
			seed := uint64(r)
			if j == 3 {
				seed = 7
			}
			for _, k := range blockKeys(geo, en.Block) {
				if !bytes.Equal(tile(k, int(en.CacheBlock)), groupData(info.GroupBytes, k, seed)) {
					fmt.Printf("round %d: %v in cache block %d differs\n", r, k, en.CacheBlock)
					return 1
				}
			}
		}
		// Cache block 7 was never named: still zero.
		for _, k := range blockKeys(geo, 0) {
			if !bytes.Equal(tile(k, 7), make([]byte, info.GroupBytes)) {
				fmt.Println("cache block 7 was written")
				return 1
			}
		}
	}
	fmt.Printf("rounds=%d\n", rounds)
	return 0
}

// blocksLoop: LOAD_BLOCKS of the blocks KVFS_CTL_BLOCKS (hex, comma
// separated), repeated to KVFS_CTL_COUNT entries through an entry array,
// into an NHD target, until killed.
func blocksLoop(c *client.Client) int {
	info := c.Info()
	var blocks []uint64
	for _, s := range strings.Split(os.Getenv("KVFS_CTL_BLOCKS"), ",") {
		b, err := strconv.ParseUint(s, 16, 64)
		if err != nil {
			fmt.Println("blocks:", err)
			return 1
		}
		blocks = append(blocks, b)
	}
	n, _ := strconv.Atoi(os.Getenv("KVFS_CTL_COUNT"))
	t := info.NHD(n, 0, info.Geometry.KVHeads)
	tensor := t.RegionBytes(info)
	buf, err := c.NewHostBuffer("", 2*int64(info.Geometry.Layers)*tensor)
	if err != nil {
		fmt.Println("buffer:", err)
		return 1
	}
	for l := range info.Geometry.Layers {
		for k := range 2 {
			t.Regions = append(t.Regions, client.Region{Buffer: buf.ID, Offset: uint64(int64(2*l+k) * tensor)})
		}
	}
	tid, err := c.RegisterTarget(t)
	if err != nil {
		fmt.Println("target:", err)
		return 1
	}
	es := make([]client.BlockEntry, n)
	for i := range es {
		es[i] = t.WholeBlock(blocks[i%len(blocks)], i)
	}
	for r := 0; ; r++ {
		if k, err := c.LoadBlocks(tid, es); err != nil || k != n {
			fmt.Println("load:", k, err)
			return 1
		}
		if r == 0 {
			fmt.Println("ready")
		}
	}
}

// TestBlocksConcurrentProcesses: 8 processes store and load through their
// own targets at once, each verifying every byte it loads.
func TestBlocksConcurrentProcesses(t *testing.T) {
	blocksConcurrentProcesses(t, envOptions{slots: 128})
}

// TestBlocksConcurrentProcessesTier is TestBlocksConcurrentProcesses
// through a DRAM tier of 8 blocks, a fraction of the processes' working
// set (8 × 12 blocks and the shared one): each STORE_BLOCKS is kept in the
// tier and written to the store from it, each LOAD_BLOCKS of blocks just
// stored is served from it or, evicted meanwhile by the others, from the
// store, while stores replace blocks other loads may be landing; every
// byte is verified as without the tier.
func TestBlocksConcurrentProcessesTier(t *testing.T) {
	e := blocksConcurrentProcesses(t, envOptions{slots: 128, tierBlocks: 8})
	if m := e.tier.Metrics(); m.Hits == 0 || m.Misses == 0 || m.Evictions == 0 || m.WrittenBytes == 0 {
		t.Fatalf("the tier was not exercised: %+v", m)
	}
}

func blocksConcurrentProcesses(t *testing.T, o envOptions) *env {
	e := mountEnv(t, o)
	e.put(blockKeys(e.geo, 0x5a5a), 7)
	secs := "2"
	if testing.Short() {
		secs = "0.4"
	}
	const procs = 8
	var wg sync.WaitGroup
	outs := make([]string, procs)
	errs := make([]error, procs)
	for p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmd := helperCmd(t, e, "blocks-rw", nil, "KVFS_CTL_ID="+strconv.Itoa(p+1), "KVFS_CTL_SECONDS="+secs)
			out, err := cmd.CombinedOutput()
			outs[p], errs[p] = strings.TrimSpace(string(out)), err
		}()
	}
	wg.Wait()
	for p := range procs {
		if errs[p] != nil || !strings.HasPrefix(outs[p], "rounds=") {
			t.Fatalf("process %d: %v: %s", p, errs[p], outs[p])
		}
	}
	t.Logf("rounds: %v", outs)
	e.waitSessions(0)
	return e
}

// TestBlocksKilledClient: a client killed with SIGKILL in the middle of
// LOAD_BLOCKS of 1,000 blocks leaves no session, target or registration,
// and the daemon serves the next client.
func TestBlocksKilledClient(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	var blocks []string
	for b := range uint64(4) {
		e.put(blockKeys(e.geo, 0x6000+b), 5)
		blocks = append(blocks, fmt.Sprintf("%x", 0x6000+b))
	}
	for round := range 3 {
		cmd := helperCmd(t, e, "blocks-loop", nil, "KVFS_CTL_BLOCKS="+strings.Join(blocks, ","), "KVFS_CTL_COUNT=1000")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		if line != "ready\n" {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("helper: %q", line)
		}
		before := e.srv.Metrics().Loads
		time.Sleep(time.Duration(10+round*37) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		e.waitSessions(0)
		if m := e.srv.Metrics(); m.Buffers != 0 || m.RegisteredBytes != 0 {
			t.Fatalf("round %d: registrations left after the kill: %+v", round, m)
		}
		t.Logf("round %d: %d loads between ready and the kill", round, e.srv.Metrics().Loads-before)
	}
	c := openClient(t, e)
	cc := newCache(t, c, layouts(e.geo)[1], 2, 0, e.geo.Layers, 0, e.geo.KVHeads)
	es := []client.BlockEntry{cc.t.WholeBlock(0x6002, 1)}
	if n, err := c.LoadBlocks(cc.id, es); err != nil || n != 1 {
		t.Fatalf("after kills: %d %v %+v", n, err, es)
	}
	for _, k := range blockKeys(e.geo, 0x6002) {
		cc.place(cc.want, e.geo, k, 1, groupData(e.gb, k, 5))
	}
	cc.check(t, "after kills")
}

// TestBlocksCClient: a C program using only include/kvfs.h registers an
// HND target and loads two blocks written with cp, inline and through an
// entry array; the cache memory it prints is byte for byte what the layout
// says.
func TestBlocksCClient(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("skipping: no C compiler")
	}
	e := mountEnv(t, envOptions{slots: 16})
	geo := e.geo
	blocks := []uint64{0x7a, 0x7b}
	for i, b := range blocks {
		for _, k := range blockKeys(geo, b) {
			cpGroup(t, e, k, groupData(e.gb, k, uint64(i)+11))
		}
	}
	inc, err := filepath.Abs("../../include")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "blocks_client")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-I", inc, "-o", bin, filepath.Join("testdata", "blocks_client.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, e.dir, "7a", "7b")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("C client: %v\n%s", err, stderr.String())
	}
	gpb := geo.GroupsPerBlock()
	wantLog := fmt.Sprintf("inline 0 %d\ninline 0 %d\ninline n_ok 2 2 groups %d\narray 0 %d\narray 0 %d\narray n_ok 2 2 groups %d\n",
		gpb, gpb, 2*gpb, gpb, gpb, 2*gpb)
	if stderr.String() != wantLog {
		t.Fatalf("C client said:\n%s\nwant:\n%s", stderr.String(), wantLog)
	}
	const nb = 4
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := nb * H * T * rb
	want := make([]byte, 2*geo.Layers*tensor)
	off := offsetFn("hnd", geo, nb, H)
	for i, b := range blocks {
		for _, k := range blockKeys(geo, b) {
			data := groupData(e.gb, layout.Key{Block: b, Layer: k.Layer, Head: k.Head, Kind: k.Kind}, uint64(i)+11)
			for _, cb := range []int{i, nb - 1 - i} {
				for row := range T {
					o := (2*k.Layer+int(k.Kind))*tensor + off(cb, row, k.Head)
					copy(want[o:o+rb], data[row*rb:])
				}
			}
		}
	}
	if !bytes.Equal(out, want) {
		t.Fatalf("C client's cache memory (%d bytes) differs from the layout's (%d)", len(out), len(want))
	}
}
