package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// readBlock reads every group of block, nil where absent.
func readBlock(t *testing.T, s *store.Store, block uint64) [][]byte {
	t.Helper()
	out := make([][]byte, testGeo.GroupsPerBlock())
	for idx := range out {
		got, err := get(s, testGeo.KeyAt(block, idx))
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			t.Fatalf("read %016x/%d: %v", block, idx, err)
		default:
			out[idx] = got
		}
	}
	return out
}

func TestRenameBlock(t *testing.T) {
	s, m := newMemStore(t, 8, testGeo)
	put(t, s, keysOf(1, 0, 1, 2, 5), 1)
	put(t, s, keysOf(9, 3), 1)
	before, _ := s.Stat(testGeo.KeyAt(1, 0))
	writes, syncs := m.Writes(), m.Syncs()
	if err := s.RenameBlock(1, 2); err != nil {
		t.Fatal(err)
	}
	// One header write and one sync: no payload moved.
	if w, y := m.Writes()-writes, m.Syncs()-syncs; w != 1 || y != 1 {
		t.Fatalf("rename made %d writes and %d syncs, want 1 and 1", w, y)
	}
	check := func(s *store.Store, what string) {
		t.Helper()
		if _, ok := s.Block(1); ok {
			t.Fatalf("%s: block 1 still present", what)
		}
		got := readBlock(t, s, 2)
		for idx := range got {
			want := []byte(nil)
			if idx == 0 || idx == 1 || idx == 2 || idx == 5 {
				want = groupData(testGeo, testGeo.KeyAt(1, idx), 1)
			}
			if !bytes.Equal(got[idx], want) {
				t.Fatalf("%s: block 2 group %d differs (present %v, want %v)", what, idx, got[idx] != nil, want != nil)
			}
		}
		gi, err := s.Stat(testGeo.KeyAt(2, 0))
		if err != nil || gi.Slot != before.Slot || gi.CRC != before.CRC || !gi.MTime.Equal(before.MTime) {
			t.Fatalf("%s: stat after rename %+v %v, before %+v", what, gi, err, before)
		}
	}
	check(s, "after rename")
	// Refusals change nothing.
	if err := s.RenameBlock(2, 9); !errors.Is(err, store.ErrBlockExists) {
		t.Fatalf("rename onto a block: %v", err)
	}
	if err := s.RenameBlock(1, 3); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("rename of an absent block: %v", err)
	}
	if err := s.RenameBlock(2, 2); err != nil {
		t.Fatalf("rename to itself: %v", err)
	}
	if !bytes.Equal(readBlock(t, s, 9)[3], groupData(testGeo, testGeo.KeyAt(9, 3), 1)) {
		t.Fatal("block 9 changed")
	}
	check(s, "after refusals")
	// The renamed block takes writes (in place and copy-on-write).
	put(t, s, keysOf(2, 7), 3)
	put(t, s, keysOf(2, 0), 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := openStore(t, m, store.Options{})
	if _, ok := s2.Block(1); ok {
		t.Fatal("block 1 back after reopen")
	}
	got := readBlock(t, s2, 2)
	if !bytes.Equal(got[7], groupData(testGeo, testGeo.KeyAt(2, 7), 3)) || !bytes.Equal(got[5], groupData(testGeo, testGeo.KeyAt(1, 5), 1)) {
		t.Fatal("block 2 after reopen")
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s2.RenameBlock(2, 4); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("rename after close: %v", err)
	}
}

