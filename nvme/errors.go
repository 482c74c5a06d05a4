package nvme

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error returned by this package wraps one of them or
// is a *StatusError, so callers test with errors.Is / errors.As.
var (
	// ErrUnavailable: NVMe passthrough cannot be used on this path or kernel.
	// The error also wraps the reason (ErrKernelTooOld, ErrNotCharDevice,
	// ErrPermission, ErrIOUringDisabled, ErrNotNVMe).
	ErrUnavailable     = errors.New("nvme: passthrough unavailable")
	ErrKernelTooOld    = errors.New("nvme: kernel too old for io_uring NVMe passthrough (need 5.19)")
	ErrNotCharDevice   = errors.New("nvme: no NVMe generic char device")
	ErrPermission      = errors.New("nvme: permission denied")
	ErrIOUringDisabled = errors.New("nvme: io_uring disabled by kernel.io_uring_disabled")
	ErrNotNVMe         = errors.New("nvme: not an NVMe namespace")

	// ErrShort: device-returned bytes are shorter than their format needs.
	ErrShort = errors.New("nvme: short data")
	// ErrFormat: device-returned bytes are inconsistent (bad sizes, counts).
	ErrFormat = errors.New("nvme: malformed data")
	// ErrUnsupported: the namespace uses a feature the engine does not
	// handle (metadata per LBA, LBA size above the page size, …).
	ErrUnsupported = errors.New("nvme: unsupported namespace")
	// ErrNoFDP: the controller or namespace has no enabled FDP.
	ErrNoFDP = errors.New("nvme: flexible data placement not enabled")
	// ErrRange: an IO lies outside the namespace.
	ErrRange = errors.New("nvme: IO out of namespace range")
	// ErrAlign: an IO's offset, length or buffer address is not aligned.
	ErrAlign = errors.New("nvme: misaligned IO")
	// ErrClosed: the Device was used after Close.
	ErrClosed = errors.New("nvme: device closed")

	// Classes of device status, matched by *StatusError.Is.
	ErrMedia          = errors.New("nvme: media or data integrity error")
	ErrPath           = errors.New("nvme: path error")
	ErrInvalidCommand = errors.New("nvme: invalid command or field")
)

// Status code types (SCT).
const (
	SCTGeneric         = 0
	SCTCommandSpecific = 1
	SCTMedia           = 2
	SCTPath            = 3
	SCTVendor          = 7
)

// Status is the 15-bit NVMe completion status as the Linux driver reports
// it (the CQE status field without the phase bit): SC in bits 7:0, SCT in
// 10:8, CRD in 12:11, More in 13, DNR in 14.
type Status uint16

// SC is the status code.
func (s Status) SC() uint8 { return uint8(s) }

// SCT is the status code type.
func (s Status) SCT() uint8 { return uint8(s>>8) & 7 }

// CRD is the command retry delay index.
func (s Status) CRD() uint8 { return uint8(s>>11) & 3 }

// More says more status information is in the Error Information log page.
func (s Status) More() bool { return s&(1<<13) != 0 }

// DNR is "do not retry": the same command will fail again.
func (s Status) DNR() bool { return s&(1<<14) != 0 }

// StatusError is a command the controller completed with a non-zero status.
type StatusError struct {
	Opcode uint8  // the command's opcode
	Admin  bool   // an admin command (else I/O)
	Status Status // the completion status
}

func (e *StatusError) Error() string {
	kind := "io"
	if e.Admin {
		kind = "admin"
	}
	dnr := ""
	if e.Status.DNR() {
		dnr = ", dnr"
	}
	return fmt.Sprintf("nvme: %s %s failed: status sct=%d sc=%#04x (%s%s)",
		kind, opcodeName(e.Opcode, e.Admin), e.Status.SCT(), e.Status.SC(), statusName(e.Status), dnr)
}

