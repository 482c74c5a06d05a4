package ctl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
)

// TestTargetLimitAfterChecks: the per-file target limit is the last check
// of REGISTER_TARGET, as docs/abi.md lists them: on a file that holds
// MaxTargets targets a malformed target still gets the errno of what is
// wrong with it (EINVAL, ENOENT, ERANGE), and only a valid one EMFILE.
func TestTargetLimitAfterChecks(t *testing.T) {
	geo := blocksGeo
	f := newBlocksFixture(t, geo, 1, 2, false)
	rb, T, H := geo.RowBytes(), geo.BlockTokens, geo.KVHeads
	tensor := 2 * T * H * rb
	s := newShm(t, 2*geo.Layers*tensor, 0)
	id := mustRegister(t, f.ss, s)
	valid := func() *abi.Target {
		tg := &abi.Target{ABI: abi.Version, NumBlocks: 2, RowBytes: uint32(rb), LayerCount: uint16(geo.Layers), HeadCount: uint16(H),
			BlockStride: uint64(H * T * rb), HeadStride: uint64(T * rb), RowPitch: uint32(rb)}
		for i := range 2 * geo.Layers {
			tg.Regions[i] = abi.TargetRegion{Buffer: id, Offset: uint64(i * tensor)}
		}
		return tg
	}
	reg := func(tg *abi.Target) (uint32, syscall.Errno) {
		in, out := make([]byte, abi.TargetSize), make([]byte, abi.TargetSize)
		tg.Marshal(in)
		_, errno := f.ss.Ioctl(abi.CmdRegisterTarget, in, out)
		return binary.LittleEndian.Uint32(out[abi.TargetOutOff:]), errno
	}
	// The fixture registered one target; fill the file up.
	for range MaxTargets - 1 {
		if _, errno := reg(valid()); errno != 0 {
			t.Fatalf("register target: %v", errno)
		}
	}
	cases := []struct {
		name  string
		bad   func(*abi.Target)
		errno syscall.Errno
	}{
		{"row_bytes", func(tg *abi.Target) { tg.RowBytes++ }, syscall.EINVAL},
		{"reserved", func(tg *abi.Target) { tg.Reserved[0] = 1 }, syscall.EINVAL},
		{"no layers", func(tg *abi.Target) { tg.LayerCount = 0 }, syscall.EINVAL},
		{"strides do not nest", func(tg *abi.Target) { tg.HeadStride = uint64(rb) }, syscall.EINVAL},
		{"regions overlap", func(tg *abi.Target) { tg.Regions[1].Offset = tg.Regions[0].Offset }, syscall.EINVAL},
		{"unknown buffer", func(tg *abi.Target) { tg.Regions[0].Buffer = id + 1000 }, syscall.ENOENT},
		{"past the buffer", func(tg *abi.Target) { tg.NumBlocks = 3 }, syscall.ERANGE},
		{"valid", func(*abi.Target) {}, syscall.EMFILE},
	}
	for _, c := range cases {
		tg := valid()
		c.bad(tg)
		if _, errno := reg(tg); errno != c.errno {
			t.Errorf("%s on a full file: %v, want %v", c.name, errno, c.errno)
		}
	}
}

// TestCallerCapsOnlyInDaemonNamespace: the capabilities a thread holds in
// a user namespace other than the daemon's count for nothing (a process
// that created its own namespace lists every one in CapEff); the
// daemon's own namespace's count as listed.
func TestCallerCapsOnlyInDaemonNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to run a process as another user")
	}
	self, err := callerCred(uint32(unix.Gettid()))
	if err != nil {
		t.Fatal(err)
	}
	if !self.hasCap(capIPCLock) {
		t.Fatalf("root in the daemon's namespace lost CAP_IPC_LOCK: %#x", self.capEff)
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep(1)")
	}
	ns := exec.Command(sleep, "600")
	// The namespace maps its root to nobody; the child becomes that root
	// (uid 65534 outside) before exec, so it runs with every capability
	// inside.
	ns.SysProcAttr = &syscall.SysProcAttr{
		Credential:  &syscall.Credential{Uid: 0, Gid: 0, NoSetGroups: true},
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 65534, Size: 1}},
	}
	if err := ns.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Process.Kill(); ns.Wait() })
	pid := ns.Process.Pid
	var raw *cred
	for range 500 {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		if err == nil && bytes.Contains(b, []byte("Name:\tsleep")) {
			if raw, err = parseStatus(pid, b); err != nil {
				t.Fatal(err)
			}
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	if raw == nil || !raw.hasCap(capIPCLock) || raw.ruid != 65534 {
		t.Fatalf("the namespaced process should list CAP_IPC_LOCK as uid 65534: %+v", raw)
	}
	c, err := callerCred(uint32(pid))
	if err != nil {
		t.Fatal(err)
	}
	if c.capEff != 0 {
		t.Fatalf("capabilities of a caller in its own user namespace count: %#x", c.capEff)
	}
}
