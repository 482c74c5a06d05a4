package nvme

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/uring"
)

// The ioctl structs and the io_uring command share Command's layout.
var _ [CmdSize]byte = [unsafe.Sizeof(Command{})]byte{}

// sysfsRoot is where sysfs is mounted; tests point it elsewhere.
var sysfsRoot = "/sys"

// Limits are the transfer limits of one namespace.
type Limits struct {
	MDTSBytes      int64 // from Identify Controller, 0 for none
	MaxHWSectorsKB int64 // queue/max_hw_sectors_kb of the block device, 0 if unknown
	MaxSegments    int64 // queue/max_segments, 0 if unknown
	// MaxTransfer is the largest single command in bytes: the smallest of
	// the limits above, with max_segments counting one segment per page
	// plus one for a buffer that does not start on a page, rounded down to
	// the LBA size.
	MaxTransfer int64
}

// Device is an open NVMe namespace, reached through its generic char
// device (/dev/ngXnY). Its methods issue synchronous ioctls; the Engine
// does data I/O through io_uring.
type Device struct {
	Path   string // the char device
	fd     int
	NSID   uint32
	Ctrl   *Controller
	NS     *Namespace
	Limits Limits
}

// OpenDevice opens an NVMe namespace by its char device (/dev/ngXnY) or
// block device (/dev/nvmeXnY, mapped to the char device through sysfs) and
// identifies it.
func OpenDevice(path string) (*Device, error) {
	cpath, err := CharDevice(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Open(cpath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
			return nil, fmt.Errorf("%w: %w: open %s: %w", ErrUnavailable, ErrPermission, cpath, err)
		}
		return nil, fmt.Errorf("nvme: open %s: %w", cpath, err)
	}
	d := &Device{Path: cpath, fd: fd}
	if err := d.identify(); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return d, nil
}

// Fd is the open char device.
func (d *Device) Fd() int { return d.fd }

// Close closes the char device. A second Close returns nil.
func (d *Device) Close() error {
	if d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

func (d *Device) identify() error {
	nsid, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), ioctlID, 0)
	if errno != 0 {
		if errno == unix.ENOTTY || errno == unix.EINVAL {
			return fmt.Errorf("%w: %w: %s: NVME_IOCTL_ID: %w", ErrUnavailable, ErrNotNVMe, d.Path, errno)
		}
		return fmt.Errorf("nvme: %s: NVME_IOCTL_ID: %w", d.Path, errno)
	}
	d.NSID = uint32(nsid)
	buf, err := allocPages(IdentifySize)
	if err != nil {
		return err
	}
	defer freePages(buf)
	if _, err := d.Admin(IdentifyCmd(CNSController, 0, addrOf(buf)), buf); err != nil {
		return fmt.Errorf("nvme: %s: identify controller: %w", d.Path, permission(err))
	}
	if d.Ctrl, err = DecodeController(buf); err != nil {
		return fmt.Errorf("nvme: %s: identify controller: %w", d.Path, err)
	}
	clear(buf)
	if _, err := d.Admin(IdentifyCmd(CNSNamespace, d.NSID, addrOf(buf)), buf); err != nil {
		return fmt.Errorf("nvme: %s: identify namespace %d: %w", d.Path, d.NSID, permission(err))
	}
	if d.NS, err = DecodeNamespace(buf); err != nil {
		return fmt.Errorf("nvme: %s: identify namespace %d: %w", d.Path, d.NSID, err)
	}
	d.Limits = d.limits()
	return nil
}

// permission marks EACCES/EPERM of a passthrough command as ErrPermission.
func permission(err error) error {
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrPermission, err)
	}
	return err
}

// limits combines MDTS and the block layer's queue limits.
func (d *Device) limits() Limits {
	l := Limits{MDTSBytes: d.Ctrl.MaxTransfer()}
	if q := queueDir(d.Path); q != "" {
		l.MaxHWSectorsKB = readSysInt(filepath.Join(q, "max_hw_sectors_kb"))
		l.MaxSegments = readSysInt(filepath.Join(q, "max_segments"))
	}
	l.MaxTransfer = computeMaxTransfer(l, d.NS.LBASize(), os.Getpagesize())
	return l
}

