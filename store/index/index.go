// Package index is the slot store's in-memory index: which slot holds each
// block, what each block says of itself (its tag, its parent, whether every
// group is present), the prefix forest the parents form, and the order in
// which blocks are evicted.
//
// It does no I/O and takes no locks: the store calls it under Store.mu, and
// the eviction trace benchmark (kvfs bench-evict) drives the same code with
// no store behind it.
//
// # Eviction order
//
// Every indexed block sits in a recency list (front = most recently used):
// the candidates, where victims are taken from the back, or the interior.
// Under LRU every block is a candidate, which is plain LRU. Under Prefix a
// block is a candidate only while no stored block names it as its parent (a
// leaf of the prefix forest); a block with a stored child is interior. A
// block whose last child goes (evicted, deleted, renamed away) becomes a
// candidate again, placed by its own last use, so a dead conversation's
// blocks leave tail first and a shared prefix stays while any continuation of
// it is stored. When every candidate is pinned, Victim falls back to the
// interior list, least recent first: a write is never refused for room while
// a block could be evicted.
//
// Under Prefix the leaves are further split by reuse: a leaf read (Touch)
// since it was stored has shown that its prefix comes back; one stored and
// never read has not (a one-off request's recomputed chain, the newest turn
// of a conversation that may not continue). The victim is the least recent
// unread leaf, unless the least recent read leaf has gone unused for more
// than the index's window (2 × its slots, in block uses: touches and
// writes) longer: reused prefixes outlive one-off blocks, and a dead
// conversation's blocks still age out. On the multi-turn chat trace of kvfs
// bench-evict this is worth about 4 points of hit ratio at a quarter of the
// working set over leaves in plain LRU order, and loses nothing on traces of
// short conversations (docs/performance.md, "Prefix-aware eviction").
//
// A block may name a parent that is not stored (yet, or any more): such
// children are counted per missing parent, and a parent stored later starts
// interior with that count. A block naming itself has no parent.
//
// Touch and Victim cost O(1) per block looked at; a block moving between the
// lists is placed by its last use, walking in from both ends of the list it
// joins (O(distance to the nearer end)).
package index

import (
	"fmt"
)

// Policy says which blocks are eviction candidates.
type Policy uint8

const (
	// Prefix evicts leaves of the prefix forest, least recently used
	// first; blocks without parents behave as under LRU.
	Prefix Policy = iota
	// LRU evicts the least recently used block.
	LRU
)

// String returns the policy's name as the command line spells it.
func (p Policy) String() string {
	switch p {
	case Prefix:
		return "prefix"
	case LRU:
		return "lru"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// ParsePolicy reads a policy name ("prefix", "lru").
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "prefix":
		return Prefix, nil
	case "lru":
		return LRU, nil
	}
	return 0, fmt.Errorf("index: unknown eviction policy %q (want prefix or lru)", s)
}

// TagSize is the bytes of a block's tag.
const TagSize = 16

// Tag is the caller's 16-byte name of what a block stands for (a hash of the
// model, dtype, shard and token chain). The zero tag is "untagged".
type Tag [TagSize]byte

// IsZero reports whether t is the zero (untagged) tag.
func (t Tag) IsZero() bool { return t == Tag{} }

// Meta is what a block says of itself besides its groups.
type Meta struct {
	Tag       Tag
	Parent    uint64
	HasParent bool
}

// Status is LOOKUP's answer for one (block, tag) pair.
type Status uint8

const (
	// Present: the block is stored with every group, and its tag is the
	// one asked for (or the zero tag was asked for).
	Present Status = iota
	// Absent: no such block, or not every group of it is stored.
	Absent
	// TagMismatch: the block is stored under another tag.
	TagMismatch
)

// String names the status.
func (s Status) String() string {
	switch s {
	case Present:
		return "present"
	case Absent:
		return "absent"
	case TagMismatch:
		return "tag-mismatch"
	}
	return fmt.Sprintf("Status(%d)", uint8(s))
}

const none = -1

type list struct {
	head, tail int64 // none when empty; head is the most recent
	n          int
}

type entry struct {
	block    uint64
	meta     Meta
	stamp    uint64 // last use; higher is more recent
	children int32  // stored blocks naming this block as parent
	prev     int64  // towards the head
	next     int64  // towards the tail
	used     bool
	full     bool // every group of the block is stored
	interior bool // in the interior list (else the candidates)
	read     bool // touched since stored (Prefix: in the read leaves)
}

// Index maps blocks to slots and keeps them in eviction order. The zero
// value is not usable: call New.
type Index struct {
	policy   Policy
	e        []entry
	bySlot   map[uint64]int64
	pending  map[uint64]int32 // stored children of each parent that is not stored
	cand     list             // the candidates; under Prefix, the unread leaves
	readLeaf list             // under Prefix, the leaves read since stored
	interior list
	clock    uint64
	window   uint64
}

