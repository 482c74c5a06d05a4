package client

import (
	"bytes"
	"errors"
	"syscall"
	"testing"

	"github.com/kvfs/kvfs/ctl/abi"
)

// Entries without tags or parents keep the minor-2 form (a daemon of
// minor 2 serves them, byte for byte as before); any tag or parent selects
// the tagged form, whose entries the daemon's decoder accepts with their
// tags and parents, and which a daemon without CapPrefix is never sent.
func TestBlocksForm(t *testing.T) {
	plain := []BlockEntry{{Block: 1, CacheBlock: 2, LayerCount: 1, HeadCount: 1, Kinds: KindsBoth}, {Block: 2, CacheBlock: 3, LayerCount: 1, HeadCount: 1, Kinds: KindsK}}
	c2 := &Client{info: Info{Caps: abi.CapBlocks}}
	c3 := &Client{info: Info{Caps: abi.CapBlocks | abi.CapPrefix}}
	for _, c := range []*Client{c2, c3} {
		flags, size, inl := c.blocksForm(plain)
		if flags != 0 || size != abi.BlockEntrySize || inl != abi.BlocksInlineMax {
			t.Fatalf("plain entries: flags %d size %d inline %d", flags, size, inl)
		}
	}
	got := make([]byte, 2*abi.BlockEntrySize)
	encodeBlocks(got, plain, abi.BlockEntrySize)
	want := make([]byte, 2*abi.BlockEntrySize)
	for i, e := range plain {
		(&abi.BlockEntry{Block: e.Block, CacheBlock: e.CacheBlock, LayerCount: 1, HeadCount: 1, Kinds: e.Kinds}).Marshal(want[i*abi.BlockEntrySize:])
	}
	if !bytes.Equal(got, want) {
		t.Fatal("plain entries are not the minor-2 encoding")
	}

	tagged := append([]BlockEntry(nil), plain...)
	tagged[1].Tag = Tag{0xaa, 15: 0x55}
	tagged[1].Parent, tagged[1].HasParent = 1, true
	for _, es := range [][]BlockEntry{tagged, {{Block: 3, HasParent: true}}, {{Block: 3, Tag: Tag{1}}}} {
		if _, size, _ := c2.blocksForm(es); size != 0 {
			t.Fatalf("tagged entries for a daemon without CapPrefix: size %d", size)
		}
		if flags, size, inl := c3.blocksForm(es); flags != abi.BlocksTagged || size != abi.BlockEntryTaggedSize || inl != abi.BlocksInlineTaggedMax {
			t.Fatalf("tagged entries: flags %d size %d inline %d", flags, size, inl)
		}
	}
	if _, err := c2.StoreBlocks(1, tagged); !errors.Is(err, syscall.EOPNOTSUPP) {
		t.Fatalf("StoreBlocks of tagged entries without CapPrefix: %v", err)
	}
	raw := make([]byte, abi.BlocksInlineSize)
	(&abi.Blocks{ABI: abi.Version, Flags: abi.BlocksTagged, Target: 1, Count: 2}).Marshal(raw)
	encodeBlocks(raw[abi.BlocksSize:], tagged, abi.BlockEntryTaggedSize)
	r, err := abi.Decode(abi.CmdStoreBlocksInline, raw, len(raw))
	if err != nil {
		t.Fatal(err)
	}
	for i := range tagged {
		var e abi.BlockEntryTagged
		e.UnmarshalSized(r.Blocks.Entries[i*abi.BlockEntryTaggedSize:], r.Blocks.Header.EntrySize())
		if err := e.CheckMeta(); err != nil || e.Block != tagged[i].Block || e.Tag != tagged[i].Tag ||
			e.Parent != tagged[i].Parent || e.HasParent() != tagged[i].HasParent || e.Kinds != tagged[i].Kinds {
			t.Fatalf("entry %d decoded as %+v (%v)", i, e, err)
		}
	}
	// Outcomes come back from either form.
	raw[abi.BlocksSize+abi.BlockEntryTaggedSize+abi.BlockStatusOff] = uint8(Absent)
	raw[abi.BlocksSize+abi.BlockEntryTaggedSize+abi.BlockDetailOff] = uint8(TagMismatch)
	raw[abi.BlocksSize+abi.BlockStatusOff] = uint8(OK)
	if n := unmarshalBlocks(tagged, raw[abi.BlocksSize:], abi.BlockEntryTaggedSize); n != 1 || tagged[1].Status != Absent || tagged[1].Detail != TagMismatch {
		t.Fatalf("outcomes: %d OK, %+v", n, tagged[1])
	}
}

