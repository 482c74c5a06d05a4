package ctl

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/client"
	"github.com/kvfs/kvfs/ctl"
	"github.com/kvfs/kvfs/store"
	"github.com/kvfs/kvfs/store/storetest"
)

// hardening2Helper runs the helper modes of this file's tests.
func hardening2Helper(mode string, c *client.Client) (rc int, ok bool) {
	switch mode {
	case "userns-outer":
		return usernsOuter(), true
	case "userns-pin":
		return usernsPin(c), true
	}
	return 0, false
}

// usernsOuter lowers RLIMIT_MEMLOCK to KVFS_CTL_MEMLOCK, then runs the
// userns-pin helper in a user namespace of its own (created by this
// unprivileged process, its uid mapped to 0 there), and passes on its
// output.
func usernsOuter() int {
	lim, _ := strconv.ParseUint(os.Getenv("KVFS_CTL_MEMLOCK"), 10, 64)
	if err := unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: lim, Max: lim}); err != nil {
		fmt.Println("setrlimit:", err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Println(err)
		return 1
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), "KVFS_CTL_HELPER=userns-pin")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
	}
	if err := cmd.Run(); err != nil {
		fmt.Println("userns:", err)
		return 1
	}
	return 0
}

// usernsPin, inside its user namespace: prints CapEff, the errno of its own
// mlock of KVFS_CTL_SIZE bytes, then creates (and registers) a host buffer
// of that size and prints pinned= and the errno.
func usernsPin(c *client.Client) int {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			fmt.Printf("capeff=%s\n", strings.TrimSpace(v))
		}
	}
	size, _ := strconv.ParseInt(os.Getenv("KVFS_CTL_SIZE"), 10, 64)
	mem := make([]byte, size)
	err := unix.Mlock(mem)
	var en syscall.Errno
	errors.As(err, &en)
	fmt.Printf("mlock=%d\n", int(en))
	if err == nil {
		unix.Munlock(mem)
	}
	buf, err := c.NewHostBuffer("", size)
	if err == nil {
		fmt.Printf("pinned=%v\n", buf.Pinned)
	}
	return printErrno(err)
}

// TestPinUserNamespace: an unprivileged user (nobody, RLIMIT_MEMLOCK 256
// KiB) that creates a user namespace holds every capability there,
// CAP_IPC_LOCK included, yet neither the kernel (its own mlock of 1 MiB)
// nor the daemon lets it pin more than its limit: the daemon decides
// capabilities in its own user namespace, where this caller has none. The
// same caller pins 128 KiB, within its limit.
func TestPinUserNamespace(t *testing.T) {
	pe := &pinEngine{Mem: storetest.Formatted(t, testGeo, 8, 4096)}
	st := storetest.Open(t, pe, store.Options{})
	const kib = 1 << 10
	e := mountEnv(t, envOptions{st: st, public: true, ctl: ctl.Options{MaxPinnedBytes: 64 << 20, MaxPinnedPerUID: 32 << 20}})
	nobody := &syscall.Credential{Uid: 65534, Gid: 65534}
	run := func(size int) map[string]string {
		out, err := helperCmd(t, e, "userns-outer", nobody, "KVFS_CTL_MEMLOCK=262144", fmt.Sprintf("KVFS_CTL_SIZE=%d", size)).CombinedOutput()
		if err != nil {
			t.Fatalf("helper: %v: %s", err, out)
		}
		kv := map[string]string{}
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, "="); ok {
				kv[k] = v
			}
		}
		if kv["errno"] == "" || kv["capeff"] == "" {
			t.Fatalf("helper said %q", out)
		}
		return kv
	}
	kv := run(1024 * kib)
	caps, err := strconv.ParseUint(kv["capeff"], 16, 64)
	if err != nil || caps&(1<<unix.CAP_IPC_LOCK) == 0 {
		t.Fatalf("the helper's namespace gave it CapEff %q: no CAP_IPC_LOCK to test with", kv["capeff"])
	}
	if kv["mlock"] != strconv.Itoa(int(syscall.ENOMEM)) {
		t.Fatalf("the kernel let the helper mlock 1 MiB over its 256 KiB limit: mlock=%s", kv["mlock"])
	}
	if kv["errno"] != strconv.Itoa(int(syscall.ENOMEM)) || pe.pinned.Load() != 0 {
		t.Fatalf("1 MiB from a user namespace with RLIMIT_MEMLOCK 256 KiB: errno=%s pinned=%s, engine pins %d; want ENOMEM",
			kv["errno"], kv["pinned"], pe.pinned.Load())
	}
	kv = run(128 * kib)
	if kv["errno"] != "0" || kv["pinned"] != "true" {
		t.Fatalf("128 KiB from a user namespace with RLIMIT_MEMLOCK 256 KiB: errno=%s pinned=%s", kv["errno"], kv["pinned"])
	}
	e.waitSessions(0)
	if pe.pinned.Load() != 0 {
		t.Fatalf("pins left after the helper exited: %d", pe.pinned.Load())
	}
}