// New returns an empty index of slots slots under policy p.
func New(slots int64, p Policy) *Index {
	x := &Index{
		policy:   p,
		e:        make([]entry, slots),
		bySlot:   make(map[uint64]int64),
		pending:  make(map[uint64]int32),
		cand:     list{head: none, tail: none},
		readLeaf: list{head: none, tail: none},
		interior: list{head: none, tail: none},
		window:   2 * uint64(slots),
	}
	return x
}

// Policy returns the index's eviction policy.
func (x *Index) Policy() Policy { return x.policy }

// Len returns the number of indexed blocks.
func (x *Index) Len() int { return len(x.bySlot) }

// Slots returns the number of slots the index covers.
func (x *Index) Slots() int64 { return int64(len(x.e)) }

// Slot returns the slot of block, if indexed.
func (x *Index) Slot(block uint64) (int64, bool) {
	s, ok := x.bySlot[block]
	return s, ok
}

// Block returns the block indexed in slot, if any.
func (x *Index) Block(slot int64) (uint64, bool) {
	e := &x.e[slot]
	return e.block, e.used
}

// Meta returns the tag and parent of the block in slot.
func (x *Index) Meta(slot int64) Meta { return x.e[slot].meta }

// Full reports whether every group of the block in slot is stored.
func (x *Index) Full(slot int64) bool { return x.e[slot].full }

// Children returns how many stored blocks name the block in slot as parent.
func (x *Index) Children(slot int64) int { return int(x.e[slot].children) }

// Insert indexes block in slot as its most recently used block. It panics
// if the slot is in use or the block is indexed elsewhere: the store keeps
// both one to one, and a breach is a bug that must not spread.
func (x *Index) Insert(slot int64, block uint64, m Meta, full bool) {
	e := &x.e[slot]
	if e.used {
		panic(fmt.Sprintf("index: insert block %016x into slot %d, which holds %016x", block, slot, e.block))
	}
	if s, ok := x.bySlot[block]; ok {
		panic(fmt.Sprintf("index: insert block %016x into slot %d: indexed in slot %d", block, slot, s))
	}
	if m.HasParent && m.Parent == block {
		m.HasParent, m.Parent = false, 0
	}
	x.clock++
	*e = entry{block: block, meta: m, stamp: x.clock, used: true, full: full, prev: none, next: none}
	x.bySlot[block] = slot
	e.children = x.pending[block]
	delete(x.pending, block)
	e.interior = x.policy == Prefix && e.children > 0
	x.pushFront(x.listOf(e), slot)
	x.link(slot)
}

// Update replaces the meta and completeness of the block in slot (a write
// that added groups or restated the tag and parent) and makes it the most
// recently used; a write is not a read (see Eviction order).
func (x *Index) Update(slot int64, m Meta, full bool) {
	e := &x.e[slot]
	if !e.used {
		panic(fmt.Sprintf("index: update of empty slot %d", slot))
	}
	if m.HasParent && m.Parent == e.block {
		m.HasParent, m.Parent = false, 0
	}
	if e.meta.HasParent != m.HasParent || e.meta.Parent != m.Parent {
		x.unlinkParent(slot)
		e.meta = m
		x.link(slot)
	} else {
		e.meta = m
	}
	e.full = full
	x.use(slot, false)
}

// SetFull records whether every group of the block in slot is stored,
// without touching it (groups deleted are no use of the block).
func (x *Index) SetFull(slot int64, full bool) {
	if !x.e[slot].used {
		panic(fmt.Sprintf("index: set full of empty slot %d", slot))
	}
	x.e[slot].full = full
}

// Touch marks the block in slot as just read.
func (x *Index) Touch(slot int64) {
	e := &x.e[slot]
	if !e.used {
		return
	}
	x.use(slot, true)
}

// use makes the block in slot the most recently used; read says it was
// read (Touch), which a write (Update) is not.
func (x *Index) use(slot int64, read bool) {
	e := &x.e[slot]
	x.clock++
	e.stamp = x.clock
	l := x.listOf(e)
	if read && !e.read {
		x.unlink(l, slot)
		e.read = true
		x.pushFront(x.listOf(e), slot)
		return
	}
	if l.head == slot {
		return
	}
	x.unlink(l, slot)
	x.pushFront(l, slot)
}

// Remove drops the block in slot from the index (evicted, deleted). Its
// parent, if stored, may become a candidate; its children keep naming it
// and are counted as children of a missing parent.
func (x *Index) Remove(slot int64) {
	e := &x.e[slot]
	if !e.used {
		panic(fmt.Sprintf("index: remove of empty slot %d", slot))
	}
	x.unlink(x.listOf(e), slot)
	x.unlinkParent(slot)
	if e.children > 0 {
		x.pending[e.block] += e.children
	}
	delete(x.bySlot, e.block)
	*e = entry{prev: none, next: none}
}

