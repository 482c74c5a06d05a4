package gpu

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvfs/kvfs/store"
)

// The staged route: groups are read from the store into pinned staging
// buffers, a group of chunks per store call, and copied to their tiles
// from there (see Routes in route.go).

// putReadGroups keeps a finished load's read groups, emptied, for the next
// (up to freelist.DefaultMax of them).
func (p *Pipeline) putReadGroups(gs *[3]readGroup) {
	for i := range gs {
		g := &gs[i]
		clear(g.chunks[:cap(g.chunks)])
		// Only the requests this load wrote: the rest were cleared by
		// the load before that wrote them (a landed load runs a staged
		// load per batch, and clearing all each time was a visible share
		// of its CPU).
		clear(g.reqs[:g.used])
		*g = readGroup{chunks: g.chunks[:0], bounds: g.bounds[:0], reqs: g.reqs[:0]}
	}
	p.idle.Put(gs)
}

// stagedLoad is one load through staging: its items, the staging buffers
// it holds and its reads in flight. Its methods are the load's steps:
// prepare hands items to chunks and builds their read requests (fill),
// queue takes a read that is over and queues its chunks' copies, finish
// takes a chunk whose copies completed and has its groups checked.
type stagedLoad struct {
	p       *Pipeline
	r       Reader
	items   []Item
	per     int  // groups per chunk
	tiled   bool // tiles among items (each at least 2 groups)
	overlap bool // two store reads may be in flight at once
	dev     Device
	h       held
	groups  *[3]readGroup
	flight  [2]*readGroup // reads started, oldest first
	nflight int
	lo      int   // items before it were handed to a chunk
	err     error // the batch's
}

// loadStaged is Load through staging, of items that move ngroups groups.
//
// With room for two groups of chunks in the depth, two store reads are
// in flight at once (each on its own goroutine): the next group's read is
// started as soon as this one's is, so the storage never waits for a read
// to end before the next begins (a store read spread over the cores leaves
// them idle at its tail), nor for the copy submissions. A group started
// while another is in flight takes only buffers free now (the batch's own
// may all be in flight, not yet queued, so there is none to wait for);
// with none in flight it may wait for one. Without the room, one group at
// a time.
func (p *Pipeline) loadStaged(r Reader, items []Item, ngroups int) error {
	gb := p.Geo.GroupBytes
	l := stagedLoad{p: p, r: r, items: items, per: p.chunkGroups(ngroups), tiled: ngroups > len(items)}
	if l.tiled {
		// A chunk takes whole tiles: at least the largest.
		for i := range items {
			l.per = max(l.per, items[i].Groups())
		}
	}
	if l.per == 0 || l.per*gb > p.Pool.BufferSize() {
		return fmt.Errorf("%w: staging buffers of %d bytes hold no %d groups of %d bytes", ErrConfig, p.Pool.BufferSize(), max(1, l.per), gb)
	}
	l.h, l.dev = held{p: p}, p.lane()
	l.overlap = 2*p.readAhead() <= p.depth()
	l.groups = p.idle.Get()
	// No read may outlive Load, even when one panics (its staging
	// buffers go back to the pool).
	defer func() {
		for i := range l.groups {
			if g := &l.groups[i]; g.done != nil {
				<-g.done
			}
		}
		p.putReadGroups(l.groups)
	}()
	l.run()
	l.h.release(l.finish)
	if l.err != nil {
		for i := l.lo; i < len(items); i++ {
			items[i].failAll(l.err)
		}
	}
	return l.err
}

// run reads the items group by group, queueing each group's copies once
// its read is over, until every item was handed to a chunk or the batch
// failed.
func (l *stagedLoad) run() {
	more := func() bool { return l.err == nil && l.lo < len(l.items) }
	l.launch(true, l.overlap)
	if l.overlap && more() {
		l.launch(false, true)
	}
	for l.nflight > 0 {
		cur := l.flight[0]
		l.flight[0], l.flight[1] = l.flight[1], nil
		l.nflight--
		cur.wait()
		if cur.err != nil && l.err == nil {
			l.err = cur.err
		}
		if l.overlap && more() {
			l.launch(false, true)
		}
		l.queue(cur)
		cur.chunks = cur.chunks[:0]
		if l.nflight == 0 && more() {
			l.launch(true, l.overlap)
		}
	}
}

