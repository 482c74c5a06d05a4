package store

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// PrepareFile creates path as a regular file of size bytes, or resizes an
// existing regular file, allocating its blocks (fallocate) so later writes
// need no metadata changes. A block device is left as it is; size must then
// be 0 or fit it.
func PrepareFile(path string, size int64) error {
	st, err := os.Stat(path)
	if err == nil && st.Mode()&os.ModeDevice != 0 {
		return nil
	}
	if err == nil && !st.Mode().IsRegular() {
		return fmt.Errorf("store: %s is neither a regular file nor a block device", path)
	}
	if size <= 0 {
		if err == nil {
			return nil
		}
		return fmt.Errorf("store: %s does not exist and no size was given", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("store: create %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("store: size %s: %w", path, err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, size); err != nil && err != unix.EOPNOTSUPP {
		return fmt.Errorf("store: allocate %d bytes for %s: %w", size, path, err)
	}
	return f.Sync()
}

// Lock takes an exclusive, non-blocking lock on path for the life of the
// returned file; a second process gets ErrLocked. Close the file to unlock.
func Lock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if err == unix.EWOULDBLOCK {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("store: lock %s: %w", path, err)
	}
	return f, nil
}
