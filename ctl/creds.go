package ctl

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Capability bits (linux/capability.h) read from a caller's CapEff.
const (
	capIPCLock = 14
)

// cred is what the kernel checks a process's file access and memory
// locking with, read from /proc/<tid>/status of the thread that issued an
// ioctl; capEff only for a thread in the daemon's user namespace (0 for
// any other, see inDaemonUserNS). That thread waits in the kernel until the daemon answers, so
// neither its id nor its credentials change while the ioctl is served (a
// thread's credentials change only by its own system calls).
type cred struct {
	tid, tgid    int
	nstgid       []int  // the process id in each pid namespace, outermost first (NStgid)
	ruid         uint32 // pinned memory is charged to the real uid, as io_uring does
	fsuid, fsgid uint32
	groups       []uint32
	capEff       uint64
}

func (c *cred) hasCap(bit uint) bool { return c.capEff&(1<<bit) != 0 }

// isProcess reports whether pid names the caller's process, in the
// daemon's pid namespace or in any namespace the caller lives in (a client
// in a container knows itself by its innermost pid).
func (c *cred) isProcess(pid uint32) bool {
	if pid == 0 {
		return false
	}
	if int64(pid) == int64(c.tgid) {
		return true
	}
	for _, n := range c.nstgid {
		if int64(n) == int64(pid) {
			return true
		}
	}
	return false
}

// callerCred reads the credentials of thread tid (the pid FUSE reports for
// a request is the calling thread's id). tid 0 (a caller outside the
// daemon's pid namespace, or an ioctl that did not come through FUSE) and a
// vanished thread give ErrCaller.
func callerCred(tid uint32) (*cred, error) {
	if tid == 0 {
		return nil, fmt.Errorf("%w: no caller process id", ErrCaller)
	}
	dir := "/proc/" + strconv.FormatUint(uint64(tid), 10)
	b, err := os.ReadFile(dir + "/status")
	if err != nil {
		return nil, fmt.Errorf("%w: thread %d: %v", ErrCaller, tid, err)
	}
	c, err := parseStatus(int(tid), b)
	if err != nil {
		return nil, err
	}
	if !inDaemonUserNS(dir) {
		c.capEff = 0
	}
	return c, nil
}

// daemonUserNS identifies the daemon's user namespace (device and inode
// of /proc/self/ns/user); ok is false when it cannot be read.
var daemonUserNS = sync.OnceValues(func() (unix.Stat_t, bool) {
	var st unix.Stat_t
	err := unix.Stat("/proc/self/ns/user", &st)
	return st, err == nil
})

// inDaemonUserNS reports whether the thread whose /proc directory is dir
// lives in the daemon's user namespace. CapEff lists capabilities in the
// thread's own user namespace: any process can create a namespace and
// hold every capability there, which the kernel honours only inside that
// namespace and the ones it owns. The daemon decides in its own namespace
// (normally the initial one, where mlock(2) and io_uring look for
// CAP_IPC_LOCK), so capabilities held in a namespace below it count for
// nothing. Those of a thread in a namespace above the daemon's (a daemon
// in a container) would count for the kernel, but the daemon cannot look
// above its own namespace (NS_GET_PARENT stops there): they count for
// nothing either, the careful side. A namespace that cannot be read (the
// daemon may not inspect the thread) is another.
func inDaemonUserNS(dir string) bool {
	self, ok := daemonUserNS()
	if !ok {
		return false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir+"/ns/user", &st); err != nil {
		return false
	}
	return st.Dev == self.Dev && st.Ino == self.Ino
}

// parseStatus parses the fields of /proc/<tid>/status that cred needs.
func parseStatus(tid int, b []byte) (*cred, error) {
	c := &cred{tid: tid}
	var have int
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		switch k {
		case "Tgid":
			if len(f) == 1 {
				n, err := strconv.Atoi(f[0])
				if err != nil {
					return nil, fmt.Errorf("%w: thread %d: Tgid %q", ErrCaller, tid, v)
				}
				c.tgid = n
				have |= 1
			}
		case "NStgid":
			for _, x := range f {
				n, err := strconv.Atoi(x)
				if err != nil {
					return nil, fmt.Errorf("%w: thread %d: NStgid %q", ErrCaller, tid, v)
				}
				c.nstgid = append(c.nstgid, n)
			}
		case "Uid", "Gid":
			if len(f) != 4 {
				return nil, fmt.Errorf("%w: thread %d: %s %q", ErrCaller, tid, k, v)
			}
			var ids [4]uint32
			for i, s := range f {
				n, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("%w: thread %d: %s %q", ErrCaller, tid, k, v)
				}
				ids[i] = uint32(n)
			}
			if k == "Uid" {
				c.ruid, c.fsuid = ids[0], ids[3]
				have |= 2
			} else {
				c.fsgid = ids[3]
				have |= 4
			}
		case "Groups":
			for _, s := range f {
				n, err := strconv.ParseUint(s, 10, 32)
				if err != nil {
					return nil, fmt.Errorf("%w: thread %d: Groups %q", ErrCaller, tid, v)
				}
				c.groups = append(c.groups, uint32(n))
			}
			have |= 8
		case "CapEff":
			if len(f) == 1 {
				n, err := strconv.ParseUint(f[0], 16, 64)
				if err != nil {
					return nil, fmt.Errorf("%w: thread %d: CapEff %q", ErrCaller, tid, v)
				}
				c.capEff = n
				have |= 16
			}
		}
	}
	if have != 31 {
		return nil, fmt.Errorf("%w: thread %d: incomplete status", ErrCaller, tid)
	}
	return c, nil
}