// computeMaxTransfer is the pure part of limits.
func computeMaxTransfer(l Limits, lba, page int) int64 {
	const fallback = 128 << 10 // what every controller takes when nothing is known
	m := int64(0)
	lower := func(v int64) {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	lower(l.MDTSBytes)
	lower(l.MaxHWSectorsKB << 10)
	if l.MaxSegments > 1 {
		lower((l.MaxSegments - 1) * int64(page))
	}
	if m == 0 {
		m = fallback
	}
	if m > 1<<30 {
		m = 1 << 30
	}
	if maxCmd := int64(maxNLB) * int64(lba); m > maxCmd {
		m = maxCmd
	}
	m -= m % int64(lba)
	if m < int64(lba) {
		m = int64(lba)
	}
	return m
}

func readSysInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0
	}
	return v
}

// queueDir finds the block device queue directory of a char device
// ngXnY (its block twin nvmeXnY), "" if there is none.
func queueDir(charPath string) string {
	name := filepath.Base(charPath)
	if !strings.HasPrefix(name, "ng") {
		return ""
	}
	q := filepath.Join(sysfsRoot, "block", "nvme"+name[2:], "queue")
	if _, err := os.Stat(q); err != nil {
		return ""
	}
	return q
}

// CharDevice maps path to the NVMe generic char device: a char device is
// returned as is, a namespace block device /dev/nvmeXnY is mapped through
// sysfs (/sys/class/nvme-generic/ngXnY/dev) to /dev/ngXnY.
func CharDevice(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.EACCES) {
			return "", fmt.Errorf("%w: %w: %s: %w", ErrUnavailable, ErrPermission, path, err)
		}
		return "", fmt.Errorf("%w: %w: %s: %w", ErrUnavailable, ErrNotCharDevice, path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return path, nil
	case unix.S_IFBLK:
	default:
		return "", fmt.Errorf("%w: %w: %s is not a device", ErrUnavailable, ErrNotCharDevice, path)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("nvme: %s: %w", path, err)
	}
	name := filepath.Base(real)
	var ctrl, ns int
	if n, err := fmt.Sscanf(name, "nvme%dn%d", &ctrl, &ns); n != 2 || err != nil || name != fmt.Sprintf("nvme%dn%d", ctrl, ns) {
		return "", fmt.Errorf("%w: %w: %s is not an NVMe namespace block device (a partition?)", ErrUnavailable, ErrNotNVMe, path)
	}
	gen := fmt.Sprintf("ng%dn%d", ctrl, ns)
	b, err := os.ReadFile(filepath.Join(sysfsRoot, "class", "nvme-generic", gen, "dev"))
	if err != nil {
		return "", fmt.Errorf("%w: %w: %s has no generic char device %s (kernel < 5.13?): %w", ErrUnavailable, ErrNotCharDevice, path, gen, err)
	}
	var maj, mnr uint32
	if _, err := fmt.Sscanf(strings.TrimSpace(string(b)), "%d:%d", &maj, &mnr); err != nil {
		return "", fmt.Errorf("nvme: %s: bad sysfs dev %q", gen, b)
	}
	cpath := filepath.Join(filepath.Dir(real), gen)
	var cst unix.Stat_t
	if err := unix.Stat(cpath, &cst); err != nil || cst.Mode&unix.S_IFMT != unix.S_IFCHR ||
		unix.Major(cst.Rdev) != maj || unix.Minor(cst.Rdev) != mnr {
		return "", fmt.Errorf("%w: %w: %s: no char device node %s for %d:%d", ErrUnavailable, ErrNotCharDevice, path, cpath, maj, mnr)
	}
	return cpath, nil
}

// Admin sends an admin command with the ioctl and returns the completion's
// dword 0. buf is the command's data buffer (kept alive across the call);
// c.Addr must point into it.
func (d *Device) Admin(c Command, buf []byte) (uint32, error) {
	return d.passthru(ioctlAdminCmd, c, buf, true)
}

// IO sends an I/O command with the synchronous ioctl.
func (d *Device) IO(c Command, buf []byte) (uint32, error) {
	if c.NSID == 0 {
		c.NSID = d.NSID
	}
	return d.passthru(ioctlIOCmd, c, buf, false)
}

