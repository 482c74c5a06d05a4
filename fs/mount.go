package fs

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CleanStale detects a mount on mountpoint whose daemon died ("transport
// endpoint is not connected") and detaches it lazily (MNT_DETACH; through
// fusermount3 -uz when not root). It reports whether it detached one.
//
// The probe is a statx with AT_STATX_FORCE_SYNC: a plain stat of a dead
// mount's root may be answered from the kernel's attribute cache (seen on
// Linux 6.18 right after the daemon was killed) and would miss it.
func CleanStale(mountpoint string) (bool, error) {
	var stx unix.Statx_t
	err := unix.Statx(unix.AT_FDCWD, mountpoint, unix.AT_STATX_FORCE_SYNC, unix.STATX_BASIC_STATS, &stx)
	if err == nil || !(errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED)) {
		return false, nil
	}
	if err := Detach(mountpoint); err != nil {
		return false, fmt.Errorf("fs: detach stale mount %s: %w", mountpoint, err)
	}
	return true, nil
}

// Detach unmounts mountpoint lazily: the mount disappears now and the
// kernel lets go of it once nothing uses it.
func Detach(mountpoint string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(mountpoint, unix.MNT_DETACH)
	}
	return fusermount("-uz", mountpoint)
}

// Unmount unmounts mountpoint (EBUSY while files are open there).
func Unmount(mountpoint string) error {
	if os.Geteuid() == 0 {
		return unix.Unmount(mountpoint, 0)
	}
	return fusermount("-u", mountpoint)
}

func fusermount(args ...string) error {
	for _, bin := range []string{"fusermount3", "fusermount"} {
		p, err := exec.LookPath(bin)
		if err != nil {
			continue
		}
		out, err := exec.Command(p, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return errors.New("fusermount3 not found (install fuse3, or run as root)")
}

// MountInfo is the line of /proc/self/mountinfo describing one mount.
type MountInfo struct {
	Mountpoint string
	FSType     string // e.g. fuse.kvfs
	Source     string
}

// Mounts returns the mounts of /proc/self/mountinfo, in its order.
func Mounts() ([]MountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []MountInfo
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent maj:min root mountpoint options [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		for i := 6; i < len(fields)-2; i++ {
			if fields[i] == "-" {
				out = append(out, MountInfo{Mountpoint: unescapeMount(fields[4]), FSType: fields[i+1], Source: unescapeMount(fields[i+2])})
				break
			}
		}
	}
	return out, sc.Err()
}

// FindMount returns the mount at mountpoint (the last one, if several are
// stacked), or ok = false when nothing is mounted there.
func FindMount(mountpoint string) (MountInfo, bool, error) {
	abs, err := filepath.Abs(mountpoint)
	if err != nil {
		return MountInfo{}, false, err
	}
	ms, err := Mounts()
	if err != nil {
		return MountInfo{}, false, err
	}
	var found MountInfo
	ok := false
	for _, m := range ms {
		if m.Mountpoint == abs {
			found, ok = m, true
		}
	}
	return found, ok, nil
}

// unescapeMount undoes the octal escapes (\040 for a space …) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, ok := octal(s[i+1 : i+4]); ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	v := 0
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
		v = v*8 + int(c-'0')
	}
	return byte(v), v < 256
}
