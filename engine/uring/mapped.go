package uring

import (
	"fmt"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/internal/fault"
	"github.com/kvfs/kvfs/store"
)

// Writes to a store file in memory (tmpfs, ramfs) are copies into a shared
// mapping of the file, made by the goroutine that calls Do, instead of
// ring writes. A write to a tmpfs file holds the inode's lock for its copy,
// so ring writes (done by the kernel's io-wq workers, which spin on that
// lock) are one copy at a time whatever the callers, and STORE_BLOCKS
// barely scales with them (docs/performance.md, "CPU per GB"). Copies
// into the mapping take no lock, so the store's
// write phases, split over the cores, run on all of them. Page cache and
// mapping are the same memory: reads (inline or through a ring) see the
// writes, and Sync orders them as it does ring writes (a no-op on tmpfs). What the
// mapping costs: page tables for the part written through it (2 MiB per
// GiB), and the daemon's RSS counts those pages (as RssShmem; the memory
// is the file's, charged once).

// mapForWrites maps the file for writes when it is in memory and writable;
// on failure the engine writes through its rings (logged).
func (e *Engine) mapForWrites(fd int, size int64, log *zap.Logger) {
	if size <= 0 || int64(int(size)) != size {
		return
	}
	m, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		log.Warn("uring: cannot map the store file in memory; writes go through the rings", zap.Error(err))
		return
	}
	e.mapped = m
}

// unmap releases the mapping; Close calls it with inl held for writing,
// so no copy is in progress, and after inl.closed is set, so none starts.
// e.mapped itself stays as it was (Do reads it without the lock): after
// Close, writeMapped answers ErrEngineClosed before touching it.
func (e *Engine) unmap() {
	if e.mapped != nil {
		_ = unix.Munmap(e.mapped)
	}
	if e.view != nil {
		_ = unix.Munmap(e.view)
	}
}

// HostView implements store.HostViewer: a file in memory (tmpfs, ramfs)
// mapped shared and read-only, made on the first call and unmapped by
// Close; nil for any other file, after Close, or when the mapping fails
// (logged). A GPU load copies groups from it by DMA (the mapping
// registered with CUDA), with no read into staging first. The mapping is
// a second one, apart from the writable one of mapped writes, so that
// what reads through the view can never write the file.
func (e *Engine) HostView() []byte {
	if !e.inMemory || e.size <= 0 || int64(int(e.size)) != e.size {
		return nil
	}
	e.inl.Lock()
	defer e.inl.Unlock()
	if e.inl.closed {
		return nil
	}
	if e.view != nil {
		return e.view
	}
	m, err := unix.Mmap(e.fd, 0, int(e.size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		e.log.Warn("uring: cannot map the store file read-only for a host view", zap.Error(err))
		return nil
	}
	e.view = m
	e.bg.Add(1)
	go e.populateView()
	return m
}

// populateChunk is how much of the view populateView maps per madvise,
// with the engine's lock held for reading: Close waits for one at most.
const populateChunk = 64 << 20

// populateView maps the view's pages that hold data (SEEK_DATA to
// SEEK_HOLE: never-written space stays unallocated), in the background,
// so that loads find them mapped instead of taking a page fault per 64
// KiB on their first pass after a mount, which several callers loading
// right after a mount pay in the daemon's system time. Loads racing it map
// the same pages; either way each is mapped once. It stops at Close, on a
// kernel without MADV_POPULATE_READ (5.14), or at the first error, leaving
// the rest to the faults. What it costs: the view's page tables for all of
// the file's data (2 MiB per GiB) from the mount on, instead of growing as
// loads touch the pages.
func (e *Engine) populateView() {
	defer e.bg.Done()
	for off := int64(0); off < e.size; {
		start, end, ok := e.dataExtent(off)
		if !ok {
			return
		}
		start &^= int64(unix.Getpagesize() - 1)
		for c := start; c < end; c += populateChunk {
			if !e.populate(c, min(c+populateChunk, end)) {
				return
			}
		}
		off = end
	}
}

// dataExtent is the first range of the file holding data at or after off
// (to its end when the file system does not tell holes apart).
func (e *Engine) dataExtent(off int64) (start, end int64, ok bool) {
	e.inl.RLock()
	defer e.inl.RUnlock()
	if e.inl.closed {
		return 0, 0, false
	}
	start, err := unix.Seek(e.fd, off, unix.SEEK_DATA)
	if err != nil { // ENXIO: no data past off
		return 0, 0, false
	}
	end, err = unix.Seek(e.fd, start, unix.SEEK_HOLE)
	if err != nil {
		end = e.size
	}
	return start, min(end, e.size), start < e.size
}

// populate maps the view's pages of [lo, hi), unless the engine closed.
func (e *Engine) populate(lo, hi int64) bool {
	e.inl.RLock()
	defer e.inl.RUnlock()
	if e.inl.closed {
		return false
	}
	if err := unix.Madvise(e.view[lo:hi], unix.MADV_POPULATE_READ); err != nil {
		e.log.Debug("uring: the host view stays mapped on demand", zap.Error(err))
		return false
	}
	return true
}

// MappedWrites reports whether writes are copies into a mapping of the
// file (a file in memory, unless InlineReads is off or the engine is
// read-only).
func (e *Engine) MappedWrites() bool { return e.mapped != nil }

// mappable reports whether Do serves ios with copies into the mapping:
// writes only (anything else goes to the rings as a whole).
func (e *Engine) mappable(ios []store.IO) bool {
	if e.mapped == nil || len(ios) == 0 {
		return false
	}
	for i := range ios {
		if ios[i].Op != store.OpWrite {
			return false
		}
	}
	return true
}

// writeMapped serves a batch of writes with copies into the mapping, each
// outcome in its Err, as the rings would.
func (e *Engine) writeMapped(ios []store.IO) error {
	e.inl.RLock()
	defer e.inl.RUnlock()
	if e.inl.closed {
		return fmt.Errorf("uring: %w", store.ErrEngineClosed)
	}
	for i := range ios {
		rq := &ios[i]
		rq.Err = e.copyIn(rq)
		if rq.Err == nil {
			e.mappedIOs.Add(1)
			e.mappedBytes.Add(uint64(rq.VecLen()))
		}
	}
	return nil
}

// copyIn copies one write into the mapping. A fault on the mapping (the
// file was truncated under the store, or its file system cannot back a
// page) is the write's error, EIO; a fault on the source is the caller's
// and panics on, as a ring write's would have failed for it.
func (e *Engine) copyIn(rq *store.IO) error {
	n := int64(rq.VecLen())
	if rq.Off < 0 || rq.Off > int64(len(e.mapped)) || n > int64(len(e.mapped))-rq.Off {
		return fmt.Errorf("uring: write of %d bytes at %d: past the end of the %d-byte file: %w", n, rq.Off, len(e.mapped), unix.EINVAL)
	}
	dst := e.mapped[rq.Off : rq.Off+n]
	if _, faulted, _ := fault.Guard(e.inMapping, func() error {
		if rq.Vec == nil {
			copy(dst, rq.Buf)
			return nil
		}
		for _, v := range rq.Vec {
			dst = dst[copy(dst, v):]
		}
		return nil
	}); faulted {
		return fmt.Errorf("uring: write at %d: the store file's memory faulted (truncated?): %w", rq.Off, unix.EIO)
	}
	return nil
}

// inMapping reports whether address a lies in the mapping.
func (e *Engine) inMapping(a uintptr) bool { return fault.In(e.mapped, a) }
