package gpu_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvfs/kvfs/gpu"
	"github.com/kvfs/kvfs/gpu/gputest"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
)

// locStore is a store whose file is host memory (a Locator): group i at
// i*gb, so groups of one block lie next to each other. It records the pins
// Locate hands out and flags an Unpin while a queued copy still reads a
// pinned group (its slot could take another block under the copy).
type locStore struct {
	*fakeStore
	host     []byte
	mu       sync.Mutex
	at       map[layout.Key]int64
	crc      map[layout.Key]uint32
	pinned   map[int64][]byte // pin → the groups it holds, for the check
	nextPin  int64
	locates  int
	closed   bool
	badOff   layout.Key // located outside the file
	violLocs []string
}

func newLocStore(r *rig, n int) *locStore {
	s := &locStore{fakeStore: r.st, host: make([]byte, (n+1)*gb), at: map[layout.Key]int64{}, crc: map[layout.Key]uint32{}, pinned: map[int64][]byte{}, badOff: layout.Key{Block: 1 << 40}}
	for i := range n {
		c := content(i)
		copy(s.host[i*gb:], c)
		s.at[key(i)], s.crc[key(i)] = int64(i*gb), store.CRC32C(c)
	}
	return s
}

// corrupt flips a byte of group i in the file (its recorded CRC stays).
func (s *locStore) corrupt(i int) { s.host[i*gb+7] ^= 0x10 }

func (s *locStore) Locate(reqs []store.LocateReq, pins []int64) ([]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return pins, store.ErrClosed
	}
	s.locates++
	for i := range reqs {
		q := &reqs[i]
		off, ok := s.at[q.Key]
		switch {
		case q.Key == s.badOff:
			q.Off, q.CRC, q.Err = int64(len(s.host)), 1, nil
		case !ok:
			q.Off, q.CRC, q.Err = 0, 0, store.ErrNotFound
		default:
			q.Off, q.CRC, q.Err = off, s.crc[q.Key], nil
			s.nextPin++
			s.pinned[s.nextPin] = s.host[off : off+gb]
			pins = append(pins, s.nextPin)
		}
	}
	return pins, nil
}

func (s *locStore) Unpin(pins []int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range pins {
		g, ok := s.pinned[p]
		if !ok {
			s.violLocs = append(s.violLocs, fmt.Sprintf("pin %d dropped twice or never taken", p))
			continue
		}
		if s.dev.Pending(g) {
			s.violLocs = append(s.violLocs, fmt.Sprintf("pin %d dropped while a queued copy reads its group", p))
		}
		delete(s.pinned, p)
	}
}

// check fails the test on a misuse the store or device saw, or a pin left.
func (s *locStore) check(t *testing.T, r *rig) {
	t.Helper()
	r.checkClean(t)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.violLocs) > 0 {
		t.Fatalf("locator saw: %v", s.violLocs)
	}
	if len(s.pinned) > 0 {
		t.Fatalf("%d pins left after the load", len(s.pinned))
	}
}

// directRig is a rig whose pipeline loads directly (Verify on the fake
// device, the host view set) from a locStore of n groups.
func directRig(t *testing.T, n, per int) (*rig, *locStore, *atomic.Int64) {
	r := newRig(t, 2, per, 2) // 2*per groups per direct chunk, 2 in flight
	r.dev.Delay, r.dev.Jitter = 50*time.Microsecond, 100*time.Microsecond
	s := newLocStore(r, n)
	calls := new(atomic.Int64)
	r.p.Verify = func(items []*gpu.Item) error {
		calls.Add(1)
		for _, it := range items {
			pitch := max(it.Pitch, rowBytes)
			if store.CRC32C(tileBytes(r, *it)) != it.CRC {
				for row := range rows {
					r.dev.Fill(it.Dst+uint64(row*pitch), make([]byte, rowBytes))
				}
				it.Err = fmt.Errorf("verify: %w", store.ErrCorrupt)
			}
		}
		return nil
	}
	r.p.SetHost(s.host)
	return r, s, calls
}