// The LOOKUP a client builds is one the decoder accepts with the client's
// pairs; the answer's counts add up across calls and the run stops at the
// first pair that is not present.
func TestLookupEncoding(t *testing.T) {
	ps := []LookupPair{{Block: 7}, {Block: 8, Tag: Tag{3}}, {Block: 1 << 60, Tag: Tag{15: 1}}}
	raw := make([]byte, abi.LookupInlineSize)
	encodeLookup(raw, ps, 0, 0)
	r, err := abi.Decode(abi.CmdLookupInline, raw, len(raw))
	if err != nil {
		t.Fatal(err)
	}
	blocks := make([]uint64, len(ps))
	tags := make([]Tag, len(ps))
	if err := abi.DecodePairs(r.Lookup.Pairs, blocks, tags); err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		if blocks[i] != ps[i].Block || tags[i] != ps[i].Tag {
			t.Fatalf("pair %d: %#x %x", i, blocks[i], tags[i])
		}
	}
	var hdr [abi.LookupSize]byte
	encodeLookup(hdr[:], ps, 4, 64)
	if r, err := abi.Decode(abi.CmdLookup, hdr[:], len(hdr)); err != nil || r.Lookup.Header.Buffer != 4 || r.Lookup.Header.Offset != 64 || r.Lookup.Header.Count != 3 {
		t.Fatalf("registered-buffer header: %+v %v", r.Lookup.Header, err)
	}

	// Two calls: the first all present, the second present then absent.
	res := LookupResult{Statuses: make([]LookupStatus, 5)}
	answer := func(st ...LookupStatus) ([]byte, []byte) {
		h := abi.LookupHeader{}
		pairs := make([]byte, len(st)*abi.LookupPairSize)
		lead := true
		for i, s := range st {
			abi.PutLookupStatus(pairs, i, s)
			switch s {
			case LookupPresent:
				h.Present++
				if lead {
					h.Run++
				}
			case LookupAbsent:
				h.Absent++
			default:
				h.Mismatch++
			}
			lead = lead && s == LookupPresent
		}
		b := make([]byte, abi.LookupSize)
		h.Marshal(b)
		return b, pairs
	}
	h1, p1 := answer(LookupPresent, LookupPresent)
	decodeLookup(&res, h1, p1, 0, 2)
	h2, p2 := answer(LookupPresent, LookupTagMismatch, LookupPresent)
	decodeLookup(&res, h2, p2, 2, 3)
	if res.Run != 3 || res.Present != 4 || res.Mismatch != 1 || res.Absent != 0 || res.Statuses[3] != LookupTagMismatch {
		t.Fatalf("result %+v", res)
	}
	h3, p3 := answer(LookupPresent)
	res2 := LookupResult{Statuses: make([]LookupStatus, 3)}
	h0, p0 := answer(LookupAbsent, LookupPresent)
	decodeLookup(&res2, h0, p0, 0, 2)
	decodeLookup(&res2, h3, p3, 2, 1)
	if res2.Run != 0 || res2.Present != 2 {
		t.Fatalf("run after a leading absent pair: %+v", res2)
	}
	if _, err := (&Client{info: Info{Caps: abi.CapBlocks}}).Lookup(ps); !errors.Is(err, syscall.ENOTTY) {
		t.Fatalf("Lookup without CapPrefix: %v", err)
	}
}
