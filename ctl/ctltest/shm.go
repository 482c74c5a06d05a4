// Package ctltest holds test helpers shared by the control path's unit tests
// (ctl) and its end-to-end tests (integration/ctl).
package ctltest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// GuardByte fills the bytes after a registered region; they must never change.
const GuardByte = 0xA5

// NewShm creates a /dev/shm file of n usable bytes followed by guard bytes,
// maps it shared (the client's view) and removes both when the test ends.
// prefix names the file. It returns the path and the whole mapping.
func NewShm(t testing.TB, prefix string, n, guard int) (string, []byte) {
	t.Helper()
	path := filepath.Join("/dev/shm", fmt.Sprintf("%s-%d-%x", prefix, os.Getpid(), rand.Uint64()))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	t.Cleanup(func() { os.Remove(path) })
	if err := f.Truncate(int64(n + guard)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, n+guard, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	for i := n; i < n+guard; i++ {
		mem[i] = GuardByte
	}
	return path, mem
}

// CheckGuard fails the test when a byte of mem after the first n changed.
func CheckGuard(t testing.TB, mem []byte, n int) {
	t.Helper()
	for i, b := range mem[n:] {
		if b != GuardByte {
			t.Fatalf("guard byte %d after the registered region changed to %#x", i, b)
		}
	}
}
