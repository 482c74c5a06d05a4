package gpu

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestNumaNodeOf(t *testing.T) {
	old := sysfsRoot
	t.Cleanup(func() { sysfsRoot = old })
	write := func(root, p, s string) {
		t.Helper()
		f := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	two := t.TempDir()
	write(two, "devices/system/node/possible", "0-1\n")
	write(two, "bus/pci/devices/0000:c1:00.0/numa_node", "1\n")
	write(two, "bus/pci/devices/0000:06:00.0/numa_node", "-1\n")
	one := t.TempDir()
	write(one, "devices/system/node/possible", "0\n")
	write(one, "bus/pci/devices/0000:c1:00.0/numa_node", "0\n")
	for _, tc := range []struct {
		root          string
		dom, bus, dev int
		want          int
	}{
		{two, 0, 0xc1, 0, 1},
		{two, 0, 0x06, 0, -1}, // sysfs does not know
		{two, 0, 0x07, 0, -1}, // no such device
		{one, 0, 0xc1, 0, -1}, // one node: nothing to place
		{t.TempDir(), 0, 0xc1, 0, -1},
	} {
		sysfsRoot = tc.root
		if got := numaNodeOf(tc.dom, tc.bus, tc.dev); got != tc.want {
			t.Errorf("%s %04x:%02x:%02x.0: node %d, want %d", tc.root, tc.dom, tc.bus, tc.dev, got, tc.want)
		}
	}
}

// TestOnNode: the thread prefers the node while fn runs, and the default
// policy is back afterwards.
func TestOnNode(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	policy := func() int {
		var mode int32
		if _, _, e := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&mode)), 0, 0, 0, 0, 0); e != 0 {
			t.Skipf("get_mempolicy: %v", e)
		}
		return int(mode)
	}
	var inside int
	if err := onNode(0, func() error { inside = policy(); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != unix.MPOL_PREFERRED {
		t.Errorf("policy inside onNode(0): %d, want MPOL_PREFERRED", inside)
	}
	if p := policy(); p != unix.MPOL_DEFAULT {
		t.Errorf("policy after onNode: %d, want MPOL_DEFAULT", p)
	}
	called := false
	_ = onNode(-1, func() error { called = true; return nil })
	if !called {
		t.Error("onNode(-1) did not run fn")
	}
}
