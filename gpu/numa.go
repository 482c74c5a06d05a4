package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The NUMA node a GPU sits on, and placing its pinned staging memory
// there: a host-to-device copy from memory on the GPU's own node does not
// cross the socket interconnect.

// sysfsRoot is where numaNodeOf looks (tests point it at a fake tree).
var sysfsRoot = "/sys"

// numaNodeOf is the NUMA node of the PCI device domain:bus:dev.0 as sysfs
// reports it, or -1 when it does not say (no such file, -1, or a machine
// with a single node, where placement is moot).
func numaNodeOf(domain, bus, dev int) int {
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "devices/system/node/possible"))
	if err != nil || !strings.ContainsAny(strings.TrimSpace(string(b)), "-,") {
		return -1 // one node (or unknown)
	}
	p := filepath.Join(sysfsRoot, fmt.Sprintf("bus/pci/devices/%04x:%02x:%02x.0/numa_node", domain, bus, dev))
	b, err = os.ReadFile(p)
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 || n >= 1024 {
		return -1
	}
	return n
}

// onNode runs fn with the calling thread's memory policy preferring node
// (MPOL_PREFERRED), then restores the default policy. The caller holds the
// OS thread (runtime.LockOSThread; Context.Do does): pages fn faults in,
// such as cuMemHostAlloc's pinned pages, come from that node while it has
// free memory. node < 0 runs fn as is. A kernel refusing the policy is not
// an error: the memory is only placed less well.
func onNode(node int, fn func() error) error {
	if node < 0 {
		return fn()
	}
	var mask [1024 / 64]uint64
	mask[node/64] |= 1 << (node % 64)
	if _, _, e := unix.Syscall(unix.SYS_SET_MEMPOLICY, unix.MPOL_PREFERRED, uintptr(unsafe.Pointer(&mask[0])), 1024+1); e != 0 {
		return fn()
	}
	defer unix.Syscall(unix.SYS_SET_MEMPOLICY, unix.MPOL_DEFAULT, 0, 0)
	return fn()
}
