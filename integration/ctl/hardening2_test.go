package ctl

import (
	"bytes"
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

// allocated is the bytes of tmpfs memory file fd holds.
func allocated(t *testing.T, fd int) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// TestRegistrationNeverAllocates: residency is decided on the registered
// range itself. A file whose first MiB is a hole and whose second MiB is
// allocated, registered for its first MiB (by descriptor and by path), has
// as many bytes allocated as the range is long, yet is registered unpinned
// and nothing of it is allocated.
func TestRegistrationNeverAllocates(t *testing.T) {
	pe := &pinEngine{Mem: storetest.Formatted(t, testGeo, 8, 4096)}
	st := storetest.Open(t, pe, store.Options{})
	const mib = 1 << 20
	e := mountEnv(t, envOptions{st: st, ctl: ctl.Options{MaxPinnedBytes: 64 * mib, MaxPinnedPerUID: 32 * mib}})
	c := openClient(t, e)
	halfHole := func(fd int) {
		t.Helper()
		if err := unix.Ftruncate(fd, 2*mib); err != nil {
			t.Fatal(err)
		}
		if err := unix.Fallocate(fd, 0, mib, mib); err != nil {
			t.Fatal(err)
		}
		if got := allocated(t, fd); got != mib {
			t.Fatalf("%d bytes allocated before registering", got)
		}
	}
	mfd, err := unix.MemfdCreate("halfhole", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	halfHole(mfd)
	if _, err := c.RegisterFD(mfd, mib); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, mfd); got != mib || pe.pinned.Load() != 0 {
		t.Fatalf("REGISTER_FD of a hole: %d bytes allocated (want %d), engine pins %d", got, mib, pe.pinned.Load())
	}

	path := fmt.Sprintf("/dev/shm/kvfs-halfhole-%d", os.Getpid())
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(path)
	defer f.Close()
	halfHole(int(f.Fd()))
	if _, err := c.RegisterHost(path, mib); err != nil {
		t.Fatal(err)
	}
	if got := allocated(t, int(f.Fd())); got != mib || pe.pinned.Load() != 0 {
		t.Fatalf("REGISTER_HOST of a hole: %d bytes allocated (want %d), engine pins %d", got, mib, pe.pinned.Load())
	}
}

// punchStore is a store for TestPunchedHoleNotRefilled: the in-memory
// engine (its copies are the daemon's own CPU accesses), with a pinning
// registrar or without, or a file store with a real engine (posix reads
// with read(2) into the client's memory, uring with fixed buffers).
func punchStore(t *testing.T, kind string) (*store.Store, *pinEngine) {
	t.Helper()
	switch kind {
	case "mem":
		return storetest.Open(t, storetest.Formatted(t, testGeo, 8, 4096), store.Options{}), nil
	case "mem-pinning":
		pe := &pinEngine{Mem: storetest.Formatted(t, testGeo, 8, 4096)}
		return storetest.Open(t, pe, store.Options{}), pe
	}
	requireMount(t)
	return fileStore(t, kind), nil
}

// TestPunchedHoleNotRefilled: a resident registration whose caller punches
// a hole in it afterwards is never allocated into: a LOAD whose tile lies
// in the hole and a STORE that reads from it fail with EFAULT and the file
// keeps its hole; tiles outside it load as before. With engines that pin
// the registration and ones that do not, whose reads land by the daemon's
// copies, read(2) or fixed buffers.
func TestPunchedHoleNotRefilled(t *testing.T) {
	const mib, hole = 1 << 20, 512 << 10
	for _, kind := range []string{"mem", "mem-pinning", "posix", "uring"} {
		t.Run(kind, func(t *testing.T) {
			st, pe := punchStore(t, kind)
			e := mountEnv(t, envOptions{st: st, ctl: ctl.Options{MaxPinnedBytes: 64 * mib, MaxPinnedPerUID: 32 * mib}})
			c := openClient(t, e)
			mfd, err := unix.MemfdCreate("punched", unix.MFD_CLOEXEC)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Close(mfd)
			if err := unix.Ftruncate(mfd, mib); err != nil {
				t.Fatal(err)
			}
			if err := unix.Fallocate(mfd, 0, 0, mib); err != nil {
				t.Fatal(err)
			}
			id, err := c.RegisterFD(mfd, 0)
			if err != nil {
				t.Fatal(err)
			}
			if pe != nil && pe.pinned.Load() != mib {
				t.Fatalf("engine pins %d, want the whole MiB", pe.pinned.Load())
			}
			t.Logf("%s: %d bytes pinned", kind, e.srv.Metrics().PinnedBytes)
			if err := unix.Fallocate(mfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, hole, 64<<10); err != nil {
				t.Fatal(err)
			}
			before := allocated(t, mfd)
			if before != mib-64<<10 {
				t.Fatalf("%d bytes allocated after the punch", before)
			}
			keys := blockKeys(e.geo, 0x77)
			e.put(keys, 3)
			_, err = c.Load([]client.Entry{{Key: keys[0], Buffer: id, Offset: hole}})
			if !errors.Is(err, syscall.EFAULT) {
				t.Errorf("LOAD into the hole: %v, want EFAULT", err)
			}
			var es []client.Entry
			for i, k := range keys {
				es = append(es, client.Entry{Key: k, Buffer: id, Offset: hole + uint64(i*e.gb)})
			}
			if _, err = c.Load(es); !errors.Is(err, syscall.EFAULT) {
				t.Errorf("LOAD of a whole block into the hole: %v, want EFAULT", err)
			}
			_, err = c.Store([]client.Entry{{Key: keys[1], Buffer: id, Offset: hole + 4096}})
			if !errors.Is(err, syscall.EFAULT) {
				t.Errorf("STORE from the hole: %v, want EFAULT", err)
			}
			if got := allocated(t, mfd); got != before {
				t.Fatalf("the daemon allocated %d bytes in the hole", got-before)
			}
			sts, err := c.Load([]client.Entry{{Key: keys[2], Buffer: id, Offset: 0}})
			if err != nil || !allOK(sts) {
				t.Fatalf("LOAD outside the hole: %v %v", err, sts)
			}
			view, err := unix.Mmap(mfd, 0, e.gb, unix.PROT_READ, unix.MAP_SHARED)
			if err != nil {
				t.Fatal(err)
			}
			defer unix.Munmap(view)
			if !bytes.Equal(view, groupData(e.gb, keys[2], 3)) {
				t.Fatal("the tile outside the hole differs")
			}
		})
	}
}
