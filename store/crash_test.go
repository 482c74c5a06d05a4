package store_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvfs/kvfs/engine/posix"
	uringengine "github.com/kvfs/kvfs/engine/uring"
	"github.com/kvfs/kvfs/layout"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
	"github.com/kvfs/kvfs/uring"
)

// op is one step of the crash workload: puts (key → version) or deletes.
type op struct {
	puts     map[layout.Key]int
	del      []layout.Key
	delBlock uint64
}

func keysOf(block uint64, idxs ...int) []layout.Key {
	out := make([]layout.Key, len(idxs))
	for i, idx := range idxs {
		out[i] = testGeo.KeyAt(block, idx)
	}
	return out
}

func all(block uint64) []int { return []int{0, 1, 2, 3, 4, 5, 6, 7} }

func putOp(version int, keys ...[]layout.Key) op {
	o := op{puts: map[layout.Key]int{}}
	for _, ks := range keys {
		for _, k := range ks {
			o.puts[k] = version
		}
	}
	return o
}

// crashWorkload mixes fresh blocks, in-place additions, overwrites
// (copy-on-write), deletes of groups and blocks, and (with few slots)
// evictions.
func crashWorkload() []op {
	return []op{
		putOp(1, keysOf(1, all(1)...)),
		putOp(1, keysOf(2, 0, 1, 2, 3)),
		putOp(2, keysOf(1, 2)),
		putOp(1, keysOf(2, 4, 5, 6, 7)),
		{del: keysOf(1, 0)},
		putOp(1, keysOf(3, all(3)...), keysOf(4, all(4)...)),
		putOp(1, keysOf(5, all(5)...)),
		{delBlock: 2},
		putOp(3, keysOf(1, 2, 3)),
		putOp(2, keysOf(6, 0), keysOf(3, 1)),
		putOp(1, keysOf(1, 0)),
	}
}

// changer is what the crash workload changes the store through: the store
// itself, or a DRAM tier in front of it (package tier).
type changer interface {
	Write([]store.WriteReq) error
	Delete([]layout.Key) error
	DeleteBlock(uint64) error
}

