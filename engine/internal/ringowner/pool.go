package ringowner

import (
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// pool carves aligned chunks out of mmap'd segments (the registered buffer
// pool). First fit over each segment's sorted, coalesced free list; the
// chunk size is kept in the returned slice's capacity. It is the only
// buffer pool of the ring-backed engines; the rings of one engine share
// it.
//
// Growth: when no segment has room and the pool is below maxBytes, alloc
// maps one more segment (segBytes, or the request rounded up to 2 MiB when
// larger, at most 1 GiB: one fixed buffer) and hands it to onGrow, which
// registers it with every ring as a fixed buffer. One caller maps at a
// time; the others wait for it rather than map too. Segments are never
// unmapped before the pool is retired. At the cap alloc reports no room
// and the engine falls back to plain memory (slower I/O: no fixed buffer).
//
// Lifetime: retire (at Close) stops handing out memory and unmaps every
// segment when the last chunk comes back. leak (after a ring failure that
// left requests that cannot be reaped) stops handing out memory and never
// unmaps: the kernel may still write into it.
type pool struct {
	mu       sync.Mutex
	grown    sync.Cond // signalled when a growth ends
	segs     []*segment
	grain    int
	segBytes int // size of a grown segment
	maxBytes int // cap on the bytes of all segments
	total    int // bytes of all segments
	used     int // bytes handed out
	growing  bool
	// onGrow, when set, runs (outside mu) after a new segment is mapped and
	// before the chunk that caused the growth is handed out.
	onGrow func(mem []byte)
	// retired: the engine is closed; nothing more is handed out, and the
	// memory is unmapped when the last chunk comes back.
	retired bool
	// leaked: requests that may name the pool were never reaped; the
	// memory stays mapped for the life of the process.
	leaked bool
	// mapFn maps a segment (mapPool; tests may replace it).
	mapFn func(n int) ([]byte, error)
}

// segment is one mapped region of the pool.
type segment struct {
	mem  []byte
	free []extent // sorted by off, no two adjacent
	used int
}

type extent struct{ off, n int }

// maxSegment is the largest segment: one fixed buffer.
const maxSegment = 1 << 30

// newPool makes a pool of the segment mem (none when empty) that does not
// grow.
func newPool(mem []byte, grain int) *pool {
	p := &pool{grain: grain, mapFn: mapPool}
	p.grown.L = &p.mu
	if len(mem) > 0 {
		p.addLocked(mem)
	}
	p.maxBytes = p.total
	return p
}

// setGrowth lets the pool grow by segments of segBytes up to maxBytes in
// all.
func (p *pool) setGrowth(segBytes, maxBytes int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.segBytes = roundHuge(min(max(segBytes, hugePage), maxSegment))
	p.maxBytes = max(maxBytes, p.total)
}

func roundHuge(n int) int { return (n + hugePage - 1) &^ (hugePage - 1) }

func (p *pool) addLocked(mem []byte) {
	p.segs = append(p.segs, &segment{mem: mem, free: []extent{{0, len(mem)}}})
	p.total += len(mem)
}

// segments returns the mapped segments.
func (p *pool) segments() [][]byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([][]byte, len(p.segs))
	for i, s := range p.segs {
		out[i] = s.mem
	}
	return out
}

// alloc returns n bytes (capacity rounded up to the grain), growing the
// pool when it may; false when there is no room.
func (p *pool) alloc(n int) ([]byte, bool) {
	if n <= 0 {
		return nil, false
	}
	size := (n + p.grain - 1) / p.grain * p.grain
	p.mu.Lock()
	for {
		if p.retired {
			p.mu.Unlock()
			return nil, false
		}
		if b, ok := p.carveLocked(n, size); ok {
			p.mu.Unlock()
			return b, true
		}
		if p.growing {
			p.grown.Wait() // another caller maps a segment: use it
			continue
		}
		seg := max(p.segBytes, roundHuge(size))
		if p.segBytes == 0 || seg > maxSegment || p.total+seg > p.maxBytes {
			p.mu.Unlock()
			return nil, false
		}
		p.growing = true
		p.mu.Unlock()
		mem, err := p.mapFn(seg)
		if err == nil && p.onGrow != nil {
			p.onGrow(mem)
		}
		p.mu.Lock()
		p.growing = false
		p.grown.Broadcast()
		if err != nil {
			p.segBytes = 0 // mapping fails: stop growing
			p.mu.Unlock()
			return nil, false
		}
		if p.retired && !p.leaked {
			unmapPool(mem) // closed meanwhile: its rings dropped the registration
			p.mu.Unlock()
			return nil, false
		}
		p.addLocked(mem)
	}
}

