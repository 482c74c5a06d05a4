package ctl

import (
	"fmt"
	"math"
	"strings"

	"golang.org/x/sys/unix"
)

const resolveFlags = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV

func openat2(dir int, name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat2(dir, name, &unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Resolve: resolveFlags})
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		return fd, err
	}
}

// pathError wraps an errno from resolving a path in the matching sentinel.
func pathError(path string, err error) error {
	switch err {
	case unix.ELOOP:
		return fmt.Errorf("%w: %s", ErrSymlink, path)
	case unix.EXDEV:
		return fmt.Errorf("%w: %s crosses a mount point", ErrFilesystem, path)
	}
	return fmt.Errorf("ctl: open %s: %w", path, err)
}

// splitShm checks that path names a file strictly inside dir and returns
// its components below dir.
func splitShm(dir, path string) ([]string, error) {
	dir = strings.TrimRight(dir, "/")
	rel, ok := strings.CutPrefix(path, dir+"/")
	if !ok {
		return nil, fmt.Errorf("%w: %s (want %s/…)", ErrOutside, path, dir)
	}
	parts := strings.Split(rel, "/")
	for _, p := range parts {
		if p == "" || p == "." || p == ".." {
			return nil, fmt.Errorf("%w: %s has an empty, . or .. component", ErrOutside, path)
		}
	}
	return parts, nil
}

// shmFile is an opened, checked registration candidate.
type shmFile struct {
	fd      int
	size    int64
	hugetlb bool // on hugetlbfs (else tmpfs)
}

// checkFile checks a descriptor the daemon is about to map: open for reading
// and writing (EACCES otherwise, as mmap(PROT_WRITE, MAP_SHARED) would say;
// EBADF for an O_PATH descriptor), a regular file (EINVAL), on tmpfs or
// hugetlbfs (EXDEV; a memfd is on tmpfs), neither immutable (EPERM) nor
// append-only (EACCES). name is for messages.
func checkFile(fd int, name string) (*shmFile, error) {
	fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("ctl: fcntl %s: %w", name, err)
	}
	if fl&unix.O_PATH != 0 {
		return nil, fmt.Errorf("%w: %s is an O_PATH descriptor", ErrBadFD, name)
	}
	if fl&unix.O_ACCMODE != unix.O_RDWR {
		return nil, fmt.Errorf("%w: %s is not open read-write", ErrAccess, name)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("ctl: stat %s: %w", name, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s (mode %#o)", ErrNotRegular, name, st.Mode)
	}
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, fmt.Errorf("ctl: statfs %s: %w", name, err)
	}
	if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
		return nil, fmt.Errorf("%w: %s (type %#x)", ErrFilesystem, name, fs.Type)
	}
	if flags, err := unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS); err == nil {
		const immutable, appendOnly = 0x10, 0x20 // FS_IMMUTABLE_FL, FS_APPEND_FL
		if flags&immutable != 0 {
			return nil, fmt.Errorf("%w: %s", ErrImmutable, name)
		}
		if flags&appendOnly != 0 {
			return nil, fmt.Errorf("%w: %s is append-only", ErrAccess, name)
		}
	}
	return &shmFile{fd: fd, size: st.Size, hugetlb: fs.Type == unix.HUGETLBFS_MAGIC}, nil
}

// openShm opens path read-write with the credentials of the caller c (see
// asCaller): the kernel decides search permission on every directory and
// read-write permission on the file exactly as for the caller, ACLs,
// supplementary groups and immutable flags included. path must be an
// absolute name of a regular file inside dir, reached without following
// any symbolic link and without leaving dir's mount; dir must be on tmpfs
// or hugetlbfs. The file is first opened O_PATH (no side effects on a FIFO
// or device), checked, then opened read-write and checked to be the same
// inode.
func openShm(dir, path string, c *cred) (*shmFile, error) {
	parts, err := splitShm(dir, path)
	if err != nil {
		return nil, err
	}
	var f *shmFile
	err = asCaller(c, func() error {
		var err error
		f, err = openShmAs(dir, path, parts)
		return err
	})
	return f, err
}

func openShmAs(dir, path string, parts []string) (*shmFile, error) {
	root, err := unix.Openat2(unix.AT_FDCWD, strings.TrimRight(dir, "/"), &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, accessError(dir, err)
	}
	cur := root
	defer func() { unix.Close(cur) }()
	var fs unix.Statfs_t
	if err := unix.Fstatfs(root, &fs); err != nil {
		return nil, fmt.Errorf("ctl: statfs %s: %w", dir, err)
	}
	if fs.Type != unix.TMPFS_MAGIC && fs.Type != unix.HUGETLBFS_MAGIC {
		return nil, fmt.Errorf("%w: %s (type %#x)", ErrFilesystem, dir, fs.Type)
	}
	var st unix.Stat_t
	for _, p := range parts[:len(parts)-1] {
		fd, err := openat2(cur, p, unix.O_PATH|unix.O_NOFOLLOW)
		if err != nil {
			return nil, accessError(path, err)
		}
		unix.Close(cur)
		cur = fd
		if err := unix.Fstat(cur, &st); err != nil {
			return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return nil, fmt.Errorf("%w: %s: %s", ErrSymlink, path, p)
		default:
			return nil, fmt.Errorf("%w: %s: %s is not a directory", ErrNotRegular, path, p)
		}
	}
	name := parts[len(parts)-1]
	pfd, err := openat2(cur, name, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return nil, accessError(path, err)
	}
	err = unix.Fstat(pfd, &st)
	unix.Close(pfd)
	if err != nil {
		return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFLNK:
		return nil, fmt.Errorf("%w: %s", ErrSymlink, path)
	default:
		return nil, fmt.Errorf("%w: %s (mode %#o)", ErrNotRegular, path, st.Mode)
	}
	dev, ino := st.Dev, st.Ino
	fd, err := openat2(cur, name, unix.O_RDWR|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, accessError(path, err)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctl: stat %s: %w", path, err)
	}
	if st.Dev != dev || st.Ino != ino || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s was replaced while it was checked", ErrNotRegular, path)
	}
	f, err := checkFile(fd, path)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return f, nil
}

// accessError is pathError plus the permission errors of opening as the
// caller.
func accessError(path string, err error) error {
	switch err {
	case unix.EACCES:
		return fmt.Errorf("%w: %s", ErrAccess, path)
	case unix.EPERM:
		return fmt.Errorf("%w: %s", ErrImmutable, path)
	}
	return pathError(path, err)
}

// checkLength resolves a requested length (0: the whole file) against the
// file's size: the result is > 0 and ≤ the size, or ErrLength.
func checkLength(f *shmFile, length uint64) (int, error) {
	if length == 0 {
		length = uint64(f.size)
	}
	if length == 0 || length > uint64(f.size) || length > math.MaxInt {
		return 0, fmt.Errorf("%w: %d bytes of a %d-byte file", ErrLength, length, f.size)
	}
	return int(length), nil
}

// mapShm maps n bytes of f shared and read-write.
func mapShm(f *shmFile, n int) ([]byte, error) {
	mem, err := unix.Mmap(f.fd, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ctl: mmap %d bytes: %w", n, err)
	}
	return mem, nil
}