// launch prepares the next group of chunks in an idle read group and
// starts its read (on a goroutine of its own when async).
func (l *stagedLoad) launch(mayWait, async bool) {
	var g *readGroup
	for i := range l.groups {
		// In flight or being queued, a group has chunks.
		if len(l.groups[i].chunks) == 0 {
			g = &l.groups[i]
			break
		}
	}
	if l.prepare(g, mayWait); len(g.chunks) > 0 {
		g.start(l.r, async)
		l.flight[l.nflight] = g
		l.nflight++
	}
}

// prepare hands the next items, from l.lo, to a group of up to readAhead
// chunks, each with a staging buffer, and builds the group's read
// requests. The first buffer may be waited for (when mayWait), the others
// are taken only if free now.
func (l *stagedLoad) prepare(g *readGroup, mayWait bool) {
	p := l.p
	g.chunks, g.bounds, g.reqs, g.err, g.panicked = g.chunks[:0], g.bounds[:0], g.reqs[:0], nil, nil
	for len(g.chunks) < p.readAhead() && l.lo < len(l.items) {
		var st *Staging
		if len(g.chunks) == 0 && mayWait {
			var err error
			if st, err = l.h.acquire(l.finish); err != nil {
				l.err = err
				break
			}
		} else if st = l.h.tryAcquire(l.finish); st == nil {
			break
		}
		lo, hi := l.lo, min(l.lo+l.per, len(l.items))
		if l.tiled {
			// Whole tiles up to per groups; their places in staging
			// (pos) follow from their heads.
			n := 0
			for hi = lo; hi < len(l.items) && n+l.items[hi].Groups() <= l.per; hi++ {
				n += l.items[hi].Groups()
			}
		}
		c := st.chunk(l.dev, hi-lo)
		g.bounds = append(g.bounds, len(g.reqs))
		g.reqs = l.fill(c, g.reqs, lo, hi)
		if rq := g.reqs[g.bounds[len(g.bounds)-1]:]; l.tiled {
			p.spanTiles(c, rq, st)
		} else {
			p.sortStaging(c, rq, st)
		}
		g.chunks = append(g.chunks, c)
		l.lo = hi
	}
	g.bounds = append(g.bounds, len(g.reqs))
	g.used = max(g.used, len(g.reqs))
}

// fill hands items [lo, hi) to chunk c and appends their read requests,
// into c's staging buffer, to reqs: a tile one request for its heads, a
// lone group one, an interleaved set one per member laid out as the set
// lies on the device. Every read is Unverified exactly when the device
// checks (check.go).
func (l *stagedLoad) fill(c *chunk, reqs []store.ReadReq, lo, hi int) []store.ReadReq {
	p, items, mem := l.p, l.items, c.st.Mem
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	unverified := p.checksOnDevice()
	if l.tiled {
		c.pos, c.tiled = c.posBuf[:0], true
	}
	at := 0 // in groups
	for i := lo; i < hi; {
		off := at * gb
		if l.tiled {
			c.pos = append(c.pos, int32(at)) // the item's (a set's) place
		}
		if it := &items[i]; it.Tile != nil {
			// A tile: one request for its heads, packed in staging,
			// their checksums straight into the tile.
			h := it.Tile.Heads
			reqs = append(reqs, store.ReadReq{Key: it.Key, Buf: mem[off : off+h*gb : len(mem)], Heads: h, HeadStride: gb, Unverified: unverified, CRCs: it.Tile.CRCs, Tag: it.tag()})
			c.items = append(c.items, it)
			c.set = append(c.set, 1)
			at += h
			i++
			continue
		}
		n := p.interleaved(items[i:hi])
		if n == 1 {
			// Capacity to the buffer's end: the store lands adjacent
			// groups of one slot with one read.
			reqs = append(reqs, store.ReadReq{Key: items[i].Key, Buf: mem[off : off+gb : len(mem)], Unverified: unverified, Tag: items[i].tag()})
			c.items = append(c.items, &items[i])
			c.set = append(c.set, 1)
			at++
			i++
			continue
		}
		// An interleaved set lands in staging as its tiles lie on the
		// device (row r of member j at r*n*RowBytes + j*RowBytes), so the
		// set moves with one copy instead of one 2D copy per group.
		sp := n * rb
		for j := range n {
			b := off + j*rb
			reqs = append(reqs, store.ReadReq{Key: items[i+j].Key, Buf: mem[b : b+(rows-1)*sp+rb], Pitch: sp, RowBytes: rb, Unverified: unverified, Tag: items[i+j].tag()})
			c.items = append(c.items, &items[i+j])
			c.set = append(c.set, int32(n*btoi(j == 0)))
			if l.tiled && j > 0 {
				c.pos = append(c.pos, int32(at)) // a member's place: its set's
			}
		}
		at += n
		i += n
	}
	if l.tiled {
		c.posBuf = c.pos // in item order: never sorted
	}
	return reqs
}

