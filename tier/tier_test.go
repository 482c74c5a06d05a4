package tier

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

var testGeo = layout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 16, BlockTokens: 16, DType: layout.BF16, Align: 512}

// newTier opens a store of storeSlots blocks on a memory device and a tier
// of tierBlocks blocks in front of it.
func newTier(t testing.TB, storeSlots, tierBlocks int64) (*Tier, *store.Store, *storetest.Mem) {
	t.Helper()
	m := storetest.Formatted(t, testGeo, storeSlots, 512)
	st := storetest.Open(t, m, store.Options{})
	tr, err := New(st, Options{Bytes: tierBlocks * testGeo.PayloadBytes()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	return tr, st, m
}

// content is the bytes of group idx of a block whose content is id: every
// 8-byte word says id, idx and its position, so a group of another
// content, another group or a torn mix is told apart.
func content(id uint64, idx int) []byte {
	b := make([]byte, testGeo.GroupBytes())
	for w := 0; w < len(b)/8; w++ {
		binary.LittleEndian.PutUint64(b[w*8:], id<<20|uint64(idx)<<12|uint64(w))
	}
	return b
}

// contentOf decodes which content a landed group is, checking every word;
// ok is false for bytes that are no content's group idx.
func contentOf(b []byte, idx int) (id uint64, ok bool) {
	id = binary.LittleEndian.Uint64(b) >> 20
	return id, bytes.Equal(b, content(id, idx))
}

// writeBlock writes every group of block b with content id through w.
func writeBlock(t testing.TB, w interface{ Write([]store.WriteReq) error }, b, id uint64, meta *store.BlockMeta) {
	t.Helper()
	reqs := make([]store.WriteReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		reqs[idx] = store.WriteReq{Key: testGeo.KeyAt(b, idx), Data: content(id, idx), Meta: meta}
	}
	if err := w.Write(reqs); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		if reqs[i].Err != nil {
			t.Fatalf("write block %d group %d: %v", b, i, reqs[i].Err)
		}
	}
}

// blockReqs asks for every group of block b, contiguous.
func blockReqs(b uint64) []store.ReadReq {
	reqs := make([]store.ReadReq, testGeo.GroupsPerBlock())
	for idx := range reqs {
		reqs[idx] = store.ReadReq{Key: testGeo.KeyAt(b, idx), Buf: make([]byte, testGeo.GroupBytes())}
	}
	return reqs
}

// readBlock reads block b through r and returns its content id, or
// ErrNotFound-style errors; every group must be of the same content.
func readBlock(t testing.TB, r interface{ Read([]store.ReadReq) error }, b uint64) (uint64, error) {
	t.Helper()
	reqs := blockReqs(b)
	if err := r.Read(reqs); err != nil {
		t.Fatal(err)
	}
	var id uint64
	for idx := range reqs {
		if err := reqs[idx].Err; err != nil {
			return 0, err
		}
		got, ok := contentOf(reqs[idx].Buf, idx)
		if !ok {
			t.Fatalf("block %d group %d: bytes of no version", b, idx)
		}
		if idx > 0 && got != id {
			t.Fatalf("block %d: group %d of content %d, group 0 of %d", b, idx, got, id)
		}
		id = got
	}
	return id, nil
}

func mustRead(t testing.TB, r interface{ Read([]store.ReadReq) error }, b, want uint64) {
	t.Helper()
	got, err := readBlock(t, r, b)
	if err != nil || got != want {
		t.Fatalf("block %d: content %d, %v; want %d", b, got, err, want)
	}
}

func TestHitMissPromotion(t *testing.T) {
	tr, st, _ := newTier(t, 16, 2)
	for b := range uint64(3) {
		writeBlock(t, st, b, 100+b, nil)
	}
	mustRead(t, tr, 0, 100)
	m := tr.Metrics()
	groups := uint64(testGeo.GroupsPerBlock())
	if m.Misses != groups || m.Hits != 0 || m.Blocks != 1 || m.PromotedBytes != groups*uint64(testGeo.GroupBytes()) {
		t.Fatalf("after a first read: %+v", m)
	}
	mustRead(t, tr, 0, 100)
	if m = tr.Metrics(); m.Hits != groups || m.Misses != groups {
		t.Fatalf("after a second read: %+v", m)
	}
	// Two more blocks in a tier of two: the least recently used goes.
	mustRead(t, tr, 1, 101)
	mustRead(t, tr, 0, 100) // 0 is now the most recent
	mustRead(t, tr, 2, 102)
	if m = tr.Metrics(); m.Evictions != 1 || m.Blocks != 2 || m.Slots != 2 {
		t.Fatalf("after filling past the tier: %+v", m)
	}
	hits := tr.Metrics().Hits
	mustRead(t, tr, 0, 100)
	if tr.Metrics().Hits != hits+groups {
		t.Fatal("block 0 was evicted before block 1, the least recently used")
	}
	mustRead(t, tr, 1, 101)
	if tr.Metrics().Hits != hits+groups {
		t.Fatal("block 1 was served from the tier after its eviction")
	}
	// An absent block is the store's answer, and takes no slot.
	if _, err := readBlock(t, tr, 9); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("absent block: %v", err)
	}
}

