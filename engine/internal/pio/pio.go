// Package pio performs one store.IO with plain system calls on the calling
// goroutine: the posix engine's requests, and the ring engines' inline
// reads of page-cache files (store.InlineReader).
package pio

import (
	"fmt"
	"io"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/store"
)

// iovMax is the most segments one preadv takes (IOV_MAX).
const iovMax = 1024

// readv serves a vector read: preadv in pieces of at most iovMax segments,
// resuming after short transfers.
func readv(fd int, r *store.IO, align int, name string) error {
	if r.Op != store.OpRead || r.Buf != nil {
		return fmt.Errorf("%s: vector %s: %w", name, r.Op, unix.EINVAL)
	}
	if r.Off%int64(align) != 0 {
		return fmt.Errorf("%s: vector read at %d: %w (alignment %d)", name, r.Off, unix.EINVAL, align)
	}
	for _, v := range r.Vec {
		if !store.Aligned(v, align) {
			return fmt.Errorf("%s: vector read segment of %d bytes: %w (alignment %d)", name, len(v), unix.EINVAL, align)
		}
	}
	vec, off := r.Vec, r.Off
	var head []byte // the rest of a segment a short read ended in
	bp := iovPool.Get().(*[]unix.Iovec)
	defer func() {
		clear(*bp) // no pointers into callers' memory stay pooled
		iovPool.Put(bp)
	}()
	for len(vec) > 0 || len(head) > 0 {
		iov := (*bp)[:0]
		if len(head) > 0 {
			iov = appendIov(iov, head)
		}
		taken := 0
		for _, v := range vec {
			if len(iov) == iovMax {
				break
			}
			iov = appendIov(iov, v)
			taken++
		}
		*bp = iov
		n, err := preadv(fd, iov, off)
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: read at %d: %w", name, off, err)
		}
		if n == 0 {
			return fmt.Errorf("%s: read at %d: %w", name, off, io.ErrUnexpectedEOF)
		}
		off += int64(n)
		// Skip what was filled.
		if len(head) > 0 {
			k := min(n, len(head))
			head, n = head[k:], n-k
		}
		used := 0
		for used < taken && n >= len(vec[used]) {
			n -= len(vec[used])
			used++
		}
		vec = vec[used:]
		if n > 0 {
			head, vec = vec[0][n:], vec[1:]
		}
	}
	return nil
}

// iovPool holds iovec arrays of iovMax entries, so that a vector read
// allocates nothing (unix.Preadv allocates one per call).
var iovPool = sync.Pool{New: func() any {
	b := make([]unix.Iovec, 0, iovMax)
	return &b
}}

func appendIov(iov []unix.Iovec, b []byte) []unix.Iovec {
	var v unix.Iovec
	v.Base = unsafe.SliceData(b)
	v.SetLen(len(b))
	return append(iov, v)
}

// preadv is preadv(2) on iov, which must be nonempty.
func preadv(fd int, iov []unix.Iovec, off int64) (int, error) {
	const longBits = unsafe.Sizeof(uintptr(0)) * 8
	lo, hi := uintptr(off), uintptr(uint64(off)>>(longBits-1)>>1) // as x/sys/unix: hi is 0 on 64-bit
	n, _, errno := unix.Syscall6(unix.SYS_PREADV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)), lo, hi, 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

// Do performs r on fd with pread, pwrite or (for a vector read) preadv,
// continuing short transfers and retrying EINTR/EAGAIN, on the calling
// goroutine. Offsets, lengths and addresses must be multiples of align;
// name prefixes errors. Reading past the end is io.ErrUnexpectedEOF.
func Do(fd int, r *store.IO, align int, name string) error {
	if r.Vec != nil {
		return readv(fd, r, align, name)
	}
	if !store.Aligned(r.Buf, align) || r.Off%int64(align) != 0 {
		return fmt.Errorf("%s: %s of %d bytes at %d: %w (alignment %d)", name, r.Op, len(r.Buf), r.Off, unix.EINVAL, align)
	}
	done := 0
	for done < len(r.Buf) {
		var n int
		var err error
		if r.Op == store.OpWrite {
			n, err = unix.Pwrite(fd, r.Buf[done:], r.Off+int64(done))
		} else {
			n, err = unix.Pread(fd, r.Buf[done:], r.Off+int64(done))
		}
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: %s at %d: %w", name, r.Op, r.Off+int64(done), err)
		}
		if n == 0 {
			return fmt.Errorf("%s: %s at %d: %w", name, r.Op, r.Off+int64(done), io.ErrUnexpectedEOF)
		}
		done += n
	}
	return nil
}
