package ctl

import (
	"bytes"
	"errors"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl/abi"
)

// ABI minor 3 through a real mount: hostile LOOKUPs and tagged block
// entries are refused with the documented errno or per-entry detail, and
// two prefixes forced onto one block id never serve each other's bytes.

// lookupRaw issues one LOOKUP with header h (the registered-buffer form)
// and returns its errno.
func lookupRaw(c *client.Client, h abi.LookupHeader) error {
	var raw [abi.LookupSize]byte
	h.Marshal(raw[:])
	_, err := c.Ioctl(abi.CmdLookup, raw[:])
	return err
}

// TestLookupHostileHeaders: LOOKUP headers the decoder refuses before any
// pair is read.
func TestLookupHostileHeaders(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	arr, err := c.NewHostBuffer("", 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	id := uint32(arr.ID)
	for _, b := range []struct {
		name string
		h    abi.LookupHeader
		want syscall.Errno
	}{
		{"count 0", abi.LookupHeader{ABI: abi.Version, Buffer: id}, syscall.EINVAL},
		{"count 65537", abi.LookupHeader{ABI: abi.Version, Count: abi.LookupMax + 1, Buffer: id}, syscall.EINVAL},
		{"count 2^32-1", abi.LookupHeader{ABI: abi.Version, Count: 1<<32 - 1, Buffer: id}, syscall.EINVAL},
		{"buffer 0", abi.LookupHeader{ABI: abi.Version, Count: 1}, syscall.EINVAL},
		{"unaligned", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id, Offset: 4}, syscall.EINVAL},
		{"flags", abi.LookupHeader{ABI: abi.Version, Flags: 1, Count: 1, Buffer: id}, syscall.EINVAL},
		{"output field", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id, Run: 3}, syscall.EINVAL},
		{"reserved", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id, Reserved: [3]uint64{0, 1}}, syscall.EINVAL},
		{"version", abi.LookupHeader{ABI: 7, Count: 1, Buffer: id}, syscall.EPROTO},
	} {
		if err := lookupRaw(c, b.h); !errors.Is(err, b.want) {
			t.Errorf("%s: %v, want %v", b.name, err, b.want)
		}
	}
	in := make([]byte, abi.LookupInlineSize)
	for _, h := range []abi.LookupHeader{{ABI: abi.Version}, {ABI: abi.Version, Count: abi.LookupInlineMax + 1},
		{ABI: abi.Version, Count: 1, Buffer: id}, {ABI: abi.Version, Count: 1, Offset: 8}} {
		h.Marshal(in)
		if _, err := c.Ioctl(abi.CmdLookupInline, in); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("inline %+v: %v, want EINVAL", h, err)
		}
	}
	// LOOKUP's number with another size or direction is not a command.
	for _, cmd := range []uint32{abi.CmdLookup&^(0x3fff<<16) | 72<<16, abi.CmdLookup &^ (2 << 30)} {
		if _, err := c.Ioctl(cmd, make([]byte, 72)); !errors.Is(err, syscall.ENOTTY) {
			t.Errorf("command %#x: %v, want ENOTTY", cmd, err)
		}
	}
	// Tagged block headers the decoder refuses: unknown flags, more
	// tagged entries than the inline argument holds.
	bl := make([]byte, abi.BlocksInlineSize)
	for _, h := range []abi.Blocks{{ABI: abi.Version, Flags: 2, Target: 1}, {ABI: abi.Version, Flags: abi.BlocksTagged | 1<<31, Target: 1},
		{ABI: abi.Version, Flags: abi.BlocksTagged, Target: 1, Count: abi.BlocksInlineTaggedMax + 1}} {
		h.Marshal(bl)
		if _, err := c.Ioctl(abi.CmdStoreBlocksInline, bl); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("blocks %+v: %v, want EINVAL", h, err)
		}
	}
	if e.srv.Metrics().Faults != 0 {
		t.Fatal("faults")
	}
}