// The tier serves the store's current version whatever changed it: writes,
// deletes and renames through the tier or straight to the store (as the
// GPU path does), and the store's own evictions.
func TestNeverStale(t *testing.T) {
	tr, st, _ := newTier(t, 4, 4)
	writeBlock(t, st, 1, 10, nil)
	mustRead(t, tr, 1, 10)
	writeBlock(t, tr, 1, 11, nil)
	mustRead(t, tr, 1, 11)
	writeBlock(t, st, 1, 12, nil) // not through the tier
	mustRead(t, tr, 1, 12)
	mustRead(t, tr, 1, 12)

	if err := st.RenameBlock(1, 2); err != nil {
		t.Fatal(err)
	}
	if _, err := readBlock(t, tr, 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("renamed-away block: %v", err)
	}
	mustRead(t, tr, 2, 12)
	writeBlock(t, st, 1, 13, nil)
	mustRead(t, tr, 1, 13)
	if err := tr.RenameBlock(1, 3); err != nil {
		t.Fatal(err)
	}
	mustRead(t, tr, 3, 13)
	if _, err := readBlock(t, tr, 1); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("renamed-away block: %v", err)
	}

	if err := st.DeleteBlock(2); err != nil {
		t.Fatal(err)
	}
	if _, err := readBlock(t, tr, 2); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("deleted block: %v", err)
	}
	// A delete of one group: the copy of the block is stale.
	if err := tr.Delete([]layout.Key{testGeo.KeyAt(3, 1)}); err != nil {
		t.Fatal(err)
	}
	reqs := blockReqs(3)
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	for idx := range reqs {
		if (idx == 1) != (reqs[idx].Err != nil) {
			t.Fatalf("after deleting group 1, group %d: %v", idx, reqs[idx].Err)
		}
	}
	// Hits of a partial copy answer its missing group as the store does.
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[1].Err, store.ErrNotFound) || reqs[1].Failed != 1 || reqs[1].Bad != 1 {
		t.Fatalf("missing group from the tier: %+v", reqs[1])
	}

	// The store's own eviction: a store of 4 slots, 16 more blocks (block
	// 3 was read: it outlives new unread blocks for 2 × 4 block uses).
	for b := uint64(10); b < 26; b++ {
		writeBlock(t, st, b, b, nil)
	}
	if _, ok := st.Block(3); ok {
		t.Fatal("block 3 was not evicted from the store")
	}
	if _, err := readBlock(t, tr, 3); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("block evicted from the store: %v", err)
	}
	if tr.Metrics().Invalidations == 0 {
		t.Fatal("no invalidation counted")
	}
}