// queue takes a group whose read is over: on a failed read its items fail
// with the error; else each chunk's copies are queued and its event
// recorded. Either way its chunks join the batch's buffers.
func (l *stagedLoad) queue(g *readGroup) {
	p := l.p
	if g.err != nil {
		for _, c := range g.chunks {
			for _, it := range c.items {
				it.failAll(g.err)
			}
			l.h.chunks = append(l.h.chunks, c)
		}
		return
	}
	for k, c := range g.chunks {
		rq := g.reqs[g.bounds[k]:g.bounds[k+1]]
		if p.checksOnDevice() {
			for j := range rq {
				c.items[j].CRC = rq[j].CRC // a tile's are in its CRCs already
			}
		}
		p.bind(c.dev, func(q Device) { p.queueH2D(q, c, rq) })
		p.record(c)
		l.h.chunks = append(l.h.chunks, c)
	}
}

// finish takes a chunk whose buffer the load is done with: once its
// copies completed, its groups that landed are checked on the device
// (check.go); a copy that failed fails the chunk's copied items.
func (l *stagedLoad) finish(c *chunk) {
	p := l.p
	err := p.wait(c)
	if err == nil && c.failed != nil {
		err = c.failed
	}
	for i, it := range c.items {
		if !c.copied[i] {
			continue
		}
		if err != nil {
			it.failAll(copyErr(err))
		}
	}
	if err == nil && p.checksOnDevice() {
		ok := c.verified[:0] // the chunk's, reused: a load allocates nothing per chunk
		for i, it := range c.items {
			if c.copied[i] && !it.done() && !it.landed {
				ok = append(ok, it)
			}
		}
		p.check(ok, nil, nil)
		clear(ok) // no item stays reachable past its batch
		c.verified = ok[:0]
	}
}

// readGroup is a group of chunks read with one store call.
type readGroup struct {
	chunks   []*chunk
	bounds   []int // the chunks' requests: reqs[bounds[k]:bounds[k+1]]
	reqs     []store.ReadReq
	used     int   // the most requests one read of this load held
	err      error // the store call's
	panicked any   // a panic of the store call on its own goroutine
	done     chan struct{}
}

// start reads the group's requests from r: on a goroutine of its own when
// async (wait collects it), else now.
func (g *readGroup) start(r Reader, async bool) {
	if !async {
		g.done = nil
		g.err = r.Read(g.reqs)
		return
	}
	g.done = make(chan struct{})
	go func() {
		defer close(g.done)
		defer func() { g.panicked = recover() }()
		g.err = r.Read(g.reqs)
	}()
}

// wait waits for the group's read; a panic in it is raised here.
func (g *readGroup) wait() {
	if g.done != nil {
		<-g.done
		g.done = nil
	}
	if g.panicked != nil {
		panic(g.panicked)
	}
}

