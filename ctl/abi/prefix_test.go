package abi

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// TestMinor2EntryBytes pins the encoding of a minor-2 block entry and
// header: a client built against minor 2 must keep producing exactly these
// bytes, and the decoder must keep accepting them as 32-byte entries.
func TestMinor2EntryBytes(t *testing.T) {
	e := BlockEntry{Block: 0x0102030405060708, CacheBlock: 0x11223344, LayerFirst: 1, LayerCount: 2, HeadFirst: 3, HeadCount: 4,
		Kinds: KindsBoth, Status: Absent, Detail: BadKey, GroupsOK: 0x55667788}
	var b [BlockEntrySize]byte
	e.Marshal(b[:])
	const want = "0807060504030201" + "44332211" + "0100" + "0200" + "0300" + "0400" + "03" + "01" + "01" + "00" + "88776655" + "00000000"
	if got := hex.EncodeToString(b[:]); got != want {
		t.Fatalf("minor-2 entry bytes\n got %s\nwant %s", got, want)
	}
	in := make([]byte, BlocksInlineSize)
	(&Blocks{ABI: Version, Target: 1, Count: BlocksInlineMax}).Marshal(in)
	r, err := Decode(CmdLoadBlocksInline, in, BlocksInlineSize)
	if err != nil || r.Blocks.Header.Tagged() || r.Blocks.Header.EntrySize() != BlockEntrySize ||
		len(r.Blocks.Entries) != BlocksInlineMax*BlockEntrySize {
		t.Fatalf("minor-2 inline header: %v, %d entry bytes", err, len(r.Blocks.Entries))
	}
	// A 32-byte entry read through the tagged decoder has no tag or parent.
	et := BlockEntryTagged{Tag: Tag{1}, Parent: 9, MetaFlags: MetaParent, Reserved2: 3}
	et.UnmarshalSized(b[:], BlockEntrySize)
	if et.BlockEntry != e || et.Tag != (Tag{}) || et.Parent != 0 || et.MetaFlags != 0 || et.Reserved2 != 0 {
		t.Fatalf("32-byte entry as tagged: %+v", et)
	}
}

func TestTaggedEntryRoundTrip(t *testing.T) {
	e := BlockEntryTagged{
		BlockEntry: BlockEntry{Block: 0xabc, CacheBlock: 7, LayerCount: 3, HeadCount: 4, Kinds: KindsK, Status: Absent, Detail: TagMismatch, GroupsOK: 2},
		Tag:        Tag{0xde, 0xad, 15: 0xef}, Parent: 0xabb, MetaFlags: MetaParent,
	}
	b := make([]byte, BlockEntryTaggedSize)
	e.Marshal(b)
	var short [BlockEntrySize]byte
	e.BlockEntry.Marshal(short[:])
	if !bytes.Equal(b[:BlockEntrySize], short[:]) {
		t.Fatal("the first 32 bytes of a tagged entry differ from the minor-2 entry")
	}
	if !bytes.Equal(b[32:48], e.Tag[:]) || le.Uint64(b[48:]) != 0xabb || le.Uint32(b[56:]) != MetaParent {
		t.Fatalf("tagged entry bytes %x", b)
	}
	var g BlockEntryTagged
	g.UnmarshalSized(b, BlockEntryTaggedSize)
	if g != e {
		t.Fatalf("round trip %+v, want %+v", g, e)
	}
	c := make([]byte, BlockEntrySize)
	e.MarshalSized(c, BlockEntrySize)
	if !bytes.Equal(c, short[:]) {
		t.Fatal("MarshalSized(32) is not the minor-2 encoding")
	}
	// Statuses are written at the same offsets in both forms.
	if b[BlockStatusOff] != uint8(Absent) || b[BlockDetailOff] != uint8(TagMismatch) || le.Uint32(b[BlockGroupsOKOff:]) != 2 {
		t.Fatal("output offsets of the tagged entry")
	}
}

