package store_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvfs/kvfs/store"
)

// FuzzSuperblock: decoding arbitrary bytes never panics, fails with one of
// the documented sentinels, and what decodes re-encodes to the same bytes.
func FuzzSuperblock(f *testing.F) {
	s, m := newMemStore(f, 2, testGeo)
	sb := s.Superblock()
	f.Add(m.Image()[:store.SuperblockSize])
	f.Add(store.MarshalSuperblock(&sb)[:100])
	f.Add(make([]byte, store.SuperblockSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := store.UnmarshalSuperblock(b)
		if err != nil {
			if !errors.Is(err, store.ErrNoStore) && !errors.Is(err, store.ErrSuperblock) && !errors.Is(err, store.ErrVersion) {
				t.Fatalf("undocumented error: %v", err)
			}
			return
		}
		if err := got.Geometry.Validate(); err != nil {
			t.Fatalf("decoded an invalid geometry: %v", err)
		}
		if re := store.MarshalSuperblock(got); !bytes.Equal(re[:112], b[:112]) {
			t.Fatalf("re-encoding differs")
		}
	})
}

// FuzzSlotHeader: decoding never panics, errors wrap ErrHeader, and a
// decoded header (version 1 or 2) is self-consistent and re-encodes, in its
// version, to the same bytes, tag and parent included.
func FuzzSlotHeader(f *testing.F) {
	s, m := newMemStore(f, 2, testGeo)
	put(f, s, keysOf(9, 0, 3, 7), 1)
	sb := s.Superblock()
	img := m.Image()
	f.Add(img[sb.DataOffset : sb.DataOffset+sb.HeaderBytes])
	f.Add(img[sb.DataOffset+sb.HeaderBytes : sb.DataOffset+2*sb.HeaderBytes])
	f.Add([]byte("KVFSSLOT"))
	n := testGeo.GroupsPerBlock()
	// Seeds of both versions, with a tag and a parent, and a tombstone.
	h := &store.Header{Block: 9, Gen: 4, Live: true, Present: make([]uint64, 1), CRC: make([]uint32, n), MTime: make([]int64, n)}
	h.Present[0], h.CRC[0], h.MTime[0] = 1, 0xabcd, 77
	h.Meta = store.BlockMeta{Tag: store.Tag{1, 2, 3}, Parent: 8, HasParent: true}
	for v := uint32(store.MinFormatVersion); v <= store.FormatVersion; v++ {
		b := make([]byte, sb.HeaderBytes)
		store.MarshalHeaderVersion(b, sb.UUID, h, v)
		f.Add(b)
	}
	tomb := &store.Header{Gen: 5, Present: make([]uint64, 1), CRC: make([]uint32, n), MTime: make([]int64, n)}
	b := make([]byte, sb.HeaderBytes)
	store.MarshalHeader(b, sb.UUID, tomb)
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := store.UnmarshalHeader(b, sb.UUID, 0, n)
		if err != nil {
			if !errors.Is(err, store.ErrHeader) {
				t.Fatalf("undocumented error: %v", err)
			}
			return
		}
		if len(h.CRC) != n || h.Count() > n || (!h.Live && h.Count() != 0) {
			t.Fatalf("inconsistent header: %+v", h)
		}
		if h.Version < store.MinFormatVersion || h.Version > store.FormatVersion {
			t.Fatalf("decoded header version %d", h.Version)
		}
		if h.Version == 1 && h.Meta != (store.BlockMeta{}) {
			t.Fatalf("version 1 header with meta %+v", h.Meta)
		}
		if h.Meta.HasParent && h.Meta.Parent == h.Block {
			t.Fatalf("block %x decoded as its own parent", h.Block)
		}
		if !h.Meta.HasParent && h.Meta.Parent != 0 {
			t.Fatalf("parent %x without the flag", h.Meta.Parent)
		}
		re := make([]byte, len(b))
		store.MarshalHeaderVersion(re, sb.UUID, h, h.Version)
		used := store.HeaderUsed(n, h.Version)
		if !bytes.Equal(re[:used], b[:used]) {
			t.Fatalf("re-encoding differs")
		}
		h2, err := store.UnmarshalHeader(re, sb.UUID, 0, n)
		if err != nil || h2.Gen != h.Gen || h2.Block != h.Block || h2.Count() != h.Count() || h2.Meta != h.Meta {
			t.Fatalf("re-encoded header does not decode the same: %v", err)
		}
	})
}

// FuzzLeaseRecord: decoding arbitrary bytes never panics, fails only with
// ErrSuperblock or ErrVersion, and a decoded record re-encodes to the same
// field bytes.
func FuzzLeaseRecord(f *testing.F) {
	r := store.LeaseRecord{UUID: [16]byte{1}, Host: "node-1", Token: [16]byte{2}}
	f.Add(store.MarshalLease(&r))
	f.Add(store.MarshalLease(&r)[:200])
	f.Add(make([]byte, store.SuperblockSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := store.UnmarshalLease(b)
		if err != nil {
			if !errors.Is(err, store.ErrSuperblock) && !errors.Is(err, store.ErrVersion) {
				t.Fatalf("undocumented error: %v", err)
			}
			return
		}
		if got == nil {
			return
		}
		re := store.MarshalLease(got)
		if !bytes.Equal(re[:12], b[:12]) || !bytes.Equal(re[16:128], b[16:128]) {
			t.Fatalf("re-encoding differs")
		}
	})
}