func (p *pool) carveLocked(n, size int) ([]byte, bool) {
	for _, s := range p.segs {
		for i, e := range s.free {
			if e.n < size {
				continue
			}
			if e.n == size {
				s.free = append(s.free[:i], s.free[i+1:]...)
			} else {
				s.free[i] = extent{e.off + size, e.n - size}
			}
			s.used += size
			p.used += size
			return s.mem[e.off : e.off+n : e.off+size], true
		}
	}
	return nil, false
}

// owns reports whether b was carved out of the pool.
func (p *pool) owns(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.segLocked(b) != nil
}

func (p *pool) segLocked(b []byte) *segment {
	if cap(b) == 0 {
		return nil
	}
	a := addrOf(b)
	for _, s := range p.segs {
		base := addrOf(s.mem)
		if a >= base && a < base+uintptr(len(s.mem)) {
			return s
		}
	}
	return nil
}

// release returns a chunk from alloc; it reports false when b is not the
// pool's.
func (p *pool) release(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.segLocked(b)
	if s == nil {
		return false
	}
	off := int(addrOf(b) - addrOf(s.mem))
	size := cap(b)
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].off > off })
	// Merge with the previous and next free extents when adjacent.
	prev := i > 0 && s.free[i-1].off+s.free[i-1].n == off
	next := i < len(s.free) && off+size == s.free[i].off
	switch {
	case prev && next:
		s.free[i-1].n += size + s.free[i].n
		s.free = append(s.free[:i], s.free[i+1:]...)
	case prev:
		s.free[i-1].n += size
	case next:
		s.free[i] = extent{off, size + s.free[i].n}
	default:
		s.free = append(s.free, extent{})
		copy(s.free[i+1:], s.free[i:])
		s.free[i] = extent{off, size}
	}
	s.used -= size
	p.used -= size
	if p.retired && !p.leaked && p.used == 0 {
		p.unmapLocked()
	}
	return true
}

func (p *pool) unmapLocked() {
	for _, s := range p.segs {
		unmapPool(s.mem)
	}
	p.segs, p.total = nil, 0
}

// retire stops handing out memory and unmaps it, now if no chunk is out,
// else when the last one comes back (release); it returns the bytes out.
func (p *pool) retire() (inUse int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retired = true
	p.grown.Broadcast()
	if p.used == 0 && !p.leaked {
		p.unmapLocked()
	}
	return p.used
}

// leak marks the pool as possibly still targeted by the kernel: it stops
// handing out memory and is never unmapped. It returns the pool's size.
func (p *pool) leak() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.leaked, p.retired = true, true
	return p.total
}

func (p *pool) inUse() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

func (p *pool) size() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.total
}

// capBytes is the most the pool grows to.
func (p *pool) capBytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.segBytes == 0 {
		return p.total
	}
	return p.maxBytes
}

func (p *pool) freeExtents() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, s := range p.segs {
		n += len(s.free)
	}
	return n
}

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (4 KiB base pages).
const hugePage = 2 << 20

// mapPool maps n bytes (rounded up to 2 MiB) of anonymous memory, aligned
// to 2 MiB, asks for transparent huge pages and faults it in. Buffers
// carved from it are then physically contiguous within each 2 MiB, so a
// 1 MiB request is one DMA segment (and one registered-buffer bvec)
// instead of 256 scattered pages. On a virtio disk that more than doubles
// the rate of 1 MiB random reads (see docs/performance.md, 'Engine against
// fio'). Where THP is off, the memory is ordinary pages and everything
// still works.
func mapPool(n int) ([]byte, error) {
	size := roundHuge(n)
	p, err := unix.MmapPtr(-1, 0, nil, uintptr(size+hugePage), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	base := uintptr(p)
	head := (hugePage - base%hugePage) % hugePage
	if head > 0 {
		_ = unix.MunmapPtr(p, head)
	}
	start := unsafe.Add(p, head)
	if tail := uintptr(hugePage) - head; tail > 0 {
		_ = unix.MunmapPtr(unsafe.Add(start, size), tail)
	}
	mem := unsafe.Slice((*byte)(start), size)
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	for i := 0; i < len(mem); i += unix.Getpagesize() {
		mem[i] = 0 // fault in, in order (a huge page per 2 MiB when THP allows)
	}
	return mem, nil
}

func unmapPool(mem []byte) {
	if len(mem) > 0 {
		_ = unix.MunmapPtr(unsafe.Pointer(unsafe.SliceData(mem)), uintptr(len(mem)))
	}
}