func TestCheckMeta(t *testing.T) {
	lay, err := small.CheckTarget(&Target{NumBlocks: 4, BlockStride: 128, HeadStride: 32, RowPitch: 8, RowBytes: 8, LayerCount: 1, HeadCount: 4,
		Regions: [TargetMaxRegions]TargetRegion{{Buffer: 1}, {Buffer: 1, Offset: 512}}}, func(uint32) (uint64, bool) { return 4096, true })
	if err != nil {
		t.Fatal(err)
	}
	ok := BlockEntry{Block: 5, CacheBlock: 1, LayerCount: 1, HeadCount: 4, Kinds: KindsBoth}
	for _, c := range []struct {
		name   string
		e      BlockEntryTagged
		want   error
		detail Detail
	}{
		{"plain", BlockEntryTagged{BlockEntry: ok}, nil, BadNone},
		{"tag", BlockEntryTagged{BlockEntry: ok, Tag: Tag{1}}, nil, BadNone},
		{"parent", BlockEntryTagged{BlockEntry: ok, Parent: 4, MetaFlags: MetaParent}, nil, BadNone},
		{"parent 0", BlockEntryTagged{BlockEntry: ok, Parent: 0, MetaFlags: MetaParent}, nil, BadNone},
		{"self parent", BlockEntryTagged{BlockEntry: ok, Parent: 5, MetaFlags: MetaParent}, ErrParent, BadParent},
		{"parent without flag", BlockEntryTagged{BlockEntry: ok, Parent: 4}, ErrParent, BadParent},
		{"unknown meta flag", BlockEntryTagged{BlockEntry: ok, MetaFlags: 2}, ErrReserved, BadReserved},
		{"high meta flag", BlockEntryTagged{BlockEntry: ok, Parent: 4, MetaFlags: MetaParent | 1<<31}, ErrReserved, BadReserved},
		{"reserved2", BlockEntryTagged{BlockEntry: ok, Reserved2: 1}, ErrReserved, BadReserved},
		{"minor-2 reserved first", BlockEntryTagged{BlockEntry: BlockEntry{Block: 5, LayerCount: 1, HeadCount: 4, Kinds: 1, Reserved1: 1},
			Parent: 5, MetaFlags: MetaParent}, ErrReserved, BadReserved},
		{"key before parent", BlockEntryTagged{BlockEntry: BlockEntry{Block: 5, LayerCount: 2, HeadCount: 4, Kinds: 1},
			Parent: 5, MetaFlags: MetaParent}, ErrKey, BadKey},
	} {
		n, err := lay.CheckTagged(&c.e)
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
		if d := DetailOf(err); d != c.detail {
			t.Errorf("%s: detail %v, want %v", c.name, d, c.detail)
		}
		if err == nil && n != 8 {
			t.Errorf("%s: %d groups", c.name, n)
		}
	}
	if DetailOf(ErrMeta) != BadMeta || TagMismatch.String() == "" || BadParent.String() == "" || BadMeta.String() == "" {
		t.Fatal("minor-3 details")
	}
}

func blocksArg(cmd uint32, h Blocks) []byte {
	b := make([]byte, IoctlSize(cmd))
	h.Marshal(b)
	return b
}

func lookupArg(cmd uint32, h LookupHeader) []byte {
	b := make([]byte, IoctlSize(cmd))
	h.Marshal(b)
	return b
}

