package uring

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	iouring "github.com/kvfs/kvfs/uring"
)

func needURing(tb testing.TB) {
	tb.Helper()
	if err := iouring.Available(); err != nil {
		tb.Skipf("skipping: io_uring is not usable here: %v", err)
	}
}

// diskDir is a temporary directory on a filesystem that does real O_DIRECT
// (not tmpfs, whose O_DIRECT is page-cache I/O). /tmp may be tmpfs, so
// /var/tmp is tried first; KVFS_TEST_DISK_DIR overrides.
func diskDir(tb testing.TB) string {
	tb.Helper()
	for _, base := range []string{os.Getenv("KVFS_TEST_DISK_DIR"), "/var/tmp", os.TempDir()} {
		if base == "" {
			continue
		}
		dir, err := os.MkdirTemp(base, "kvfs-uring-test-")
		if err != nil {
			continue
		}
		if directOK(dir) {
			tb.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
		os.RemoveAll(dir)
	}
	tb.Skip("skipping: no directory on a filesystem with real O_DIRECT (/var/tmp and $TMPDIR are tmpfs or refuse it); set KVFS_TEST_DISK_DIR")
	return ""
}

func directOK(dir string) bool {
	var sf unix.Statfs_t
	if unix.Statfs(dir, &sf) != nil || sf.Type == unix.TMPFS_MAGIC {
		return false
	}
	p := filepath.Join(dir, "probe")
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_DIRECT|unix.O_CLOEXEC, 0o644)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	defer os.Remove(p)
	b, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return false
	}
	defer unix.Munmap(b)
	n, err := unix.Pwrite(fd, b, 0)
	return err == nil && n == 4096
}

// alignedBuf is n bytes of page-aligned memory outside the Go heap.
func alignedBuf(tb testing.TB, n int) []byte {
	tb.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Munmap(b) })
	return b
}

// fill writes a pattern derived from seed (every 8 bytes differ).
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 1
	for i := 0; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		binary.LittleEndian.PutUint64(b[i:], x)
	}
	for i := len(b) &^ 7; i < len(b); i++ {
		b[i] = byte(seed + uint64(i))
	}
}

func pattern(n int, seed uint64) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

func newRing(tb testing.TB, o iouring.Options) *iouring.Ring {
	tb.Helper()
	needURing(tb)
	r, err := iouring.New(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	return r
}

// openDirect creates a file of size bytes (filled with pattern seed 0 per
// 4 KiB block index) and opens it O_DIRECT.
func openDirect(tb testing.TB, dir string, size int) int {
	tb.Helper()
	p := filepath.Join(dir, "data")
	// Written and synced, so that O_DIRECT reads do not wait for writeback.
	f, err := os.Create(p)
	if err == nil {
		_, err = f.Write(make([]byte, size))
	}
	if err == nil {
		err = f.Sync()
	}
	if f != nil {
		f.Close()
	}
	if err != nil {
		tb.Fatal(err)
	}
	fd, err := unix.Open(p, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { unix.Close(fd) })
	return fd
}

func runtimeGosched() { runtime.Gosched() }

func addrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