// Rename gives the block in slot the id to (which must not be indexed). It
// keeps its tag, parent and place in the order; blocks naming the old id
// now name a missing parent, and blocks naming to become its children.
func (x *Index) Rename(slot int64, to uint64) {
	e := &x.e[slot]
	if !e.used {
		panic(fmt.Sprintf("index: rename of empty slot %d", slot))
	}
	if s, ok := x.bySlot[to]; ok {
		panic(fmt.Sprintf("index: rename slot %d to %016x: indexed in slot %d", slot, to, s))
	}
	x.unlinkParent(slot)
	if e.children > 0 {
		x.pending[e.block] += e.children
	}
	delete(x.bySlot, e.block)
	e.block = to
	x.bySlot[to] = slot
	e.children = x.pending[to]
	delete(x.pending, to)
	if e.meta.HasParent && e.meta.Parent == to {
		e.meta.HasParent, e.meta.Parent = false, 0
	}
	x.place(slot)
	x.link(slot)
}

// Victim returns the slot of the block to evict next, skipping every slot
// for which skip returns true (pinned, or part of the write that needs the
// room), or -1 when every block is skipped.
func (x *Index) Victim(skip func(slot int64) bool) int64 {
	u, r := x.oldest(&x.cand, skip), x.oldest(&x.readLeaf, skip)
	switch {
	case u != none && r != none:
		if x.e[r].stamp+x.window < x.e[u].stamp {
			return r
		}
		return u
	case u != none:
		return u
	case r != none:
		return r
	}
	return x.oldest(&x.interior, skip)
}

// oldest returns the least recently used slot of l that skip does not
// skip, or none.
func (x *Index) oldest(l *list, skip func(slot int64) bool) int64 {
	for s := l.tail; s != none; s = x.e[s].prev {
		if skip == nil || !skip(s) {
			return s
		}
	}
	return none
}

// Lookup answers one (block, tag) pair: Present when the block is stored
// whole and tag is zero or its tag; TagMismatch when stored under another
// tag; Absent otherwise. It touches nothing.
func (x *Index) Lookup(block uint64, tag Tag) Status {
	s, ok := x.bySlot[block]
	if !ok {
		return Absent
	}
	e := &x.e[s]
	if !tag.IsZero() && e.meta.Tag != tag {
		return TagMismatch
	}
	if !e.full {
		return Absent
	}
	return Present
}

// Each calls f for every indexed slot, most recently used candidates first
// (under Prefix the unread leaves, then the read ones), then the interior,
// until f returns false.
func (x *Index) Each(f func(slot int64, block uint64) bool) {
	for _, l := range []*list{&x.cand, &x.readLeaf, &x.interior} {
		for s := l.head; s != none; s = x.e[s].next {
			if !f(s, x.e[s].block) {
				return
			}
		}
	}
}

// link counts the block in slot as a child of its parent.
func (x *Index) link(slot int64) {
	e := &x.e[slot]
	if !e.meta.HasParent {
		return
	}
	ps, ok := x.bySlot[e.meta.Parent]
	if !ok {
		x.pending[e.meta.Parent]++
		return
	}
	p := &x.e[ps]
	p.children++
	if p.children == 1 {
		x.place(ps)
	}
}

// unlinkParent stops counting the block in slot as its parent's child.
func (x *Index) unlinkParent(slot int64) {
	e := &x.e[slot]
	if !e.meta.HasParent {
		return
	}
	ps, ok := x.bySlot[e.meta.Parent]
	if !ok {
		if n := x.pending[e.meta.Parent] - 1; n > 0 {
			x.pending[e.meta.Parent] = n
		} else {
			delete(x.pending, e.meta.Parent)
		}
		return
	}
	p := &x.e[ps]
	p.children--
	if p.children == 0 {
		x.place(ps)
	}
}

// place moves the block in slot to the list its children count says,
// keeping each list ordered by stamp.
func (x *Index) place(slot int64) {
	e := &x.e[slot]
	want := x.policy == Prefix && e.children > 0
	if want == e.interior {
		return
	}
	x.unlink(x.listOf(e), slot)
	e.interior = want
	x.insertByStamp(x.listOf(e), slot)
}

func (x *Index) listOf(e *entry) *list {
	if e.interior {
		return &x.interior
	}
	if e.read && x.policy == Prefix {
		return &x.readLeaf
	}
	return &x.cand
}