func (d *Device) passthru(req uintptr, c Command, buf []byte, admin bool) (uint32, error) {
	if d.fd < 0 {
		return 0, fmt.Errorf("nvme: %s: %w", d.Path, ErrClosed)
	}
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(d.fd), req, uintptr(unsafe.Pointer(&c)))
	runtime.KeepAlive(buf)
	if errno != 0 {
		return 0, fmt.Errorf("nvme: %s: %w", opcodeName(c.Opcode, admin), errno)
	}
	if int32(r) > 0 {
		return c.Result, &StatusError{Opcode: c.Opcode, Admin: admin, Status: Status(r)}
	}
	return c.Result, nil
}

func addrOf(b []byte) uint64 {
	if len(b) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&b[0])))
}

// FDPInfo describes the placement state of a namespace for `kvfs info`.
type FDPInfo struct {
	Supported      bool        // the controller supports FDP (CTRATT bit 19)
	Enabled        bool        // FDP is enabled on the namespace's endurance group
	EnduranceGroup uint16      // endurance group id
	ConfigIndex    int         // the configuration in use
	Config         *FDPConfig  // nil when FDP is disabled
	Handles        []RUHStatus // the namespace's placement handles, in PID order
	LBASize        int         // to turn RUAMW (blocks) into bytes
	Reason         string      // why FDP is not used, when it is not
}

// String renders the FDP state for `kvfs info`: one line, then one line
// per handle.
func (f *FDPInfo) String() string {
	var b strings.Builder
	switch {
	case !f.Enabled:
		fmt.Fprintf(&b, "fdp: off (%s)", f.Reason)
	default:
		fmt.Fprintf(&b, "fdp: on, endurance group %d, configuration %d", f.EnduranceGroup, f.ConfigIndex)
		if c := f.Config; c != nil {
			fmt.Fprintf(&b, ": %d handles, %d reclaim groups, reclaim unit %d MiB", c.NRUH, c.NRG, c.RUNS>>20)
		}
		for i, h := range f.Handles {
			role := "data"
			if i == 0 {
				role = "meta"
			}
			fmt.Fprintf(&b, "\n  handle %d (pid %d, ruh %d, %s): %d bytes available in its reclaim unit", i, h.PID, h.RUHID, role, f.AvailableBytes(i))
		}
	}
	return b.String()
}

// AvailableBytes is how much can still be written to handle i's current
// reclaim unit.
func (f *FDPInfo) AvailableBytes(i int) int64 { return int64(f.Handles[i].RUAMW) * int64(f.LBASize) }

// FDP discovers the namespace's FDP state: Get Features 1Dh, the FDP
// configurations log page and the reclaim unit handle status. A controller
// without FDP returns an FDPInfo with Enabled false and a nil error.
func (d *Device) FDP() (*FDPInfo, error) {
	info := &FDPInfo{Supported: d.Ctrl.FDP(), LBASize: int(d.NS.Format().DataSize)}
	if !info.Supported {
		info.Reason = "controller does not support FDP"
		return info, nil
	}
	info.EnduranceGroup = d.NS.ENDGID
	if info.EnduranceGroup == 0 {
		info.EnduranceGroup = 1
	}
	dw0, err := d.Admin(GetFeaturesCmd(FeatureFDP, 0, uint32(info.EnduranceGroup)), nil)
	if err != nil {
		return nil, fmt.Errorf("nvme: %s: get features FDP: %w", d.Path, permission(err))
	}
	feat := DecodeFDPFeature(dw0)
	info.ConfigIndex = int(feat.ConfigIndex)
	if !feat.Enabled {
		info.Reason = fmt.Sprintf("FDP disabled on endurance group %d", info.EnduranceGroup)
		return info, nil
	}
	cfgs, err := d.fdpConfigs(info.EnduranceGroup)
	if err != nil {
		return nil, err
	}
	if info.ConfigIndex >= len(cfgs) {
		return nil, fmt.Errorf("%w: FDP configuration %d in use of %d", ErrFormat, info.ConfigIndex, len(cfgs))
	}
	info.Config = &cfgs[info.ConfigIndex]
	if info.Handles, err = d.RUHStatus(); err != nil {
		return nil, err
	}
	info.Enabled = true
	return info, nil
}