// queueH2D sets each item's outcome from its read and queues the copies of
// the groups that go to the device (good ones, and corrupt ones zeroed).
// Packed groups adjacent in staging and on the device become one run, and
// runs become copies (copyRuns); a pitched group is one 2D copy (or one
// copy per row without Copier2D).
func (p *Pipeline) queueH2D(q Device, c *chunk, reqs []store.ReadReq) {
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	c2 := copier2D(q)
	runs := c.runs[:0]
	fail := func(err error) {
		if c.failed == nil {
			c.failed = copyErr(err)
		}
	}
	// In staging order (j), so runs form as the tiles lie there.
	for j := 0; j < len(reqs); {
		i := j
		if c.order != nil {
			i = int(c.order[j])
		}
		if n := int(c.set[i]); n > 1 {
			runs = p.queueSet(q, c2, c, reqs, i, n, runs, fail)
			j += n
			continue
		}
		if c.items[i].Tile != nil {
			runs = p.queueTile(c, i, &reqs[i], runs)
			j++
			continue
		}
		it := c.items[i]
		rerr := reqs[i].Err
		src := c.at(i, gb)
		if !goesOn(rerr) {
			it.Err = rerr
			j++
			continue
		}
		if rerr != nil {
			// Corrupt: never leave a failed group in the destination as
			// if good (the store zeroed it too).
			clear(c.st.Mem[src : src+gb])
		}
		it.Err = rerr
		if c.failed != nil {
			it.Err = c.failed
			j++
			continue
		}
		c.copied[i] = true
		if !p.pitched(it) {
			runs = addRun(runs, run{src: src, dst: it.Dst, n: gb, m: it.Mapping})
			j++
			continue
		}
		var err error
		if c2 != nil {
			err = c2.CopyH2D2D(it.Dst, it.Pitch, c.st.Mem[src:src+gb], rb, rb, rows)
		} else {
			for r := 0; r < rows && err == nil; r++ {
				err = q.CopyH2D(it.Dst+uint64(r*it.Pitch), c.st.Mem[src+r*rb:src+(r+1)*rb])
			}
		}
		if err != nil {
			fail(err)
		}
		j++
	}
	if c.failed == nil {
		// A tiled chunk's runs are already whole tiles, in item order: a
		// block's (layer, kind) tiles one after another in staging, and
		// as far apart on the device as the target's tensors are, so in
		// that order they become one 2D copy per block (sorted by
		// destination, one per tensor and block). A chunk staged in spans
		// (spanTiles) is sorted: its heads' runs join across blocks.
		if err := p.copyRuns(q, c.st.Mem, &c.batch, runs, c2, c.tiled && !c.spanned); err != nil {
			fail(err)
		}
	}
	c.runs = runs[:0]
}

// queueTile sets the outcome of tile item i from its read, q, and adds the
// copies of the heads that landed to runs: the whole tile as one run when
// its heads lie next to each other on the device, else one run per head;
// a head that failed (missing, or its read failed) is not copied, so its
// destination is left as it was.
func (p *Pipeline) queueTile(c *chunk, i int, q *store.ReadReq, runs []run) []run {
	gb := p.Geo.GroupBytes
	it := c.items[i]
	t := it.Tile
	it.Err, t.Failed, t.Bad = q.Err, q.Failed, q.Bad
	if c.failed != nil {
		it.failAll(c.failed)
		return runs
	}
	if it.done() {
		return runs
	}
	c.copied[i] = true
	// Its heads lie q.HeadStride apart in staging: side by side, or a
	// span's width apart (spanTiles).
	src, shs := c.at(i, gb), q.HeadStride
	if t.Bad == 0 && t.HeadStride == gb && shs == gb {
		return addRun(runs, run{src: src, dst: it.Dst, n: t.Heads * gb, m: it.Mapping})
	}
	for h := range t.Heads {
		if t.Bad&(1<<h) == 0 {
			runs = addRun(runs, run{src: src + h*shs, dst: it.Dst + uint64(h*t.HeadStride), n: gb, m: it.Mapping})
		}
	}
	return runs
}

