package nvme

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// CtrlPath is one controller through which a namespace is reached: the
// namespace's only controller, or one path of a multipath namespace.
type CtrlPath struct {
	Name      string `json:"name"`      // controller, e.g. nvme1
	Transport string `json:"transport"` // pcie, tcp, rdma, fc, loop
	Address   string `json:"address"`   // pcie: the PCI address; fabrics: "traddr=…,trsvcid=…"
	SubsysNQN string `json:"subsysnqn"`
	State     string `json:"state"` // live, connecting, resetting, …
}

// Fabric reports whether the path crosses NVMe over Fabrics (any transport
// but PCIe).
func (p CtrlPath) Fabric() bool { return p.Transport != "" && p.Transport != "pcie" }

// Attachment is how a namespace is attached to this host: its controller
// paths, read from sysfs.
type Attachment struct {
	Subsystem string     `json:"subsystem,omitempty"` // nvme-subsysN for a multipath head, "" for a single controller
	SubsysNQN string     `json:"subsysnqn"`
	Paths     []CtrlPath `json:"paths"`
}

// Fabric reports whether any path to the namespace is an NVMe over
// Fabrics one.
func (a *Attachment) Fabric() bool {
	for _, p := range a.Paths {
		if p.Fabric() {
			return true
		}
	}
	return false
}

// Transport is the transport of the first path ("" without paths).
func (a *Attachment) Transport() string {
	if len(a.Paths) == 0 {
		return ""
	}
	return a.Paths[0].Transport
}

// String is one line for logs and kvfs info: "fabric: tcp traddr=…
// (nqn …, nvme1 live)" or "local: pcie 0000:00:04.0 (nqn …, nvme0 live)".
func (a *Attachment) String() string {
	var b strings.Builder
	if a.Fabric() {
		b.WriteString("fabric: ")
	} else {
		b.WriteString("local: ")
	}
	for i, p := range a.Paths {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s %s (%s %s)", p.Transport, p.Address, p.Name, p.State)
	}
	if len(a.Paths) == 0 {
		b.WriteString("no controller path")
	}
	fmt.Fprintf(&b, ", subsysnqn %s", a.SubsysNQN)
	return b.String()
}

// Attach reads from sysfs how the NVMe namespace at path (a block device
// /dev/nvmeXnY or a generic char device /dev/ngXnY, or a link to one) is
// attached: the controller behind it or, for a multipath head, every
// controller of its subsystem, each with its transport and address.
func Attach(path string) (*Attachment, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return nil, fmt.Errorf("nvme: %s: %w", path, err)
	}
	kind := ""
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFBLK:
		kind = "block"
	case unix.S_IFCHR:
		kind = "char"
	default:
		return nil, fmt.Errorf("%w: %s is not a device", ErrNotNVMe, path)
	}
	dir := filepath.Join(sysfsRoot, "dev", kind, fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)))
	a, err := attachAt(dir)
	if err != nil {
		return nil, fmt.Errorf("nvme: %s: %w", path, err)
	}
	return a, nil
}

var (
	ctrlName   = regexp.MustCompile(`^nvme[0-9]+$`)
	subsysName = regexp.MustCompile(`^nvme-subsys[0-9]+$`)
)

// attachAt reads the attachment of the namespace whose sysfs directory is
// devDir (/sys/dev/block/MAJ:MIN or /sys/dev/char/MAJ:MIN). Its "device"
// link leads to the controller (one path) or to the subsystem of a
// multipath head, whose controllers are links named nvmeN inside it.
func attachAt(devDir string) (*Attachment, error) {
	parent, err := filepath.EvalSymlinks(filepath.Join(devDir, "device"))
	if err != nil {
		return nil, fmt.Errorf("%w: no sysfs device link: %w", ErrNotNVMe, err)
	}
	base := filepath.Base(parent)
	switch {
	case ctrlName.MatchString(base):
		p, err := readCtrl(parent)
		if err != nil {
			return nil, err
		}
		return &Attachment{SubsysNQN: p.SubsysNQN, Paths: []CtrlPath{p}}, nil
	case subsysName.MatchString(base):
		a := &Attachment{Subsystem: base, SubsysNQN: readSysString(filepath.Join(parent, "subsysnqn"))}
		ents, err := os.ReadDir(parent)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrNotNVMe, err)
		}
		for _, e := range ents {
			if !ctrlName.MatchString(e.Name()) {
				continue
			}
			p, err := readCtrl(filepath.Join(parent, e.Name()))
			if err != nil {
				return nil, err
			}
			a.Paths = append(a.Paths, p)
		}
		sort.Slice(a.Paths, func(i, j int) bool { return ctrlLess(a.Paths[i].Name, a.Paths[j].Name) })
		if len(a.Paths) == 0 {
			return nil, fmt.Errorf("%w: subsystem %s has no controller", ErrNotNVMe, base)
		}
		return a, nil
	}
	return nil, fmt.Errorf("%w: sysfs parent %s is neither an NVMe controller nor a subsystem", ErrNotNVMe, base)
}

func ctrlLess(a, b string) bool {
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

// readCtrl reads one controller's sysfs directory; a directory without a
// transport attribute is not an NVMe controller.
func readCtrl(dir string) (CtrlPath, error) {
	p := CtrlPath{Name: filepath.Base(dir)}
	b, err := os.ReadFile(filepath.Join(dir, "transport"))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return p, fmt.Errorf("%w: %s has no transport attribute", ErrNotNVMe, p.Name)
		}
		return p, err
	}
	p.Transport = strings.TrimSpace(string(b))
	p.Address = readSysString(filepath.Join(dir, "address"))
	p.SubsysNQN = readSysString(filepath.Join(dir, "subsysnqn"))
	p.State = readSysString(filepath.Join(dir, "state"))
	return p, nil
}

func readSysString(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	// Fabric addresses are one line; some kernels end them with a NUL.
	return strings.TrimRight(strings.TrimSpace(string(b)), "\x00")
}
