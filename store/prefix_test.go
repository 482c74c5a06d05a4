package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/index"
	"github.com/kvfs/kvfs/store/storetest"
)

// putMeta writes groups idxs of block (version v) with meta m, and fails
// the test on any error.
func putMeta(t testing.TB, s *store.Store, block uint64, m *store.BlockMeta, v int, idxs ...int) {
	t.Helper()
	if err := writeMeta(s, block, m, v, idxs...); err != nil {
		t.Fatal(err)
	}
}

func writeMeta(s *store.Store, block uint64, m *store.BlockMeta, v int, idxs ...int) error {
	reqs := make([]store.WriteReq, len(idxs))
	for i, idx := range idxs {
		k := s.Geometry().KeyAt(block, idx)
		reqs[i] = store.WriteReq{Key: k, Data: groupData(s.Geometry(), k, v), Meta: m}
	}
	if err := s.Write(reqs); err != nil {
		return err
	}
	for _, r := range reqs {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}

// getTag reads group k expecting tag; the destination starts filled with
// 0xEE so that a test sees whether anything landed.
func getTag(s *store.Store, k layout.Key, tag store.Tag) ([]byte, error) {
	r := []store.ReadReq{{Key: k, Buf: bytes.Repeat([]byte{0xEE}, s.Geometry().GroupBytes()), Tag: &tag}}
	if err := s.Read(r); err != nil {
		return nil, err
	}
	return r[0].Buf, r[0].Err
}

func untouched(b []byte) bool { return len(bytes.Trim(b, "\xee")) == 0 }

var (
	tagA = store.Tag{0xa}
	tagB = store.Tag{0xb}
)

// Two prefixes forced onto one block id never read as each other's: a read
// expecting one tag fails with ErrTagMismatch (nothing lands) while the
// block holds the other, and a write under the other tag replaces the
// block whole, keeping none of the first prefix's groups.
func TestTagCollision(t *testing.T) {
	s, m := newMemStore(t, 4, testGeo)
	geo := s.Geometry()
	const id = 7
	putMeta(t, s, id, &store.BlockMeta{Tag: tagA}, 1, all(id)...)
	k0, k5 := geo.KeyAt(id, 0), geo.KeyAt(id, 5)

	check := func(k layout.Key, tag store.Tag, version int, wantErr error) {
		t.Helper()
		got, err := getTag(s, k, tag)
		switch {
		case wantErr != nil:
			if err != wantErr { //nolint:errorlint // the sentinel itself
				t.Fatalf("read %v with tag %x: %v, want %v", k, tag[0], err, wantErr)
			}
			if !untouched(got) {
				t.Fatalf("read %v with tag %x failed but wrote the destination", k, tag[0])
			}
		case err != nil:
			t.Fatalf("read %v with tag %x: %v", k, tag[0], err)
		case !bytes.Equal(got, groupData(geo, k, version)):
			t.Fatalf("read %v with tag %x: not version %d", k, tag[0], version)
		}
	}
	check(k0, tagA, 1, nil)
	check(k0, store.Tag{}, 1, nil) // unchecked
	check(k0, tagB, 0, store.ErrTagMismatch)
	if !errors.Is(store.ErrTagMismatch, store.ErrNotFound) {
		t.Fatal("ErrTagMismatch does not wrap ErrNotFound")
	}
	if n := s.Metrics().TagMismatch; n != 1 {
		t.Fatalf("TagMismatch %d, want 1", n)
	}

	// The other prefix writes two groups under the same id: the block is
	// replaced, in place or not, and the first prefix's other groups are
	// gone, for every tag.
	putMeta(t, s, id, &store.BlockMeta{Tag: tagB}, 2, 0, 1)
	check(k0, tagB, 2, nil)
	check(k0, tagA, 0, store.ErrTagMismatch)
	check(k5, tagB, 0, store.ErrNotFound)
	check(k5, store.Tag{}, 0, store.ErrNotFound)
	check(k5, tagA, 0, store.ErrTagMismatch)
	if bi, ok := s.Block(id); !ok || bi.Groups != 2 || bi.Meta.Tag != tagB {
		t.Fatalf("block after replacement: %+v %v", bi, ok)
	}
	// A write without meta keeps the stored tag; and again with the first
	// tag, over present groups (copy-on-write): nothing of B is carried.
	putMeta(t, s, id, nil, 3, 2)
	check(geo.KeyAt(id, 2), tagB, 3, nil)
	putMeta(t, s, id, &store.BlockMeta{Tag: tagA}, 4, 0)
	check(k0, tagA, 4, nil)
	check(geo.KeyAt(id, 1), tagA, 0, store.ErrNotFound)
	check(geo.KeyAt(id, 2), store.Tag{}, 0, store.ErrNotFound)

	// Lookup agrees, and the tag survives a reopen.
	out := make([]index.Status, 3)
	if run := s.Lookup([]uint64{id, id, 99}, []store.Tag{tagA, tagB, {}}, out); run != 0 ||
		out[0] != index.Absent || out[1] != index.TagMismatch || out[2] != index.Absent {
		t.Fatalf("lookup: run %d, %v", run, out)
	}
	putMeta(t, s, id, &store.BlockMeta{Tag: tagA}, 4, 1, 2, 3, 4, 5, 6, 7)
	if run := s.Lookup([]uint64{id, id}, []store.Tag{tagA, {}}, out); run != 2 || out[0] != index.Present || out[1] != index.Present {
		t.Fatalf("lookup of the whole block: run %d, %v", run, out)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, m, store.Options{})
	check(k5, tagA, 4, nil)
	check(k5, tagB, 0, store.ErrTagMismatch)

	// Locate (the GPU path's lookup) checks the tag too, and pins nothing
	// for a mismatch's sake beyond the block it names.
	lr := []store.LocateReq{{Key: k0, Tag: &tagB}, {Key: k0, Tag: &tagA}}
	pins, err := s.Locate(lr, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.Unpin(pins)
	if lr[0].Err != store.ErrTagMismatch || lr[0].Off != 0 || lr[1].Err != nil || lr[1].Off == 0 { //nolint:errorlint
		t.Fatalf("locate: %v off %d; %v off %d", lr[0].Err, lr[0].Off, lr[1].Err, lr[1].Off)
	}
}

// One Write naming one block with two metas fails every request of that
// block (and only those); a parent equal to the block is no parent.
func TestWriteMetaDisagree(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	geo := s.Geometry()
	mk := func(block uint64, idx int, m *store.BlockMeta) store.WriteReq {
		k := geo.KeyAt(block, idx)
		return store.WriteReq{Key: k, Data: groupData(geo, k, 1), Meta: m}
	}
	reqs := []store.WriteReq{
		mk(1, 0, &store.BlockMeta{Tag: tagA}),
		mk(1, 1, nil),
		mk(1, 2, &store.BlockMeta{Tag: tagB}),
		mk(2, 0, &store.BlockMeta{Tag: tagA, HasParent: true, Parent: 2}),
	}
	if err := s.Write(reqs); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if !errors.Is(reqs[i].Err, store.ErrInvalid) {
			t.Fatalf("request %d: %v, want ErrInvalid", i, reqs[i].Err)
		}
	}
	if reqs[3].Err != nil {
		t.Fatal(reqs[3].Err)
	}
	if _, ok := s.Block(1); ok {
		t.Fatal("block 1 written despite its disagreeing metas")
	}
	if bi, _ := s.Block(2); bi.Meta != (store.BlockMeta{Tag: tagA}) {
		t.Fatalf("block 2 meta %+v, want its tag and no parent", bi.Meta)
	}
}

// Eviction under index.Prefix takes leaves of the prefix forest, skipping
// pinned blocks, those never read before those read (until a read one has
// gone unused for the index's window longer); a parent whose children are
// gone becomes a leaf. Under index.LRU the same trace evicts by recency.
func TestEvictionParents(t *testing.T) {
	chain := func(p uint64) *store.BlockMeta {
		return &store.BlockMeta{Tag: store.Tag{byte(p)}, Parent: p, HasParent: true}
	}
	run := func(policy index.Policy) (gone []uint64) {
		m := newMem(t, 5)
		s := openStore(t, m, store.Options{Evict: policy})
		putMeta(t, s, 1, &store.BlockMeta{}, 1, 0) // root
		putMeta(t, s, 2, chain(1), 1, 0)           // 1 <- 2
		putMeta(t, s, 3, chain(2), 1, 0)           // 1 <- 2 <- 3
		putMeta(t, s, 4, chain(1), 1, 0)           // 1 <- 4
		putMeta(t, s, 5, nil, 1, 0)                // no parent
		// Use the root, then block 3: recency, oldest first, is 2 4 5 1 3.
		for _, b := range []uint64{1, 3} {
			if _, err := get(s, keysOf(b, 0)[0]); err != nil {
				t.Fatal(err)
			}
		}
		// Block 4 pinned (a GPU load in flight) through every eviction.
		pins, err := s.Locate([]store.LocateReq{{Key: keysOf(4, 0)[0]}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Unpin(pins)
		for b := uint64(10); b < 40; b++ {
			before := present(s, 1, 2, 3, 4, 5)
			putMeta(t, s, b, nil, 1, 0)
			now := present(s, 1, 2, 3, 4, 5)
			for _, id := range []uint64{1, 2, 3, 4, 5} {
				if before[id] && !now[id] {
					gone = append(gone, id)
				}
			}
		}
		return gone
	}
	// Prefix: leaves 3 (read), 4 (pinned), 5 (never read), and 10.. as
	// they come (never read). 5 goes first; then the new blocks replace
	// each other while 3, read, is within the window; then 3, and 2, a
	// leaf once 3 is gone. The root stays while its pinned child 4 is
	// stored.
	if got, want := run(index.Prefix), []uint64{5, 3, 2}; !equalIDs(got, want) {
		t.Errorf("prefix evicted %v, want %v", got, want)
	}
	// LRU: 2 5 1 3 by recency (4 pinned), the root among them.
	if got, want := run(index.LRU), []uint64{2, 5, 1, 3}; !equalIDs(got, want) {
		t.Errorf("lru evicted %v, want %v", got, want)
	}
}

// newMem formats a store of slots slots on a memory engine, unopened.
func newMem(t testing.TB, slots int) *storetest.Mem {
	t.Helper()
	m := storetest.NewMem(store.SizeFor(testGeo, int64(slots)), 512)
	if _, err := store.Format(m, testGeo, store.FormatOptions{}); err != nil {
		t.Fatal(err)
	}
	return m
}

func present(s *store.Store, ids ...uint64) map[uint64]bool {
	out := map[uint64]bool{}
	for _, id := range ids {
		_, out[id] = s.Block(id)
	}
	return out
}

func equalIDs(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// tagOp writes groups idxs of block as version v with meta (nil: none).
type tagOp struct {
	block uint64
	meta  *store.BlockMeta
	idxs  []int
	v     int
}

// blockState is a block as the model has it: its meta and group versions.
type blockState struct {
	meta   store.BlockMeta
	groups map[int]int
}

func (o tagOp) next(cur *blockState) *blockState {
	n := &blockState{groups: map[int]int{}}
	if cur != nil && (o.meta == nil || o.meta.Tag == cur.meta.Tag) {
		n.meta = cur.meta
		for i, v := range cur.groups {
			n.groups[i] = v
		}
	}
	if o.meta != nil {
		n.meta = *o.meta
	}
	for _, i := range o.idxs {
		n.groups[i] = o.v
	}
	return n
}

func (o tagOp) apply(s *store.Store) error { return writeMeta(s, o.block, o.meta, o.v, o.idxs...) }

// TestCrashTagged crashes at every write of a workload of tagged writes
// (new blocks with parents, additions under the same tag, replacements by
// another tag in place and by copy-on-write, writes without meta) and
// checks that each block recovers exactly as its last acknowledged state or
// as the state the interrupted write was making: its tag, its parent and
// its groups together, never one prefix's groups under another's tag.
func TestCrashTagged(t *testing.T) {
	meta := func(tag byte, parent uint64) *store.BlockMeta {
		return &store.BlockMeta{Tag: store.Tag{tag}, Parent: parent, HasParent: parent != 0}
	}
	work := []tagOp{
		{1, meta(0xa, 0), all(1), 1},
		{2, meta(0xb, 1), []int{0, 1, 2, 3}, 2},
		{1, meta(0xc, 0), []int{0, 1}, 3}, // replaced, copy-on-write (groups present)
		{2, nil, []int{4, 5, 6, 7}, 4},    // added in place, tag kept
		{3, meta(0xa, 2), all(3), 5},
		{1, meta(0xa, 0), []int{2}, 6},     // replaced in place (group absent)
		{2, meta(0xb, 3), []int{0}, 7},     // same tag, new parent, copy-on-write
		{3, meta(0xd, 0), []int{5, 6}, 8},  // replaced, copy-on-write
		{4, nil, []int{0}, 9},              // untagged block
		{4, meta(0xe, 1), []int{1, 2}, 10}, // tagged over an untagged block: replaced
	}
	const slots = 12
	m := newMem(t, slots)
	s := openStore(t, m, store.Options{})
	before := m.Writes()
	for i, o := range work {
		if err := o.apply(s); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	total := m.Writes() - before
	s.Close()
	for k := 1; k <= total+1; k++ {
		m := newMem(t, slots)
		s := openStore(t, m, store.Options{})
		store.CheckMemoryOnly(s)
		m.CrashAt(k)
		acked := map[uint64]*blockState{}
		inflight := -1
		for i, o := range work {
			if err := o.apply(s); err != nil {
				if !m.Crashed() {
					t.Fatalf("k=%d: op %d failed without a crash: %v", k, i, err)
				}
				inflight = i
				break
			}
			acked[o.block] = o.next(acked[o.block])
		}
		for seed := range uint64(4) {
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512)
			what := fmt.Sprintf("k=%d seed=%d", k, seed)
			r := openStore(t, storetest.NewMemFrom(img, 512), store.Options{})
			for b := uint64(1); b <= 4; b++ {
				ok := []*blockState{acked[b]}
				if inflight >= 0 && work[inflight].block == b {
					ok = append(ok, work[inflight].next(acked[b]))
				}
				if err := matchState(r, b, ok); err != nil {
					t.Fatalf("%s: block %d: %v", what, b, err)
				}
			}
			r.Close()
		}
	}
}

// matchState checks that block b of s is one of the states ok (nil: absent).
func matchState(s *store.Store, b uint64, ok []*blockState) error {
	bi, present := s.Block(b)
	for _, st := range ok {
		if st == nil {
			if !present {
				return nil
			}
			continue
		}
		if !present || bi.Meta != st.meta || bi.Groups != len(st.groups) {
			continue
		}
		same := true
		for idx, v := range st.groups {
			k := testGeo.KeyAt(b, idx)
			got, err := getTag(s, k, st.meta.Tag)
			if err != nil || !bytes.Equal(got, groupData(testGeo, k, v)) {
				same = false
				break
			}
		}
		if same {
			return nil
		}
	}
	return fmt.Errorf("recovered as %+v (present %v), which is none of the states allowed", bi.Meta, present)
}

// A format version 1 store (made by the version 1 code path: its smaller
// headers, version 1 superblock) opens and serves under the new code: its
// blocks have zero tags and no parents, it keeps writing version 1 headers
// (an older kvfs still reads it), refuses a tag or parent, and reports its
// version.
func TestFormatVersion1Store(t *testing.T) {
	const slots = 4
	m := storetest.NewMem(store.SizeFor(testGeo, slots), 512)
	sb, err := store.Format(m, testGeo, store.FormatOptions{Version: 1})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Version != 1 || sb.HeaderBytes != 512 {
		t.Fatalf("version 1 superblock: version %d, %d-byte headers", sb.Version, sb.HeaderBytes)
	}
	s := openStore(t, m, store.Options{})
	if v := s.Info().Version; v != 1 {
		t.Fatalf("Info().Version %d", v)
	}
	putMeta(t, s, 1, nil, 1, all(1)...)
	putMeta(t, s, 2, &store.BlockMeta{}, 1, 0) // a zero meta is no tag
	if err := writeMeta(s, 3, &store.BlockMeta{Tag: tagA}, 1, 0); !errors.Is(err, store.ErrVersion) {
		t.Fatalf("tagged write to a version 1 store: %v", err)
	}
	if err := writeMeta(s, 3, &store.BlockMeta{HasParent: true, Parent: 1}, 1, 0); !errors.Is(err, store.ErrVersion) {
		t.Fatalf("write with a parent to a version 1 store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// Every header on the device is version 1.
	img := m.Image()
	for slot := range int64(slots) {
		for c := range int64(2) {
			off := sb.DataOffset + slot*sb.SlotBytes + c*sb.HeaderBytes
			h, err := store.UnmarshalHeader(img[off:off+sb.HeaderBytes], sb.UUID, slot, testGeo.GroupsPerBlock())
			if err == nil && h.Version != 1 {
				t.Fatalf("slot %d copy %d: header version %d in a version 1 store", slot, c, h.Version)
			}
		}
	}
	s = openStore(t, m, store.Options{})
	for _, k := range keysOf(1, all(1)...) {
		if got, err := getTag(s, k, store.Tag{}); err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
			t.Fatalf("%v: %v", k, err)
		}
	}
	if _, err := getTag(s, keysOf(1, 0)[0], tagA); err != store.ErrTagMismatch { //nolint:errorlint
		t.Fatalf("tagged read of an untagged block: %v", err)
	}
	out := make([]index.Status, 2)
	if run := s.Lookup([]uint64{1, 2}, nil, out); run != 1 || out[0] != index.Present || out[1] != index.Absent {
		t.Fatalf("lookup: run %d %v", run, out)
	}
	if bi, _ := s.Block(1); bi.Meta != (store.BlockMeta{}) {
		t.Fatalf("block meta %+v in a version 1 store", bi.Meta)
	}
	rep, err := s.Fsck(false)
	if err != nil || len(rep.Problems) != 0 || rep.FormatVersion != 1 {
		t.Fatalf("fsck: %v %v, format version %d", err, rep.Problems, rep.FormatVersion)
	}
}

// Lookup and tagged reads under concurrent stores, replacements, deletes
// and evictions: a Lookup answer is one the store's history explains (a
// Present (block, tag) was stored whole under that tag, a TagMismatch block
// was stored under another), its run is its leading Present answers, and a
// tagged read returns exactly that tag's bytes or nothing.
func TestLookupConcurrent(t *testing.T) {
	s, _ := newMemStore(t, 6, testGeo)
	const ids, versions = 10, 3
	tagOf := func(id uint64, v int) store.Tag { return store.Tag{byte(id), byte(v), 0x7a} }
	var mu sync.Mutex
	tried := map[uint64]map[int]bool{} // versions each block was ever written with
	note := func(id uint64, v int) {
		mu.Lock()
		defer mu.Unlock()
		if tried[id] == nil {
			tried[id] = map[int]bool{}
		}
		tried[id][v] = true
	}
	explains := func(id uint64, v int, st index.Status) bool {
		mu.Lock()
		defer mu.Unlock()
		switch st {
		case index.Present:
			return v == 0 && len(tried[id]) > 0 || tried[id][v]
		case index.TagMismatch:
			for w := range tried[id] {
				if w != v {
					return true
				}
			}
			return false
		}
		return true
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id, v := uint64(r.IntN(ids)+1), r.IntN(versions)+1
				if i%17 == 0 {
					if err := s.DeleteBlock(id); err != nil && !errors.Is(err, store.ErrNotFound) {
						errs <- err
						return
					}
					continue
				}
				note(id, v)
				m := &store.BlockMeta{Tag: tagOf(id, v), Parent: id - 1, HasParent: id > 1}
				if err := writeMeta(s, id, m, v, all(id)...); err != nil && !errors.Is(err, store.ErrFull) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer close(stop)
		r := rand.New(rand.NewPCG(9, 9))
		for range 3000 {
			n := r.IntN(6) + 1
			blocks, tags, vs := make([]uint64, n), make([]store.Tag, n), make([]int, n)
			for i := range n {
				blocks[i], vs[i] = uint64(r.IntN(ids)+1), r.IntN(versions+1)
				if vs[i] > 0 {
					tags[i] = tagOf(blocks[i], vs[i])
				}
			}
			out := make([]index.Status, n)
			run := s.Lookup(blocks, tags, out)
			lead := 0
			for lead < n && out[lead] == index.Present {
				lead++
			}
			if run != lead {
				errs <- fmt.Errorf("lookup run %d, answers %v", run, out)
				return
			}
			for i := range n {
				if !explains(blocks[i], vs[i], out[i]) {
					errs <- fmt.Errorf("lookup of block %d version %d: %v, which no write explains", blocks[i], vs[i], out[i])
					return
				}
			}
			// A tagged read gets its version's bytes or nothing.
			k := testGeo.KeyAt(blocks[0], r.IntN(testGeo.GroupsPerBlock()))
			v := r.IntN(versions) + 1
			got, err := getTag(s, k, tagOf(k.Block, v))
			switch {
			case err == nil && !bytes.Equal(got, groupData(testGeo, k, v)):
				errs <- fmt.Errorf("tagged read of %v version %d: another version's bytes", k, v)
				return
			case err != nil && !errors.Is(err, store.ErrNotFound):
				errs <- fmt.Errorf("tagged read of %v: %w", k, err)
				return
			case err != nil && !untouched(got):
				errs <- fmt.Errorf("failed tagged read of %v wrote its destination", k)
				return
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// In one Write, a block's requests without Meta go with those that have
// it: all of them replace a block stored under another tag.
func TestWriteMetaMixed(t *testing.T) {
	s, _ := newMemStore(t, 4, testGeo)
	geo := s.Geometry()
	putMeta(t, s, 3, &store.BlockMeta{Tag: tagA}, 1, all(3)...)
	k1, k2, k5 := geo.KeyAt(3, 1), geo.KeyAt(3, 2), geo.KeyAt(3, 5)
	reqs := []store.WriteReq{
		{Key: k1, Data: groupData(geo, k1, 2)},
		{Key: k2, Data: groupData(geo, k2, 2), Meta: &store.BlockMeta{Tag: tagB}},
	}
	if err := s.Write(reqs); err != nil || reqs[0].Err != nil || reqs[1].Err != nil {
		t.Fatal(err, reqs[0].Err, reqs[1].Err)
	}
	for _, k := range []layout.Key{k1, k2} {
		if got, err := getTag(s, k, tagB); err != nil || !bytes.Equal(got, groupData(geo, k, 2)) {
			t.Fatalf("%v under the new tag: %v", k, err)
		}
	}
	if _, err := getTag(s, k5, store.Tag{}); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the old prefix's group %v: %v", k5, err)
	}
}

// UpgradeFormat moves a version 1 store to version 2 in place where the
// longer headers fit: its blocks stay readable, tagged writes are taken
// and survive a reopen, and an older version is what a torn upgrade
// leaves at worst. A geometry whose headers do not fit is refused.
func TestUpgradeFormat(t *testing.T) {
	m := storetest.NewMem(store.SizeFor(testGeo, 4), 512)
	if _, err := store.Format(m, testGeo, store.FormatOptions{Version: 1}); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, m, store.Options{})
	putMeta(t, s, 1, nil, 1, all(1)...)
	if changed, err := s.UpgradeFormat(); err != nil || !changed {
		t.Fatalf("upgrade: %v %v", changed, err)
	}
	if changed, err := s.UpgradeFormat(); err != nil || changed {
		t.Fatalf("second upgrade: %v %v", changed, err)
	}
	if v := s.Info().Version; v != 2 {
		t.Fatalf("version %d after the upgrade", v)
	}
	putMeta(t, s, 2, &store.BlockMeta{Tag: tagA, Parent: 1, HasParent: true}, 1, 0, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openStore(t, m, store.Options{})
	if sb := s.Superblock(); sb.Version != 2 {
		t.Fatalf("reopened as version %d", sb.Version)
	}
	for _, k := range keysOf(1, all(1)...) {
		if got, err := getTag(s, k, store.Tag{}); err != nil || !bytes.Equal(got, groupData(testGeo, k, 1)) {
			t.Fatalf("%v after the upgrade: %v", k, err)
		}
	}
	if bi, _ := s.Block(2); bi.Meta != (store.BlockMeta{Tag: tagA, Parent: 1, HasParent: true}) {
		t.Fatalf("tagged block after the reopen: %+v", bi.Meta)
	}
	if rep, err := s.Fsck(false); err != nil || !rep.Clean() || rep.FormatVersion != 2 {
		t.Fatalf("fsck: %v %+v", err, rep)
	}

	// A crash at either superblock write, or at the sync: the store opens
	// as version 1 or 2, its blocks whole.
	for k := 1; k <= 3; k++ {
		m := storetest.NewMem(store.SizeFor(testGeo, 4), 512)
		if _, err := store.Format(m, testGeo, store.FormatOptions{Version: 1}); err != nil {
			t.Fatal(err)
		}
		s := openStore(t, m, store.Options{})
		putMeta(t, s, 1, nil, 1, all(1)...)
		store.CheckMemoryOnly(s)
		m.CrashAt(k)
		if _, err := s.UpgradeFormat(); err == nil && k <= 2 {
			t.Fatalf("k=%d: upgrade survived a crash at its write", k)
		}
		for seed := range uint64(4) {
			r := openStore(t, storetest.NewMemFrom(m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512), 512), store.Options{})
			if v := r.Info().Version; v != 1 && v != 2 {
				t.Fatalf("k=%d: version %d", k, v)
			}
			if err := matchState(r, 1, []*blockState{tagOp{block: 1, idxs: all(1), v: 1}.next(nil)}); err != nil {
				t.Fatalf("k=%d seed=%d: %v", k, seed, err)
			}
			r.Close()
		}
	}

	// 17 layers of one head: the version 1 header is 488 bytes, version
	// 2's 520, past the 512-byte copies.
	geo := layout.Geometry{Layers: 17, KVHeads: 1, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}
	m2 := storetest.NewMem(store.SizeFor(geo, 2)*2, 512)
	if _, err := store.Format(m2, geo, store.FormatOptions{Version: 1}); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, m2, store.Options{})
	if changed, err := s2.UpgradeFormat(); !errors.Is(err, store.ErrVersion) || changed {
		t.Fatalf("upgrade where the headers do not fit: %v %v", changed, err)
	}
	if v := s2.Info().Version; v != 1 {
		t.Fatalf("version %d after a refused upgrade", v)
	}
}
