package client

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
	"github.com/kvfs/kvfs/layout"
)

// CtlPath is the control file relative to the mount point.
const CtlPath = ".kvfs/ctl"

// ShmDir is where host buffers live.
const ShmDir = "/dev/shm"

// ErrVersion is returned by Open when the daemon speaks another ABI.
var ErrVersion = errors.New("kvfs client: daemon speaks another ABI version")

// Status is the outcome of one entry; Detail says why one is BadRequest.
type (
	Status = abi.Status
	Detail = abi.Detail
)

// Entry statuses.
const (
	OK         = abi.OK
	Absent     = abi.Absent
	Corrupt    = abi.Corrupt
	BadRequest = abi.BadRequest
	IOError    = abi.IOError
	NoSpace    = abi.NoSpace
)

// BufferID names a registration.
type BufferID uint32

// Entry is one group to move: Key's tile goes to (LOAD) or comes from
// (STORE) the registered buffer at Offset. Pitch 0 means the tile's rows are
// packed (GroupBytes contiguous bytes); otherwise row r is at
// Offset + r×Pitch, each row RowBytes long.
type Entry struct {
	Key    layout.Key
	Buffer BufferID
	Offset uint64
	Pitch  uint32
}

// Info describes the daemon and its store.
type Info struct {
	ABI                uint32
	Caps               uint64
	Geometry           layout.Geometry
	GroupBytes         int
	GroupStride        int64
	RowBytes           int
	GroupsPerBlock     int
	MaxEntries         int // per ioctl
	MaxEntriesSmall    int
	MaxBuffers         int   // registrations per open file
	MaxRegisteredBytes int64 // per open file
	Slots, UsedSlots   int64
	UUID               [16]byte
	Engine             string
	ABIMinor           uint32 // 0 for a daemon before minor 1
	// Pinning limits (0 when the engine pins nothing, or an older daemon):
	// daemon-wide, per uid, and pinned now by all callers.
	MaxPinnedBytes, MaxPinnedPerUID, PinnedBytes int64
	// MaxBlockEntries: block entries per LOAD_BLOCKS/STORE_BLOCKS (0
	// without abi.CapBlocks).
	MaxBlockEntries int
}

// Has reports whether the daemon has capability cap (abi.Cap*).
func (i Info) Has(cap uint64) bool { return i.Caps&cap != 0 }

// Error is a failed ioctl.
type Error struct {
	Op    string
	Errno syscall.Errno
}

func (e *Error) Error() string {
	if r := reason(e.Op, e.Errno); r != "" {
		return fmt.Sprintf("kvfs client: %s: %s (%v)", e.Op, r, e.Errno)
	}
	return fmt.Sprintf("kvfs client: %s: %v", e.Op, e.Errno)
}

func (e *Error) Unwrap() error { return e.Errno }

// reason explains an errno as docs/abi.md defines it.
func reason(op string, e syscall.Errno) string {
	switch e {
	case syscall.EPROTO:
		return "daemon speaks another ABI version"
	case syscall.ENOTTY:
		return "not a kvfs control file, or unknown command"
	case syscall.EBADF:
		return "session closed"
	case syscall.EFAULT:
		return "registered memory faulted (was the file shrunk?)"
	case syscall.EROFS:
		return "store is read-only"
	}
	if op == "register-fd" {
		switch e {
		case syscall.EBADF:
			return "not an open descriptor (O_PATH or closed)"
		case syscall.ESRCH:
			return "the daemon cannot see this process (another pid namespace?)"
		case syscall.EPERM:
			return "immutable or sealed file, or the daemon may not take descriptors of this process"
		case syscall.EACCES:
			return "descriptor not open read-write, or append-only file"
		case syscall.ENOMEM:
			return "over the pinned-memory limit (RLIMIT_MEMLOCK, or the daemon's per-uid or total cap)"
		}
		op = "register"
	}
	if op == "register-cuda" {
		switch e {
		case syscall.ENODEV:
			return "the daemon has no usable GPU (no CUDA driver or device, no such ordinal, or --gpu=false)"
		case syscall.EINVAL:
			return "the driver refused the IPC handle (not cuIpcGetMemHandle of an allocation's base, or the exporter is gone), or malformed request"
		case syscall.ERANGE:
			return "offset+length beyond the allocation, or length zero"
		case syscall.EACCES:
			return "this process may not open the GPU device files itself"
		case syscall.ESRCH:
			return "the daemon cannot see this process (another pid namespace?)"
		case syscall.EMFILE:
			return "too many buffers registered on this handle"
		case syscall.EDQUOT:
			return "registered-bytes limit of this handle"
		}
		return ""
	}
	if op != "register" {
		if e == syscall.ENOENT && op == "unregister" {
			return "no such buffer on this handle"
		}
		return ""
	}
	switch e {
	case syscall.EPERM:
		return "file is not inside " + ShmDir + ", is immutable, or the daemon cannot take this process's credentials"
	case syscall.ESRCH:
		return "the daemon cannot see this process (another pid namespace?)"
	case syscall.ENOMEM:
		return "over the pinned-memory limit (RLIMIT_MEMLOCK, or the daemon's per-uid or total cap)"
	case syscall.ELOOP:
		return "path has a symbolic link"
	case syscall.EACCES:
		return "caller may not open the file read-write"
	case syscall.EBADF:
		return "not an open descriptor"
	case syscall.EINVAL:
		return "not a regular file, or malformed request"
	case syscall.EXDEV:
		return "file is not on tmpfs or hugetlbfs"
	case syscall.ERANGE:
		return "length is zero or beyond the end of the file"
	case syscall.EMFILE:
		return "too many buffers registered on this handle"
	case syscall.EDQUOT:
		return "registered-bytes limit of this handle"
	case syscall.ENOENT:
		return "no such file"
	}
	return ""
}