// insertByStamp puts slot into l after every entry with a higher stamp,
// walking in from both ends at once.
func (x *Index) insertByStamp(l *list, slot int64) {
	st := x.e[slot].stamp
	f, b := l.head, l.tail
	for f != none {
		if x.e[f].stamp < st {
			x.insertBefore(l, f, slot)
			return
		}
		if x.e[b].stamp >= st {
			x.insertAfter(l, b, slot)
			return
		}
		f, b = x.e[f].next, x.e[b].prev
	}
	x.pushBack(l, slot)
}

func (x *Index) pushFront(l *list, slot int64) {
	e := &x.e[slot]
	e.prev, e.next = none, l.head
	if l.head != none {
		x.e[l.head].prev = slot
	} else {
		l.tail = slot
	}
	l.head = slot
	l.n++
}

func (x *Index) pushBack(l *list, slot int64) {
	e := &x.e[slot]
	e.prev, e.next = l.tail, none
	if l.tail != none {
		x.e[l.tail].next = slot
	} else {
		l.head = slot
	}
	l.tail = slot
	l.n++
}

func (x *Index) insertBefore(l *list, at, slot int64) {
	if x.e[at].prev == none {
		x.pushFront(l, slot)
		return
	}
	x.insertAfter(l, x.e[at].prev, slot)
}

func (x *Index) insertAfter(l *list, at, slot int64) {
	e := &x.e[slot]
	n := x.e[at].next
	e.prev, e.next = at, n
	x.e[at].next = slot
	if n != none {
		x.e[n].prev = slot
	} else {
		l.tail = slot
	}
	l.n++
}

func (x *Index) unlink(l *list, slot int64) {
	e := &x.e[slot]
	if e.prev != none {
		x.e[e.prev].next = e.next
	} else {
		l.head = e.next
	}
	if e.next != none {
		x.e[e.next].prev = e.prev
	} else {
		l.tail = e.prev
	}
	e.prev, e.next = none, none
	l.n--
}

// Check verifies the index's own invariants: the lists hold exactly the
// indexed blocks, once each, in the list their children count says, ordered
// by stamp; every children count and missing-parent count is what the
// parents imply. It returns a description of each breach, or nil.
func (x *Index) Check() []string {
	var bad []string
	addf := func(f string, a ...any) {
		if len(bad) < 20 {
			bad = append(bad, fmt.Sprintf(f, a...))
		}
	}
	seen := make(map[int64]bool, len(x.bySlot))
	for _, l := range []*list{&x.cand, &x.readLeaf, &x.interior} {
		interior := l == &x.interior
		n, prev := 0, int64(none)
		for s := l.head; s != none && n <= len(x.e); s = x.e[s].next {
			e := &x.e[s]
			n++
			switch {
			case !e.used:
				addf("slot %d: listed but empty", s)
			case seen[s]:
				addf("slot %d: listed twice", s)
			case x.listOf(e) != l:
				addf("slot %d: in the wrong list (interior %v, read %v)", s, e.interior, e.read)
			case x.bySlot[e.block] != s:
				addf("slot %d: block %016x indexed in slot %d", s, e.block, x.bySlot[e.block])
			}
			if e.prev != prev {
				addf("slot %d: prev %d, want %d", s, e.prev, prev)
			}
			if prev != none && x.e[prev].stamp < e.stamp {
				addf("slot %d: stamp %d after %d", s, e.stamp, x.e[prev].stamp)
			}
			seen[s] = true
			prev = s
		}
		if n != l.n || prev != l.tail {
			addf("list (interior %v): %d walked, %d counted, tail %d want %d", interior, n, l.n, l.tail, prev)
		}
	}
	if len(seen) != len(x.bySlot) {
		addf("%d blocks listed, %d indexed", len(seen), len(x.bySlot))
	}
	children := map[uint64]int32{}
	for s := range x.e {
		e := &x.e[s]
		if e.used && e.meta.HasParent {
			children[e.meta.Parent]++
		}
	}
	for s := range x.e {
		e := &x.e[s]
		if !e.used {
			continue
		}
		if e.children != children[e.block] {
			addf("slot %d: block %016x counts %d children, has %d", s, e.block, e.children, children[e.block])
		}
		if want := x.policy == Prefix && e.children > 0; e.interior != want {
			addf("slot %d: interior %v with %d children", s, e.interior, e.children)
		}
		if e.meta.HasParent && e.meta.Parent == e.block {
			addf("slot %d: block %016x is its own parent", s, e.block)
		}
		delete(children, e.block)
	}
	for p, n := range children {
		if x.pending[p] != n {
			addf("missing parent %016x: counted %d children, has %d", p, x.pending[p], n)
		}
	}
	for p, n := range x.pending {
		if children[p] != n {
			addf("missing parent %016x: counted %d children, has %d", p, n, children[p])
		}
	}
	return bad
}