// requirePrefix skips the test while the daemon has no minor-3 handlers
// (tagged entries, LOOKUP): the ctl wiring over the store's tags is not on
// this branch yet.
func requirePrefix(t *testing.T, c *client.Client) {
	t.Helper()
	if i := c.Info(); !i.Has(abi.CapPrefix) {
		t.Skip("the daemon does not serve tagged entries and LOOKUP yet (no KVFS_CAP_PREFIX)")
	}
}

// putBlocks writes whole blocks into the mounted store.
func putBlocks(t *testing.T, e *env, seed uint64, ids ...uint64) {
	t.Helper()
	for _, id := range ids {
		e.put(blockKeys(e.geo, id), seed)
	}
}

// TestLookupHostilePairs: pair arrays outside their buffer, in an
// unregistered buffer or with reserved bytes set are refused whole, no
// status written; the daemon then answers a good LOOKUP.
func TestLookupHostilePairs(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 16})
	c := openClient(t, e)
	requirePrefix(t, c)
	putBlocks(t, e, 1, 0xb0, 0xb1)
	arr, err := c.NewHostBuffer("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	id := uint32(arr.ID)
	for i := range 128 {
		(&abi.LookupPair{Block: 0xb0 + uint64(i%3)}).Marshal(arr.Mem[i*abi.LookupPairSize:])
	}
	before := bytes.Clone(arr.Mem)
	for _, b := range []struct {
		name string
		h    abi.LookupHeader
		want syscall.Errno
	}{
		{"past the end", abi.LookupHeader{ABI: abi.Version, Count: 129, Buffer: id}, syscall.ERANGE},
		{"offset past the end", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id, Offset: 4096}, syscall.ERANGE},
		{"last pair cut", abi.LookupHeader{ABI: abi.Version, Count: 2, Buffer: id, Offset: 4096 - 40}, syscall.ERANGE},
		{"huge offset", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id, Offset: 1<<64 - 8}, syscall.ERANGE},
		{"max count", abi.LookupHeader{ABI: abi.Version, Count: abi.LookupMax, Buffer: id}, syscall.ERANGE},
		{"unregistered buffer", abi.LookupHeader{ABI: abi.Version, Count: 1, Buffer: id + 100}, syscall.ENOENT},
	} {
		if err := lookupRaw(c, b.h); !errors.Is(err, b.want) {
			t.Errorf("%s: %v, want %v", b.name, err, b.want)
		}
	}
	if !bytes.Equal(arr.Mem, before) {
		t.Fatal("a refused LOOKUP wrote into the pair array")
	}
	// Reserved bytes of one pair: the whole call is refused.
	for _, off := range []int{25, 31} {
		arr.Mem[5*abi.LookupPairSize+off] = 0x80
		if err := lookupRaw(c, abi.LookupHeader{ABI: abi.Version, Count: 8, Buffer: id}); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("reserved byte %d of pair 5: %v, want EINVAL", off, err)
		}
		arr.Mem[5*abi.LookupPairSize+off] = 0
	}
	if !bytes.Equal(arr.Mem, before) {
		t.Fatal("a refused LOOKUP wrote into the pair array")
	}
	// Garbage in the status bytes is ignored on input; a good call after
	// the refusals answers every pair.
	arr.Mem[abi.LookupStatusOff] = 0xff
	var raw [abi.LookupSize]byte
	(&abi.LookupHeader{ABI: abi.Version, Count: 6, Buffer: id, Offset: 0}).Marshal(raw[:])
	run, err := c.Ioctl(abi.CmdLookup, raw[:])
	if err != nil {
		t.Fatal(err)
	}
	var h abi.LookupHeader
	h.Unmarshal(raw[:])
	if run != 2 || h.Run != 2 || h.Present != 4 || h.Absent != 2 || h.Mismatch != 0 {
		t.Fatalf("lookup: run %d, header %+v", run, h)
	}
	for i := range 6 {
		want := abi.LookupPresent
		if i%3 == 2 {
			want = abi.LookupAbsent
		}
		if got := abi.LookupStatus(arr.Mem[i*abi.LookupPairSize+abi.LookupStatusOff]); got != want {
			t.Fatalf("pair %d: %v, want %v", i, got, want)
		}
	}
	if arr.Mem[6*abi.LookupPairSize+abi.LookupStatusOff] != 0 {
		t.Fatal("LOOKUP wrote a status past its count")
	}
	if e.srv.Metrics().Faults != 0 {
		t.Fatal("faults")
	}
}

