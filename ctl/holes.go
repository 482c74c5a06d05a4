package ctl

import (
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A resident registration (every page of its range allocated when it was
// registered) must never be allocated into by the daemon, even after the
// caller punched holes in it (fallocate PUNCH_HOLE): the daemon's mapping
// is registered with a userfaultfd in missing mode with the SIGBUS
// feature, so that an access through it to a page the file no longer has
// faults (SIGBUS for the daemon's own copies, caught as ErrFault; EFAULT
// for the kernel's, a read(2) into it) instead of allocating a page. The
// userfaultfd delivers no events, so one serves every registration; its
// ranges go with their mappings at munmap.

// userfaultfd(2) ABI (linux/userfaultfd.h).
const (
	uffdAPI               = 0xAA
	uffdioAPI             = 0xc018aa3f // _IOWR(0xAA, 0x3F, struct uffdio_api)
	uffdioRegister        = 0xc020aa00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	uffdioUnregister      = 0x8010aa01 // _IOR(0xAA, 0x01, struct uffdio_range)
	uffdRegisterMissing   = 1          // UFFDIO_REGISTER_MODE_MISSING
	uffdFeatureMissingHug = 1 << 4     // UFFD_FEATURE_MISSING_HUGETLBFS
	uffdFeatureMissingShm = 1 << 5     // UFFD_FEATURE_MISSING_SHMEM
	uffdFeatureSigbus     = 1 << 7     // UFFD_FEATURE_SIGBUS
)

type uffdioAPIArg struct{ api, features, ioctls uint64 }

type uffdioRegisterArg struct{ start, len, mode, ioctls uint64 }

// holeGuard is the daemon's userfaultfd, opened on first use.
type holeGuard struct {
	once sync.Once
	fd   int
	err  error
}

func (g *holeGuard) open() {
	// Not UFFD_USER_MODE_ONLY: the kernel's own accesses (read(2) into the
	// mapping) must fault too. That needs CAP_SYS_PTRACE or
	// vm.unprivileged_userfaultfd = 1.
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC|unix.O_NONBLOCK, 0, 0)
	if e != 0 {
		g.fd, g.err = -1, fmt.Errorf("userfaultfd: %w", e)
		return
	}
	a := uffdioAPIArg{api: uffdAPI, features: uffdFeatureSigbus | uffdFeatureMissingShm | uffdFeatureMissingHug}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, uffdioAPI, uintptr(unsafe.Pointer(&a))); e != 0 {
		unix.Close(int(fd))
		g.fd, g.err = -1, fmt.Errorf("userfaultfd: UFFDIO_API: %w", e)
		return
	}
	g.fd = int(fd)
}

// guard registers mem, a shared mapping of a tmpfs or hugetlbfs file,
// so that touching a page the file lacks faults instead of allocating it.
func (g *holeGuard) guard(mem []byte) error {
	g.once.Do(g.open)
	if g.err != nil {
		return g.err
	}
	r := uffdioRegisterArg{start: uint64(uintptrOf(mem)), len: uint64(len(mem)), mode: uffdRegisterMissing}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(g.fd), uffdioRegister, uintptr(unsafe.Pointer(&r))); e != 0 {
		return fmt.Errorf("userfaultfd: UFFDIO_REGISTER %d bytes: %w", len(mem), e)
	}
	return nil
}

// unguard undoes guard.
func (g *holeGuard) unguard(mem []byte) {
	r := [2]uint64{uint64(uintptrOf(mem)), uint64(len(mem))}
	unix.Syscall(unix.SYS_IOCTL, uintptr(g.fd), uffdioUnregister, uintptr(unsafe.Pointer(&r)))
}

// close closes the userfaultfd; call it after every guarded mapping is
// unmapped (closing it drops the guard of those left).
func (g *holeGuard) close() {
	g.once.Do(func() { g.fd, g.err = -1, fmt.Errorf("userfaultfd: closed") })
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd, g.err = -1, fmt.Errorf("userfaultfd: closed")
	}
}

// residentPages reports whether every page of mem, a shared mapping of a
// tmpfs file, is in the file (mincore asks the page cache for pages the
// mapping has not touched), so that pinning them allocates nothing. It
// stops at the first page that is not. On hugetlbfs mincore reports only
// pages mapped here, so a fresh mapping reads as not resident: the careful
// answer where the kernel gives no exact one.
func residentPages(mem []byte) bool {
	page := unix.Getpagesize()
	const chunk = 1 << 16 // pages per mincore call
	vec := make([]byte, chunk)
	for off := 0; off < len(mem); off += chunk * page {
		end := min(len(mem), off+chunk*page)
		v := vec[:(end-off+page-1)/page]
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptrOf(mem[off:]), uintptr(end-off), uintptrOf(v)); e != 0 {
			return false
		}
		for _, b := range v {
			if b&1 == 0 {
				return false
			}
		}
	}
	return true
}