// TestDirectLoad: groups are copied straight from the host view (no store
// read, no staging), adjacent groups as one copy; a group whose bytes fail
// its checksum is zeroed where it landed and reported corrupt, an absent one
// leaves its destination alone, one placed outside the view fails alone;
// every pin is dropped, and only after the copies that read its group.
func TestDirectLoad(t *testing.T) {
	for _, v := range []string{"single", "batched", "lanes", "2D"} {
		t.Run(v, func(t *testing.T) { testDirectLoad(t, v) })
	}
}

func testDirectLoad(t *testing.T, variant string) {
	const n = 203
	per := 4
	if variant == "batched" {
		per = 16 // chunks of 32 groups: 8 runs of 4, a batch
	}
	r, s, calls := directRig(t, n, per)
	switch variant {
	case "batched":
		r.dev.EnableBatch = true
	case "lanes":
		r.dev.LaneCount = 3
	case "2D":
		r.dev.Enable2D = true
	}
	its := r.items(n, 11)
	s.corrupt(17)
	s.corrupt(150)
	delete(s.at, key(40))
	its[60].Key = s.badOff
	old := bytes.Repeat([]byte{0x5A}, gb)
	for i := range its {
		r.dev.Fill(its[i].Dst, old)
	}
	if err := r.p.Load(s, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		got := r.dev.Mem(it.Dst, gb)
		switch i {
		case 17, 150:
			if !errors.Is(it.Err, store.ErrCorrupt) || !bytes.Equal(got, make([]byte, gb)) {
				t.Fatalf("corrupt item %d: %v, zeroed %v", i, it.Err, bytes.Equal(got, make([]byte, gb)))
			}
		case 40:
			if it.Err != store.ErrNotFound || !bytes.Equal(got, old) {
				t.Fatalf("absent item: %v, destination kept %v", it.Err, bytes.Equal(got, old))
			}
		case 60:
			if !errors.Is(it.Err, gpu.ErrCopy) || !bytes.Equal(got, old) {
				t.Fatalf("item outside the view: %v, destination kept %v", it.Err, bytes.Equal(got, old))
			}
		default:
			if it.Err != nil || !bytes.Equal(got, content(i)) {
				t.Fatalf("item %d: %v, bytes right %v", i, it.Err, bytes.Equal(got, content(i)))
			}
		}
	}
	s.check(t, r)
	if s.reads != 0 {
		t.Fatalf("%d store reads in a direct load", s.reads)
	}
	if got := r.p.Direct(); got != n {
		t.Fatalf("Direct() = %d, want %d", got, n)
	}
	if variant == "batched" && r.dev.Batches() == 0 {
		t.Fatal("no batched copies on a device that batches")
	}
	if c := r.dev.Copies(); c >= n/2 {
		t.Fatalf("%d copies for %d groups in runs of 4: adjacent groups were not one copy", c, n)
	}
	if s.locates < n/(2*per) || int(calls.Load()) < n/(2*per)-1 {
		t.Fatalf("%d Locate and %d Verify calls for %d groups in chunks of %d", s.locates, calls.Load(), n, 2*per)
	}
}

// TestDirectFallsBack: without a host view, without Verify, or with a
// pitched tile in the batch, a load goes through staging, and lands the
// same bytes.
func TestDirectFallsBack(t *testing.T) {
	for _, mode := range []string{"no host view", "no verify", "pitched"} {
		t.Run(mode, func(t *testing.T) {
			const n = 40
			r, s, _ := directRig(t, n, 4)
			its := r.items(n, 12)
			for i := range n {
				r.st.groups[key(i)] = content(i)
			}
			switch mode {
			case "no host view":
				r.p.SetHost(nil)
			case "no verify":
				r.p.Verify = nil
			case "pitched":
				its[5].Pitch = 2 * rowBytes
				its[5].Dst = gputest.Base + 1<<20
			}
			if err := r.p.Load(s, its, false); err != nil {
				t.Fatal(err)
			}
			for i, it := range its {
				want := content(i)
				if it.Err != nil || !bytes.Equal(tileBytes(r, it), want) {
					t.Fatalf("item %d: %v", i, it.Err)
				}
			}
			if r.p.Direct() != 0 || s.reads == 0 {
				t.Fatalf("%d groups direct, %d store reads: not the staged path", r.p.Direct(), s.reads)
			}
			s.check(t, r)
		})
	}
}