// spanTiles stages a chunk's tiles whose heads lie apart on the device (a
// Hugging Face cache, [heads, seq, head_dim] per (layer, kind): head j a
// whole sequence after head j-1) so that each head's consecutive cache
// blocks move with one copy. Tiles of one (layer, kind) of consecutive
// cache blocks, in destination order, form a span of m tiles whose head
// j's groups lie side by side on the device; the span is staged head by
// head, tile i's head j at (j*m + i) groups from the span's start, and the
// store lands each tile's heads m groups apart (ReadReq.HeadStride). Head
// j of a span is then one run of m groups, and a chunk's spans, one
// (layer, kind) after another, become one 2D copy where the target's
// tensors are evenly spaced (copyRuns, in destination order): one copy
// per chunk instead of one 2D copy of single groups per block. Chunks with
// no span of two tiles or more (head-major tiles, whose heads are side by
// side already; blocks scattered over the cache) and chunks with pitched
// tiles keep item order.
func (p *Pipeline) spanTiles(c *chunk, reqs []store.ReadReq, st *Staging) {
	n := len(c.items)
	if n < 2 || len(c.pos) != n {
		return
	}
	gb := p.Geo.GroupBytes
	strided := false
	for _, it := range c.items {
		if p.pitched(it) {
			return
		}
		strided = strided || it.Tile != nil && it.Tile.HeadStride > gb
	}
	if !strided {
		return
	}
	// (destination, item) pairs in destination order; addresses of
	// different mappings never coincide, and a span stays in one.
	ents := c.byDest(n)
	// span is the length of the span starting at ents[k].
	span := func(k int) int {
		it := c.items[ents[k].i]
		t := it.Tile
		if t == nil || t.HeadStride <= gb {
			return 1
		}
		m := 1
		for k+m < n && (m+1)*gb <= t.HeadStride {
			nx := c.items[ents[k+m].i]
			if nx.Tile == nil || nx.Tile.Heads != t.Heads || nx.Tile.HeadStride != t.HeadStride || nx.Mapping != it.Mapping || nx.Dst != it.Dst+uint64(m*gb) {
				break
			}
			m++
		}
		return m
	}
	spans := false
	for k := 0; k < n && !spans; k += span(k) {
		spans = span(k) > 1
	}
	if !spans {
		return
	}
	c.spanned = true
	at := 0 // in groups
	for k := 0; k < n; {
		m := span(k)
		for j := range m {
			i := ents[k+j].i
			it, q := c.items[i], &reqs[i]
			c.pos[i] = int32(at + j)
			o, h := (at+j)*gb, it.Groups()
			if it.Tile == nil {
				q.Buf = st.Mem[o : o+gb : len(st.Mem)]
				continue
			}
			q.HeadStride = m * gb
			q.Buf = st.Mem[o : o+(h-1)*m*gb+gb : len(st.Mem)]
		}
		at += m * c.items[ents[k].i].Groups()
		k += m
	}
}

// sortStaging places a chunk's packed tiles in its staging buffer in the
// order of their destinations when, in item order, they would move in
// short copies: the tiles of one (layer, kind, head) of consecutive cache
// blocks of a Hugging Face cache ([batch, kv_heads, seq, head_dim]) lie
// next to each other on the device but a whole block apart in item order
// (one 4 KiB copy per group); staged by destination they move with one
// copy. The store then lands a run of a slot's groups by vector read (its
// destinations lie apart in staging) instead of one contiguous read, so
// chunks whose tiles already form runs of minRun groups or more (a
// head-major cache's heads of one block), chunks with pitched tiles
// (interleaved sets) and chunks already in destination order keep item
// order.
func (p *Pipeline) sortStaging(c *chunk, reqs []store.ReadReq, st *Staging) {
	const minRun = 4
	n := len(c.items)
	if n < 2 {
		return
	}
	gb := p.Geo.GroupBytes
	sorted, runs := true, 1
	for i, it := range c.items {
		if p.pitched(it) {
			return
		}
		if i > 0 {
			prev := c.items[i-1]
			if it.Dst < prev.Dst {
				sorted = false
			}
			if it.Dst != prev.Dst+uint64(gb) || it.Mapping != prev.Mapping {
				runs++
			}
		}
	}
	if sorted || n >= minRun*runs {
		return
	}
	ents := c.byDest(n)
	c.posBuf, c.orderBuf = grow(c.posBuf, n), grow(c.orderBuf, n)
	c.pos, c.order = c.posBuf, c.orderBuf
	for k, e := range ents {
		c.pos[e.i], c.order[k] = int32(k), e.i
	}
	for i := range reqs {
		o := int(c.pos[i]) * gb
		reqs[i].Buf = st.Mem[o : o+gb : len(st.Mem)]
	}
}