// TestTaggedEntriesHostile: tagged entries with reserved bits, unknown
// meta flags, a parent without its flag, a self-parent, or disagreeing
// tags for one block are refused one by one with their detail; the others
// proceed; a tagged entry array that fits as 32-byte entries but not as
// 64-byte ones is refused whole.
func TestTaggedEntriesHostile(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 32})
	c := openClient(t, e)
	requirePrefix(t, c)
	geo := e.geo
	cc := newCache(t, c, layouts(geo)[0], 8, 0, geo.Layers, 0, geo.KVHeads)
	whole := func(id uint64, cb int, tag byte) abi.BlockEntryTagged {
		w := cc.t.WholeBlock(id, cb)
		return abi.BlockEntryTagged{BlockEntry: abi.BlockEntry{Block: id, CacheBlock: uint32(cb), LayerCount: w.LayerCount,
			HeadFirst: w.HeadFirst, HeadCount: w.HeadCount, Kinds: abi.KindsBoth}, Tag: abi.Tag{tag}}
	}
	es := []abi.BlockEntryTagged{
		whole(0x100, 0, 1), // fine
		whole(0x101, 1, 1), // reserved2
		whole(0x102, 2, 1), // unknown meta flag
		whole(0x103, 3, 1), // parent without flag
		whole(0x104, 4, 1), // self-parent
		whole(0x105, 5, 1), // same block, two tags: both refused
		whole(0x105, 6, 2),
		whole(0x106, 7, 1), // fine, with a parent
	}
	es[1].Reserved2 = 1
	es[2].MetaFlags = 4
	es[3].Parent = 0x100
	es[4].Parent, es[4].MetaFlags = 0x104, abi.MetaParent
	es[7].Parent, es[7].MetaFlags = 0x100, abi.MetaParent
	raw := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: uint32(cc.id), Count: uint32(len(es))}).Marshal(raw)
	for i := range es {
		es[i].Marshal(raw[abi.BlocksSize+i*abi.BlockEntryTaggedSize:])
	}
	n, err := c.Ioctl(abi.CmdStoreBlocksInline, raw)
	if err != nil || n != 2 {
		t.Fatalf("store: %d OK, %v", n, err)
	}
	want := []abi.Detail{abi.BadNone, abi.BadReserved, abi.BadReserved, abi.BadParent, abi.BadParent, abi.BadMeta, abi.BadMeta, abi.BadNone}
	for i := range es {
		var g abi.BlockEntryTagged
		g.Unmarshal(raw[abi.BlocksSize+i*abi.BlockEntryTaggedSize:])
		wantSt := abi.BadRequest
		if want[i] == abi.BadNone {
			wantSt = abi.OK
		}
		if g.Status != wantSt || g.Detail != want[i] {
			t.Errorf("entry %d: %v/%v, want %v/%v", i, g.Status, g.Detail, wantSt, want[i])
		}
		// The daemon writes only the outcome: tag and parent stay.
		if g.Tag != es[i].Tag || g.Parent != es[i].Parent || g.MetaFlags != es[i].MetaFlags {
			t.Errorf("entry %d: the daemon changed its tag or parent: %+v", i, g)
		}
	}
	st := e.st
	for _, id := range []uint64{0x101, 0x102, 0x103, 0x104, 0x105} {
		if _, ok := st.Block(id); ok {
			t.Errorf("refused block %#x was stored", id)
		}
	}
	r, err := c.Lookup([]client.LookupPair{{Block: 0x100, Tag: client.Tag{1}}, {Block: 0x106, Tag: client.Tag{1}}, {Block: 0x106, Tag: client.Tag{2}}, {Block: 0x105}})
	if err != nil || r.Run != 2 || r.Statuses[2] != client.LookupTagMismatch || r.Statuses[3] != client.LookupAbsent {
		t.Fatalf("lookup after the store: %+v %v", r, err)
	}

	// The registered-array form counts 64 bytes an entry: 64 tagged
	// entries fit 4 KiB as 32-byte ones would not.
	arr, err := c.NewHostBuffer("", 4096)
	if err != nil {
		t.Fatal(err)
	}
	var hdr [abi.BlocksSize]byte
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: uint32(cc.id), Count: 65, Buffer: uint32(arr.ID)}).Marshal(hdr[:])
	if _, err := c.Ioctl(abi.CmdLoadBlocks, hdr[:]); !errors.Is(err, syscall.ERANGE) {
		t.Fatalf("65 tagged entries in 4 KiB: %v, want ERANGE", err)
	}
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: uint32(cc.id), Count: 1, Buffer: uint32(arr.ID), Offset: 4096 - 32}).Marshal(hdr[:])
	if _, err := c.Ioctl(abi.CmdLoadBlocks, hdr[:]); !errors.Is(err, syscall.ERANGE) {
		t.Fatalf("a tagged entry cut by the buffer's end: %v, want ERANGE", err)
	}
	if e.srv.Metrics().Faults != 0 {
		t.Fatal("faults")
	}
}

