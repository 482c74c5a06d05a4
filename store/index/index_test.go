package index

import (
	"math/rand/v2"
	"testing"
)

// model is the index's specification written the slow way: every question
// is answered by looking at every block.
type model struct {
	policy Policy
	blocks map[uint64]*mblock
	clock  uint64
}

type mblock struct {
	slot  int64
	meta  Meta
	full  bool
	stamp uint64
	read  bool // touched since inserted
}

func (m *model) children(b uint64) int {
	n := 0
	for _, c := range m.blocks {
		if c.meta.HasParent && c.meta.Parent == b {
			n++
		}
	}
	return n
}

// victim: under LRU the least recently used unskipped block. Under Prefix,
// among the unskipped leaves: the least recently used unread one, unless the
// least recently used read one was last used more than window uses before
// it (or there is no unread one); with no leaf, the least recently used
// unskipped block.
func (m *model) victim(skip func(int64) bool, window uint64) int64 {
	var oldest [3]*mblock // unread leaf, read leaf, interior
	for id, b := range m.blocks {
		if skip(b.slot) {
			continue
		}
		k := 0
		switch {
		case m.policy == LRU:
		case m.children(id) > 0:
			k = 2
		case b.read:
			k = 1
		}
		if oldest[k] == nil || b.stamp < oldest[k].stamp {
			oldest[k] = b
		}
	}
	u, r, in := oldest[0], oldest[1], oldest[2]
	switch {
	case u != nil && r != nil && r.stamp+window < u.stamp, u == nil && r != nil:
		return r.slot
	case u != nil:
		return u.slot
	case in != nil:
		return in.slot
	}
	return -1
}

func check(t *testing.T, x *Index) {
	t.Helper()
	if bad := x.Check(); bad != nil {
		t.Fatalf("index invariants: %v", bad)
	}
}

func TestAgainstModel(t *testing.T) {
	for _, p := range []Policy{Prefix, LRU} {
		t.Run(p.String(), func(t *testing.T) {
			for seed := range uint64(20) {
				runModel(t, p, seed)
			}
		})
	}
}

func runModel(t *testing.T, p Policy, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 7))
	const slots = 48
	x := New(slots, p)
	m := &model{policy: p, blocks: map[uint64]*mblock{}}
	free := make([]int64, 0, slots)
	for s := int64(slots - 1); s >= 0; s-- {
		free = append(free, s)
	}
	// Few ids, so parents are often stored, missing, renamed or reused.
	id := func() uint64 { return uint64(r.IntN(64)) + 1 }
	meta := func(block uint64) Meta {
		var m Meta
		if r.IntN(4) > 0 {
			m.HasParent, m.Parent = true, id()
		}
		if m.HasParent && m.Parent == block {
			m.HasParent, m.Parent = false, 0
		}
		m.Tag[0] = byte(r.IntN(3))
		return m
	}
	anyBlock := func() (uint64, *mblock) {
		for id, b := range m.blocks {
			return id, b
		}
		return 0, nil
	}
	for step := range 3000 {
		switch op := r.IntN(10); {
		case op < 3 && len(free) > 0: // insert
			b := id()
			if _, ok := m.blocks[b]; ok {
				continue
			}
			s := free[len(free)-1]
			free = free[:len(free)-1]
			mt, full := meta(b), r.IntN(5) > 0
			x.Insert(s, b, mt, full)
			m.clock++
			m.blocks[b] = &mblock{slot: s, meta: mt, full: full, stamp: m.clock}
		case op < 5: // touch
			if b, mb := anyBlock(); mb != nil {
				_ = b
				x.Touch(mb.slot)
				m.clock++
				mb.stamp, mb.read = m.clock, true
			}
		case op < 6: // update, or set full without a touch
			if b, mb := anyBlock(); mb != nil {
				mt, full := meta(b), r.IntN(5) > 0
				if r.IntN(3) == 0 {
					x.SetFull(mb.slot, full)
					mb.full = full
					break
				}
				x.Update(mb.slot, mt, full)
				m.clock++
				mb.meta, mb.full, mb.stamp = mt, full, m.clock
			}
		case op < 7: // rename
			if b, mb := anyBlock(); mb != nil {
				to := id()
				if _, ok := m.blocks[to]; ok {
					continue
				}
				x.Rename(mb.slot, to)
				delete(m.blocks, b)
				if mb.meta.HasParent && mb.meta.Parent == to {
					mb.meta.HasParent, mb.meta.Parent = false, 0
				}
				m.blocks[to] = mb
			}
		case op < 8: // remove
			if b, mb := anyBlock(); mb != nil {
				x.Remove(mb.slot)
				delete(m.blocks, b)
				free = append(free, mb.slot)
			}
		default: // evict, some slots pinned
			pinned := map[int64]bool{}
			for range r.IntN(4) {
				pinned[int64(r.IntN(slots))] = true
			}
			skip := func(s int64) bool { return pinned[s] }
			got, want := x.Victim(skip), m.victim(skip, 2*slots)
			if got != want {
				t.Fatalf("seed %d step %d: victim slot %d, model says %d", seed, step, got, want)
			}
			if got >= 0 {
				b, _ := x.Block(got)
				x.Remove(got)
				delete(m.blocks, b)
				free = append(free, got)
			}
		}
		check(t, x)
		if x.Len() != len(m.blocks) {
			t.Fatalf("seed %d step %d: %d indexed, model has %d", seed, step, x.Len(), len(m.blocks))
		}
		for b, mb := range m.blocks {
			if s, ok := x.Slot(b); !ok || s != mb.slot {
				t.Fatalf("seed %d step %d: block %d in slot %d (%v), model %d", seed, step, b, s, ok, mb.slot)
			}
			if x.Meta(mb.slot) != mb.meta || x.Full(mb.slot) != mb.full || x.Children(mb.slot) != m.children(b) {
				t.Fatalf("seed %d step %d: block %d meta/full/children disagree with the model", seed, step, b)
			}
			var other Tag
			other[0] = mb.meta.Tag[0] + 1
			want := Absent
			if mb.full {
				want = Present
			}
			if got := x.Lookup(b, mb.meta.Tag); got != want && !(mb.meta.Tag.IsZero() && got == want) {
				t.Fatalf("seed %d step %d: lookup of block %d with its tag: %v, want %v", seed, step, b, got, want)
			}
			if got := x.Lookup(b, other); got != TagMismatch {
				t.Fatalf("seed %d step %d: lookup of block %d with another tag: %v", seed, step, b, got)
			}
		}
	}
}