func TestDecodeMinor3(t *testing.T) {
	tagged := Blocks{ABI: Version, Flags: BlocksTagged, Target: 1}
	for _, c := range []struct {
		name string
		cmd  uint32
		in   []byte
		want error
		n    int // entry or pair bytes of an accepted inline request
	}{
		{"tagged inline", CmdStoreBlocksInline, blocksArg(CmdStoreBlocksInline, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: 3}), nil, 3 * 64},
		{"tagged inline max", CmdLoadBlocksInline, blocksArg(CmdLoadBlocksInline, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: BlocksInlineTaggedMax}), nil, BlocksInlineTaggedMax * 64},
		{"tagged inline over", CmdLoadBlocksInline, blocksArg(CmdLoadBlocksInline, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: BlocksInlineTaggedMax + 1}), ErrCount, 0},
		{"untagged inline 509", CmdLoadBlocksInline, blocksArg(CmdLoadBlocksInline, Blocks{ABI: Version, Target: 1, Count: BlocksInlineMax}), nil, BlocksInlineMax * 32},
		{"tagged buffer", CmdStoreBlocks, blocksArg(CmdStoreBlocks, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: BlocksMax, Buffer: 2, Offset: 64}), nil, 0},
		{"tagged buffer over", CmdStoreBlocks, blocksArg(CmdStoreBlocks, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: BlocksMax + 1, Buffer: 2}), ErrCount, 0},
		{"tagged unaligned", CmdStoreBlocks, blocksArg(CmdStoreBlocks, Blocks{ABI: Version, Flags: BlocksTagged, Target: 1, Count: 1, Buffer: 2, Offset: 4}), ErrEntriesAt, 0},
		{"unknown blocks flag", CmdStoreBlocks, blocksArg(CmdStoreBlocks, Blocks{ABI: Version, Flags: 2, Target: 1, Count: 1, Buffer: 2}), ErrFlags, 0},
		{"blocks flag high", CmdLoadBlocksInline, blocksArg(CmdLoadBlocksInline, Blocks{ABI: Version, Flags: BlocksTagged | 1<<31}), ErrFlags, 0},
		{"tagged reserved", CmdLoadBlocksInline, blocksArg(CmdLoadBlocksInline, Blocks{ABI: tagged.ABI, Flags: tagged.Flags, Reserved: [3]uint64{0, 0, 1}}), ErrReserved, 0},

		{"lookup inline", CmdLookupInline, lookupArg(CmdLookupInline, LookupHeader{ABI: Version, Count: 5}), nil, 5 * 32},
		{"lookup inline max", CmdLookupInline, lookupArg(CmdLookupInline, LookupHeader{ABI: Version, Count: LookupInlineMax}), nil, LookupInlineMax * 32},
		{"lookup inline over", CmdLookupInline, lookupArg(CmdLookupInline, LookupHeader{ABI: Version, Count: LookupInlineMax + 1}), ErrCount, 0},
		{"lookup inline buffer", CmdLookupInline, lookupArg(CmdLookupInline, LookupHeader{ABI: Version, Count: 1, Buffer: 1}), ErrReserved, 0},
		{"lookup buffer", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: LookupMax, Buffer: 1, Offset: 8}), nil, 0},
		{"lookup count 0", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Buffer: 1}), ErrCount, 0},
		{"lookup inline count 0", CmdLookupInline, lookupArg(CmdLookupInline, LookupHeader{ABI: Version}), ErrCount, 0},
		{"lookup over", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: LookupMax + 1, Buffer: 1}), ErrCount, 0},
		{"lookup count huge", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: 1<<32 - 1, Buffer: 1}), ErrCount, 0},
		{"lookup no buffer", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: 1}), ErrEntriesAt, 0},
		{"lookup unaligned", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: 1, Buffer: 1, Offset: 12}), ErrEntriesAt, 0},
		{"lookup version", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: 2, Count: 1, Buffer: 1}), ErrVersion, 0},
		{"lookup flags", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Flags: 1, Count: 1, Buffer: 1}), ErrFlags, 0},
		{"lookup out field", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: 1, Buffer: 1, Run: 1}), ErrReserved, 0},
		{"lookup reserved", CmdLookup, lookupArg(CmdLookup, LookupHeader{ABI: Version, Count: 1, Buffer: 1, Reserved: [3]uint64{1}}), ErrReserved, 0},
		{"lookup short", CmdLookup, make([]byte, 63), ErrSize, 0},
	} {
		r, err := Decode(c.cmd, c.in, len(c.in))
		if !errors.Is(err, c.want) || (c.want == nil && err != nil) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
			continue
		}
		if err != nil {
			continue
		}
		got := len(r.Blocks.Entries)
		if r.Op == OpLookup {
			got = len(r.Lookup.Pairs)
			if r.Lookup.Header.Count == 0 {
				t.Errorf("%s: empty lookup accepted", c.name)
			}
		}
		if got != c.n {
			t.Errorf("%s: %d entry bytes, want %d", c.name, got, c.n)
		}
	}
	if c, err := Lookup(CmdLookup); err != nil || c.Op != OpLookup || c.Op.String() != "lookup" || !c.In || !c.Out {
		t.Fatalf("Lookup(CmdLookup) = %+v, %v", c, err)
	}
}

func TestLookupPairs(t *testing.T) {
	arr := make([]byte, 3*LookupPairSize)
	ps := []LookupPair{{Block: 1}, {Block: 2, Tag: Tag{7, 15: 9}, Status: LookupTagMismatch}, {Block: 1 << 63, Tag: Tag{1}}}
	for i := range ps {
		ps[i].Marshal(arr[i*LookupPairSize:])
	}
	blocks := make([]uint64, 3)
	tags := make([]Tag, 3)
	if err := DecodePairs(arr, blocks, tags); err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		if blocks[i] != ps[i].Block || tags[i] != ps[i].Tag {
			t.Fatalf("pair %d: %#x %x", i, blocks[i], tags[i])
		}
	}
	// A named tag type with the same layout decodes alike.
	type otherTag [16]byte
	ot := make([]otherTag, 3)
	if err := DecodePairs(arr, blocks, ot); err != nil || ot[1] != otherTag(ps[1].Tag) {
		t.Fatalf("named tag type: %v %x", err, ot[1])
	}
	for _, off := range []int{25, 28, 31} {
		bad := bytes.Clone(arr)
		bad[LookupPairSize+off] = 1
		if err := DecodePairs(bad, blocks, tags); !errors.Is(err, ErrReserved) {
			t.Fatalf("reserved byte %d: %v", off, err)
		}
	}
	PutLookupStatus(arr, 2, LookupPresent)
	var p LookupPair
	p.Unmarshal(arr[2*LookupPairSize:])
	if p.Status != LookupPresent || p.Block != 1<<63 || p.Status.String() != "present" {
		t.Fatalf("pair after PutLookupStatus: %+v", p)
	}
	h := LookupHeader{Present: 1, Absent: 2, Mismatch: 3, Run: 4}
	out := make([]byte, LookupSize)
	h.PutResult(out)
	var g LookupHeader
	g.Unmarshal(out)
	if g != h {
		t.Fatalf("PutResult: %+v", g)
	}
}