// TestDirectCopyFails: a copy failing mid-load fails the groups of its
// chunk (their bytes undefined, never reported done) and no others; a store
// closed mid-load fails the rest with its error. Pins are dropped either way.
func TestDirectCopyFails(t *testing.T) {
	for _, mode := range []string{"run", "enqueue", "closed", "run-4-workers"} {
		t.Run(mode, func(t *testing.T) {
			const n = 64
			r, s, _ := directRig(t, n, 4)
			r.dev.EnableBatch = false
			// One submitter: chunks fail alone. With several on the fake's
			// one queue, an event may cover another submitter's failed
			// copy, failing more groups (never fewer).
			r.p.DirectWorkers = 1
			if mode == "run-4-workers" {
				r.p.DirectWorkers, mode = 4, "run"
			}
			strict := r.p.DirectWorkers == 1
			its := r.items(n, 13)
			fail := func(i int) error {
				if i == 5 {
					return gputest.ErrInjected
				}
				return nil
			}
			switch mode {
			case "run":
				r.dev.FailCopy = fail
			case "enqueue":
				r.dev.FailEnqueue = fail
			case "closed":
				r.p.Verify = func(items []*gpu.Item) error { // closes the store after the first chunk
					s.mu.Lock()
					s.closed = true
					s.mu.Unlock()
					return nil
				}
			}
			err := r.p.Load(s, its, false)
			if mode == "closed" {
				if !errors.Is(err, store.ErrClosed) {
					t.Fatalf("load from a store closed midway: %v", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			nok, nfail := 0, 0
			for i, it := range its {
				switch {
				case it.Err == nil:
					nok++
					if !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
						t.Fatalf("item %d reported done without its bytes", i)
					}
				case mode == "closed" && errors.Is(it.Err, store.ErrClosed), errors.Is(it.Err, gputest.ErrInjected):
					nfail++
				default:
					t.Fatalf("item %d: %v", i, it.Err)
				}
			}
			if nfail == 0 || (strict && (nok == 0 || (mode != "closed" && nok < n/2))) {
				t.Fatalf("%d done, %d failed", nok, nfail)
			}
			s.check(t, r)
		})
	}
}

// TestDirect2DPerBlock: a block's tiles lie one after another in the file
// and, a constant stride apart, in the target's evenly spaced tensors (one
// per layer and kind): a direct load moves each block with one 2D copy
// instead of one copy per tile. One submitter or several, the same bytes.
func TestDirect2DPerBlock(t *testing.T) {
	for _, workers := range []int{1, 4} {
		t.Run(fmt.Sprint(workers, " workers"), func(t *testing.T) {
			const n, tiles, blocks = 8 * 40, 8, 40 // key(i): block i/8, layer i%8
			r, s, _ := directRig(t, n, 4)
			r.dev.Enable2D = true
			r.p.DirectWorkers = workers
			tensor := uint64(blocks * gb)
			its := make([]gpu.Item, n)
			for i := range its {
				cb := uint64(blocks - 1 - i/tiles) // cache blocks in reverse
				its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(i%tiles)*tensor + cb*gb}
			}
			if err := r.p.Load(s, its, false); err != nil {
				t.Fatal(err)
			}
			for i, it := range its {
				if it.Err != nil || !bytes.Equal(r.dev.Mem(it.Dst, gb), content(i)) {
					t.Fatalf("item %d: %v", i, it.Err)
				}
			}
			if c := r.dev.Copies2D(); c != blocks {
				t.Fatalf("%d 2D copies for %d blocks, want one each", c, blocks)
			}
			s.check(t, r)
		})
	}
}

// TestDirectPitched: with Land, pitched (token-major) tiles load directly
// too: each block's groups are copied packed into device scratch with one
// copy and Land puts every group's rows in place (a corrupt one as zeros,
// reported); the bytes between a tile's rows, other heads' rows, stay as
// they were. A batch mixing packed and pitched tiles takes both ways.
func TestDirectPitched(t *testing.T) {
	const n = 8 * 24
	r, s, _ := directRig(t, n, 16)
	lands := 0
	r.p.Land = deviceLand(r.dev, r.p.Geo, &lands)
	s.corrupt(9)
	// key(i) is layer i%8 of block i/8: a block's 8 groups, like 8 heads,
	// interleave row by row in the cache (pitch 8 rows), blocks apart.
	const pitch = 8 * rowBytes
	guard := bytes.Repeat([]byte{0xA7}, 1<<20)
	r.dev.Fill(gputest.Base, guard)
	its := make([]gpu.Item, n)
	for i := range its {
		b, h := i/8, i%8
		its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(b*rows*pitch+h*rowBytes), Pitch: pitch}
		if b%3 == 2 { // some blocks packed, after the cache
			its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + 1<<19 + uint64(i*gb)}
		}
	}
	copies := r.dev.Copies()
	if err := r.p.Load(s, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		want := content(i)
		if i == 9 {
			want = make([]byte, gb)
			if !errors.Is(it.Err, store.ErrCorrupt) {
				t.Fatalf("corrupt item: %v", it.Err)
			}
		} else if it.Err != nil {
			t.Fatalf("item %d: %v", i, it.Err)
		}
		if !bytes.Equal(tileBytes(r, it), want) {
			t.Fatalf("item %d: wrong bytes", i)
		}
	}
	// Nothing else in the cache changed: only the 8 heads' rows of the
	// pitched blocks were written, and they cover their blocks whole.
	for b := range n / 8 {
		if b%3 == 2 {
			if !bytes.Equal(r.dev.Mem(gputest.Base+uint64(b*rows*pitch), rows*pitch), guard[:rows*pitch]) {
				t.Fatalf("cache block %d, loaded packed elsewhere, changed", b)
			}
		}
	}
	if r.p.Direct() != n || lands == 0 || s.reads != 0 {
		t.Fatalf("%d direct, %d Land calls, %d store reads", r.p.Direct(), lands, s.reads)
	}
	if c := r.dev.Copies() - copies; c > n/8 {
		t.Fatalf("%d copies for %d blocks of 8 groups", c, n/8)
	}
	s.check(t, r)
	r.p.Close()
	if a := r.dev.Allocated(); a != 0 {
		t.Fatalf("%d bytes of device scratch left after Close", a)
	}
}

