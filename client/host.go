package client

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/kvfs/kvfs/ctl/abi"
)

// HostBuffer is shared memory mapped into this process and registered with
// the daemon.
type HostBuffer struct {
	ID BufferID
	// Path names the memory: the file for OpenHostBuffer, "memfd:NAME" for
	// NewHostBuffer (anonymous memory, not a path).
	Path string
	Mem  []byte // the mapping, len = registered size
	// Pinned is true when the daemon's engine pinned the memory for
	// zero-copy fixed-buffer I/O (REGISTER_FD reports it; false when
	// unknown).
	Pinned bool

	c     *Client
	unpin func() error // Pin's undoing
}

// Pin page-locks the buffer's memory through pin, once: pin receives the
// mapping and returns the undoing, which Close runs before it unmaps the
// memory; Pin on a buffer already pinned does nothing. client/cudaclient's
// PinHost pins for CUDA this way, so that a program using only this package
// does not link the CUDA binding.
func (b *HostBuffer) Pin(pin func(mem []byte) (unpin func() error, err error)) error {
	if b.unpin != nil {
		return nil
	}
	if len(b.Mem) == 0 {
		return &Error{Op: "pin", Errno: unix.EBADF}
	}
	unpin, err := pin(b.Mem)
	if err != nil {
		return err
	}
	b.unpin = unpin
	return nil
}

// NewHostBuffer creates size bytes of shared memory, allocates them (so
// the daemon may pin them without allocating anything itself), maps and
// registers them. Nothing of it has a name in a file system: with a daemon
// that has REGISTER_FD it is a memfd; with an older one a /dev/shm file that
// is unlinked as soon as it is registered. So a process killed at any point
// after NewHostBuffer returned leaves nothing behind. name (optional) is the
// memfd's name, for /proc/<pid>/maps. Close, or closing the Client, frees
// it.
func (c *Client) NewHostBuffer(name string, size int64) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("kvfs client: host buffer of %d bytes", size)
	}
	if name == "" {
		name = fmt.Sprintf("kvfs-%d-%016x", os.Getpid(), rand.Uint64())
	}
	if c.info.Has(abi.CapRegisterFD) {
		fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("kvfs client: memfd_create: %w", err)
		}
		f := os.NewFile(uintptr(fd), "memfd:"+name)
		defer f.Close()
		if err := allocate(f, size); err != nil {
			return nil, err
		}
		return c.mapAndRegister(f, "memfd:"+name, size)
	}
	// A daemon without REGISTER_FD: a /dev/shm file, unlinked once registered.
	path := filepath.Join(ShmDir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	defer f.Close()
	defer os.Remove(path)
	if err := allocate(f, size); err != nil {
		return nil, err
	}
	return c.mapAndRegister(f, path, size)
}

// allocate sizes f and allocates its pages (tmpfs fallocate), so the
// memory exists before the daemon maps it.
func allocate(f *os.File, size int64) error {
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("kvfs client: size %s: %w", f.Name(), err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil && !errors.Is(err, unix.EOPNOTSUPP) {
		return fmt.Errorf("kvfs client: allocate %d bytes of %s: %w", size, f.Name(), err)
	}
	return nil
}

// OpenHostBuffer maps and registers an existing file on tmpfs or hugetlbfs
// (for example in /dev/shm): its first size bytes, or all of it when size is
// 0. The file is opened here, read-write, so the kernel decides whether this
// process may use it. Close leaves the file in place.
func (c *Client) OpenHostBuffer(path string, size int64) (*HostBuffer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	if size == 0 {
		size = st.Size()
	}
	if size <= 0 || size > st.Size() {
		return nil, fmt.Errorf("kvfs client: %s has %d bytes, %d wanted", path, st.Size(), size)
	}
	return c.mapAndRegister(f, path, size)
}

func (c *Client) mapAndRegister(f *os.File, path string, size int64) (*HostBuffer, error) {
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: mmap %s: %w", path, err)
	}
	b := &HostBuffer{Path: path, Mem: mem, c: c}
	if c.info.Has(abi.CapRegisterFD) {
		b.ID, b.Pinned, err = c.registerFD(int(f.Fd()), size)
	} else {
		b.ID, err = c.RegisterHost(path, size)
	}
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	if err := c.own(b); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// Close unregisters and unmaps the buffer.
func (b *HostBuffer) Close() error {
	b.c.disown(b)
	return b.close()
}

func (b *HostBuffer) close() error {
	if b.Mem == nil {
		return nil
	}
	var uerr error
	if b.unpin != nil {
		uerr, b.unpin = b.unpin(), nil
	}
	err := b.c.Unregister(b.ID)
	if errors.Is(err, unix.EBADF) {
		err = nil // the client was closed first: the registration is gone
	}
	if e := unix.Munmap(b.Mem); err == nil {
		err = e
	}
	b.Mem = nil
	return errors.Join(err, uerr)
}