// Client is an open control file.
type Client struct {
	f    *os.File
	fd   uintptr
	info Info
	bufs sync.Pool // *[abi.BatchSize]byte

	// mu is held shared around every ioctl and exclusively by Close, so
	// an ioctl never reaches a descriptor number reused after Close.
	mu     sync.RWMutex
	closed bool

	owned struct {
		sync.Mutex
		bufs   map[*HostBuffer]struct{}
		closed bool
	}
	blk blockState // targets and entry arrays (blocks.go)
}

// Open opens mountpoint's control file and checks the daemon's ABI version.
func Open(mountpoint string) (*Client, error) {
	return OpenCtl(filepath.Join(mountpoint, CtlPath))
}

// OpenCtl opens the control file at path.
func OpenCtl(path string) (*Client, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	c := &Client{f: f, fd: f.Fd()}
	c.bufs.New = func() any { return new([abi.BatchSize]byte) }
	var raw [abi.InfoSize]byte
	if err := c.ioctl("info", abi.CmdInfo, raw[:]); err != nil {
		f.Close()
		return nil, err
	}
	var i abi.Info
	i.Unmarshal(raw[:])
	if i.ABI != abi.Version {
		f.Close()
		return nil, fmt.Errorf("%w: %d, this client speaks %d", ErrVersion, i.ABI, abi.Version)
	}
	c.info = Info{
		ABI: i.ABI, Caps: i.Caps,
		Geometry: layout.Geometry{Layers: int(i.Layers), KVHeads: int(i.KVHeads), HeadDim: int(i.HeadDim),
			BlockTokens: int(i.BlockTokens), DType: layout.DType(i.DType), Align: int(i.Align)},
		GroupBytes: int(i.GroupBytes), GroupStride: int64(i.GroupStride), RowBytes: int(i.RowBytes),
		GroupsPerBlock: int(i.GroupsPerBlock), MaxEntries: int(i.MaxEntries), MaxEntriesSmall: int(i.MaxEntriesSmall),
		MaxBuffers: int(i.MaxBuffers), MaxRegisteredBytes: int64(i.MaxRegisteredBytes),
		Slots: int64(i.Slots), UsedSlots: int64(i.UsedSlots), UUID: i.UUID, Engine: i.EngineName(),
	}
	if i.Caps&abi.CapLimits != 0 {
		c.info.ABIMinor = i.ABIMinor
		c.info.MaxPinnedBytes, c.info.MaxPinnedPerUID = int64(i.MaxPinnedBytes), int64(i.MaxPinnedPerUID)
		c.info.PinnedBytes = int64(i.PinnedBytes)
	}
	if i.Caps&abi.CapBlocks != 0 {
		c.info.MaxBlockEntries = int(i.MaxBlockEntries)
	}
	return c, nil
}

// Info is what the daemon reported at Open.
func (c *Client) Info() Info { return c.info }

// Fd is the control file's descriptor (for poking at the raw ABI).
func (c *Client) Fd() uintptr { return c.fd }

