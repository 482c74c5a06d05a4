package tier

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/internal/bytesize"
	"github.com/kvfs/kvfs/internal/par"
)

// ErrTooLarge is New's refusal of a tier larger than the machine can give:
// more than its available memory, or memory the kernel would not map or
// fault in.
var ErrTooLarge = errors.New("tier: not enough memory for the DRAM tier")

// hugePage is the size of the huge pages the arena asks for with
// MAP_HUGETLB (the kernel's default size on x86-64 and arm64 with 4K base
// pages).
const hugePage = 2 << 20

// arena is the tier's memory: one anonymous mapping, faulted in whole at
// New so that the memory is the tier's from the start (a shortage fails
// the mount, not a load hours later) and the daemon's resident size is the
// arena plus the small per-slot bookkeeping.
type arena struct {
	b    []byte
	huge bool // backed by reserved huge pages (MAP_HUGETLB)
	// m is the whole mapping: b, rounded up to whole huge pages when huge.
	m []byte
	// thpWhy, when not empty, says why the system's reserved huge pages
	// were not used (New logs it).
	thpWhy string
	// located counts the slots Locate pinned for GPU copies and Unpin has
	// not released: the device may still be reading them, so free waits
	// for them before unmapping (see Tier.Locate).
	located sync.WaitGroup
}

// meminfo reads one "Key: N kB" field of /proc/meminfo, in bytes (pages
// for the HugePages_ counts, which have no unit).
func meminfo(key string) (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || name != key {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return 0, false
		}
		v, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return 0, false
		}
		if len(fields) > 1 && fields[1] == "kB" {
			v <<= 10
		}
		return v, true
	}
	return 0, false
}

// mapArena maps n bytes for the tier. It uses reserved huge pages when the
// system has enough of them free (HugePages_Free; the mapping rounded up
// to whole huge pages), else ordinary pages with transparent huge pages
// asked for (MADV_HUGEPAGE), saying why in thpWhy when huge pages are
// reserved; either way every page is faulted in before it returns. More
// than MemAvailable (for ordinary pages), or a mapping or fault-in the
// kernel refuses, is ErrTooLarge.
func mapArena(n int64) (*arena, error) {
	if n <= 0 || int64(int(n)) != n {
		return nil, fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	var why string
	if total, ok := meminfo("HugePages_Total"); ok && total > 0 {
		free, _ := meminfo("HugePages_Free")
		size, _ := meminfo("Hugepagesize")
		hn := (n + hugePage - 1) / hugePage * hugePage
		switch {
		case size != hugePage:
			why = fmt.Sprintf("the reserved huge pages are of %s, not %s", bytesize.Format(size), bytesize.Format(hugePage))
		case free*size < hn:
			why = fmt.Sprintf("%d huge pages of %s are free, the tier needs %d", free, bytesize.Format(size), hn/hugePage)
		default:
			m, err := unix.Mmap(-1, 0, int(hn), unix.PROT_READ|unix.PROT_WRITE,
				unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_HUGETLB|unix.MAP_POPULATE)
			if err == nil {
				return &arena{b: m[:n], m: m, huge: true}, nil
			}
			why = fmt.Sprintf("mapping %d huge pages: %v", hn/hugePage, err)
		}
	}
	if avail, ok := meminfo("MemAvailable"); ok && n > avail {
		return nil, fmt.Errorf("%w: %s asked, %s available (MemAvailable in /proc/meminfo)", ErrTooLarge, bytesize.Format(n), bytesize.Format(avail))
	}
	b, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("%w: mapping %s: %v", ErrTooLarge, bytesize.Format(n), err)
	}
	// Transparent huge pages cut the TLB misses of copies that sweep
	// whole blocks; a kernel without them keeps base pages.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	if err := populate(b); err != nil {
		_ = unix.Munmap(b)
		return nil, fmt.Errorf("%w: faulting in %s: %v", ErrTooLarge, bytesize.Format(n), err)
	}
	return &arena{b: b, m: b, thpWhy: why}, nil
}

// populateChunk is the piece of the arena one goroutine faults in at a
// time: the kernel zeroes every page it gives, at a few GB/s per core, so a
// tier of hundreds of GiB is faulted in by every core at once.
const populateChunk = 256 << 20

// populate faults every page of b in. MADV_POPULATE_WRITE says when the
// kernel cannot (ENOMEM), where touching the pages would get the daemon
// killed instead. Kernels before 5.14 answer EINVAL: the pages are then
// touched one by one, which cannot report a shortage but still commits
// them.
func populate(b []byte) error {
	var mu sync.Mutex
	var first error
	par.Pieces(len(b), populateChunk, runtime.GOMAXPROCS(0), func(lo, hi int) {
		switch err := unix.Madvise(b[lo:hi], unix.MADV_POPULATE_WRITE); {
		case err == nil:
		case errors.Is(err, unix.EINVAL):
			for i := lo; i < hi; i += os.Getpagesize() {
				b[i] = 0
			}
		default:
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
	})
	return first
}

// free unmaps the arena once no GPU copy may still read it (the slots
// Locate pinned were all unpinned). The tier is closed by then, so no new
// pin is taken.
func (a *arena) free() error {
	if a == nil || a.b == nil {
		return nil
	}
	a.located.Wait()
	err := unix.Munmap(a.m)
	a.b, a.m = nil, nil
	return err
}