func (d *Device) fdpConfigs(endgid uint16) ([]FDPConfig, error) {
	// Header first, then exactly the announced size (see RUHStatus on SGLs).
	hdr, err := d.logPage(LogFDPConfigs, endgid, fdpConfsHeaderSize)
	if err != nil {
		return nil, err
	}
	size := int(binary.LittleEndian.Uint32(hdr[4:]))
	if size < fdpConfsHeaderSize || size > maxFDPLogSize {
		return nil, fmt.Errorf("%w: FDP configurations log size %d", ErrFormat, size)
	}
	b, err := d.logPage(LogFDPConfigs, endgid, (size+3)&^3)
	if err != nil {
		return nil, err
	}
	return DecodeFDPConfigs(b)
}

func (d *Device) logPage(lid uint8, lsi uint16, n int) ([]byte, error) {
	buf, err := allocPages(n)
	if err != nil {
		return nil, err
	}
	defer freePages(buf)
	if _, err := d.Admin(GetLogPageCmd(lid, lsi, 0, 0, addrOf(buf), uint32(n)), buf); err != nil {
		return nil, fmt.Errorf("nvme: %s: log page %#x: %w", d.Path, lid, permission(err))
	}
	return append([]byte(nil), buf...), nil
}

// RUHStatus reads the reclaim unit handle status of the namespace.
//
// It asks for the 16-byte header first and then for exactly the
// descriptors the header announces: Linux sends user passthrough data as
// SGLs when the controller supports them, and a controller without SGL
// "excess length" support (QEMU's) fails a transfer whose SGL is longer
// than the data it returns (Data SGL Length Invalid).
func (d *Device) RUHStatus() ([]RUHStatus, error) {
	hdr, err := d.ioMgmtRecv(ruhsHeaderSize)
	if err != nil {
		return nil, err
	}
	n := int(hdr[14]) | int(hdr[15])<<8
	if n == 0 {
		return DecodeRUHStatus(hdr)
	}
	b, err := d.ioMgmtRecv(RUHStatusSize(n))
	if err != nil {
		return nil, err
	}
	return DecodeRUHStatus(b)
}

func (d *Device) ioMgmtRecv(n int) ([]byte, error) {
	buf, err := allocPages(n)
	if err != nil {
		return nil, err
	}
	defer freePages(buf)
	if _, err := d.IO(IOMgmtRecvCmd(IOMgmtRUHS, d.NSID, addrOf(buf), uint32(n)), buf); err != nil {
		return nil, fmt.Errorf("nvme: %s: reclaim unit handle status: %w", d.Path, permission(err))
	}
	return append([]byte(nil), buf...), nil
}

// Available reports why io_uring NVMe passthrough cannot be used on path,
// or nil when it can: the kernel must be 5.19 or later, io_uring enabled,
// path an NVMe namespace with a generic char device, and the caller
// allowed to open it read-write and identify it. Every error wraps
// ErrUnavailable and one reason.
func Available(path string) error {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fmt.Errorf("%w: uname: %w", ErrUnavailable, err)
	}
	rel := unix.ByteSliceToString(u.Release[:])
	if !KernelAtLeast(rel, 5, 19) {
		return fmt.Errorf("%w: %w: running %s", ErrUnavailable, ErrKernelTooOld, rel)
	}
	if v := readSysInt("/proc/sys/kernel/io_uring_disabled"); v == 2 || (v == 1 && unix.Geteuid() != 0) {
		return fmt.Errorf("%w: %w (= %d)", ErrUnavailable, ErrIOUringDisabled, v)
	}
	if err := uring.Available(); err != nil {
		return fmt.Errorf("%w: %w: %w", ErrUnavailable, ErrIOUringDisabled, err)
	}
	d, err := OpenDevice(path)
	if err != nil {
		if !errors.Is(err, ErrUnavailable) {
			err = fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	return d.Close()
}

// KernelAtLeast reports whether a kernel release string ("6.1.0-13-amd64")
// is at least major.minor. Unparseable releases are taken as new enough.
func KernelAtLeast(release string, major, minor int) bool {
	var ma, mi int
	if n, _ := fmt.Sscanf(release, "%d.%d", &ma, &mi); n != 2 {
		return true
	}
	return ma > major || (ma == major && mi >= minor)
}