// FuzzLookup: the LOOKUP decoder never panics, accepts only headers whose
// fixed fields are valid, and DecodePairs accepts only pairs whose reserved
// bytes are zero, decoding their ids and tags exactly.
func FuzzLookup(f *testing.F) {
	in := make([]byte, LookupInlineSize)
	(&LookupHeader{ABI: Version, Count: 2}).Marshal(in)
	(&LookupPair{Block: 9, Tag: Tag{1}}).Marshal(in[LookupSize:])
	(&LookupPair{Block: 10, Status: LookupAbsent}).Marshal(in[LookupSize+LookupPairSize:])
	f.Add(false, in)
	f.Add(true, in[:LookupSize])
	f.Fuzz(func(t *testing.T, inline bool, raw []byte) {
		cmd := CmdLookup
		if inline {
			cmd = CmdLookupInline
		}
		arg := make([]byte, IoctlSize(cmd))
		copy(arg, raw)
		r, err := Decode(cmd, arg, len(arg))
		if err != nil {
			return
		}
		h := r.Lookup.Header
		if r.Op != OpLookup || h.ABI != Version || h.Flags != 0 || h.Count == 0 || h.Count > uint32(r.Max) ||
			h.Present|h.Absent|h.Mismatch|h.Run != 0 || h.Reserved != [3]uint64{} {
			t.Fatalf("accepted header %+v", h)
		}
		if !inline {
			if h.Buffer == 0 || h.Offset%8 != 0 || r.Lookup.Pairs != nil {
				t.Fatalf("accepted pair array %+v", h)
			}
			return
		}
		if h.Buffer != 0 || h.Offset != 0 || len(r.Lookup.Pairs) != int(h.Count)*LookupPairSize {
			t.Fatalf("inline %+v with %d pair bytes", h, len(r.Lookup.Pairs))
		}
		blocks := make([]uint64, h.Count)
		tags := make([]Tag, h.Count)
		err = DecodePairs(r.Lookup.Pairs, blocks, tags)
		firstBad := -1
		for i := range blocks {
			var p LookupPair
			p.Unmarshal(r.Lookup.Pairs[i*LookupPairSize:])
			if p.Reserved != [7]byte{} {
				firstBad = i
				break
			}
			if err == nil && (blocks[i] != p.Block || tags[i] != p.Tag) {
				t.Fatalf("pair %d decoded %#x %x, want %+v", i, blocks[i], tags[i], p)
			}
		}
		if (firstBad >= 0) != (err != nil) || (err != nil && !errors.Is(err, ErrReserved)) {
			t.Fatalf("DecodePairs: %v, first pair with reserved bytes %d", err, firstBad)
		}
	})
}

// FuzzTaggedEntry: any 64 bytes round-trip through BlockEntryTagged, and
// CheckMeta accepts exactly the entries with zero reserved bits, a parent
// only under its flag, and no self-parent.
func FuzzTaggedEntry(f *testing.F) {
	b := make([]byte, BlockEntryTaggedSize)
	(&BlockEntryTagged{BlockEntry: BlockEntry{Block: 3, LayerCount: 1, HeadCount: 1, Kinds: 1}, Tag: Tag{4}, Parent: 2, MetaFlags: MetaParent}).Marshal(b)
	f.Add(b)
	f.Fuzz(func(t *testing.T, raw []byte) {
		in := make([]byte, BlockEntryTaggedSize)
		copy(in, raw)
		var e BlockEntryTagged
		e.Unmarshal(in)
		out := make([]byte, BlockEntryTaggedSize)
		e.Marshal(out)
		if !bytes.Equal(in, out) {
			t.Fatalf("round trip %x → %x", in, out)
		}
		flags := le.Uint32(in[56:])
		parent := le.Uint64(in[48:])
		wantOK := le.Uint32(in[60:]) == 0 && flags&^MetaParent == 0 &&
			(flags&MetaParent != 0 || parent == 0) && (flags&MetaParent == 0 || parent != le.Uint64(in[0:]))
		if err := e.CheckMeta(); (err == nil) != wantOK {
			t.Fatalf("CheckMeta(%+v) = %v", e, err)
		}
	})
}