func TestTags(t *testing.T) {
	tr, st, _ := newTier(t, 8, 4)
	a, b := store.Tag{1}, store.Tag{2}
	writeBlock(t, st, 5, 50, &store.BlockMeta{Tag: a})
	mustRead(t, tr, 5, 50) // cached, read untagged
	for _, c := range []struct {
		tag  store.Tag
		want error
	}{{a, nil}, {b, store.ErrTagMismatch}, {store.Tag{}, nil}} {
		reqs := blockReqs(5)
		for i := range reqs {
			reqs[i].Tag = &c.tag
		}
		hits := tr.Metrics().Hits
		if err := tr.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			if reqs[i].Err != c.want {
				t.Fatalf("tag %v group %d: %v, want %v", c.tag, i, reqs[i].Err, c.want)
			}
			if c.want != nil && !bytes.Equal(reqs[i].Buf, make([]byte, len(reqs[i].Buf))) {
				t.Fatalf("tag mismatch wrote the destination of group %d", i)
			}
		}
		if c.want == nil && tr.Metrics().Hits == hits {
			t.Fatalf("tag %v: not served from the tier", c.tag)
		}
	}
	// The block restored under another tag (straight to the store): a
	// request for the old tag is a mismatch, the new one the new bytes.
	writeBlock(t, st, 5, 51, &store.BlockMeta{Tag: b})
	reqs := blockReqs(5)
	for i := range reqs {
		reqs[i].Tag = &a
	}
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	if reqs[0].Err != store.ErrTagMismatch {
		t.Fatalf("old tag after a retag: %v", reqs[0].Err)
	}
	mustRead(t, tr, 5, 51)
}

// Every shape the store lands (pitched rows, head ranges, unverified) lands
// the same from the tier, and leaves the bytes between rows alone.
func TestShapes(t *testing.T) {
	tr, st, _ := newTier(t, 8, 4)
	writeBlock(t, st, 7, 70, nil)
	mustRead(t, tr, 7, 70)
	gb, rb, heads := testGeo.GroupBytes(), testGeo.RowBytes(), testGeo.KVHeads
	rows := gb / rb
	mk := func() []store.ReadReq {
		fill := func(n int) []byte { return bytes.Repeat([]byte{0xee}, n) }
		pitch := heads * rb
		return []store.ReadReq{
			{Key: layout.Key{Block: 7, Layer: 1, Kind: layout.V, Head: 1}, Buf: fill(gb)},
			{Key: layout.Key{Block: 7, Layer: 0, Kind: layout.K, Head: 0}, Buf: fill((rows-1)*pitch + rb), Pitch: pitch, RowBytes: rb},
			{Key: layout.Key{Block: 7, Layer: 1, Kind: layout.K}, Heads: heads, HeadStride: rb, Pitch: pitch, RowBytes: rb, Buf: fill((heads-1)*rb + (rows-1)*pitch + rb)},
			{Key: layout.Key{Block: 7, Layer: 0, Kind: layout.V}, Heads: heads, HeadStride: gb + 64, Buf: fill((heads-1)*(gb+64) + gb)},
			{Key: layout.Key{Block: 7, Layer: 0, Kind: layout.V}, Heads: heads, HeadStride: gb, Buf: fill(heads * gb), Unverified: true, CRCs: make([]uint32, heads)},
			{Key: layout.Key{Block: 7, Layer: 1, Kind: layout.V}, Buf: fill(gb), Unverified: true},
			{Key: layout.Key{Block: 7, Layer: 1, Kind: layout.V}, Buf: fill(gb - 1)}, // wrong size
			{Key: layout.Key{Block: 7, Layer: 9}, Buf: fill(gb)},                     // no such layer
		}
	}
	want, got := mk(), mk()
	if err := st.Read(want); err != nil {
		t.Fatal(err)
	}
	hits := tr.Metrics().Hits
	if err := tr.Read(got); err != nil {
		t.Fatal(err)
	}
	if tr.Metrics().Hits == hits {
		t.Fatal("no hit")
	}
	for i := range want {
		w, g := want[i], got[i]
		if !bytes.Equal(w.Buf, g.Buf) || (w.Err == nil) != (g.Err == nil) || w.Failed != g.Failed || w.Bad != g.Bad || w.CRC != g.CRC || !slicesEqual(w.CRCs, g.CRCs) {
			t.Fatalf("request %d: tier %+v (err %v), store %+v (err %v)", i, g, g.Err, w, w.Err)
		}
		if w.Err != nil && g.Err.Error() != w.Err.Error() {
			t.Fatalf("request %d: tier says %v, store %v", i, g.Err, w.Err)
		}
	}
}