// A conversation's tail leaves before its root, and a shared root stays
// while any conversation continues it, however old the root's last use.
func TestPrefixKeepsRoots(t *testing.T) {
	x := New(8, Prefix)
	// root(1) <- a1(2) <- a2(3); root <- b1(4)
	x.Insert(0, 1, Meta{}, true)
	x.Insert(1, 2, Meta{HasParent: true, Parent: 1}, true)
	x.Insert(2, 3, Meta{HasParent: true, Parent: 2}, true)
	x.Insert(3, 4, Meta{HasParent: true, Parent: 1}, true)
	// Conversation a is read again: root, a1, a2 touched in order.
	x.Touch(0)
	x.Touch(1)
	x.Touch(2)
	order := []uint64{}
	for x.Len() > 0 {
		s := x.Victim(nil)
		b, _ := x.Block(s)
		order = append(order, b)
		x.Remove(s)
		check(t, x)
	}
	want := []uint64{4, 3, 2, 1}
	for i := range want {
		if order[i] != want[i] {
			t.Fatalf("eviction order %v, want %v", order, want)
		}
	}
	// Under LRU the root, least recently used, goes first.
	y := New(8, LRU)
	y.Insert(0, 1, Meta{}, true)
	y.Insert(1, 2, Meta{HasParent: true, Parent: 1}, true)
	if s := y.Victim(nil); s != 0 {
		t.Fatalf("LRU victim slot %d, want 0 (the root)", s)
	}
}

// A parent stored after its children starts interior; a pinned leaf makes
// the victim come from the interior rather than fail.
func TestParentAfterChildAndFallback(t *testing.T) {
	x := New(4, Prefix)
	x.Insert(0, 10, Meta{HasParent: true, Parent: 5}, true)
	x.Insert(1, 5, Meta{}, true)
	check(t, x)
	if x.Children(1) != 1 {
		t.Fatalf("parent stored after its child counts %d children", x.Children(1))
	}
	if s := x.Victim(nil); s != 0 {
		t.Fatalf("victim slot %d, want the child's 0", s)
	}
	if s := x.Victim(func(s int64) bool { return s == 0 }); s != 1 {
		t.Fatalf("with the leaf pinned the victim is slot %d, want the parent's 1", s)
	}
	if s := x.Victim(func(int64) bool { return true }); s != -1 {
		t.Fatalf("everything pinned gives victim %d", s)
	}
}

func TestSelfParentIgnored(t *testing.T) {
	x := New(2, Prefix)
	x.Insert(0, 7, Meta{HasParent: true, Parent: 7}, true)
	check(t, x)
	if x.Meta(0).HasParent || x.Children(0) != 0 {
		t.Fatal("a block naming itself as parent was linked to itself")
	}
}

func TestParsePolicy(t *testing.T) {
	for _, p := range []Policy{Prefix, LRU} {
		got, err := ParsePolicy(p.String())
		if err != nil || got != p {
			t.Fatalf("ParsePolicy(%q) = %v, %v", p.String(), got, err)
		}
	}
	if _, err := ParsePolicy("lfu"); err == nil {
		t.Fatal("ParsePolicy accepted lfu")
	}
}

// Under Prefix a leaf read since it was stored outlives leaves stored and
// never read, until it has gone unused for the window (2 × slots uses)
// longer than they have.
func TestReadLeavesOutliveUnread(t *testing.T) {
	x := New(8, Prefix)
	x.Insert(0, 1, Meta{}, true) // read below: a reused prefix
	x.Insert(1, 2, Meta{}, true) // never read
	x.Touch(0)
	x.Insert(2, 3, Meta{}, true) // never read, newer than block 1
	if s := x.Victim(nil); s != 1 {
		t.Fatalf("victim slot %d, want 1 (the oldest unread leaf)", s)
	}
	x.Remove(1)
	if s := x.Victim(nil); s != 2 {
		t.Fatalf("victim slot %d, want 2 (unread, though newer than the read leaf)", s)
	}
	// Writes (Update) are uses but not reads: the unread leaf moves ahead
	// in time until the read leaf is more than the window older.
	for range 16 {
		x.Update(2, Meta{}, true)
	}
	if s := x.Victim(nil); s != 0 {
		t.Fatalf("victim slot %d, want 0: the read leaf went unused longer than the window", s)
	}
	check(t, x)
}
