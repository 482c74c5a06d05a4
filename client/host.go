package client

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// HostBuffer is a file of /dev/shm mapped into this process and registered
// with the daemon.
type HostBuffer struct {
	ID   BufferID
	Path string
	Mem  []byte // the mapping, len = registered size

	c      *Client
	unlink bool
}

// NewHostBuffer creates /dev/shm/<name> (mode 0600; a unique name when name
// is empty), sizes it, maps it and registers it. Close undoes all of it,
// including the file.
func (c *Client) NewHostBuffer(name string, size int64) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("kvfs client: host buffer of %d bytes", size)
	}
	if name == "" {
		name = fmt.Sprintf("kvfs-%d-%016x", os.Getpid(), rand.Uint64())
	}
	path := filepath.Join(ShmDir, name)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	b, err := c.mapAndRegister(f, path, size, true)
	f.Close()
	if err != nil {
		os.Remove(path)
		return nil, err
	}
	return b, nil
}

// OpenHostBuffer maps and registers an existing file of /dev/shm: its first
// size bytes, or all of it when size is 0. Close leaves the file in place.
func (c *Client) OpenHostBuffer(path string, size int64) (*HostBuffer, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	defer f.Close()
	return c.mapAndRegister(f, path, size, false)
}

func (c *Client) mapAndRegister(f *os.File, path string, size int64, create bool) (*HostBuffer, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("kvfs client: %w", err)
	}
	if create {
		if err := f.Truncate(size); err != nil {
			return nil, fmt.Errorf("kvfs client: size %s: %w", path, err)
		}
	} else if size == 0 {
		size = st.Size()
	}
	if size <= 0 || size > st.Size() && !create {
		return nil, fmt.Errorf("kvfs client: %s has %d bytes, %d wanted", path, st.Size(), size)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("kvfs client: mmap %s: %w", path, err)
	}
	id, err := c.RegisterHost(path, size)
	if err != nil {
		unix.Munmap(mem)
		return nil, err
	}
	return &HostBuffer{ID: id, Path: path, Mem: mem, c: c, unlink: create}, nil
}

// Close unregisters and unmaps the buffer, and removes its file when
// NewHostBuffer created it.
func (b *HostBuffer) Close() error {
	if b.Mem == nil {
		return nil
	}
	err := b.c.Unregister(b.ID)
	if errors.Is(err, unix.EBADF) {
		err = nil // the client was closed first: the registration is gone
	}
	if e := unix.Munmap(b.Mem); err == nil {
		err = e
	}
	b.Mem = nil
	if b.unlink {
		if e := os.Remove(b.Path); err == nil && e != nil && !errors.Is(e, os.ErrNotExist) {
			err = e
		}
	}
	return err
}
