package store

import (
	"fmt"
	"io"
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

// WrittenBytes reports how many bytes of the regular file path hold
// written data, and its size. Holes and unwritten extents (allocated by
// fallocate, as PrepareFile does, but never written) are not counted: the
// file system answers reads of them with zeros and no device I/O, so a
// benchmark reading them (fio on a fresh store file) measures memory, not
// the device. It asks the file system with lseek SEEK_DATA/SEEK_HOLE; where
// those are not supported the whole file counts as written.
func WrittenBytes(path string) (written, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if !st.Mode().IsRegular() {
		return 0, 0, fmt.Errorf("store: %s is not a regular file", path)
	}
	size = st.Size()
	written = size
	err = holes(int(f.Fd()), size, func(lo, hi int64) error {
		written -= hi - lo
		return nil
	})
	return written, size, err
}

// holes calls f with each hole [lo, hi) of the file fd of size bytes, in
// order; unwritten extents count as holes where the file system says so.
func holes(fd int, size int64, f func(lo, hi int64) error) error {
	for off := int64(0); off < size; {
		lo, err := unix.Seek(fd, off, unix.SEEK_HOLE)
		if err == unix.ENXIO || (err == nil && lo >= size) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("store: seek hole: %w", err)
		}
		hi, err := unix.Seek(fd, lo, unix.SEEK_DATA)
		if err == unix.ENXIO {
			hi, err = size, nil
		}
		if err != nil {
			return fmt.Errorf("store: seek data: %w", err)
		}
		hi = min(hi, size)
		if hi <= lo {
			return fmt.Errorf("store: seek data at %d gave %d", lo, hi)
		}
		if err := f(lo, hi); err != nil {
			return err
		}
		off = hi
	}
	return nil
}

// zeroChunk is the size of one write of ZeroFile.
const zeroChunk = 8 << 20

// ZeroFile writes zeros over every hole and unwritten extent of the regular
// file path (what WrittenBytes does not count) and makes them durable, so
// that every byte of the file is written data: reads of any part of it go
// to the device, and the first write into an unwritten extent no longer
// converts it (a metadata change its fdatasync would have to commit). It
// writes with O_DIRECT where the file system allows it (no page cache
// filled with zeros) and leaves written data as it is. A block device is
// refused. progress, when not nil, is called with the bytes zeroed so far
// and the bytes to zero (found first).
func ZeroFile(path string, progress func(done, total int64)) error {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("store: zero %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("store: zero %s: not a regular file", path)
	}
	// Writes go through a second, O_DIRECT descriptor while the file
	// system takes them; a piece it refuses (EINVAL: no O_DIRECT there,
	// or an unaligned end) is written through f.
	wfd := int(f.Fd())
	if d, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0); err == nil {
		defer unix.Close(d)
		wfd = d
	}
	// Anonymous memory is page-aligned and zero, as O_DIRECT wants.
	buf, err := unix.Mmap(-1, 0, zeroChunk, unix.PROT_READ, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("store: zero %s: %w", path, err)
	}
	defer unix.Munmap(buf)
	var total, done int64
	if progress != nil {
		if err := holes(int(f.Fd()), st.Size(), func(lo, hi int64) error { total += hi - lo; return nil }); err != nil {
			return err
		}
		progress(0, total)
	}
	err = holes(int(f.Fd()), st.Size(), func(lo, hi int64) error {
		for off := lo; off < hi; {
			n := int(min(hi-off, zeroChunk))
			w, err := unix.Pwrite(wfd, buf[:n], off)
			if err == unix.EINVAL && wfd != int(f.Fd()) {
				w, err = unix.Pwrite(int(f.Fd()), buf[:n], off)
			}
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return fmt.Errorf("store: zero %s at %d: %w", path, off, err)
			}
			if w == 0 {
				return fmt.Errorf("store: zero %s at %d: %w", path, off, io.ErrShortWrite)
			}
			off += int64(w)
			if progress != nil {
				done += int64(w)
				progress(done, max(total, done))
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("store: zero %s: %w", path, err)
	}
	return nil
}