func (o op) apply(s changer) error {
	switch {
	case o.puts != nil:
		var reqs []store.WriteReq
		for k, v := range o.puts {
			reqs = append(reqs, store.WriteReq{Key: k, Data: groupData(testGeo, k, v)})
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
		return s.DeleteBlock(o.delBlock)
	}
}

// model is what has been acknowledged: key → version (absent when missing).
type model map[layout.Key]int

func (m model) apply(o op) {
	for k, v := range o.puts {
		m[k] = v
	}
	for _, k := range o.del {
		delete(m, k)
	}
	if o.puts == nil && o.del == nil {
		for k := range m {
			if k.Block == o.delBlock {
				delete(m, k)
			}
		}
	}
}

// touches reports the versions op may leave for k (-1: absent).
func (o op) touches(k layout.Key) (int, bool) {
	if v, ok := o.puts[k]; ok {
		return v, true
	}
	for _, d := range o.del {
		if d == k {
			return -1, true
		}
	}
	if o.puts == nil && o.del == nil && k.Block == o.delBlock {
		return -1, true
	}
	return 0, false
}

// TestCrashAtEveryWrite crashes the engine at its k-th write for every k of
// the workload, takes several possible device images (unsynced writes lost,
// landed or torn), reopens, and checks that every group reads as its last
// acknowledged value, the value being written, or (only where eviction or
// the interrupted operation allows) absent — never as bytes whose checksum
// fails.
func TestCrashAtEveryWrite(t *testing.T) {
	for _, c := range []struct {
		name  string
		slots int
	}{{"roomy", 12}, {"evicting", 4}} {
		t.Run(c.name, func(t *testing.T) { crashAtEveryWrite(t, c.slots) })
	}
}

func crashAtEveryWrite(t *testing.T, slots int) {
	work := crashWorkload()
	evicting := slots < 7
	// Count the writes of a run without a crash.
	s, m := newMemStore(t, slots, testGeo)
	before := m.Writes()
	for i, o := range work {
		if err := o.apply(s); err != nil && !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	total := m.Writes() - before
	if total < 20 {
		t.Fatalf("workload made only %d writes", total)
	}
	images := 0
	for k := 1; k <= total+1; k++ {
		s, m := newMemStore(t, slots, testGeo)
		store.CheckMemoryOnly(s) // its device crashes under it
		m.CrashAt(k)
		acked, crashedOp := runWorkload(t, s, work, m.Crashed, fmt.Sprintf("k=%d", k))
		for seed := range uint64(4) {
			images++
			img := m.CrashImage(rand.New(rand.NewPCG(uint64(k), seed)), 512)
			checkRecovered(t, fmt.Sprintf("k=%d seed=%d", k, seed), storetest.NewMemFrom(img, 512), acked, work, crashedOp, evicting)
		}
	}
	t.Logf("%d crash points, %d device images checked", total+1, images)
}

// runWorkload applies work until the engine crashes; it returns what was
// acknowledged and the index of the interrupted op (-1 when none).
func runWorkload(t *testing.T, s changer, work []op, crashed func() bool, what string) (model, int) {
	return runWorkloadChecked(t, s, work, crashed, what, nil)
}

// runWorkloadChecked is runWorkload that calls check, when not nil, after
// each op the device acknowledged before crashing.
func runWorkloadChecked(t *testing.T, s changer, work []op, crashed func() bool, what string, check func(acked model) error) (model, int) {
	acked := model{}
	for i, o := range work {
		err := o.apply(s)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			if !crashed() {
				t.Fatalf("%s: op %d failed without a crash: %v", what, i, err)
			}
			return acked, i
		}
		acked.apply(o)
		if check != nil && !crashed() {
			if err := check(acked); err != nil {
				t.Fatalf("%s: after op %d: %v", what, i, err)
			}
		}
	}
	return acked, -1
}

// checkRecovered opens the store on m, a device after a crash, and checks
// the invariant, then that the store takes writes and reopens.
func checkRecovered(t *testing.T, what string, m store.Engine, acked model, work []op, crashedOp int, evicting bool) {
	t.Helper()
	s := openStore(t, m, store.Options{})
	var inflight *op
	if crashedOp >= 0 {
		inflight = &work[crashedOp]
	}
	if err := checkModel(s, acked, inflight, evicting); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	rep, err := s.Fsck(false)
	if err != nil {
		t.Fatalf("%s: fsck: %v", what, err)
	}
	for _, p := range rep.Problems {
		if p.Key != nil {
			t.Fatalf("%s: fsck: %v", what, p)
		}
	}
	// The recovered store takes new writes and a clean reopen.
	put(t, s, keysOf(7, 0), 9)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	openStore(t, m, store.Options{}).Close() // before the caller closes m
}

// checkModel checks every group of blocks 1 to 6 against what was
// acknowledged: it reads as its acknowledged value or as the value the
// interrupted op (inflight, nil when none) was writing, and it is absent
// only where it was never acknowledged, the interrupted op deletes it, or
// (evicting) the store may have evicted its block.
func checkModel(s interface{ Read([]store.ReadReq) error }, acked model, inflight *op, evicting bool) error {
	for b := uint64(1); b <= 6; b++ {
		for idx := range testGeo.GroupsPerBlock() {
			k := testGeo.KeyAt(b, idx)
			reqs := []store.ReadReq{{Key: k, Buf: make([]byte, testGeo.GroupBytes())}}
			if err := s.Read(reqs); err != nil {
				return err
			}
			got, err := reqs[0].Buf, reqs[0].Err
			want, isAcked := acked[k]
			var inV int
			var inTouch bool
			if inflight != nil {
				inV, inTouch = inflight.touches(k)
			}
			switch {
			case errors.Is(err, store.ErrNotFound):
				if isAcked && !evicting && !(inTouch && inV < 0) {
					// Without eviction, the only way an acknowledged group
					// may vanish is the interrupted op deleting it.
					return fmt.Errorf("%v acknowledged (v%d) but absent", k, want)
				}
			case err != nil:
				return fmt.Errorf("%v: %w", k, err)
			default:
				okAcked := isAcked && bytes.Equal(got, groupData(testGeo, k, want))
				okNew := inTouch && inV > 0 && bytes.Equal(got, groupData(testGeo, k, inV))
				if !okAcked && !okNew {
					return fmt.Errorf("%v reads neither its acknowledged value (v%d, %v) nor the one being written", k, want, isAcked)
				}
			}
		}
	}
	return nil
}

// TestCheckModelCatches shows that checkModel, the crash tests' judge,
// fails on what it must catch: a lost acknowledged group, a stale value, a
// group that should be gone; and accepts what an interrupted op explains.
func TestCheckModelCatches(t *testing.T) {
	s, _ := newMemStore(t, 8, testGeo)
	put(t, s, keysOf(1, 0, 1), 1)
	put(t, s, keysOf(2, 0), 2)
	acked := model{keysOf(1, 0)[0]: 1, keysOf(1, 1)[0]: 1, keysOf(2, 0)[0]: 2}
	if err := checkModel(s, acked, nil, false); err != nil {
		t.Fatalf("a store matching its model: %v", err)
	}
	lost := model{keysOf(3, 0)[0]: 1}
	for k, v := range acked {
		lost[k] = v
	}
	if err := checkModel(s, lost, nil, false); err == nil || !strings.Contains(err.Error(), "but absent") {
		t.Errorf("lost group: %v", err)
	}
	// Eviction or the interrupted op deleting it explains the absence.
	if err := checkModel(s, lost, nil, true); err != nil {
		t.Errorf("lost group while evicting: %v", err)
	}
	del := op{del: keysOf(3, 0)}
	if err := checkModel(s, lost, &del, false); err != nil {
		t.Errorf("lost group the interrupted op deletes: %v", err)
	}
	// A put that was not interrupted explains nothing.
	notDel := putOp(1, keysOf(3, 0))
	if err := checkModel(s, lost, &notDel, false); err == nil {
		t.Error("absence explained by an interrupted put")
	}
	stale := model{keysOf(1, 0)[0]: 2, keysOf(1, 1)[0]: 1, keysOf(2, 0)[0]: 2}
	if err := checkModel(s, stale, nil, false); err == nil || !strings.Contains(err.Error(), "neither") {
		t.Errorf("stale value: %v", err)
	}
	// The interrupted op's value is accepted, another one is not.
	inflight := putOp(2, keysOf(1, 0))
	if err := checkModel(s, stale, &inflight, false); err == nil {
		t.Error("v1 accepted as the in-flight v2 or the acknowledged v2")
	}
	inflight = putOp(1, keysOf(1, 0))
	if err := checkModel(s, stale, &inflight, false); err != nil {
		t.Errorf("in-flight value: %v", err)
	}
	resurrected := model{keysOf(1, 0)[0]: 1, keysOf(2, 0)[0]: 2} // keysOf(1, 1) deleted
	if err := checkModel(s, resurrected, nil, false); err == nil {
		t.Error("a deleted group that reads back passed")
	}
}

// crashAtEveryWriteOn runs the crash workload on a real engine over a file:
// the Crashing wrapper rolls unsynced writes back on the file itself, and
// the store is reopened with a fresh engine on the same file.
func crashAtEveryWriteOn(t *testing.T, open func(path string) (store.Engine, error), slots, seeds int) {
	path := t.TempDir() + "/crash.kvfs"
	fresh := func() (*store.Store, *storetest.Crashing, store.Engine) {
		if err := store.PrepareFile(path, store.SizeFor(testGeo, int64(slots))); err != nil {
			t.Fatal(err)
		}
		e, err := open(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Format(e, testGeo, store.FormatOptions{Force: true}); err != nil {
			t.Fatal(err)
		}
		c := storetest.NewCrashing(e)
		s := openStore(t, c, store.Options{})
		store.CheckMemoryOnly(s) // its device crashes under it
		return s, c, e
	}
	work := crashWorkload()
	s, c, e := fresh()
	runWorkload(t, s, work, c.Crashed, "dry run")
	total := c.Writes()
	s.Close()
	e.Close()
	for k := 1; k <= total+1; k++ {
		for seed := range uint64(seeds) {
			s, c, e := fresh()
			c.CrashAt(k)
			what := fmt.Sprintf("%s k=%d seed=%d", e.Name(), k, seed)
			acked, crashedOp := runWorkload(t, s, work, c.Crashed, what)
			if err := c.Crash(rand.New(rand.NewPCG(uint64(k), seed)), max(e.Align(), 512)); err != nil {
				t.Fatal(err)
			}
			e.Close()
			e2, err := open(path)
			if err != nil {
				t.Fatal(err)
			}
			checkRecovered(t, what, e2, acked, work, crashedOp, slots < 7)
			e2.Close()
		}
	}
	t.Logf("%d crash points × %d images on the %s engine", total+1, seeds, e.Name())
}

func TestCrashAtEveryWritePosix(t *testing.T) {
	open := func(path string) (store.Engine, error) { return posix.Open(path, posix.Options{}) }
	crashAtEveryWriteOn(t, open, 12, 1)
	crashAtEveryWriteOn(t, open, 4, 1)
}

func TestCrashAtEveryWriteUring(t *testing.T) {
	if err := uring.Available(); err != nil {
		t.Skipf("io_uring unavailable here: %v", err)
	}
	open := func(path string) (store.Engine, error) {
		return uringengine.OpenEngine(path, uringengine.EngineOptions{Direct: true, BufferPool: 1 << 20})
	}
	crashAtEveryWriteOn(t, open, 12, 1)
	crashAtEveryWriteOn(t, open, 4, 1)
}
