package nvme

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeSysfs builds a sysfs tree shaped like the kernel's: a local PCIe
// controller nvme0 with its namespace nvme0n1 / ng0n1 below it, and a
// multipath NVMe/TCP namespace nvme1n1 / ng1n1 under subsystem
// nvme-subsys1 with two controller paths nvme1 and nvme2. The char devices
// are /dev/null's (1:3) and /dev/zero's (1:5) numbers, so that Attach runs
// end to end on real device nodes.
func fakeSysfs(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	write := func(rel, content string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(rel, target string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(target, p); err != nil {
			t.Fatal(err)
		}
	}
	pci := "devices/pci0000:00/0000:00:04.0/nvme/nvme0"
	write(pci+"/transport", "pcie\n")
	write(pci+"/address", "0000:00:04.0\n")
	write(pci+"/subsysnqn", "nqn.2019-08.org.qemu:kvfsplain\n")
	write(pci+"/state", "live\n")
	write(pci+"/nvme0n1/dev", "259:0\n")
	link(pci+"/nvme0n1/device", "../../nvme0")
	write(pci+"/ng0n1/dev", "1:3\n")
	link(pci+"/ng0n1/device", "../../nvme0")
	link("dev/char/1:3", "../../"+pci+"/ng0n1")
	link("dev/block/259:0", "../../"+pci+"/nvme0n1")

	sub := "devices/virtual/nvme-subsystem/nvme-subsys1"
	write(sub+"/subsysnqn", "kvfs-fabric\n")
	for i, c := range []string{"nvme1", "nvme2"} {
		d := "devices/virtual/nvme-fabrics/ctl/" + c
		write(d+"/transport", "tcp\n")
		// The kernel ends fabric addresses with a newline (some versions
		// also with a NUL).
		write(d+"/address", "traddr=127.0.0.1,trsvcid=442"+string(rune('0'+i))+",src_addr=127.0.0.1\x00\n")
		write(d+"/subsysnqn", "kvfs-fabric\n")
		write(d+"/state", []string{"live", "connecting"}[i]+"\n")
		link(sub+"/"+c, "../../nvme-fabrics/ctl/"+c)
	}
	write(sub+"/nvme1n1/dev", "259:1\n")
	link(sub+"/nvme1n1/device", "../../nvme-subsys1")
	write(sub+"/ng1n1/dev", "1:5\n")
	link(sub+"/ng1n1/device", "../../nvme-subsys1")
	link("dev/char/1:5", "../../"+sub+"/ng1n1")
	link("dev/block/259:1", "../../"+sub+"/nvme1n1")
	// Not NVMe: a char device whose parent is something else.
	write("devices/virtual/mem/random/dev", "1:8\n")
	link("devices/virtual/mem/random/device", "../../mem")
	if err := os.MkdirAll(filepath.Join(root, "devices/virtual/mem/mem"), 0o755); err != nil {
		t.Fatal(err)
	}
	link("dev/char/1:8", "../../devices/virtual/mem/random")
	return root
}

func withSysfs(t *testing.T, root string) {
	old := sysfsRoot
	sysfsRoot = root
	t.Cleanup(func() { sysfsRoot = old })
}

func TestAttachLocal(t *testing.T) {
	withSysfs(t, fakeSysfs(t))
	a, err := Attach("/dev/null") // 1:3 = ng0n1 in the fake tree
	if err != nil {
		t.Fatal(err)
	}
	if a.Fabric() || a.Subsystem != "" || len(a.Paths) != 1 {
		t.Fatalf("local namespace: %+v", a)
	}
	p := a.Paths[0]
	if p != (CtrlPath{Name: "nvme0", Transport: "pcie", Address: "0000:00:04.0", SubsysNQN: "nqn.2019-08.org.qemu:kvfsplain", State: "live"}) {
		t.Fatalf("path %+v", p)
	}
	if a.SubsysNQN != p.SubsysNQN || a.Transport() != "pcie" {
		t.Fatalf("attachment %+v", a)
	}
	if s := a.String(); !strings.HasPrefix(s, "local: pcie 0000:00:04.0 (nvme0 live)") {
		t.Errorf("String() = %q", s)
	}
}

func TestAttachFabricMultipath(t *testing.T) {
	withSysfs(t, fakeSysfs(t))
	a, err := Attach("/dev/zero") // 1:5 = ng1n1, the multipath head
	if err != nil {
		t.Fatal(err)
	}
	if !a.Fabric() || a.Subsystem != "nvme-subsys1" || a.SubsysNQN != "kvfs-fabric" || a.Transport() != "tcp" {
		t.Fatalf("fabric namespace: %+v", a)
	}
	want := []CtrlPath{
		{Name: "nvme1", Transport: "tcp", Address: "traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1", SubsysNQN: "kvfs-fabric", State: "live"},
		{Name: "nvme2", Transport: "tcp", Address: "traddr=127.0.0.1,trsvcid=4421,src_addr=127.0.0.1", SubsysNQN: "kvfs-fabric", State: "connecting"},
	}
	if len(a.Paths) != len(want) {
		t.Fatalf("paths %+v", a.Paths)
	}
	for i := range want {
		if a.Paths[i] != want[i] {
			t.Errorf("path %d: %+v, want %+v", i, a.Paths[i], want[i])
		}
	}
	s := a.String()
	if !strings.HasPrefix(s, "fabric: tcp traddr=127.0.0.1,trsvcid=4420") || !strings.Contains(s, "(nvme2 connecting)") || !strings.HasSuffix(s, "subsysnqn kvfs-fabric") {
		t.Errorf("String() = %q", s)
	}
}

func TestAttachNotNVMe(t *testing.T) {
	withSysfs(t, fakeSysfs(t))
	for _, p := range []string{"/dev/random", "/dev/full", "/proc/self/status"} {
		// /dev/random's parent is not NVMe; /dev/full (1:7) has no sysfs
		// entry in the fake tree; a regular file is no device.
		if _, err := Attach(p); !errors.Is(err, ErrNotNVMe) {
			t.Errorf("Attach(%s) = %v, want ErrNotNVMe", p, err)
		}
	}
}