// TestTagCollision: two prefixes forced onto one block id. A LOAD
// expecting the other prefix's tag gets ABSENT/TAG_MISMATCH and none of
// the stored bytes, in every cache layout (including those the store reads
// straight into); a STORE under a new tag replaces the block, and the FUSE
// files then hold the new prefix's bytes. A minor-2 STORE (no tag) keeps
// the stored tag.
func TestTagCollision(t *testing.T) {
	e := mountEnv(t, envOptions{slots: 32})
	c := openClient(t, e)
	requirePrefix(t, c)
	geo := e.geo
	tagA, tagB := client.Tag{0xa, 15: 1}, client.Tag{0xb, 15: 1}
	for li, lay := range layouts(geo) {
		id := 0xc011 + uint64(li)
		cc := newCache(t, c, lay, 4, 0, geo.Layers, 0, geo.KVHeads)
		keys := blockKeys(geo, id)
		// Prefix A's KV in cache block 0, prefix B's in cache block 1.
		for _, k := range keys {
			cc.place(cc.buf.Mem, geo, k, 0, groupData(e.gb, k, 1))
			cc.place(cc.buf.Mem, geo, k, 1, groupData(e.gb, k, 2))
		}
		cc.want = bytes.Clone(cc.buf.Mem)
		store := func(cb int, tag client.Tag) {
			t.Helper()
			es := []client.BlockEntry{cc.t.WholeBlock(id, cb)}
			es[0].Tag = tag
			if n, err := c.StoreBlocks(cc.id, es); err != nil || n != 1 {
				t.Fatalf("%s: store under %x: %d %v %+v", lay.name, tag, n, err, es)
			}
		}
		load := func(cb int, tag client.Tag) client.BlockEntry {
			t.Helper()
			es := []client.BlockEntry{cc.t.WholeBlock(id, cb)}
			es[0].Tag = tag
			if _, err := c.LoadBlocks(cc.id, es); err != nil {
				t.Fatalf("%s: load: %v", lay.name, err)
			}
			return es[0]
		}
		mismatch := func(cb int, tag client.Tag, what string) {
			t.Helper()
			got := load(cb, tag)
			if got.Status != client.Absent || got.Detail != client.TagMismatch || got.GroupsOK != 0 {
				t.Fatalf("%s %s: %+v, want absent/tag mismatch", lay.name, what, got)
			}
			cc.check(t, what)
		}
		lookup := func(want ...client.LookupStatus) {
			t.Helper()
			r, err := c.Lookup([]client.LookupPair{{Block: id, Tag: tagA}, {Block: id, Tag: tagB}, {Block: id}})
			if err != nil || len(r.Statuses) != 3 || r.Statuses[0] != want[0] || r.Statuses[1] != want[1] || r.Statuses[2] != want[2] {
				t.Fatalf("%s: lookup %+v %v, want %v", lay.name, r, err, want)
			}
		}

		store(0, tagA)
		lookup(client.LookupPresent, client.LookupTagMismatch, client.LookupPresent)
		mismatch(2, tagB, "load of A's block expecting B")
		if got := load(2, tagA); got.Status != client.OK {
			t.Fatalf("%s: load under the stored tag: %+v", lay.name, got)
		}
		for _, k := range keys {
			cc.place(cc.want, geo, k, 2, groupData(e.gb, k, 1))
		}
		cc.check(t, "load under the stored tag")

		// A minor-2 STORE of the same block keeps its tag.
		es := []client.BlockEntry{cc.t.WholeBlock(id, 0)}
		if n, err := c.StoreBlocks(cc.id, es); err != nil || n != 1 {
			t.Fatalf("%s: untagged store: %d %v", lay.name, n, err)
		}
		lookup(client.LookupPresent, client.LookupTagMismatch, client.LookupPresent)

		// Prefix B under the same id replaces A.
		store(1, tagB)
		lookup(client.LookupTagMismatch, client.LookupPresent, client.LookupPresent)
		mismatch(3, tagA, "load of B's block expecting A")
		for _, k := range keys {
			if got := e.cat(k); !bytes.Equal(got, groupData(e.gb, k, 2)) {
				t.Fatalf("%s: FUSE read of %v after the replacing store: not prefix B's bytes", lay.name, k)
			}
		}
		// An untagged LOAD takes whatever is stored.
		if got := load(3, client.Tag{}); got.Status != client.OK {
			t.Fatalf("%s: untagged load: %+v", lay.name, got)
		}
		for _, k := range keys {
			cc.place(cc.want, geo, k, 3, groupData(e.gb, k, 2))
		}
		cc.check(t, "untagged load")
	}
}