// Close closes the host buffers the client created or opened, then the
// control file; the daemon drops every registration of it.
func (c *Client) Close() error {
	c.closeTargets()
	c.owned.Lock()
	bufs := c.owned.bufs
	c.owned.bufs, c.owned.closed = nil, true
	c.owned.Unlock()
	for b := range bufs {
		b.close()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	return c.f.Close()
}

// Ioctl issues one raw ioctl on the control file: arg must be
// _IOC_SIZE(cmd) bytes. It returns ioctl's result.
func (c *Client) Ioctl(cmd uint32, arg []byte) (int, error) {
	var p unsafe.Pointer
	if len(arg) > 0 {
		p = unsafe.Pointer(&arg[0])
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return 0, unix.EBADF
	}
	for {
		r, _, e := unix.Syscall(unix.SYS_IOCTL, c.fd, uintptr(cmd), uintptr(p))
		if e == unix.EINTR {
			continue // every command is idempotent
		}
		if e != 0 {
			return 0, e
		}
		return int(int32(r)), nil
	}
}

func (c *Client) ioctl(op string, cmd uint32, arg []byte) error {
	if _, err := c.Ioctl(cmd, arg); err != nil {
		return &Error{Op: op, Errno: err.(syscall.Errno)}
	}
	return nil
}

// RegisterHost registers the first size bytes (0: all) of path, a file
// directly or indirectly inside /dev/shm that the calling thread may open
// read-write (the daemon opens it with this thread's credentials).
// RegisterFD and the HostBuffer functions register a descriptor instead.
func (c *Client) RegisterHost(path string, size int64) (BufferID, error) {
	if size < 0 {
		return 0, &Error{Op: "register", Errno: syscall.ERANGE}
	}
	r := abi.RegisterHost{ABI: abi.Version, Length: uint64(size)}
	if !r.SetPath(path) {
		return 0, &Error{Op: "register", Errno: syscall.ENAMETOOLONG}
	}
	var raw [abi.RegisterHostSize]byte
	r.Marshal(raw[:])
	if err := c.ioctl("register", abi.CmdRegisterHost, raw[:]); err != nil {
		return 0, fmt.Errorf("%w: %s", err, path)
	}
	r.Unmarshal(raw[:])
	return BufferID(r.Buffer), nil
}

// RegisterFD registers the first size bytes (0: all) of the file open as
// fd in this process, read-write, on tmpfs or hugetlbfs (a memfd, a
// /dev/shm file). The daemon takes the descriptor itself (pidfd_getfd), so
// fd may be closed once this returns. Needs a daemon with abi.CapRegisterFD.
func (c *Client) RegisterFD(fd int, size int64) (BufferID, error) {
	id, _, err := c.registerFD(fd, size)
	return id, err
}

func (c *Client) registerFD(fd int, size int64) (BufferID, bool, error) {
	if size < 0 {
		return 0, false, &Error{Op: "register-fd", Errno: syscall.ERANGE}
	}
	if fd < 0 || fd > math.MaxInt32 {
		return 0, false, &Error{Op: "register-fd", Errno: syscall.EBADF}
	}
	r := abi.RegisterFD{ABI: abi.Version, Length: uint64(size), FD: int32(fd)}
	var raw [abi.RegisterFDSize]byte
	r.Marshal(raw[:])
	if err := c.ioctl("register-fd", abi.CmdRegisterFD, raw[:]); err != nil {
		return 0, false, err
	}
	r.Unmarshal(raw[:])
	return BufferID(r.Buffer), r.Pinned != 0, nil
}

// RegisterCUDA registers length bytes at offset inside a CUDA allocation of
// this process: handle is cuIpcGetMemHandle of the allocation's base
// (cuMemGetAddressRange gives the base of a pointer), device the ordinal
// as the daemon's driver numbers devices (the same CUDA_VISIBLE_DEVICES in
// both, or unset). The daemon opens the handle with cuIpcOpenMemHandle and
// checks offset+length against the allocation; the allocation must stay
// alive until Unregister or Close. Needs a daemon with abi.CapCUDA
// (ENODEV otherwise). CUDA forbids opening a handle in the process that
// exported it, so the daemon must be another process.
func (c *Client) RegisterCUDA(handle [64]byte, offset, length uint64, device int) (BufferID, error) {
	if length == 0 || offset+length < offset {
		return 0, &Error{Op: "register-cuda", Errno: syscall.ERANGE}
	}
	if device < 0 || device > math.MaxInt32 {
		return 0, &Error{Op: "register-cuda", Errno: syscall.ENODEV}
	}
	r := abi.RegisterCUDA{ABI: abi.Version, Handle: handle, Offset: offset, Length: length, Device: uint32(device)}
	var raw [abi.RegisterCUDASize]byte
	r.Marshal(raw[:])
	if err := c.ioctl("register-cuda", abi.CmdRegisterCUDA, raw[:]); err != nil {
		return 0, err
	}
	r.Unmarshal(raw[:])
	return BufferID(r.Buffer), nil
}

func (c *Client) own(b *HostBuffer) error {
	c.owned.Lock()
	defer c.owned.Unlock()
	if c.owned.closed {
		return &Error{Op: "register", Errno: syscall.EBADF}
	}
	if c.owned.bufs == nil {
		c.owned.bufs = map[*HostBuffer]struct{}{}
	}
	c.owned.bufs[b] = struct{}{}
	return nil
}

func (c *Client) disown(b *HostBuffer) {
	c.owned.Lock()
	delete(c.owned.bufs, b)
	c.owned.Unlock()
}

// Unregister drops a registration.
func (c *Client) Unregister(id BufferID) error {
	var raw [abi.UnregisterSize]byte
	(&abi.Unregister{ABI: abi.Version, Buffer: uint32(id)}).Marshal(raw[:])
	return c.ioctl("unregister", abi.CmdUnregister, raw[:])
}

// Load reads the entries' groups into their buffers, in as many ioctls as
// needed (MaxEntries per ioctl). Each entry gets a status; err is for a
// failure of a whole ioctl.
func (c *Client) Load(es []Entry) ([]Status, error) {
	st := make([]Status, len(es))
	_, err := c.Batch(true, es, st, nil)
	return st, err
}

// Store writes the entries' groups from their buffers, durably.
func (c *Client) Store(es []Entry) ([]Status, error) {
	st := make([]Status, len(es))
	_, err := c.Batch(false, es, st, nil)
	return st, err
}

// MaxInFlight is how many ioctls one Load or Store of more than MaxEntries
// entries keeps in flight at once. The daemon serves them in parallel, which
// hides the per-ioctl round trip.
const MaxInFlight = 4

// Batch is Load (load) or Store without allocation: statuses go to st (and
// details to det when it is not nil), both len(es) long. It returns the
// number of entries with status OK. Batches of more than MaxEntries entries
// go out as several ioctls, up to MaxInFlight at a time; when one fails,
// the error is returned and the statuses of its entries are left as they
// were.
func (c *Client) Batch(load bool, es []Entry, st []Status, det []Detail) (int, error) {
	if len(st) < len(es) || (det != nil && len(det) < len(es)) {
		return 0, fmt.Errorf("kvfs client: %d statuses for %d entries", len(st), len(es))
	}
	if len(es) <= abi.BatchMax {
		return c.chunk(load, es, st, det)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		nok   int
		first error
		sem   = make(chan struct{}, MaxInFlight)
	)
	for lo := 0; lo < len(es); lo += abi.BatchMax {
		hi := min(len(es), lo+abi.BatchMax)
		var d []Detail
		if det != nil {
			d = det[lo:hi]
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			n, err := c.chunk(load, es[lo:hi], st[lo:hi], d)
			mu.Lock()
			nok += n
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return nok, first
}

// chunk issues one LOAD or STORE of at most MaxEntries entries.
func (c *Client) chunk(load bool, es []Entry, st []Status, det []Detail) (int, error) {
	raw := c.bufs.Get().(*[abi.BatchSize]byte)
	defer c.bufs.Put(raw)
	op, cm, arg := "load", abi.CmdLoad, raw[:abi.BatchSize]
	if !load {
		op, cm = "store", abi.CmdStore
	}
	n := len(es)
	if n <= abi.BatchSmallMax {
		arg = raw[:abi.BatchSmallSz]
		if cm = abi.CmdLoadSmall; !load {
			cm = abi.CmdStoreSmall
		}
	}
	(&abi.BatchHeader{ABI: abi.Version, Count: uint32(n)}).Marshal(arg)
	for i := range es {
		e := &es[i]
		ae := abi.Entry{Block: e.Key.Block, Layer: uint16(e.Key.Layer), Head: uint16(e.Key.Head), Kind: uint8(e.Key.Kind),
			Buffer: uint32(e.Buffer), Offset: e.Offset, Pitch: e.Pitch}
		if e.Key.Layer < 0 || e.Key.Layer > 0xffff || e.Key.Head < 0 || e.Key.Head > 0xffff {
			ae.Layer, ae.Head = 0xffff, 0xffff // out of any geometry: the daemon says BadKey
		}
		ae.Marshal(arg[abi.BatchHeaderSize+i*abi.EntrySize:])
	}
	if _, err := c.Ioctl(cm, arg); err != nil {
		return 0, &Error{Op: op, Errno: err.(syscall.Errno)}
	}
	nok := 0
	for i := range n {
		b := arg[abi.BatchHeaderSize+i*abi.EntrySize:]
		st[i] = Status(b[abi.EntryStatusOff])
		if det != nil {
			det[i] = Detail(b[abi.EntryDetailOff])
		}
		if st[i] == OK {
			nok++
		}
	}
	return nok, nil
}