// Is makes errors.Is(err, ErrMedia), ErrPath, ErrInvalidCommand and ErrRange
// match the corresponding classes of status.
func (e *StatusError) Is(target error) bool {
	sct, sc := e.Status.SCT(), e.Status.SC()
	switch target {
	case ErrMedia:
		return sct == SCTMedia || (sct == SCTGeneric && sc == 0x04) // data transfer error
	case ErrPath:
		return sct == SCTPath
	case ErrInvalidCommand:
		return sct == SCTGeneric && (sc == 0x01 || sc == 0x02 || sc == 0x0B)
	case ErrRange:
		return sct == SCTGeneric && (sc == 0x80 || sc == 0x81)
	}
	return false
}

// Temporary reports whether the command may succeed when retried.
func (e *StatusError) Temporary() bool { return !e.Status.DNR() }

func opcodeName(op uint8, admin bool) string {
	if admin {
		switch op {
		case AdminGetLogPage:
			return "get-log-page"
		case AdminIdentify:
			return "identify"
		case AdminGetFeatures:
			return "get-features"
		}
		return fmt.Sprintf("opcode %#02x", op)
	}
	switch op {
	case OpFlush:
		return "flush"
	case OpWrite:
		return "write"
	case OpRead:
		return "read"
	case OpIOMgmtRecv:
		return "io-mgmt-recv"
	}
	return fmt.Sprintf("opcode %#02x", op)
}

var statusNames = map[uint16]string{
	// Generic command status.
	0x000: "success",
	0x001: "invalid command opcode",
	0x002: "invalid field in command",
	0x003: "command id conflict",
	0x004: "data transfer error",
	0x005: "aborted: power loss notification",
	0x006: "internal error",
	0x007: "aborted: requested",
	0x008: "aborted: SQ deleted",
	0x009: "aborted: failed fused command",
	0x00A: "aborted: missing fused command",
	0x00B: "invalid namespace or format",
	0x00C: "command sequence error",
	0x00D: "invalid SGL segment descriptor",
	0x00F: "invalid SGL data length",
	0x015: "invalid controller memory buffer use",
	0x016: "PRP offset invalid",
	0x020: "namespace is write protected",
	0x021: "command interrupted",
	0x022: "transient transport error",
	0x080: "LBA out of range",
	0x081: "capacity exceeded",
	0x082: "namespace not ready",
	0x083: "reservation conflict",
	0x084: "format in progress",
	// Command specific status.
	0x101: "invalid completion queue",
	0x102: "invalid queue identifier",
	0x109: "invalid log page",
	0x10A: "invalid format",
	0x10D: "feature identifier not saveable",
	0x10E: "feature not changeable",
	0x10F: "feature not namespace specific",
	0x180: "conflicting attributes",
	0x181: "invalid protection information",
	0x182: "attempted write to read only range",
	0x183: "command size limit exceeded",
	// Media and data integrity errors.
	0x280: "write fault",
	0x281: "unrecovered read error",
	0x282: "end-to-end guard check error",
	0x283: "end-to-end application tag check error",
	0x284: "end-to-end reference tag check error",
	0x285: "compare failure",
	0x286: "access denied",
	0x287: "deallocated or unwritten logical block",
	// Path related status.
	0x300: "internal path error",
	0x301: "asymmetric access persistent loss",
	0x302: "asymmetric access inaccessible",
	0x303: "asymmetric access transition",
	0x360: "controller pathing error",
	0x370: "host pathing error",
	0x371: "command aborted by host",
}

func statusName(s Status) string {
	if n, ok := statusNames[uint16(s.SCT())<<8|uint16(s.SC())]; ok {
		return n
	}
	switch s.SCT() {
	case SCTGeneric:
		return "generic status"
	case SCTCommandSpecific:
		return "command specific status"
	case SCTMedia:
		return "media error"
	case SCTPath:
		return "path error"
	case SCTVendor:
		return "vendor specific"
	}
	return "reserved status type"
}