func slicesEqual(a, b []uint32) bool {
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

// A block corrupt in the store never enters the tier; a copy in the tier
// that rots is never served.
func TestCorruption(t *testing.T) {
	tr, st, m := newTier(t, 8, 4)
	writeBlock(t, st, 3, 30, nil)
	writeBlock(t, st, 4, 40, nil)
	gi, err := st.Stat(testGeo.KeyAt(3, 2))
	if err != nil {
		t.Fatal(err)
	}
	sb := st.Superblock()
	m.Poke(sb.DataOffset+gi.Slot*sb.SlotBytes+2*sb.HeaderBytes+testGeo.Offset(2)+5, []byte{0xff})
	reqs := blockReqs(3)
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(reqs[2].Err, store.ErrCorrupt) || reqs[0].Err != nil {
		t.Fatalf("corrupt group: %v, others %v", reqs[2].Err, reqs[0].Err)
	}
	if n := tr.Metrics().Blocks; n != 0 {
		t.Fatalf("a block with a corrupt group entered the tier (%d blocks)", n)
	}

	mustRead(t, tr, 4, 40)
	tr.mu.Lock()
	slot, _ := tr.mu.idx.Slot(4)
	tr.mu.Unlock()
	tr.group(slot, 1)[7] ^= 1 // the copy rots
	mustRead(t, tr, 4, 40)
	if mt := tr.Metrics(); mt.Corrupt != 1 {
		t.Fatalf("rotten copy: %+v", mt)
	}
	mustRead(t, tr, 4, 40) // read back into the tier
	if mt := tr.Metrics(); mt.Corrupt != 1 || mt.Blocks != 1 {
		t.Fatalf("after reading back: %+v", mt)
	}
}

// Prefix-aware eviction: a block other cached blocks name as their parent
// stays while leaves go.
func TestPrefixEviction(t *testing.T) {
	tr, st, _ := newTier(t, 16, 3)
	writeBlock(t, st, 1, 1, &store.BlockMeta{Tag: store.Tag{1}})
	writeBlock(t, st, 2, 2, &store.BlockMeta{Tag: store.Tag{2}, Parent: 1, HasParent: true})
	writeBlock(t, st, 3, 3, &store.BlockMeta{Tag: store.Tag{3}, Parent: 1, HasParent: true})
	writeBlock(t, st, 4, 4, &store.BlockMeta{Tag: store.Tag{4}, Parent: 1, HasParent: true})
	for b := uint64(1); b <= 4; b++ {
		mustRead(t, tr, b, b)
	}
	hits := tr.Metrics().Hits
	mustRead(t, tr, 1, 1) // least recently used, but the parent of the others
	if tr.Metrics().Hits == hits {
		t.Fatal("the shared parent was evicted before a leaf")
	}
}

func TestTooLarge(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 4, 512)
	st := storetest.Open(t, m, store.Options{})
	_, err := New(st, Options{Bytes: 1 << 56})
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "available") {
		t.Fatalf("a tier of 64 PiB: %v", err)
	}
	if _, err := New(st, Options{Bytes: 100}); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("a tier smaller than a block: %v", err)
	}
}

func TestClosed(t *testing.T) {
	tr, st, _ := newTier(t, 4, 2)
	writeBlock(t, st, 1, 1, nil)
	mustRead(t, tr, 1, 1)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Read(blockReqs(1)); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("read of a closed tier: %v", err)
	}
}