// stagedAt is an item of a chunk (i) and its destination, for sortStaging.
// byDest returns the chunk's n items as (destination, item) pairs in
// destination order, in the chunk's sort buffer: pairs, not item indexes
// sorted through pointers.
func (c *chunk) byDest(n int) []stagedAt {
	ents := grow(c.sortBuf, n)
	c.sortBuf = ents
	for i, it := range c.items {
		ents[i] = stagedAt{it.Dst, int32(i)}
	}
	slices.SortFunc(ents, func(a, b stagedAt) int { return cmp.Compare(a.dst, b.dst) })
	return ents
}

type stagedAt struct {
	dst uint64
	i   int32
}

// interleaved is how many of its, from the first, form an interleaved set:
// pitched tiles (the heads of one (layer, kind) of an NHD cache block)
// whose rows sit side by side on the device, each RowBytes after the
// previous, with the same pitch: row r of the set is one span of
// n*RowBytes bytes. 1 when the first tile starts no such set.
func (p *Pipeline) interleaved(its []Item) int {
	rb, pitch := p.Geo.RowBytes, its[0].Pitch
	if pitch == 0 || pitch == rb || p.Geo.Rows < 2 {
		return 1
	}
	n := 1
	for n < len(its) && its[n].Pitch == pitch && its[n].Mapping == its[0].Mapping && its[n].Dst == its[0].Dst+uint64(n*rb) && (n+1)*rb <= pitch {
		n++
	}
	return n
}

// queueSet sets the outcomes of the interleaved set reqs[i:i+n] and queues
// its copies: the whole set as one run (its rows fill the pitch: merged
// with adjacent runs) or one 2D copy when every member goes to the device
// (good, or corrupt and zeroed by the store in staging); else one 2D copy
// per member that does, so a missing group's tile is left as it was.
func (p *Pipeline) queueSet(q Device, c2 Copier2D, c *chunk, reqs []store.ReadReq, i, n int, runs []run, fail func(error)) []run {
	gb, rows, rb := p.Geo.GroupBytes, p.Geo.Rows, p.Geo.RowBytes
	all := true
	for j := i; j < i+n; j++ {
		it, rerr := c.items[j], reqs[j].Err
		if !goesOn(rerr) {
			it.Err, all = rerr, false
			continue
		}
		it.Err = rerr
		if c.failed != nil {
			it.Err = c.failed
			continue
		}
		c.copied[j] = true
	}
	if c.failed != nil {
		return runs
	}
	sp := n * rb
	at := c.at(i, gb)
	img := c.st.Mem[at : at+n*gb]
	dst, pitch := c.items[i].Dst, c.items[i].Pitch
	var err error
	switch {
	case all && pitch == sp:
		runs = addRun(runs, run{src: at, dst: dst, n: n * gb, m: c.items[i].Mapping})
	case all && c2 != nil:
		err = c2.CopyH2D2D(dst, pitch, img, sp, sp, rows)
	case all:
		for r := 0; r < rows && err == nil; r++ {
			err = q.CopyH2D(dst+uint64(r*pitch), img[r*sp:r*sp+sp])
		}
	default:
		for j := i; j < i+n && err == nil; j++ {
			if !c.copied[j] {
				continue
			}
			o := (j - i) * rb
			if c2 != nil {
				err = c2.CopyH2D2D(c.items[j].Dst, pitch, img[o:o+(rows-1)*sp+rb], sp, rb, rows)
				continue
			}
			for r := 0; r < rows && err == nil; r++ {
				err = q.CopyH2D(c.items[j].Dst+uint64(r*pitch), img[o+r*sp:o+r*sp+rb])
			}
		}
	}
	if err != nil {
		fail(err)
	}
	return runs
}