// TestPrefixCClient: a C program using only include/kvfs.h stores tagged
// blocks with a parent, asks LOOKUP inline and through a registered pair
// array, and loads one block under a wrong tag (absent, tag mismatch, its
// cache block untouched) and one under its own.
func TestPrefixCClient(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		t.Skip("skipping: no C compiler")
	}
	e := mountEnv(t, envOptions{slots: 16})
	requirePrefix(t, openClient(t, e))
	inc, err := filepath.Abs("../../include")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "prefix_client")
	if out, err := exec.Command(cc, "-std=c11", "-Wall", "-Werror", "-I", inc, "-o", bin, filepath.Join("testdata", "prefix_client.c")).CombinedOutput(); err != nil {
		t.Fatalf("cc: %v\n%s", err, out)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(bin, e.dir)
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("C client: %v\n%s", err, stderr.String())
	}
	const want = "store n_ok 2 statuses 0 0\n" +
		"inline run 2/2 present 2 absent 1 mismatch 1 statuses 1 1 3 2\n" +
		"array run 2/2 present 2 absent 1 mismatch 1 statuses 1 1 3 2\n" +
		"load n_ok 1 mismatch 1/9 ok 0/0\n" +
		"cache block 2 untouched 1, cache block 3 loaded 1\n"
	if stderr.String() != want {
		t.Fatalf("C client said:\n%s\nwant:\n%s", stderr.String(), want)
	}
}