// A store whose device fails reads: the failure is the caller's answer, as
// from the store, and the block does not enter the tier; once it is in, a
// hit needs no device.
func TestStoreFaults(t *testing.T) {
	for _, fault := range []storetest.Fault{storetest.EIO, storetest.ShortRead} {
		m := storetest.Formatted(t, testGeo, 8, 512)
		var failing atomic.Bool
		fe := storetest.NewFaulty(m, func(n int, r store.IO) storetest.Fault {
			if failing.Load() && r.Op == store.OpRead {
				return fault
			}
			return storetest.None
		}, nil)
		st := storetest.Open(t, fe, store.Options{})
		tr, err := New(st, Options{Bytes: 4 * testGeo.PayloadBytes()})
		if err != nil {
			t.Fatal(err)
		}
		defer tr.Close()
		writeBlock(t, st, 1, 10, nil)
		failing.Store(true)
		reqs := blockReqs(1)
		if err := tr.Read(reqs); err != nil {
			t.Fatal(err)
		}
		for i := range reqs {
			if err := reqs[i].Err; !errors.Is(err, unix.EIO) {
				t.Fatalf("fault %v: group %d: %v, want the device's EIO", fault, i, err)
			}
		}
		if n := tr.Metrics().Blocks; n != 0 {
			t.Fatalf("fault %v: a block that failed to read entered the tier", fault)
		}
		failing.Store(false)
		mustRead(t, tr, 1, 10)
		failing.Store(true)
		hits := tr.Metrics().Hits
		mustRead(t, tr, 1, 10)
		if tr.Metrics().Hits == hits {
			t.Fatalf("fault %v: not a hit", fault)
		}
	}
}

// A hit allocates nothing: the tier sits on the path of every load.
func TestHitAllocs(t *testing.T) {
	if raceOn {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	tr, st, _ := newTier(t, 8, 4)
	writeBlock(t, st, 2, 20, nil)
	reqs := blockReqs(2)
	if err := tr.Read(reqs); err != nil {
		t.Fatal(err)
	}
	hits := tr.Metrics().Hits
	if n := testing.AllocsPerRun(50, func() {
		if err := tr.Read(reqs); err != nil || reqs[0].Err != nil {
			t.Fatal(err, reqs[0].Err)
		}
	}); n != 0 {
		t.Fatalf("%v allocations per hit", n)
	}
	if tr.Metrics().Hits == hits {
		t.Fatal("no hit")
	}
}

// rss is the process's resident size (VmRSS), in bytes.
func rss(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n << 10
		}
	}
	t.Skip("no VmRSS")
	return 0
}

// The tier's memory is resident once New returns (a shortage fails New,
// not a load later), and its bookkeeping is small beside it.
func TestArenaResident(t *testing.T) {
	m := storetest.Formatted(t, testGeo, 4, 512)
	st := storetest.Open(t, m, store.Options{})
	const size = 64 << 20
	before := rss(t)
	freeBefore, _ := meminfo("HugePages_Free")
	tr, err := New(st, Options{Bytes: size})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if tr.Metrics().HugePages {
		// Reserved huge pages are not counted in VmRSS.
		if free, _ := meminfo("HugePages_Free"); freeBefore-free != size/hugePage {
			t.Fatalf("%d huge pages taken for a tier of %d bytes", freeBefore-free, size)
		}
		return
	}
	grew := rss(t) - before
	if grew > size+size/8 {
		t.Fatalf("resident size grew by %d bytes for a tier of %d", grew, size)
	}
	page := os.Getpagesize()
	vec := make([]byte, (len(tr.ar.b)+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&tr.ar.b[0])), uintptr(len(tr.ar.b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	for i, v := range vec {
		if v&1 == 0 {
			t.Fatalf("page %d of %d of the arena is not resident", i, len(vec))
		}
	}
}
