package fault_test

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"unsafe"

	"github.com/kvfs/kvfs/internal/fault"
)

// shrunk maps a two-page file and truncates it to one page: the second
// page of the mapping faults (SIGBUS) when touched.
func shrunk(t *testing.T) []byte {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ps := os.Getpagesize()
	if err := f.Truncate(int64(2 * ps)); err != nil {
		t.Fatal(err)
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, 2*ps, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	if err := f.Truncate(int64(ps)); err != nil {
		t.Fatal(err)
	}
	return mem
}

func TestGuardRecoversOwnedFault(t *testing.T) {
	mem := shrunk(t)
	ps := os.Getpagesize()
	addr, faulted, err := fault.Guard(func(a uintptr) bool { return fault.In(mem, a) }, func() error {
		mem[0] = 1 // the first page is backed
		mem[ps] = 1
		return errors.New("not reached")
	})
	if !faulted || err != nil {
		t.Fatalf("faulted %v, err %v; want a recovered fault", faulted, err)
	}
	if !fault.In(mem[ps:], addr) {
		t.Fatalf("fault at %#x, not in the truncated page", addr)
	}
	if mem[0] != 1 {
		t.Fatal("the write before the fault was lost")
	}
}

func TestGuardReturnsError(t *testing.T) {
	want := errors.New("f's error")
	_, faulted, err := fault.Guard(func(uintptr) bool { return true }, func() error { return want })
	if faulted || err != want {
		t.Fatalf("faulted %v, err %v; want f's error", faulted, err)
	}
}

func TestGuardPropagatesForeignFault(t *testing.T) {
	mem := shrunk(t)
	ps := os.Getpagesize()
	defer func() {
		r := recover()
		if _, ok := r.(interface{ Addr() uintptr }); !ok {
			t.Fatalf("recovered %v; want the fault to propagate", r)
		}
	}()
	_, _, _ = fault.Guard(func(uintptr) bool { return false }, func() error {
		mem[ps] = 1
		return nil
	})
	t.Fatal("a fault outside the owned memory was swallowed")
}

func TestGuardPropagatesOtherPanics(t *testing.T) {
	defer func() {
		if r := recover(); r != "boom" {
			t.Fatalf("recovered %v; want boom", r)
		}
	}()
	_, _, _ = fault.Guard(func(uintptr) bool { return true }, func() error { panic("boom") })
}

func TestIn(t *testing.T) {
	b := make([]byte, 16)
	if fault.In(nil, 0) || !fault.In(b, uintptrOf(b)) || !fault.In(b, uintptrOf(b)+15) || fault.In(b, uintptrOf(b)+16) {
		t.Fatal("In disagrees with the slice's bounds")
	}
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