// TestLandedStaged: from a store not in memory (read through staging), with
// Land, pitched tiles are read packed and copied packed into device
// scratch, and Land writes their rows: no 2D copy, a corrupt group zeroed
// in its tile and reported, an absent one leaving its tile alone, packed
// tiles of the same load in place; more pitched tiles than one scratch
// holds go in batches.
func TestLandedStaged(t *testing.T) {
	r := newRig(t, 3, 8, 3)
	r.dev.Enable2D = true
	r.p.LandBatch = 100 * gb // three batches of pitched tiles
	verified := 0
	verify := func(items []*gpu.Item) error {
		for _, it := range items {
			verified++
			if store.CRC32C(r.dev.Mem(it.Dst, gb)) != it.CRC {
				r.dev.Fill(it.Dst, make([]byte, gb))
				it.Err = fmt.Errorf("verify: %w", store.ErrCorrupt)
			}
		}
		return nil
	}
	lands := 0
	r.p.Verify = verify
	r.p.Land = deviceLand(r.dev, r.p.Geo, &lands)
	const n = 8 * 30
	const pitch = 8 * rowBytes
	its := make([]gpu.Item, n)
	for i := range its {
		r.st.groups[key(i)] = content(i)
		b, h := i/8, i%8
		its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(b*rows*pitch+h*rowBytes), Pitch: pitch}
		if b%4 == 3 {
			its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + 1<<19 + uint64(i*gb)}
		}
	}
	r.st.corrupt[key(10)] = true
	delete(r.st.groups, key(17))
	old := bytes.Repeat([]byte{0x5A}, rowBytes)
	for row := range rows {
		r.dev.Fill(its[17].Dst+uint64(row*pitch), old)
	}
	before := slices.Clone(its)
	if err := r.p.Load(r.st, its, false); err != nil {
		t.Fatal(err)
	}
	for i, it := range its {
		if b := before[i]; it.Dst != b.Dst || it.Pitch != b.Pitch || it.Mapping != b.Mapping {
			t.Fatalf("item %d names tile %#x pitch %d mapping %#x after the load, was %#x, %d, %#x", i, it.Dst, it.Pitch, it.Mapping, b.Dst, b.Pitch, b.Mapping)
		}
		want := content(i)
		switch i {
		case 10:
			want = make([]byte, gb)
			if !errors.Is(it.Err, store.ErrCorrupt) {
				t.Fatalf("corrupt item: %v", it.Err)
			}
		case 17:
			want = bytes.Repeat(old, rows)
			if it.Err != store.ErrNotFound {
				t.Fatalf("absent item: %v", it.Err)
			}
		default:
			if it.Err != nil {
				t.Fatalf("item %d: %v", i, it.Err)
			}
		}
		if !bytes.Equal(tileBytes(r, it), want) {
			t.Fatalf("item %d: wrong bytes", i)
		}
	}
	if r.dev.Copies2D() != 0 || lands < 2 || r.st.unverified != n-1 {
		t.Fatalf("%d 2D copies, %d Land calls, %d unverified reads of %d", r.dev.Copies2D(), lands, r.st.unverified, n)
	}
	// Each group is checked once: the packed tiles by Verify where they
	// landed, the pitched ones by Land alone.
	packed := 0
	for _, it := range its {
		if it.Pitch == 0 {
			packed++
		}
	}
	if verified != packed {
		t.Fatalf("Verify checked %d groups, want the %d packed tiles' only", verified, packed)
	}
	r.checkClean(t)
	r.p.Close()
	if a := r.dev.Allocated(); a != 0 {
		t.Fatalf("%d bytes of device scratch left after Close", a)
	}
}