// asCaller runs fn on a fresh OS thread that carries the caller's file
// system credentials: its supplementary groups, fsgid and fsuid, and an
// effective capability set cut down to the caller's. The kernel then
// decides every access fn makes as it would for the caller (mode bits,
// ACLs, supplementary groups, immutable and append-only flags; the LSM
// context stays the daemon's). The credentials are set with raw system
// calls, which act on the calling thread only (Go's syscall.Setgroups
// would change every thread of the daemon), and the thread is never
// returned to the scheduler's pool: the goroutine ends with it locked, so
// the runtime terminates the thread.
//
// A daemon that may not assume other credentials (no CAP_SETUID and
// CAP_SETGID) gets ErrAssume.
func asCaller(c *cred, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with this goroutine
		if err := assume(c); err != nil {
			done <- err
			return
		}
		done <- fn()
	}()
	return <-done
}

func assume(c *cred) error {
	var gp uintptr
	if len(c.groups) > 0 {
		gp = uintptr(unsafe.Pointer(&c.groups[0]))
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(c.groups)), gp, 0); e != 0 {
		return fmt.Errorf("%w: setgroups: %v", ErrAssume, e)
	}
	runtime.KeepAlive(c.groups)
	// setfsgid/setfsuid return the previous id and report no error: set,
	// then read back by setting again.
	unix.RawSyscall(unix.SYS_SETFSGID, uintptr(c.fsgid), 0, 0)
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSGID, uintptr(c.fsgid), 0, 0); uint32(r) != c.fsgid {
		return fmt.Errorf("%w: setfsgid %d", ErrAssume, c.fsgid)
	}
	unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.fsuid), 0, 0)
	if r, _, _ := unix.RawSyscall(unix.SYS_SETFSUID, uintptr(c.fsuid), 0, 0); uint32(r) != c.fsuid {
		return fmt.Errorf("%w: setfsuid %d", ErrAssume, c.fsuid)
	}
	// Moving fsuid away from 0 already dropped the file-system
	// capabilities; a root caller with fewer capabilities than the daemon
	// (a container) must not get the daemon's.
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capget: %v", ErrAssume, err)
	}
	data[0].Effective &= uint32(c.capEff)
	data[1].Effective &= uint32(c.capEff >> 32)
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("%w: capset: %v", ErrAssume, err)
	}
	return nil
}

// takeFD duplicates descriptor fd of the thread tid into the daemon with
// pidfd_getfd. The thread is the ioctl's caller, blocked in the kernel
// until we answer, so tid names it for the whole call.
func takeFD(tid uint32, fd int32) (int, error) {
	if tid == 0 {
		return -1, fmt.Errorf("%w: no caller process id", ErrCaller)
	}
	pfd, err := unix.PidfdOpen(int(tid), unix.PIDFD_THREAD)
	if err == unix.EINVAL {
		// Before Linux 6.9 (no PIDFD_THREAD) a pidfd names a thread-group
		// leader; the descriptor table is the process's either way.
		var c *cred
		if c, err = callerCred(tid); err != nil {
			return -1, err
		}
		pfd, err = unix.PidfdOpen(c.tgid, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("%w: pidfd_open %d: %v", ErrCaller, tid, err)
	}
	defer unix.Close(pfd)
	nfd, err := unix.PidfdGetfd(pfd, int(fd), 0)
	switch err {
	case nil:
		return nfd, nil
	case unix.EBADF:
		return -1, fmt.Errorf("%w: %d is not open in the caller", ErrBadFD, fd)
	case unix.EPERM:
		return -1, fmt.Errorf("%w: pidfd_getfd: %v", ErrTakeFD, err)
	case unix.ESRCH:
		return -1, fmt.Errorf("%w: pidfd_getfd: %v", ErrCaller, err)
	}
	return -1, fmt.Errorf("ctl: pidfd_getfd %d of %d: %w", fd, tid, err)
}
