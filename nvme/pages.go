package nvme

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// allocPages returns n bytes (rounded up to the page size) of anonymous,
// page-aligned memory outside the Go heap for the admin and management
// commands' data buffers: the controller DMAs into them, and a page-aligned
// buffer needs no bounce in the kernel. Free it with freePages.
func allocPages(n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("nvme: buffer of %d bytes", n)
	}
	page := unix.Getpagesize()
	size := (n + page - 1) &^ (page - 1)
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("nvme: mmap %d bytes: %w", size, err)
	}
	return b[:n], nil
}

// freePages releases memory from allocPages.
func freePages(b []byte) {
	if cap(b) > 0 {
		_ = unix.Munmap(b[:cap(b)])
	}
}