// tileBytes is an item's group as it lies in its tile on the fake device
// (rows Pitch apart, or packed).
func tileBytes(r *rig, it gpu.Item) []byte {
	var got []byte
	for row := range rows {
		got = append(got, r.dev.Mem(it.Dst+uint64(row*max(it.Pitch, rowBytes)), rowBytes)...)
	}
	return got
}

// TestDirectScratchBudget: concurrent direct loads of pitched tiles keep
// the device scratch they hold within ScratchBudget plus one chunk's per
// load (a load over the budget finishes its own oldest chunk and reuses
// its scratch), and land every byte.
func TestDirectScratchBudget(t *testing.T) {
	const loads, perLoad = 6, 8 * 64
	r, s, _ := directRig(t, loads*perLoad, 4) // chunks of 8 groups
	r.dev.Delay, r.dev.Jitter = 20*time.Microsecond, 40*time.Microsecond
	lands := 0
	r.p.Land = deviceLand(r.dev, r.p.Geo, &lands)
	chunk := 8 * gb
	budget := 2 * chunk
	r.p.ScratchBudget = budget
	r.p.DirectWorkers = 1
	const pitch = 8 * rowBytes
	its := make([]gpu.Item, loads*perLoad)
	for i := range its {
		b, h := i/8, i%8
		its[i] = gpu.Item{Key: key(i), Dst: gputest.Base + uint64(b*rows*pitch+h*rowBytes), Pitch: pitch}
	}
	var wg sync.WaitGroup
	for k := range loads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.p.Load(s, its[k*perLoad:(k+1)*perLoad], false); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for i, it := range its {
		if it.Err != nil || !bytes.Equal(tileBytes(r, it), content(i)) {
			t.Fatalf("item %d: %v", i, it.Err)
		}
	}
	if peak := r.dev.PeakAllocated(); peak > budget+loads*chunk {
		t.Fatalf("%d bytes of device scratch at once, budget %d plus %d loads × %d", peak, budget, loads, chunk)
	}
	s.check(t, r)
}
