package client

import (
	"errors"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Pin runs its pinner once per buffer, Close runs the undoing it returned
// before unmapping, and a buffer without memory refuses to be pinned.
func TestHostBufferPin(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	// A closed client: Unregister fails with EBADF, which Close takes as
	// "the registration is already gone".
	b := &HostBuffer{Mem: mem, c: &Client{closed: true}}
	pins, unpins := 0, 0
	pin := func(m []byte) (func() error, error) {
		if &m[0] != &mem[0] || len(m) != len(mem) {
			t.Errorf("pinner got %p+%d, want the mapping %p+%d", &m[0], len(m), &mem[0], len(mem))
		}
		pins++
		return func() error { unpins++; return nil }, nil
	}
	for range 2 {
		if err := b.Pin(pin); err != nil {
			t.Fatal(err)
		}
	}
	if pins != 1 {
		t.Fatalf("pinner ran %d times, want once", pins)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if unpins != 1 {
		t.Fatalf("Close ran the undoing %d times, want once", unpins)
	}
	if err := b.Pin(pin); !errors.Is(err, syscall.EBADF) {
		t.Fatalf("Pin after Close = %v, want EBADF", err)
	}

	failed := &HostBuffer{Mem: make([]byte, 1), c: &Client{closed: true}}
	want := errors.New("no driver")
	if err := failed.Pin(func([]byte) (func() error, error) { return nil, want }); err != want {
		t.Fatalf("Pin = %v, want the pinner's error", err)
	}
	if failed.unpin != nil {
		t.Fatal("a failed Pin left an undoing behind")
	}
}
