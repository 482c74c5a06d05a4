package nvme

import (
	"errors"
	"os"
	"strings"
	"testing"
	"unsafe"
)

// Tests named TestDevice* and TestEngine* need a real (or emulated) NVMe
// namespace. `make test-nvme` boots QEMU with one and runs them there; on
// other machines they skip.

// testDevicePath returns the namespace to test on, or skips.
func testDevicePath(t *testing.T) string {
	t.Helper()
	p := os.Getenv("KVFS_NVME_DEV")
	if p == "" {
		if _, err := os.Stat("/dev/ng0n1"); err != nil {
			t.Skip("no NVMe namespace: KVFS_NVME_DEV is unset and /dev/ng0n1 does not exist; `make test-nvme` runs this test under QEMU")
		}
		p = "/dev/ng0n1"
	}
	return p
}

// wantFDP is what the rig booted: KVFS_FDP=on|off ("" = don't check).
func wantFDP() string { return os.Getenv("KVFS_FDP") }

func TestDeviceIdentify(t *testing.T) {
	path := testDevicePath(t)
	if err := Available(path); err != nil {
		t.Fatalf("Available(%s) = %v", path, err)
	}
	d, err := OpenDevice(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	t.Logf("nsid %d, model %q, serial %q, fw %q, mdts %d, ctratt %#x, lba %d (+%d meta), %d blocks",
		d.NSID, d.Ctrl.Model, d.Ctrl.Serial, d.Ctrl.Firmware, d.Ctrl.MDTS, d.Ctrl.CTRATT,
		d.NS.LBASize(), d.NS.Format().MetaSize, d.NS.NSZE)
	t.Logf("limits %+v", d.Limits)
	if d.NSID != 1 || d.NS.LBASize() < 512 || d.Limits.MaxTransfer < int64(d.NS.LBASize()) {
		t.Fatalf("implausible identify: nsid %d, lba %d, limits %+v", d.NSID, d.NS.LBASize(), d.Limits)
	}
	if d.Limits.MaxHWSectorsKB == 0 || d.Limits.MaxSegments == 0 {
		t.Errorf("no block queue limits found in sysfs for %s: %+v", d.Path, d.Limits)
	}
	switch wantFDP() {
	case "on":
		if !d.Ctrl.FDP() {
			t.Errorf("controller does not report FDP (ctratt %#x)", d.Ctrl.CTRATT)
		}
	case "off":
		if d.Ctrl.FDP() {
			t.Errorf("controller reports FDP (ctratt %#x)", d.Ctrl.CTRATT)
		}
	}
}

func TestDeviceBlockPath(t *testing.T) {
	path := testDevicePath(t)
	blk := strings.Replace(path, "/ng", "/nvme", 1)
	if _, err := os.Stat(blk); err != nil {
		t.Skipf("no block device %s", blk)
	}
	got, err := CharDevice(blk)
	if err != nil || got != path {
		t.Fatalf("CharDevice(%s) = %q, %v; want %s", blk, got, err, path)
	}
	if err := Available(blk); err != nil {
		t.Fatalf("Available(%s) = %v", blk, err)
	}
}

func TestDeviceFDP(t *testing.T) {
	path := testDevicePath(t)
	d, err := OpenDevice(path)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info, err := d.FDP()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", info)
	if info.Config != nil {
		t.Logf("config %+v", *info.Config)
	}
	for i, h := range info.Handles {
		t.Logf("handle %d: pid %d ruhid %d available %d blocks (%d bytes)", i, h.PID, h.RUHID, h.RUAMW, info.AvailableBytes(i))
	}
	switch wantFDP() {
	case "on":
		if !info.Enabled || info.Config == nil || len(info.Handles) != 8 {
			t.Fatalf("want FDP with 8 handles, got %+v", info)
		}
	case "off":
		if info.Enabled || info.Supported {
			t.Fatalf("want no FDP, got %+v", info)
		}
	}
}

// A closed Device refuses commands with ErrClosed (which engine/nvme maps to
// store.ErrEngineClosed) and a second Close is harmless. Needs no device:
// the closed state is the fd alone.
func TestClosedDevice(t *testing.T) {
	d := &Device{Path: "/dev/ng-test", fd: -1}
	if _, err := d.Admin(IdentifyCmd(CNSController, 0, 0), nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Admin after Close = %v, want ErrClosed", err)
	}
	if _, err := d.RUHStatus(); !errors.Is(err, ErrClosed) {
		t.Fatalf("RUHStatus after Close = %v, want ErrClosed", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
}

func TestAllocPages(t *testing.T) {
	b, err := allocPages(100)
	if err != nil {
		t.Fatal(err)
	}
	defer freePages(b)
	if len(b) != 100 || cap(b)%os.Getpagesize() != 0 || uintptr(unsafe.Pointer(&b[0]))%uintptr(os.Getpagesize()) != 0 {
		t.Fatalf("allocPages(100): len %d cap %d at %p", len(b), cap(b), &b[0])
	}
	if _, err := allocPages(0); err == nil {
		t.Fatal("allocPages(0) succeeded")
	}
}