// TestRenameBlockFailure fails the header write, then the sync: the rename
// reports the error, the block stays under its old id in memory and after
// a reopen, and the invariants hold.
func TestRenameBlockFailure(t *testing.T) {
	for _, c := range []struct {
		name  string
		fault func(f *storetest.Faulty, syncFail *bool)
	}{
		{"write", func(f *storetest.Faulty, _ *bool) {
			f.SetInjector(func(n int, r store.IO) storetest.Fault {
				if r.Op == store.OpWrite {
					return storetest.EIO
				}
				return storetest.None
			})
		}},
		{"torn", func(f *storetest.Faulty, _ *bool) {
			f.SetInjector(func(n int, r store.IO) storetest.Fault {
				if r.Op == store.OpWrite {
					return storetest.TornWrite
				}
				return storetest.None
			})
		}},
		{"sync", func(_ *storetest.Faulty, syncFail *bool) { *syncFail = true }},
	} {
		t.Run(c.name, func(t *testing.T) {
			mem := storetest.Formatted(t, testGeo, 4, 512)
			syncFail := false
			f := storetest.NewFaulty(mem, nil, func() bool {
				if syncFail {
					syncFail = false
					return true
				}
				return false
			})
			s := openStore(t, f, store.Options{})
			put(t, s, keysOf(1, 0, 3), 1)
			c.fault(f, &syncFail)
			if err := s.RenameBlock(1, 2); err == nil {
				t.Fatal("rename succeeded through a fault")
			}
			f.SetInjector(nil)
			if _, ok := s.Block(2); ok {
				t.Fatal("block 2 exists after a failed rename")
			}
			if got := readBlock(t, s, 1); !bytes.Equal(got[3], groupData(testGeo, testGeo.KeyAt(1, 3), 1)) {
				t.Fatal("block 1 unreadable after a failed rename")
			}
			if err := s.CheckInvariants(); err != nil {
				t.Fatal(err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s2 := openStore(t, mem, store.Options{})
			if _, ok := s2.Block(2); ok {
				t.Fatal("block 2 after reopen")
			}
			if got := readBlock(t, s2, 1); !bytes.Equal(got[0], groupData(testGeo, testGeo.KeyAt(1, 0), 1)) {
				t.Fatal("block 1 after reopen")
			}
			// And the rename works once the device does.
			if err := s2.RenameBlock(1, 2); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// rop is one step of the rename crash workload.
type rop struct {
	puts     []layout.Key
	version  int
	from, to uint64 // a rename when puts is nil and from != 0
	del      []layout.Key
}

// rmodel maps each present key to the key and version its bytes were
// written as (a renamed group keeps its bytes).
type rval struct {
	origin layout.Key
	v      int
}
type rmodel map[layout.Key]rval

func (m rmodel) clone() rmodel {
	c := rmodel{}
	for k, v := range m {
		c[k] = v
	}
	return c
}

func (m rmodel) apply(o rop) {
	switch {
	case o.puts != nil:
		for _, k := range o.puts {
			m[k] = rval{k, o.version}
		}
	case o.del != nil:
		for _, k := range o.del {
			delete(m, k)
		}
	default:
		moved := rmodel{}
		for k, v := range m {
			if k.Block == o.from {
				delete(m, k)
				k.Block = o.to
				moved[k] = v
			}
		}
		for k, v := range moved {
			m[k] = v
		}
	}
}

func (o rop) run(s *store.Store) error {
	switch {
	case o.puts != nil:
		reqs := make([]store.WriteReq, len(o.puts))
		for i, k := range o.puts {
			reqs[i] = store.WriteReq{Key: k, Data: groupData(testGeo, k, o.version)}
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
	case o.del != nil:
		return s.Delete(o.del)
	default:
		return s.RenameBlock(o.from, o.to)
	}
}

func renameWorkload() []rop {
	return []rop{
		{puts: keysOf(1, all(1)...), version: 1},
		{puts: keysOf(2, 0, 1, 2), version: 1},
		{from: 1, to: 3},
		{puts: keysOf(3, 4), version: 2},         // copy-on-write of the renamed block
		{puts: keysOf(1, 0, 6), version: 3},      // the old id is free for a new block
		{from: 2, to: 4},                         //
		{puts: keysOf(4, 5), version: 1},         // in place into the renamed block
		{del: keysOf(3, 0, 1)},                   //
		{from: 3, to: 2},                         // back onto an id that was renamed away
		{from: 4, to: 5},                         //
		{puts: keysOf(5, 0, 1, 2), version: 4},   //
		{from: 1, to: 6},                         //
		{puts: keysOf(6, all(6)...), version: 5}, //
	}
}

// snapshotModel reads blocks 1 to 6 of s into a map of key → bytes.
func snapshotStore(s *store.Store) (map[layout.Key][]byte, error) {
	out := map[layout.Key][]byte{}
	for b := uint64(1); b <= 6; b++ {
		for idx := range testGeo.GroupsPerBlock() {
			k := testGeo.KeyAt(b, idx)
			got, err := get(s, k)
			switch {
			case errors.Is(err, store.ErrNotFound):
			case err != nil:
				return nil, fmt.Errorf("%v: %w", k, err)
			default:
				out[k] = got
			}
		}
	}
	return out, nil
}

// matches reports whether the store's content is exactly what m says.
func (m rmodel) matches(got map[layout.Key][]byte) bool {
	if len(got) != len(m) {
		return false
	}
	for k, v := range m {
		if !bytes.Equal(got[k], groupData(testGeo, v.origin, v.v)) {
			return false
		}
	}
	return true
}

// TestRenameBlockCrashAtEveryWrite crashes a workload of writes, deletes
// and renames at every write, takes several device images per crash point
// (unsynced writes lost, landed or torn), reopens, and checks that the
// store holds exactly the acknowledged state or, where an operation was
// interrupted, exactly the state after it: a rename is all or nothing.
// With this many slots nothing is evicted, and every operation touches one
// block, so per-block atomicity makes the whole store atomic.
func TestRenameBlockCrashAtEveryWrite(t *testing.T) {
	const slots = 12
	work := renameWorkload()
	s, m := newMemStore(t, slots, testGeo)
	before := m.Writes()
	final := rmodel{}
	for i, o := range work {
		if err := o.run(s); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
		final.apply(o)
	}
	got, err := snapshotStore(s)
	if err != nil || !final.matches(got) {
		t.Fatalf("the workload without a crash does not end as its model: %v", err)
	}
	total := m.Writes() - before
	images := 0
	check := func(what string, img []byte, acked, after rmodel) {
		t.Helper()
		images++
		e := storetest.NewMemFrom(img, 512)
		r := openStore(t, e, store.Options{})
		got, err := snapshotStore(r)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if !acked.matches(got) && (after == nil || !after.matches(got)) {
			t.Fatalf("%s: the store holds neither the acknowledged state nor the state after the interrupted op", what)
		}
		// The recovered store takes a rename and a clean reopen.
		if bs := r.Blocks(); len(bs) > 0 {
			if err := r.RenameBlock(bs[0].ID, 0x77); err != nil {
				t.Fatalf("%s: rename after recovery: %v", what, err)
			}
		}
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
		openStore(t, e, store.Options{}).Close()
	}
	// run applies the workload until an op fails (the crash); it returns
	// the acknowledged state and the state had the failed op completed.
	run := func(s *store.Store, crashed func() bool, what string) (acked, after rmodel) {
		acked = rmodel{}
		for i, o := range work {
			if err := o.run(s); err != nil {
				if !crashed() {
					t.Fatalf("%s: op %d failed without a crash: %v", what, i, err)
				}
				after = acked.clone()
				after.apply(o)
				return acked, after
			}
			acked.apply(o)
		}
		return acked, nil
	}
	// A crash at every write: that write and everything after are lost.
	for k := 1; k <= total+1; k++ {
		s, m := newMemStore(t, slots, testGeo)
		store.CheckMemoryOnly(s)
		m.CrashAt(k)
		acked, after := run(s, m.Crashed, fmt.Sprintf("k=%d", k))
		for seed := range uint64(4) {
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512)
			check(fmt.Sprintf("k=%d seed=%d", k, seed), img, acked, after)
		}
	}
	// A crash at every sync: the writes before it may be lost, landed or
	// torn (a rename's one header write among them). The failpoint fails
	// the n-th sync and every failpoint after it, so no I/O follows.
	syncs := 0
	for n := 1; ; n++ {
		calls, crashed := 0, false
		fp := func(name string) error {
			if name == "before-sync" && !crashed {
				calls++
				crashed = calls == n
			}
			if crashed {
				return errors.New("crash")
			}
			return nil
		}
		size := store.SizeFor(testGeo, slots)
		m := storetest.NewMem(size, 512)
		if _, err := store.Format(m, testGeo, store.FormatOptions{}); err != nil {
			t.Fatal(err)
		}
		s := openStore(t, m, store.Options{Failpoint: fp})
		store.CheckMemoryOnly(s)
		acked, after := run(s, func() bool { return crashed }, fmt.Sprintf("sync %d", n))
		if !crashed {
			break
		}
		syncs++
		for seed := range uint64(4) {
			// Tear in 64-byte pieces: stricter than a device's atomic
			// sector, so a header written over its current copy (one
			// sector here) would be caught.
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(n), seed)), 64)
			check(fmt.Sprintf("sync %d seed=%d", n, seed), img, acked, after)
		}
	}
	t.Logf("%d write and %d sync crash points, %d device images checked", total+1, syncs, images)
}
